"""The records of a workload ready to run (the Workload and its settings), shared by the
builder (kvplan/workload/build.py), the simulator and the replays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kvplan.model.layout import KVLayout
from kvplan.workload.chunks import RequestChunk

from kvplan.workload.spec import AllocatorSpec

if TYPE_CHECKING:
    from kvplan.model.step_time import StepModel
    from kvplan.workload.spec import PrefixSection, SamplingSpec, WorkloadSpec

@dataclass(frozen=True, slots=True)
class ParallelRun:
    """A serve run's data (and expert) parallelism: vLLM's sizes (kvplan.model.parallel.Parallelism),
    what the workload asked (its `parallel:` section) and, with a GPU, the step-time terms the DP
    ranks share (kvplan.model.parallel_step.ParallelStep: the routed experts over the tokens of
    every rank, the all-to-all). The pool and the clock of the Workload are one rank's."""

    par: Any
    asked: Any  # kvplan.workload.spec.ParallelSpec
    step: Any = None  # kvplan.model.parallel_step.ParallelStep, with a GPU

    def to_dict(self) -> dict:
        out = {**self.par.to_dict(), **{k: v for k, v in self.asked.to_dict().items() if k not in ("dp", "pp")}}
        if self.step is not None:
            out["network_bytes_per_s"] = self.step.network
        return out


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
class SglangConfig:
    """SGLang's scheduler settings for a serve run with `engine: sglang` (kvplan/sim/sglang.py has
    the rules, each from SGLang's source): lpm or fcfs, the new-token ratio's start (0.7 x
    conservativeness, at most 1), chunked_prefill_size (0: no chunking), max_prefill_tokens,
    max_running_requests, and whether the radix cache reuses prefixes."""

    schedule_policy: str = "lpm"
    schedule_conservativeness: float = 1.0
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 256
    radix_cache: bool = True


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """A CPU tier of KV blocks per replica (vLLM's OffloadingConnector, native backend):
    `cpu_bytes` of host memory for the whole TP group of `world_size` GPUs, each GPU loading its
    shard (`gpu_bytes_per_token` a token) over its own link at `gb_per_s` (kvplan/sim/offload.py)."""

    cpu_bytes: int
    gb_per_s: float
    gpu_bytes_per_token: int
    world_size: int = 1


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
    step: "StepModel | None" = field(default=None, compare=False, repr=False)  # the physical model, with a GPU


@dataclass(frozen=True, slots=True)
class SpeculativeRun:
    """Speculative decoding of a serve run: the setting (kvplan.model.speculative.Speculative) and
    its draft on the workload's GPU (a Draft; None without a model and a gpu: tokens only)."""

    setting: Any
    draft: Any = None


@dataclass(slots=True)
class Workload:
    """A workload ready to run (kvplan/workload/build.py makes it from a WorkloadSpec): what is
    served, what arrives, what is compared, and how."""

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
    prefix: "PrefixSection | None" = None  # shared prefixes and the prefix replay's options
    sampling: "SamplingSpec | None" = None  # experiment sharing: its sampling groups
    offload: OffloadConfig | None = None  # serve and fleet: a CPU tier per replica
    speculative: "SpeculativeRun | None" = None  # serve: speculative decoding (kvplan/workload/build.py)
    sglang: SglangConfig | None = None  # serve with engine: sglang (None: vLLM's scheduler)
    parallel: "ParallelRun | None" = None  # serve: DP ranks of a MoE model in lockstep (kvplan/sim/data_parallel.py)
    spec: "WorkloadSpec | None" = field(default=None, compare=False, repr=False)  # what it was built from
    #   (experiment fleet: spec.fleet, its replica groups, router and transfer link)
