"""How long one scheduler step takes, in integer ticks.

Without a GPU (`TimingConfig.gpu_name` is None) a tick is one step and every step takes 1 tick.
With a GPU a tick is one picosecond. The default model is the physical one of
kvplan/model/step_time.py, turned into integers once here:

    gpu  = overhead + per_request * requests + linear[tokens] + kv_per_token * kv_read
           + attention_per_pair * pairs
    step = max(gpu, host + host_per_request * requests)

(host and host_per_request are 0 under synchronous scheduling, where the host time is part of
overhead and per_request; under async scheduling the engine core's host work overlaps the GPU.)

where linear[n] (the linear layers and all-reduces of a step of n tokens, a curve, not a
constant) is tabulated for every n up to the token budget (and extended by its last slope
beyond), and pairs is what the step's prefill chunks attend over. `timing: {model: roofline}`
keeps the plain roofline of earlier releases:

    step = overhead + max(weights + kv_per_token * kv_read,  compute_per_token * tokens)

`kv_read` is the KV the step reads: every scheduled request's tokens held at the start of the
step (a decode reads its whole context once; a prefill chunk reads the chunks before it).
`tokens` is the tokens the step processes (prefill chunks plus one per decoding request). Memory
time is bytes / (HBM bandwidth x bandwidth_efficiency); compute time is flops_per_token x tokens
/ (peak x flops_efficiency). The constants are rounded to whole picoseconds once, here, and every
later sum is integer arithmetic: a jump over many steps summed in closed form equals the
step-by-step sum exactly, so the fast engine and the reference agree to the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.model.gpus import get_gpu
from kvplan.workload.records import PoolSpec, TimingConfig

TICKS_PER_SECOND = 10**12  # picoseconds, when a GPU is set
MAX_ARRIVAL_TICKS = 2**62  # about 53 days in picoseconds: int64 room for every sum of times


def table_ticks(table: tuple[int, ...], slope: int, tokens: int) -> int:
    """Ticks of `tokens` tokens on a table tabulated for 0, 1, ... tokens, extended by `slope`."""
    last = len(table) - 1
    if tokens <= last:
        return table[tokens]
    return table[last] + (tokens - last) * slope


@dataclass(frozen=True, slots=True)
class StepClock:
    """The integer constants of the step-time model (all zero and `timed` False for step units)."""

    timed: bool
    overhead: int = 0  # ticks added to every step
    weights: int = 0  # roofline: ticks to read the weights once
    kv_per_token: int = 0  # ticks to read one token's KV
    compute_per_token: int = 0  # roofline: ticks of compute per processed token
    physical: bool = False
    per_request: int = 0  # physical: ticks per scheduled request
    attention_per_pair: int = 0  # physical: ticks per prefill attention pair
    linear: tuple[int, ...] = ()  # physical: ticks of the linear layers for 0, 1, ... tokens
    linear_slope: int = 0  # physical: ticks per token beyond the table
    frontend: int = 0  # physical: ticks a client sees on top of TTFT and E2E (the API server)
    frontend_service: int = 0  # physical: ticks the API server spends on each request, one at a time
    stream_token: int = 0  # physical: ticks of the API server's time per streamed output token
    host: int = 0  # physical, async scheduling: the engine core's host ticks a step (overlapped)
    host_per_request: int = 0  # physical, async scheduling: its host ticks per scheduled request

    @property
    def ticks_per_unit(self) -> int:
        """Ticks per reported time unit: 10**12 per second, or 1 per step."""
        return TICKS_PER_SECOND if self.timed else 1

    @property
    def unit(self) -> str:
        return "s" if self.timed else "step"

    def linear_ticks(self, tokens: int) -> int:
        return table_ticks(self.linear, self.linear_slope, tokens)

    def step_ticks(self, kv_read: int, tokens: int, requests: int = 0, pairs: int = 0, extra_gpu: int = 0) -> int:
        """Duration of one step that reads `kv_read` tokens of KV and processes `tokens` tokens
        for `requests` requests, its prefill chunks attending over `pairs` token pairs; the
        physical model adds `extra_gpu` ticks of GPU work (a speculative step's drafts)."""
        if not self.timed:
            return 1
        if self.physical:
            gpu = (self.overhead + self.per_request * requests + self.linear_ticks(tokens)
                   + self.kv_per_token * kv_read + self.attention_per_pair * pairs + extra_gpu)
            return max(gpu, self.host + self.host_per_request * requests)
        memory = self.weights + self.kv_per_token * kv_read
        return self.overhead + max(memory, self.compute_per_token * tokens)

    def arrival_ticks(self, arrival: np.ndarray) -> np.ndarray:
        """Arrival times (seconds, or steps) as int64 ticks.

        Steps: rounded up, so a request arriving at 2.5 is first seen by the step starting at 3.
        Seconds: rounded to the nearest picosecond.
        """
        values = np.asarray(arrival, dtype=np.float64)
        with np.errstate(all="ignore"):  # an overflow to inf is refused just below
            scaled = values * TICKS_PER_SECOND if self.timed else values
            ticks = np.rint(scaled) if self.timed else np.ceil(scaled)
        if values.size and not (np.isfinite(ticks).all() and ticks.min() >= 0
                                and ticks.max() < MAX_ARRIVAL_TICKS):
            raise WorkloadError("arrival times must be finite, >= 0 and below about 53 days "
                                "(4.6e6 s, or 4.6e18 steps)", field="arrival")
        return ticks.astype(np.int64)


def _ticks(seconds: float) -> int:
    return int(round(seconds * TICKS_PER_SECOND))


def _positive(value: float, field: str) -> float:
    if not value > 0:
        raise WorkloadError(f"must be > 0, got {value!r}", field=field)
    return float(value)


def _fraction(value: float, field: str) -> float:
    if not 0 < value <= 1:
        raise WorkloadError(f"must be in (0, 1], got {value!r}", field=field)
    return float(value)


TABLE_LIMIT = 1 << 16  # linear[] entries at most; beyond, the last slope (compute-bound by then)


def make_clock(timing: TimingConfig, pool: PoolSpec | None = None, token_budget: int = 8192) -> StepClock:
    """The clock for a workload: step units without a GPU; with one the physical model (when the
    workload names a model, `timing.step`) or the roofline, in picoseconds.

    Roofline: bandwidth and peak FLOP/s left at 0 are read from the GPU catalog by `gpu_name`; a
    KV size per token left at 0 falls back to the pool's bytes per slot.
    """
    if timing.gpu_name is None:
        return StepClock(timed=False)
    if timing.step is not None and timing.model == "physical":
        return _physical_clock(timing.step, token_budget)
    hbm, peak = timing.hbm_bytes_per_s, timing.peak_flops
    if not hbm or not peak:
        gpu = get_gpu(timing.gpu_name)
        hbm, peak = hbm or gpu.hbm_bytes_per_s, peak or gpu.peak_bf16_flops
    bandwidth = _positive(hbm, "timing.hbm_bytes_per_s") * _fraction(
        timing.bandwidth_efficiency, "timing.bandwidth_efficiency")
    flops = _positive(peak, "timing.peak_flops") * _fraction(
        timing.flops_efficiency, "timing.flops_efficiency")
    kv_bytes = timing.kv_bytes_per_token or (pool.bytes_per_slot if pool else 0) or 0
    for name in ("weight_bytes", "flops_per_token", "step_overhead_s"):
        if getattr(timing, name) < 0:
            raise WorkloadError(f"must be >= 0, got {getattr(timing, name)!r}",
                                field=f"timing.{name}")
    overhead = _ticks(timing.step_overhead_s)
    weights = _ticks(timing.weight_bytes / bandwidth)
    if overhead + weights == 0:
        overhead = 1  # a step takes at least one tick, so time always moves forward
    return StepClock(
        timed=True,
        overhead=overhead,
        weights=weights,
        kv_per_token=_ticks(kv_bytes / bandwidth),
        compute_per_token=_ticks(timing.flops_per_token / flops),
    )


@lru_cache(maxsize=64)
def _linear_table(view, size: int) -> tuple[int, ...]:
    return tuple(_ticks(x) for x in view.per_token_table(size))


@lru_cache(maxsize=128)
def _physical_clock(step, token_budget: int) -> StepClock:
    """Integer ticks of the physical model (kvplan/model/step_time.py) for a token budget (kept for
    the next setup of the same model, GPU and budget: a search builds it once, not per setting).
    The linear table is shared by the steps that differ only in what it does not read (the KV
    bytes and attention of a token, the lm_head, the overheads): auto and fp8 KV, for one."""
    size = max(2, min(token_budget, TABLE_LIMIT) + 1)
    view = replace(step, kv_bytes_per_token=0, attention_flops_per_pair=0.0, lm_head_flops_per_request=0.0,
                   enforce_eager=False, async_scheduling=True)
    linear = _linear_table(view, size)
    slope = max(linear[-1] - linear[-2], 0)
    overhead = max(_ticks(step.overhead_s), 1)  # a step takes at least one tick
    return StepClock(timed=True, overhead=overhead, kv_per_token=_ticks(step.kv_read_s_per_token),
                     physical=True, per_request=_ticks(step.per_request_s),
                     attention_per_pair=_ticks(step.attention_s_per_pair), linear=linear, linear_slope=slope,
                     frontend=_ticks(step.constants.frontend_latency_s),
                     frontend_service=_ticks(step.constants.frontend_request_s),
                     stream_token=_ticks(step.constants.stream_token_s),
                     host=_ticks(step.host_step_s), host_per_request=_ticks(step.host_request_s))
