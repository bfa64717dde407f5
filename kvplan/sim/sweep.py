"""Request-rate sweep: the highest Poisson arrival rate an allocator sustains under a latency bound.

Kwon et al. (SOSP'23, Figure 12) plot normalized latency (end-to-end latency / output tokens,
averaged over requests) against the request rate; the rate a system sustains is where the curve
stays under a bound. `rate_sweep` re-runs `simulate` once per rate with the same requests re-timed
as a Poisson process, and reports the curve and that rate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.sim.engine import simulate
from kvplan.sim.metrics import ServeResult
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec
from kvplan.workload.chunks import RequestChunk

RequestsForRate = Callable[[float], Iterator[RequestChunk]]


@dataclass(frozen=True, slots=True)
class SweepPoint:
    rate: float  # requests per second (per step without a GPU)
    normalized_latency: float | None  # mean, in the run's time unit per output token
    result: ServeResult


@dataclass(frozen=True, slots=True)
class SweepResult:
    points: tuple[SweepPoint, ...]
    latency_bound: float
    max_rate: float | None  # the highest rate at and below which every point is under the bound

    def to_dict(self) -> dict:
        return {"latency_bound": self.latency_bound, "max_rate": self.max_rate,
                "points": [{"rate": p.rate, "normalized_latency_s": p.normalized_latency}
                           for p in self.points]}


def poisson_retimed(workload: Workload) -> RequestsForRate:
    """A builder that keeps the workload's requests and replaces their arrivals with a Poisson
    process of the given rate, drawn from a generator seeded by the workload's seed."""

    def build(rate: float) -> Iterator[RequestChunk]:
        rng = np.random.default_rng([workload.seed, 0x5EED])
        start = 0.0
        for chunk in workload.make_requests():
            gaps = rng.exponential(1.0 / rate, len(chunk))
            arrival = start + np.cumsum(gaps)
            if len(chunk):
                start = float(arrival[-1])
            yield replace(chunk, arrival=arrival)

    return build


def rate_sweep(workload: Workload, allocator: AllocatorSpec, rates: Iterable[float],
               latency_bound: float, *,
               requests_for_rate: RequestsForRate | None = None,
               progress_for: Callable[[int], Callable[[int, int], None] | None] = lambda i: None) -> SweepResult:
    """Simulate at each rate (ascending) and find the highest rate under `latency_bound`.

    `requests_for_rate(rate)` builds the request chunks for one rate; by default the workload's
    own requests re-timed as a Poisson process (`poisson_retimed`). `progress_for(i)`: the engine's
    progress hook for the i-th rate's run.
    """
    rates = sorted(float(r) for r in rates)
    if not rates or rates[0] <= 0:
        raise WorkloadError("rates must be a non-empty list of numbers > 0", field="rates")
    build = requests_for_rate or poisson_retimed(workload)
    points = []
    for i, rate in enumerate(rates):
        run = replace(workload, make_requests=lambda rate=rate: build(rate))
        result = simulate(run, allocator, progress=progress_for(i))
        points.append(SweepPoint(rate, result.normalized_latency.mean, result))
    best = None
    for p in points:
        if p.normalized_latency is None or p.normalized_latency > latency_bound:
            break
        best = p.rate
    return SweepResult(tuple(points), latency_bound, best)
