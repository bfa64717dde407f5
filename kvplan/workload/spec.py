"""The records a workload is declared in, before its model is resolved: how a Workload is made.

A `WorkloadSpec` says what a workload file says, in typed, frozen records that check themselves
when they are made (a bad value raises WorkloadError naming the field, relative to the record:
`SchedulerSpec(max_num_seqs=0)` fails on `max_num_seqs`). The YAML file is one reader of them
(kvplan/workload/schema.py, which locates errors by line); flag runs, the configurations `kvplan
plan` tries, calibration runs and a fleet's replica groups are made in code, as `replace(...)` of
a spec. `kvplan.workload.build.build_workload` turns a spec into the `Workload` the experiments
run (models resolved, pools sized, defaults filled in for the GPU).

None in a field means "the default", which may depend on the model or GPU (a scheduler's batch
limits, max_model_len): the builder fills it in, as `vllm serve` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.workload.checks import check_bool, check_choice, check_float, check_int, check_text
from kvplan.workload.checks import fail as _fail
from kvplan.workload.distributions import AllAtOnce, ArrivalProcess, Lengths
from kvplan.workload.routing import RouterSpec
from kvplan.workload.traces import TRACE_FORMATS
from kvplan.workload.traces.columns import TraceColumns

EXPERIMENTS = ("capacity", "serve", "prefix", "sharing", "fleet")
MAX_REQUESTS = 50_000_000
MAX_SLOTS = 2**40
MIN_EFFICIENCY = 0.01  # no GPU serves at under 1% of its bandwidth or peak; below it times stop being numbers
MAX_REPLICAS = 256  # each replica keeps its own pool tables (a few MB with prefix caching): memory stays bounded
ROLES = ("both", "prefill", "decode")
PREEMPTIONS = ("recompute", "swap")
ENGINES = ("vllm", "sglang")  # the serving engine whose scheduler a serve run follows (kvplan/sim/sglang.py)
SCHEDULE_POLICIES = ("lpm", "fcfs")  # SGLang's --schedule-policy values kvplan models
TIMING_MODELS = ("physical", "roofline")
TOO_LONG = ("error", "clip")
ARRIVAL_TRACES = ("sharegpt", "agentic", "vllm-bench")  # traces without timestamps of their own
UNTIMED_TRACES = ("sharegpt", "vllm-bench")  # no timestamps at all: nothing to scale


# ---- the sections of a workload --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllocatorSpec:
    """One allocator to compare: contiguous with a reservation policy, or paged with a block size."""

    kind: str  # "contiguous" | "paged"
    policy: str | None = None  # contiguous: "max" | "pow2" | "oracle"
    block_size: int | None = None  # paged
    max_len: int | None = None  # contiguous "max"/"pow2": the per-request limit reserved up to
    prefix_caching: bool | None = None  # paged: override scheduler.prefix_caching (None: follow it)
    hybrid: bool | None = None  # paged: override scheduler.hybrid_kv_cache_manager (None: follow it)
    offload: bool | None = None  # paged: False runs without the workload's CPU tier (None: follow it)

    def __post_init__(self) -> None:
        check_choice(self.kind, ("contiguous", "paged"), "kind")
        if self.kind == "contiguous":
            check_choice(self.policy, ("max", "pow2", "oracle"), "policy")
            check_int(self.max_len, "max_len", ge=1, le=2**40, optional=True)  # None: max_model_len
        else:
            check_int(self.block_size, "block_size", ge=1, le=2**20)

    @property
    def label(self) -> str:
        if self.kind == "contiguous":
            return f"contiguous-{self.policy}"
        return (f"paged-B{self.block_size}" + (" no-cache" if self.prefix_caching is False else "")
                + (" all-full" if self.hybrid is False else "") + (" no-offload" if self.offload is False else ""))



POOL_KEYS = ("slots", "kv_memory", "gpu_memory_utilization", "mem_fraction_static")
POOL_ENGINES = ("vllm", "none")
DEFAULT_FRACTION = "default"  # pool.mem_fraction_static: SGLang's own default for the GPU and TP


@dataclass(frozen=True, slots=True)
class PoolRequest:
    """The KV pool asked for: exactly one of token `slots`, `kv_memory` bytes, vLLM's
    `gpu_memory_utilization`: what vLLM allocates at start-up at that utilization, with the
    workload's scheduler settings (kvplan/model/vllm_memory.py, as `kvplan size` prints it), or
    with `engine: none` the bare bound utilization x GPU memory - weights; or SGLang's
    `mem_fraction_static` (engine: sglang; a fraction, or "default": SGLang's for the GPU and TP):
    the max_total_num_tokens SGLang allocates at start-up (kvplan/model/sglang_memory.py, as
    `kvplan size --engine sglang` prints it)."""

    slots: int | None = None
    kv_memory: int | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | str | None = None  # a fraction in (0, 1], or DEFAULT_FRACTION
    engine: str = "vllm"  # gpu_memory_utilization: "vllm", the pool vLLM allocates at start-up (kvplan
    #   size's); "none", the bare bound utilization x GPU memory - weights

    def __post_init__(self) -> None:
        check_choice(self.engine, POOL_ENGINES, "engine")
        if self.engine != "vllm" and self.gpu_memory_utilization is None:
            raise _fail("engine", "applies to gpu_memory_utilization (the pool of slots or kv_memory is given)")
        present = [k for k in POOL_KEYS if getattr(self, k) is not None]
        if not present:
            raise _fail("", f"needs exactly one of: {', '.join(POOL_KEYS)}")
        if len(present) > 1:
            raise _fail(present[1], f"give only one of: {', '.join(POOL_KEYS)} (found {', '.join(present)})")
        check_int(self.slots, "slots", ge=1, le=MAX_SLOTS, optional=True)
        check_int(self.kv_memory, "kv_memory", gt=0, optional=True)
        check_float(self.gpu_memory_utilization, "gpu_memory_utilization", gt=0, le=1, optional=True)
        if self.mem_fraction_static != DEFAULT_FRACTION:
            if isinstance(self.mem_fraction_static, str):
                raise _fail("mem_fraction_static", f"expected a number in (0, 1] or {DEFAULT_FRACTION} (SGLang's "
                                                   f"for the GPU and TP), got {self.mem_fraction_static!r}")
            check_float(self.mem_fraction_static, "mem_fraction_static", gt=0, le=1, optional=True)

    @property
    def key(self) -> str:
        """The one key given."""
        return next(k for k in POOL_KEYS if getattr(self, k) is not None)


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """vLLM's scheduler settings as given (vLLM's names and meanings); None: vLLM's default
    (the batch limits `vllm serve` sets for the GPU, max_model_len the model's context)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    chunked_prefill: bool = True
    preemption: str = "recompute"
    swap_space: int | None = None  # bytes of CPU swap space (needs a model)
    swap_slots: int | None = None  # or the CPU pool in token slots
    null_block: bool = True
    prefix_caching: bool = True
    hybrid_kv_cache_manager: bool = True
    allow_long_max_model_len: bool = False  # vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: max_model_len may pass the context

    def __post_init__(self) -> None:
        check_int(self.max_num_seqs, "max_num_seqs", ge=1, le=2**20, optional=True)
        check_int(self.max_num_batched_tokens, "max_num_batched_tokens", ge=1, le=2**31, optional=True)
        check_int(self.max_model_len, "max_model_len", ge=1, le=2**31, optional=True)
        for name in ("chunked_prefill", "null_block", "prefix_caching", "hybrid_kv_cache_manager",
                     "allow_long_max_model_len"):
            check_bool(getattr(self, name), name)
        check_choice(self.preemption, PREEMPTIONS, "preemption")
        check_int(self.swap_space, "swap_space", ge=0, optional=True)
        check_int(self.swap_slots, "swap_slots", ge=0, le=MAX_SLOTS, optional=True)
        if self.swap_space is not None and self.swap_slots is not None:
            raise _fail("swap_slots", "give only one of: swap_space, swap_slots (found swap_space, swap_slots)")


@dataclass(frozen=True, slots=True)
class TimingSpec:
    """The step-time model: "physical" (kvplan/model/step_time.py: its fitted constants, or a
    `kvplan calibrate` profile's, with any efficiency given here in their place) or "roofline"
    (overhead + max(memory, compute)); None: the model's own value (0.8, 0.5 and 0 ms roofline)."""

    model: str = "physical"
    bandwidth_efficiency: float | None = None
    flops_efficiency: float | None = None
    step_overhead_ms: float | None = None
    profile: Path | None = None  # a timing profile (kvplan calibrate --out), as given or absolute

    def __post_init__(self) -> None:
        check_choice(self.model, TIMING_MODELS, "model")
        check_float(self.bandwidth_efficiency, "bandwidth_efficiency", ge=MIN_EFFICIENCY, le=1, optional=True)
        check_float(self.flops_efficiency, "flops_efficiency", ge=MIN_EFFICIENCY, le=1, optional=True)
        check_float(self.step_overhead_ms, "step_overhead_ms", ge=0, le=1e6, optional=True)
        if self.profile is not None and self.model != "physical":
            raise _fail("profile", "a timing profile applies to model: physical, with a model and a gpu")

    def given(self) -> dict[str, float]:
        """The efficiencies and overhead set here (not left to the model)."""
        return {k: getattr(self, k) for k in ("bandwidth_efficiency", "flops_efficiency", "step_overhead_ms")
                if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class SyntheticRequests:
    """`count` requests, lengths drawn from `prompt` and `output`, arriving by `arrival`."""

    count: int
    prompt: Lengths
    output: Lengths
    arrival: ArrivalProcess = AllAtOnce()

    def __post_init__(self) -> None:
        check_int(self.count, "count", ge=1)
        if self.count > MAX_REQUESTS:
            raise _fail("count", f"{self.count:,} requests is above the limit of {MAX_REQUESTS:,}")
        if not isinstance(self.prompt, Lengths) or self.prompt.min < 1:
            raise _fail("prompt", "expected lengths of at least 1 token")
        if not isinstance(self.output, Lengths) or self.output.min < 0:
            raise _fail("output", "expected lengths of at least 0 tokens")


@dataclass(frozen=True, slots=True)
class TraceRequests:
    """The requests of a trace file (kvplan/workload/traces/): `limit` of them, `repeat` times,
    timestamps scaled by `time_scale`, or arriving by `arrival` where the trace has none."""

    format: str
    path: Path
    limit: int | None = None
    time_scale: float | None = None  # None: 1 (traces with timestamps only)
    repeat: int = 1
    too_long: str = "error"  # a request above max_model_len: an error, or cut to fit ("clip")
    history: bool = False  # sharegpt: each turn carries the conversation before it
    arrival: ArrivalProcess | None = None
    columns: TraceColumns | None = None  # csv: the header names and time unit (None: the defaults)

    def __post_init__(self) -> None:
        check_choice(self.format, TRACE_FORMATS, "trace.format")
        check_int(self.limit, "trace.limit", ge=1, optional=True)
        check_float(self.time_scale, "trace.time_scale", gt=0, optional=True)
        check_int(self.repeat, "trace.repeat", ge=1, le=MAX_REQUESTS)
        check_choice(self.too_long, TOO_LONG, "trace.too_long")
        check_bool(self.history, "trace.history")
        if self.history and self.format != "sharegpt":
            raise _fail("trace.history", "applies to sharegpt traces")
        if self.columns is not None and (self.format != "csv" or not isinstance(self.columns, TraceColumns)):
            raise _fail("trace.columns", "applies to csv traces (a TraceColumns)")
        if self.arrival is not None and self.format not in ARRIVAL_TRACES:
            article = "an" if self.format[0] in "aeiou" else "a"
            raise _fail("arrival", f"{article} {self.format} trace has its own timestamps; remove arrival")
        if self.time_scale is not None and self.format in UNTIMED_TRACES:
            raise _fail("trace.time_scale", f"a {self.format} trace has no timestamps to scale")


Requests = Union[SyntheticRequests, TraceRequests]


# ---- the sections of the prefix and sharing experiments ----------------------------------------


POPULARITY = ("uniform", "zipf")
SAMPLING_MODES = ("parallel", "beam")  # kvplan/replay/sharing.py
BEAM_PARENTS = ("random", "best")


@dataclass(frozen=True, slots=True)
class PrefixSpec:
    """Shared prompt starts for a synthetic workload (the YAML `prefix:` section, key for key).

    system_prompts: distinct system prompts (0: none). system_prompt_len: their length in tokens
    (one int for all, or one per prompt). popularity: uniform | zipf (prompt k is picked with
    probability proportional to (k + 1) ** -zipf_a). turns: requests per conversation; each
    turn's prompt is the previous turn's prompt and answer followed by the request's own new
    tokens. sessions: conversations open at once (each request continues one of them, picked
    uniformly). hash_block_size: tokens per generated hash id (use the simulated block size or
    a multiple of it). max_prompt_len: a conversation that would pass it starts afresh.
    """

    system_prompts: int = 8
    system_prompt_len: int | tuple[int, ...] = 1024
    popularity: str = "zipf"
    zipf_a: float = 1.2
    turns: int = 1
    sessions: int = 16
    hash_block_size: int = 16
    max_prompt_len: int | None = None

    def __post_init__(self) -> None:
        for name, lo in (("system_prompts", 0), ("turns", 1), ("sessions", 1),
                         ("hash_block_size", 1), ("max_prompt_len", 1)):  # fmt: skip
            value = getattr(self, name)
            if not (value is None and name == "max_prompt_len") and not _is_int(value, lo):
                raise _bad(name, value, f"an integer >= {lo}")
        lens = self.system_prompt_len
        lens = (lens,) * self.system_prompts if _is_int(lens, 1) else lens
        if (not isinstance(lens, (list, tuple)) or len(lens) != self.system_prompts
                or not all(_is_int(n, 1) for n in lens)):  # fmt: skip
            raise _bad("system_prompt_len", lens, f"{self.system_prompts} lengths >= 1, or one")
        object.__setattr__(self, "system_prompt_len", tuple(int(n) for n in lens))
        if self.popularity not in POPULARITY:
            raise _bad("popularity", self.popularity, " or ".join(POPULARITY))
        a = self.zipf_a
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a < float("inf"):
            raise _bad("zipf_a", a, "a number > 0")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["system_prompt_len"] = list(self.system_prompt_len)
        return d


def _is_int(value, lo: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo


def _bad(name: str, value, want: str) -> WorkloadError:
    return WorkloadError(f"got {value!r}; expected {want}", field=name)


@dataclass(frozen=True, slots=True)
class PrefixSection:
    """The `prefix:` section: synthetic shared prefixes (`shared`; None: the requests' own hash
    blocks, a trace's), and the prefix replay's options (experiment: prefix only): requests
    resident at once, and whether a request's output is held in the cache with its prompt."""

    shared: PrefixSpec | None = None
    max_running: int = 1
    hold_output: bool = False

    def __post_init__(self) -> None:
        if self.shared is not None and not isinstance(self.shared, PrefixSpec):
            raise _fail("", f"expected shared prefixes, got {self.shared!r}")
        check_int(self.max_running, "max_running", ge=1, le=1_000_000)
        check_bool(self.hold_output, "hold_output")

    @property
    def replays(self) -> bool:
        """Whether a replay option differs from its default."""
        return self.max_running != 1 or self.hold_output


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """The `sampling:` section of experiment sharing: parallel sampling or beam search groups
    ("both": each), of each width, the beam's parent rule."""

    mode: str = "both"
    widths: tuple[int, ...] = (2, 4, 6)
    parent: str = "random"

    def __post_init__(self) -> None:
        check_choice(self.mode, (*SAMPLING_MODES, "both"), "mode")
        if not isinstance(self.widths, tuple) or not self.widths:
            raise _fail("widths", f"expected a list of group widths, got {self.widths!r}")
        for i, w in enumerate(self.widths):
            check_int(w, f"widths[{i}]", ge=1, le=64)
        check_choice(self.parent, BEAM_PARENTS, "parent")


# ---- fleets -------------------------------------------------------------------------------


GROUP_OVERRIDES = ("model", "gpu", "tp", "kv_dtype", "pool", "scheduler", "allocators", "timing")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """`count` identical replicas; each field left None is the fleet file's own (top level)."""

    name: str
    count: int = 1
    role: str = "both"  # "prefill" / "decode": a pool of a disaggregated fleet
    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    kv_dtype: str | None = None
    pool: PoolRequest | None = None
    scheduler: SchedulerSpec | None = None
    allocators: tuple[AllocatorSpec, ...] | None = None
    timing: TimingSpec | None = None

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        check_int(self.count, "count", ge=1, le=MAX_REPLICAS)
        check_choice(self.role, ROLES, "role")
        check_int(self.tp, "tp", ge=1, le=4096, optional=True)
        check_choice(self.kv_dtype, KV_DTYPE_CHOICES, "kv_dtype", optional=True)
        if self.allocators is not None and not self.allocators:
            raise _fail("allocators", "expected at least one allocator")

    def overrides(self) -> dict[str, Any]:
        """The fields this group sets (the rest it takes from the fleet)."""
        return {k: getattr(self, k) for k in GROUP_OVERRIDES if getattr(self, k) is not None}


MAX_LINK_GB_PER_S = 1e6  # 1 PB/s: far above any interconnect (NVLink 5 is 1.8 TB/s)
MAX_LINK_LATENCY_S = 60.0  # a minute: far above any network's latency


# The proxy of a disaggregated deployment (vLLM's disaggregated-serving proxy, a FastAPI server
# relaying through httpx): it takes the client's request, posts it to a prefill server with
# max_tokens 1, waits for that answer, posts it to a decode server and relays its stream. Two
# relays of a Python HTTP proxy, each about 1-3 ms where measured (a Python forwarding proxy adds
# 1.3 ms to a local HTTP call, mike820324/microProxy#200; Python LLM proxies 5-15 ms with
# streaming, arniesaha/agentweave#93): 5 ms, settable as transfer.proxy_s.
DEFAULT_PROXY_S = 0.005


@dataclass(frozen=True, slots=True)
class Transfer:
    """The links a request's KV crosses, from its prefill replica's to its decode replica's:
    `latency_s` + the KV bytes each GPU holds / `gb_per_s` (every GPU of the TP group sends its
    own shard, all at once; 0: no bandwidth limit). Each replica has its own link, which carries
    one transfer at a time, so a request's KV waits while either of its links carries earlier
    ones (kvplan/fleet/run.py's TransferLinks).
    `proxy_s`: the proxy's share of every request's TTFT and E2E (DEFAULT_PROXY_S)."""

    gb_per_s: float
    latency_s: float = 0.0
    proxy_s: float = DEFAULT_PROXY_S

    def __post_init__(self) -> None:
        check_float(self.gb_per_s, "gb_per_s", ge=0, le=MAX_LINK_GB_PER_S)
        check_float(self.latency_s, "latency_s", ge=0, le=MAX_LINK_LATENCY_S)
        check_float(self.proxy_s, "proxy_s", ge=0, le=MAX_LINK_LATENCY_S)


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Replica groups behind a router; with prefill and decode groups, disaggregated over
    `transfer` (kvplan/fleet/run.py runs it)."""

    groups: tuple[GroupSpec, ...]
    router: RouterSpec = RouterSpec()
    transfer: Transfer | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise _fail("replicas", "expected at least one replica group")
        total = 0
        for i, group in enumerate(self.groups):
            total += group.count
            if total > MAX_REPLICAS:
                raise _fail(f"replicas[{i}]", f"more than {MAX_REPLICAS:,} replicas in all")
        roles = {g.role for g in self.groups}
        if roles != {"both"} and roles != {"prefill", "decode"}:
            raise _fail("replicas", "a disaggregated fleet has prefill and decode groups only "
                                    f"(got roles {', '.join(sorted(roles))})")
        if roles == {"prefill", "decode"} and self.transfer is None:
            raise _fail("replicas", "a disaggregated fleet needs `transfer: {gb_per_s, latency_s}`, "
                                    "the link the KV moves over")
        if roles == {"both"} and self.transfer is not None:
            raise _fail("transfer", "a colocated fleet moves no KV between replicas: `transfer:` needs "
                                    "groups with role: prefill and role: decode")

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "both" for g in self.groups)


# ---- service-level objectives ------------------------------------------------------------------


SLO_KEYS = ("ttft_s", "tpot_s", "e2e_s")
MAX_SLO_S = 1e6  # about 12 days: far above any latency target


@dataclass(frozen=True, slots=True)
class SloSpec:
    """`slo:` of a serve or fleet file: per-request latency limits in seconds (None: no limit), at
    least one. A request counts toward goodput when its TTFT, its TPOT and its E2E are each
    within the limit given, all at once (DistServe's SLO attainment; vLLM's benchmark --goodput)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            check_float(getattr(self, key), key, gt=0, le=MAX_SLO_S, optional=True)
        if all(getattr(self, key) is None for key in SLO_KEYS):
            raise _fail("slo", f"expected at least one limit of {', '.join(SLO_KEYS)}")

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in SLO_KEYS}


# ---- a CPU offload tier ------------------------------------------------------------------------


MIN_OFFLOAD_GB_PER_S = 0.01  # 10 MB/s: below it a load of one block would leave the simulated clock
MAX_OFFLOAD_BYTES = 2**50  # a PiB of host memory: far above any server's


@dataclass(frozen=True, slots=True)
class OffloadSpec:
    """`offload:` of a serve or fleet file: vLLM's native CPU KV offloading (`--kv-offloading-size`,
    `--kv-offloading-backend native`: the OffloadingConnector), one tier per replica.

    `kv_offloading_size`: bytes of host memory for the whole TP group, as vLLM's flag means it
    (vllm/v1/kv_offload/cpu/spec.py, CPUOffloadingSpec: num_blocks = bytes // (page bytes x
    layers x world size)). `gb_per_s`: each GPU's host-to-device bandwidth; every GPU of the TP
    group loads its own shard at once (kvplan/sim/offload.py has the rules)."""

    kv_offloading_size: int
    gb_per_s: float

    def __post_init__(self) -> None:
        check_int(self.kv_offloading_size, "kv_offloading_size", gt=0, le=MAX_OFFLOAD_BYTES)
        check_float(self.gb_per_s, "gb_per_s", ge=MIN_OFFLOAD_GB_PER_S, le=MAX_LINK_GB_PER_S)


# ---- speculative decoding ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeculativeSpec:
    """`speculative:` of a serve file: vLLM's --speculative-config (method, num_speculative_tokens)
    and the acceptance rate of each draft position (kvplan/model/speculative.py; None: the method's
    published default). Checked by kvplan/model/speculative.make_speculative."""

    method: str
    num_speculative_tokens: int | None = None
    acceptance: tuple[float, ...] | None = None

    def setting(self):
        from kvplan.model.speculative import make_speculative

        return make_speculative(self.method, self.num_speculative_tokens, self.acceptance, field="method",
                                k_field="num_speculative_tokens", acceptance_field="acceptance")

    def __post_init__(self) -> None:
        self.setting()


PARALLEL_KEYS = ("dp", "pp", "enable_expert_parallel", "all2all_backend", "expert_imbalance", "network_gbps")


@dataclass(frozen=True, slots=True)
class ParallelSpec:
    """`parallel:` of a serve file: vLLM's --data-parallel-size (dp) and --enable-expert-parallel on
    a MoE model, with the step-time options of kvplan/model/parallel_step.py (all2all_backend,
    expert_imbalance, network_gbps: each GPU's network bandwidth in Gb/s; None: the GPU's). Each DP
    rank is an engine of its own, the ranks stepping in lockstep (kvplan/sim/data_parallel.py).
    Pipeline stages (pp) are priced by `kvplan step --pp`, not simulated: pp other than 1 is refused."""

    dp: int = 1
    pp: int = 1
    enable_expert_parallel: bool = False
    all2all_backend: str = "allgather_reducescatter"
    expert_imbalance: float = 1.3
    network_gbps: float | None = None

    def __post_init__(self) -> None:
        from kvplan.model.parallel import MAX_DEGREE
        from kvplan.model.parallel_step import ALL2ALL_BACKENDS

        check_int(self.dp, "dp", ge=1, le=MAX_DEGREE)
        check_int(self.pp, "pp", ge=1, le=MAX_DEGREE)
        if self.pp != 1:
            raise _fail("pp", "pipeline stages are not simulated in serve (kvplan step --pp prices their "
                              "step); give pp: 1")
        check_bool(self.enable_expert_parallel, "enable_expert_parallel")
        check_choice(self.all2all_backend, ALL2ALL_BACKENDS, "all2all_backend")
        check_float(self.expert_imbalance, "expert_imbalance", ge=1.0, le=8.0)
        check_float(self.network_gbps, "network_gbps", ge=1, le=10_000, optional=True)  # kvplan step's range

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in PARALLEL_KEYS}


@dataclass(frozen=True, slots=True)
class SglangSpec:
    """`sglang:` of a serve file with `engine: sglang`: SGLang's scheduler flags, with SGLang's names
    (python/sglang/srt/server_args.py). None: SGLang's default (kvplan/sim/sglang.py says which).

    `schedule_policy` lpm | fcfs; `schedule_conservativeness` scales the initial new-token ratio;
    `chunked_prefill_size` the tokens of one prefill chunk (-1: no chunking); `max_prefill_tokens`
    the tokens of one prefill batch; `max_running_requests` the running batch's cap (default:
    scheduler.max_num_seqs); `disable_radix_cache` turns RadixAttention's prefix reuse off."""

    schedule_policy: str = "lpm"
    schedule_conservativeness: float = 1.0
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    disable_radix_cache: bool = False

    def __post_init__(self) -> None:
        check_choice(self.schedule_policy, SCHEDULE_POLICIES, "schedule_policy")
        check_float(self.schedule_conservativeness, "schedule_conservativeness", gt=0, le=100)
        if self.chunked_prefill_size is not None and self.chunked_prefill_size != -1:
            check_int(self.chunked_prefill_size, "chunked_prefill_size", ge=1, le=2**31)
        check_int(self.max_prefill_tokens, "max_prefill_tokens", ge=1, le=2**31, optional=True)
        check_int(self.max_running_requests, "max_running_requests", ge=1, le=2**20, optional=True)
        check_bool(self.disable_radix_cache, "disable_radix_cache")


# ---- the workload --------------------------------------------------------------------------


Locate = Callable[[str], "int | None"]  # a field's line in the file the spec was read from


# Why an SGLang server cannot be a prefill or decode replica (the file's check and the fleet's own)
SGLANG_DISAGGREGATED = ("a disaggregated fleet's prefill and decode replicas run vLLM's scheduler and its KV connector; "
                        "SGLang's disaggregation is not modelled")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload as declared: what is served, what arrives, what is compared, and how.

    `path` is the file it was read from ("" when made in code), `locate` the line of a field in it."""

    name: str
    pool: PoolRequest
    requests: SyntheticRequests | TraceRequests
    experiment: str = "serve"
    seed: int = 0
    model: str | None = None
    kv_dtype: str = "auto"
    tp: int = 1
    gpu: str | None = None
    allocators: tuple[AllocatorSpec, ...] = (AllocatorSpec("paged", block_size=16),)
    scheduler: SchedulerSpec = SchedulerSpec()
    timing: TimingSpec = TimingSpec()
    fleet: FleetSpec | None = None
    prefix: PrefixSection | None = None
    sampling: SamplingSpec | None = None
    slo: SloSpec | None = None  # serve and fleet: the limits goodput counts against
    offload: OffloadSpec | None = None  # serve and fleet: a CPU tier of KV blocks per replica
    speculative: SpeculativeSpec | None = None  # serve: speculative decoding (vLLM's --speculative-config)
    engine: str = "vllm"  # serve: whose scheduler runs the requests (ENGINES)
    sglang: SglangSpec | None = None  # engine sglang: its scheduler flags (None: SGLang's defaults)
    parallel: ParallelSpec | None = None  # serve: DP ranks (and EP) of a MoE model, in lockstep
    path: str = ""
    locate: Locate | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_text(self.name, "name")
        check_int(self.seed, "seed", ge=0)
        check_choice(self.experiment, EXPERIMENTS, "experiment")
        check_text(self.model, "model", optional=True)
        check_choice(self.kv_dtype, KV_DTYPE_CHOICES, "kv_dtype")
        check_int(self.tp, "tp", ge=1, le=4096)
        check_text(self.gpu, "gpu", optional=True)
        if self.gpu is not None and self.model is None:
            raise _fail("gpu", "a gpu needs a model (weights and FLOPs come from it)")
        if not self.allocators:
            raise _fail("allocators", "expected at least one allocator")
        for i, a in enumerate(self.allocators):
            if not isinstance(a, AllocatorSpec):
                raise _fail(f"allocators[{i}]", f"expected an allocator, got {a!r}")
        if self.fleet is not None and self.experiment != "fleet":
            raise _fail("replicas", f"applies to experiment: fleet, and this is experiment: {self.experiment}")
        if self.fleet is None and self.experiment == "fleet":
            raise _fail("replicas", "a fleet needs `replicas:`, a list of replica groups")
        if self.prefix is not None and self.prefix.replays and self.experiment != "prefix":
            raise _fail("prefix.max_running", f"applies to experiment: prefix, and this is experiment: {self.experiment}")
        if self.offload is not None:
            self._check_offload()
        if self.speculative is not None and self.experiment != "serve":
            raise _fail("speculative", f"applies to experiment: serve, and this is experiment: {self.experiment}")
        self._check_engine()
        if self.parallel is not None:
            self._check_parallel()

    def _check_parallel(self) -> None:
        """What the lockstep DP simulation (kvplan/sim/data_parallel.py) does not build, refused naming the key."""
        if not isinstance(self.parallel, ParallelSpec):
            raise _fail("parallel", f"expected vLLM's parallel sizes, got {self.parallel!r}")
        if self.experiment != "serve":
            raise _fail("parallel", f"applies to experiment: serve, and this is experiment: {self.experiment}")
        if self.engine != "vllm":
            raise _fail("parallel", "is modelled on vLLM's DP engine cores; engine: sglang runs without it")
        if self.model is None:
            raise _fail("parallel", "needs a model (its routed experts decide what the DP ranks share)")
        if self.offload is not None:
            raise _fail("parallel", "a CPU tier with data parallelism is not simulated; remove one of offload: "
                                    "and parallel:")

    def _check_engine(self) -> None:
        """SGLang's scheduler (kvplan/sim/sglang.py) runs serve and fleet experiments on its token pool, with
        RadixAttention and retraction; what it does not model is refused naming the key."""
        check_choice(self.engine, ENGINES, "engine")
        if self.sglang is not None and not isinstance(self.sglang, SglangSpec):
            raise _fail("sglang", f"expected SGLang's scheduler flags, got {self.sglang!r}")
        if self.engine == "vllm":
            if self.sglang is not None:
                raise _fail("sglang", "applies to engine: sglang")
            if self.pool.mem_fraction_static is not None:
                raise _fail("pool.mem_fraction_static", "sizes SGLang's start-up pool (engine: sglang); for vLLM "
                                                        "give pool.gpu_memory_utilization")
            return
        if self.experiment not in ("serve", "fleet"):
            raise _fail("engine", f"sglang runs serve and fleet experiments, and this is experiment: {self.experiment}")
        if self.fleet is not None and self.fleet.disaggregated:
            raise _fail("engine", f"{SGLANG_DISAGGREGATED}: expected engine: vllm")
        if self.offload is not None:
            raise _fail("offload", "a CPU tier is vLLM's offloading connector; engine: sglang runs without one")
        if self.speculative is not None:
            from kvplan.model.speculative import SGLANG_METHODS, sglang_refusal

            if self.speculative.setting().method not in SGLANG_METHODS:
                raise _fail("speculative.method", sglang_refusal("engine: sglang"))
        if self.pool.gpu_memory_utilization is not None:
            raise _fail("pool.gpu_memory_utilization", "sizes vLLM's start-up pool; for engine: sglang give "
                                                       "pool.mem_fraction_static (SGLang's start-up rule; default: "
                                                       "SGLang's for the GPU and TP)")
        if self.pool.mem_fraction_static is not None:
            for key, theirs in (("max_num_seqs", "max_running_requests"),
                                ("max_num_batched_tokens", "chunked_prefill_size")):
                if getattr(self.scheduler, key) is not None:
                    raise _fail(f"scheduler.{key}", f"is vLLM's; with pool.mem_fraction_static SGLang's start-up "
                                                    f"sets its own: give sglang.{theirs}")
        if self.scheduler.preemption != "recompute":
            raise _fail("scheduler.preemption", "SGLang retracts requests (their KV is dropped and recomputed): "
                                                "engine: sglang takes preemption: recompute")
        if self.allocators != (AllocatorSpec("paged", block_size=16),):
            raise _fail("allocators", "SGLang's pool is its own (token slots, page size 1): leave allocators "
                                      "out with engine: sglang")

    def _check_offload(self) -> None:
        """Where a CPU tier cannot apply, refused naming `offload` (vLLM's connector stores and
        finds blocks by their prefix hashes, loads them into a paged pool, in a timed engine)."""
        if self.experiment not in ("serve", "fleet"):
            raise _fail("offload", f"applies to experiments serve and fleet (an engine that steps), and this "
                                   f"is experiment: {self.experiment}")
        if self.gpu is None:
            raise _fail("offload", "a CPU tier needs a gpu: its loads take KV bytes / gb_per_s seconds, "
                                   "and a run without a gpu counts steps")
        if not self.scheduler.prefix_caching:
            raise _fail("offload", "a CPU tier needs prefix caching (vLLM's offloading connector looks "
                                   "blocks up by their prefix hashes): remove scheduler.prefix_caching: false")
        if any(a.kind != "paged" or a.prefix_caching is False for a in self.allocators):
            raise _fail("offload", "a CPU tier serves paged allocators with prefix caching; remove the others")
        if self.fleet is not None and self.fleet.disaggregated:
            raise _fail("offload", "a CPU tier is modelled on colocated replicas (decode pools run without "
                                   "prefix caching); remove offload: or the prefill and decode roles")
