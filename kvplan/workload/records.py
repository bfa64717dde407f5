"""Plain records shared by the workload reader, the trace readers and the simulator.

Requests travel in chunks of numpy arrays so that a million-request workload never becomes a
million Python objects at once; readers yield chunks lazily.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np

from kvplan.model.layout import KVLayout

CHUNK_SIZE = 65_536
MAX_TOKENS = 2**31  # tokens of one prompt or output: far above any context, far below int64 sums


@dataclass(frozen=True, slots=True)
class RequestChunk:
    """A run of consecutive requests in arrival order.

    arrival: float64 seconds (or steps when the workload has no GPU), nondecreasing across chunks.
    prompt_len, output_len: int64 token counts (prompt >= 1, output >= 0).
    hash_ids: optional per-request tuples of prefix-block hash ids (traces that carry them),
    each block covering `hash_block_size` tokens.
    cut: which of these requests the reader cut at max_model_len (counted as clipped).
    """

    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    hash_ids: list[tuple[int, ...]] | None = None
    hash_block_size: int = 0
    cut: np.ndarray | None = None  # per request: True where a trace reader cut it short
    preload: np.ndarray | None = None  # per request: prompt tokens whose KV arrives computed (a
    # disaggregated fleet's decode replicas; kvplan/fleet/run.py), at most prompt - 1

    def __len__(self) -> int:
        return len(self.prompt_len)

    def take(self, idx) -> "RequestChunk":
        """The requests at `idx` (a slice, or an array of positions in order)."""
        hashes = self.hash_ids
        if hashes is not None:
            hashes = hashes[idx] if isinstance(idx, slice) else [hashes[i] for i in np.asarray(idx).tolist()]
        return replace(self, arrival=self.arrival[idx], prompt_len=self.prompt_len[idx],
                       output_len=self.output_len[idx], hash_ids=hashes,
                       cut=None if self.cut is None else self.cut[idx],
                       preload=None if self.preload is None else self.preload[idx])


@dataclass(frozen=True, slots=True)
class AllocatorSpec:
    """One allocator to compare: contiguous with a reservation policy, or paged with a block size."""

    kind: str  # "contiguous" | "paged"
    policy: str | None = None  # contiguous: "max" | "pow2" | "oracle"
    block_size: int | None = None  # paged
    max_len: int | None = None  # contiguous "max"/"pow2": the per-request limit reserved up to
    prefix_caching: bool | None = None  # paged: override scheduler.prefix_caching (None: follow it)
    hybrid: bool | None = None  # paged: override scheduler.hybrid_kv_cache_manager (None: follow it)

    @property
    def label(self) -> str:
        if self.kind == "contiguous":
            return f"contiguous-{self.policy}"
        return (f"paged-B{self.block_size}" + (" no-cache" if self.prefix_caching is False else "")
                + (" all-full" if self.hybrid is False else ""))


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The KV pool: `slots` token slots; `bytes_per_slot` when a model is known (else None)."""

    slots: int
    bytes_per_slot: int | None = None
    kv_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """vLLM's scheduler settings, with vLLM's names and meanings."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    chunked_prefill: bool = False
    preemption: str = "recompute"  # "recompute" | "swap"
    swap_slots: int = 0  # CPU pool for swap preemption, in token slots
    null_block: bool = False  # keep block 0 out of use, as vLLM does (a workload file's default)
    prefix_caching: bool = False  # automatic prefix caching (vLLM V1's default; a workload file's)
    hybrid_kv_cache_manager: bool = True  # vLLM's layer groups for sliding-window and state layers


@dataclass(frozen=True, slots=True)
class TimingConfig:
    """Roofline step-time model; when `gpu_name` is None the time unit is one scheduler step."""

    gpu_name: str | None = None
    hbm_bytes_per_s: float = 0.0
    peak_flops: float = 0.0
    weight_bytes: int = 0
    flops_per_token: float = 0.0  # forward FLOPs per processed token (about 2 x parameters)
    kv_bytes_per_token: int = 0
    bandwidth_efficiency: float = 0.8
    flops_efficiency: float = 0.5
    step_overhead_s: float = 0.0
    model: str = "physical"  # "physical": kvplan/model/step_time.py; "roofline": the formula above
    step: Any = field(default=None, compare=False, repr=False)  # the physical StepModel, with a model


@dataclass(slots=True)
class Workload:
    """A validated workload file: what is served, what arrives, what is compared, and how."""

    name: str
    path: str
    seed: int
    experiment: str  # "capacity" (static, the lesson's) | "serve" (discrete-event) | "prefix" | "sharing"
    num_requests: int
    pool: PoolSpec
    allocators: tuple[AllocatorSpec, ...]
    scheduler: SchedulerConfig
    timing: TimingConfig
    make_requests: Callable[[], Iterator[RequestChunk]] = field(repr=False)
    layout: KVLayout | None = None
    contiguous_max_len: int = 8192  # the per-request limit the "max" and "pow2" policies reserve up to
    extras: dict = field(default_factory=dict)  # validated sections of later features (prefix, groups)
