"""From the integer record of a run to the numbers people read.

Both engines hand over the same `RawRun`: per-request event ticks (indexed by request id, in
arrival order), counters, and time integrals as exact Python ints. Every float is computed here,
once, in a fixed order, so two runs that agree on the integers agree on every printed digit.

Memory breakdown, in slots, measured during each step after that step's allocations and weighted
by the step's duration (idle gaps count with the pool empty); the five parts partition the pool:
- token_states: slots holding a token's KV for a running request (the prompt, then every token
  but the last one sampled: a request of P + O tokens ends holding P + O - 1, as in vLLM).
- reserved: contiguous only: reserved slots the request will still fill before it finishes
  (prompt + output - 1 - held). Paged: 0, nothing is set aside ahead of use.
- internal: allocated slots that will never hold a token: a contiguous reservation beyond
  prompt + output - 1, or the unfilled tail of a paged request's last block.
- external: free slots that cannot be used. Contiguous: the free runs shorter than the reservation
  of the request at the head of the waiting queue, counted when the free slots in total would
  hold that reservation (the head is refused only because the free space is in pieces); 0 when
  nothing waits or when the pool is simply too full (a shortage, as in the capacity experiment).
  Paged: the slots % B left over after cutting the pool into blocks.
- free: the other unallocated slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.memory.prefix_cache import PrefixCacheStats
from kvplan.model.step_time import STREAM_BUSY_CAP
from kvplan.sim.inputs import SimSetup
from kvplan.sim.offload import OffloadStats, offload_dict
from kvplan.sim.overload import Overload, overload_of
from kvplan.sim.slo import client_latencies, goodput, within

INTEGRALS = ("time", "running", "tokens", "allocated", "final", "external")
TIMELINE_FIELDS = ("time", "running", "waiting", "token_states", "reserved", "internal",
                   "external", "free")
BREAKDOWN_KEYS = ("token_states", "reserved", "internal", "external", "free")


def prefix_cache_dict(s: PrefixCacheStats) -> dict:
    """The counters under the serve JSON's "prefix_cache" keys (frozen: prefix_hit_rate is hit_rate)."""
    return {"prefix_hit_rate": s.hit_rate, "prefill_tokens_saved": s.prefill_tokens_saved,
            "lookups": s.lookups, "query_tokens": s.query_tokens, "hit_tokens": s.hit_tokens,
            "blocks_evicted": s.blocks_evicted, "blocks_reused": s.blocks_reused}


@dataclass(slots=True)
class RawRun:
    """What an engine produces: integers only."""

    arrival: np.ndarray  # per request, ticks
    admitted: np.ndarray  # first admission tick
    first_token: np.ndarray
    finish: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    preemptions: np.ndarray  # per request
    clipped: int
    steps: int
    preemptions_total: int
    swap_outs: int
    recomputed_tokens: int
    peak_running: int
    t_origin: int
    t_end: int
    integrals: dict[str, int]  # keys INTEGRALS: sums of value x step ticks
    timeline: np.ndarray  # (points, 8) int64, columns TIMELINE_FIELDS, time in ticks
    timeline_delta: int  # ticks between timeline points
    sent: np.ndarray | None = None  # per request, ticks the client sent it (None: its arrival)
    prefix: PrefixCacheStats | None = None  # with prefix caching
    hit_tokens: np.ndarray | None = None  # with prefix caching: per request, prompt tokens hit
    offload: OffloadStats | None = None  # with a CPU tier


@dataclass(frozen=True, slots=True)
class Stats:
    """Mean and percentiles of one per-request quantity, in the run's time unit."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @staticmethod
    def of(values: np.ndarray) -> "Stats":
        if values.size == 0:
            return Stats(None, None, None, None)
        p50, p90, p99 = (float(x) for x in np.percentile(values, [50, 90, 99]))
        return Stats(float(np.mean(values)), p50, p90, p99)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}


@dataclass(frozen=True, slots=True)
class Timeline:
    """Point samples of the state every `interval` time units: arrays named TIMELINE_FIELDS."""

    interval: float
    columns: dict[str, np.ndarray]

    def to_dict(self) -> dict:
        return {"interval": self.interval, **{k: v.tolist() for k, v in self.columns.items()}}


@dataclass(frozen=True, slots=True)
class RequestRecords:
    """Per-request columns (times in the run's unit; -1 never happens for completed runs)."""

    columns: dict[str, np.ndarray]

    FIELDS = ("arrival", "admitted", "first_token", "finish", "prompt", "output", "preemptions")
    # with prefix caching also "cached_tokens": the prompt tokens its first admission found cached;
    # with an API server that streams at a cost also "frontend": what it added to TTFT and E2E

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.columns)

    def __len__(self) -> int:
        return len(self.columns["prompt"])

    def iter_chunks(self, size: int = 65_536) -> Iterator[dict[str, np.ndarray]]:
        """Column slices of at most `size` rows, for streaming to a CSV."""
        for begin in range(0, len(self), size):
            yield {k: v[begin:begin + size] for k, v in self.columns.items()}


@dataclass(frozen=True, slots=True)
class ServeResult:
    """One allocator's dynamic run. Times are in `time_unit` ("s", or "step" without a GPU).

    Per request: TTFT = first token - arrival (the first token comes at the end of the step that
    completes the prefill); TPOT = (finish - first token) / (output - 1), over requests with more
    than one output token; e2e = finish - arrival; normalized latency = e2e / output tokens
    (Kwon et al.); queue delay = first admission - arrival. makespan runs from the first arrival to
    the last finish; throughput_tps counts output tokens. allocated_slots, tokens_stored and
    utilization are time averages (the capacity experiment's names, measured over the run), and
    every request is admitted and completed by the end, so `admitted` equals `completed`.
    """

    allocator: str  # "contiguous" | "paged"
    label: str  # "contiguous-max", "paged-B16", ...
    policy: str | None
    block_size: int | None
    time_unit: str
    pool_slots: int
    completed: int
    clipped: int
    steps: int
    makespan: float
    throughput_rps: float
    throughput_tps: float
    ttft: Stats
    tpot: Stats
    e2e: Stats
    normalized_latency: Stats
    queue_delay: Stats
    peak_running: int
    mean_running: float
    preemptions: int
    swap_outs: int
    recomputed_tokens: int
    allocated_slots: float  # time-averaged
    tokens_stored: float  # time-averaged
    utilization: float
    breakdown: dict[str, float]  # BREAKDOWN_KEYS, fractions of the pool
    timeline: Timeline | None = None
    requests: RequestRecords | None = None
    prefix: PrefixCacheStats | None = None  # None: prefix caching off
    overload: Overload | None = None  # arrivals faster than admissions (kvplan/sim/overload.py)
    goodput: dict | None = None  # with an `slo:`, the requests within it (kvplan/sim/slo.goodput)
    offload: dict | None = None  # with a CPU tier: kvplan/sim/offload.offload_dict
    data_parallel: dict | None = None  # DP ranks in lockstep: kvplan/sim/data_parallel.LockstepSim.summary

    @property
    def wasted_slots(self) -> float:
        return self.allocated_slots - self.tokens_stored

    def to_dict(self) -> dict:
        """Plain data with stable keys (the timeline and per-request records are separate)."""
        return {
            "allocator": self.allocator, "label": self.label, "policy": self.policy,
            "block_size": self.block_size,
            "time_unit": self.time_unit, "pool_slots": self.pool_slots,
            "admitted": self.completed, "completed": self.completed, "clipped": self.clipped,
            "steps": self.steps, "makespan": self.makespan,
            "throughput_rps": self.throughput_rps, "throughput_tps": self.throughput_tps,
            "ttft_s": self.ttft.to_dict(), "tpot_s": self.tpot.to_dict(),
            "e2e_s": self.e2e.to_dict(), "normalized_latency_s": self.normalized_latency.to_dict(),
            "queue_delay_s": self.queue_delay.to_dict(),
            "peak_running": self.peak_running, "mean_running": self.mean_running,
            "preemptions": self.preemptions, "swap_outs": self.swap_outs,
            "recomputed_tokens": self.recomputed_tokens,
            "allocated_slots": self.allocated_slots, "tokens_stored": self.tokens_stored,
            "wasted_slots": self.wasted_slots, "utilization": self.utilization,
            "memory_breakdown": dict(self.breakdown),
            "prefix_caching": self.prefix is not None,
            "prefix_cache": prefix_cache_dict(self.prefix) if self.prefix is not None else None,
            "overload": self.overload.to_dict() if self.overload is not None else None,
            **({} if self.goodput is None else {"goodput": self.goodput}),
            **({} if self.data_parallel is None else {"data_parallel": self.data_parallel}),
            **({} if self.offload is None else {"offload": self.offload}),
        }  # fmt: skip


def breakdown_integrals(raw: RawRun, setup: SimSetup) -> dict[str, int]:
    """The five parts of the pool, each integrated over time (exact ints summing to slots x T)."""
    i = raw.integrals
    total = setup.slots * i["time"]
    if setup.paged:
        parts = [i["tokens"], 0, i["allocated"] - i["tokens"]]
    else:
        parts = [i["tokens"], i["final"] - i["tokens"], i["allocated"] - i["final"]]
    parts += [i["external"], total - i["allocated"] - i["external"]]
    return dict(zip(BREAKDOWN_KEYS, parts))


def token_rate_at(raw: RawRun, times: np.ndarray) -> np.ndarray:
    """The engine's output tokens per tick at each of `times`: every request with more than one
    output token streams its later tokens evenly from its first token to its finish (the sum of
    those rates over the requests streaming then; a step function, swept once in time order)."""
    many = (raw.output > 1) & (raw.first_token >= 0)
    if not many.any():
        return np.zeros(len(times))
    start, end = raw.first_token[many], raw.finish[many]
    rate = (raw.output[many] - 1) / np.maximum(end - start, 1)
    at = np.concatenate([start, end])
    order = np.argsort(at, kind="stable")
    level = np.cumsum(np.concatenate([rate, -rate])[order])
    k = np.searchsorted(at[order], times, side="right") - 1
    return np.maximum(np.where(k >= 0, level[np.maximum(k, 0)], 0.0), 0.0)


def client_frontend(raw: RawRun, clock) -> int | np.ndarray:
    """Ticks the API server adds to each request's TTFT and E2E: its per-request work
    (`clock.frontend`), stretched by 1 / (1 - rho) when the same process also streams tokens, rho =
    the engine's token rate at the request's send x the server's time per token (processor sharing;
    kvplan/model/step_time.py, StepConstants.stream_token_s). A plain number when nothing streams or costs."""
    if not clock.frontend or not clock.stream_token or not raw.finish.size:
        return clock.frontend
    sent = raw.arrival if raw.sent is None else raw.sent
    busy = np.minimum(token_rate_at(raw, sent) * clock.stream_token, STREAM_BUSY_CAP)
    return np.rint(clock.frontend / (1.0 - busy)).astype(np.int64)


def latency_arrays(raw: RawRun, per_unit: int, frontend: int | np.ndarray = 0) -> dict[str, np.ndarray]:
    """Per-request latencies as a client measures them, in the run's unit: `frontend` ticks (the
    API server's request and first-response handling, outside the GPU's steps; one number or one
    per request, `client_frontend`) are added to TTFT and E2E; TPOT is over the requests with more
    than one output token."""
    arrival, out = (raw.arrival if raw.sent is None else raw.sent), raw.output
    lat = client_latencies(arrival, raw.first_token, raw.finish, out, frontend, per_unit)
    return {"ttft": lat["ttft"], "tpot": lat["tpot"][out > 1], "e2e": lat["e2e"],
            "normalized_latency": lat["e2e"] / out, "queue_delay": (raw.admitted - arrival) / per_unit}


def _latencies(raw: RawRun, per_unit: int, frontend: int | np.ndarray = 0) -> dict[str, Stats]:
    return {k: Stats.of(v) for k, v in latency_arrays(raw, per_unit, frontend).items()}


def _timeline(raw: RawRun, setup: SimSetup) -> Timeline:
    per_unit = setup.clock.ticks_per_unit
    cols = {name: raw.timeline[:, k].copy() for k, name in enumerate(TIMELINE_FIELDS)}
    cols["time"] = (cols["time"] - raw.t_origin) / per_unit
    return Timeline(raw.timeline_delta / per_unit, cols)


def check_possible(raw: RawRun) -> None:
    """The last line of defence: a run whose events are out of order is an error, never output.

    Every request arrives, is admitted, emits its first token and finishes in that order (a
    request with no output has no first token), at ticks >= 0 within the run.
    """
    arrival, admitted, first, finish = raw.arrival, raw.admitted, raw.first_token, raw.finish
    has_first = first >= 0
    bad = ((arrival < 0) | (admitted < arrival) | (finish < admitted) | (finish > raw.t_end)
           | (has_first & ((first < admitted) | (first > finish))))
    if raw.t_end < raw.t_origin or bad.any():
        i = int(np.flatnonzero(bad)[0]) if bad.any() else 0
        raise WorkloadError(f"internal error: an impossible result for request {i} (arrival "
                            f"{arrival[i]}, admitted {admitted[i]}, first token {first[i]}, finish "
                            f"{finish[i]} ticks); please report it with this workload")


def build_result(raw: RawRun, setup: SimSetup, *, record_requests: bool = False, slo=None) -> ServeResult:
    """Every reported number of one run, from its integers (checked by check_possible first);
    with `slo` (kvplan/workload/spec.SloSpec), its goodput."""
    check_possible(raw)
    per_unit = setup.clock.ticks_per_unit
    span = raw.integrals["time"]
    makespan = span / per_unit
    parts = breakdown_integrals(raw, setup)
    total = setup.slots * span
    alloc, tokens = raw.integrals["allocated"], raw.integrals["tokens"]
    records = None
    frontend = client_frontend(raw, setup.clock)
    if record_requests:
        times = {k: getattr(raw, k) / per_unit
                 for k in ("arrival", "admitted", "first_token", "finish")}
        if raw.sent is not None:
            times["arrival"] = raw.sent / per_unit  # when the client sent it
        cached = {} if raw.hit_tokens is None else {"cached_tokens": raw.hit_tokens}
        added = {"frontend": frontend / per_unit} if isinstance(frontend, np.ndarray) else {}
        records = RequestRecords({**times, "prompt": raw.prompt, "output": raw.output,
                                  "preemptions": raw.preemptions, **cached, **added})
    return ServeResult(
        allocator="paged" if setup.paged else "contiguous", label=setup.label, policy=setup.policy,
        block_size=setup.block_size if setup.paged else None,
        time_unit=setup.clock.unit, pool_slots=setup.slots,
        completed=int(raw.finish.size), clipped=raw.clipped, steps=raw.steps,
        makespan=makespan,
        throughput_rps=raw.finish.size / makespan if span else 0.0,
        throughput_tps=int(raw.output.sum()) / makespan if span else 0.0,
        **_latencies(raw, per_unit, frontend),
        peak_running=raw.peak_running,
        mean_running=raw.integrals["running"] / span if span else 0.0,
        preemptions=raw.preemptions_total, swap_outs=raw.swap_outs,
        recomputed_tokens=raw.recomputed_tokens,
        allocated_slots=alloc / span if span else 0.0,
        tokens_stored=tokens / span if span else 0.0,
        utilization=tokens / alloc if alloc else 0.0,
        breakdown={k: (v / total if total else 0.0) for k, v in parts.items()},
        timeline=_timeline(raw, setup),
        requests=records,
        prefix=raw.prefix,
        overload=overload_of(raw.arrival, raw.admitted, per_unit),
        goodput=None if slo is None else goodput(slo, within(slo, **client_latencies(
            raw.arrival if raw.sent is None else raw.sent, raw.first_token, raw.finish, raw.output, frontend, per_unit)),
            makespan),
        offload=None if raw.offload is None else offload_dict(raw.offload, setup.offload, setup.block_size, raw.prefix),
    )  # fmt: skip
