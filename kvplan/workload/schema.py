"""Read a workload file into a `WorkloadSpec`, and through it a `Workload` (the full schema:
workloads/SCHEMA.md).

```yaml
name: lesson                  # default: the file name without .yaml
seed: 0                       # default 0; one numpy default_rng(seed) per workload
experiment: capacity          # capacity | serve | prefix | sharing | fleet (default serve)
model: meta-llama/Meta-Llama-3-8B   # any `kvplan size` model argument (optional with pool.slots)
kv_dtype: auto                # auto|fp32|bf16|fp16|fp8|int8|int4 (or vLLM's fp8_e4m3, fp8_e5m2)
tp: 1
gpu: H100-80GB                # optional, needs model; enables the roofline time model
pool:                         # exactly one of slots | kv_memory | gpu_memory_utilization | mem_fraction_static
  slots: 131072
  # kv_memory: 16GiB          #   needs model: slots = kv_memory // layout.bytes_per_token
  # gpu_memory_utilization: 0.92  # needs model+gpu: vLLM's start-up pool (engine: none: util x memory - weights)
  # mem_fraction_static: default  # engine: sglang, needs model+gpu: SGLang's start-up pool (or a fraction)
requests:                     # synthetic: count (<= 50M), prompt, output, arrival; or a trace
  count: 500
  prompt: {dist: uniform, low: 100, high: 2000}   # + optional min (>= 1) / max
  output: {dist: fixed, value: 0}                 # + optional min (>= 0) / max
  # dists: fixed {value} | uniform {low, high} inclusive | normal {mean, std}
  #   | lognormal {sigma, mean | median} | exponential {mean} | zipf {a > 1, scale, max}
  #   | histogram {edges, weights} | csv {path, column}
  arrival: {process: all_at_once}  # | poisson {rate} | gamma {rate, cv}
  # trace: {format: azure|mooncake|vidur|csv|sharegpt|agentic|vllm-bench|vllm-bench-timed, path: ../traces/x.csv,
  #         limit: 1000, time_scale: 1.0, repeat: 1, too_long: error|clip, history: false (sharegpt),
  #         columns: {timestamp, prompt_tokens, output_tokens}, timestamp_unit: s|ms|us|datetime (csv)}
  #   (arrival with a trace: sharegpt/vllm-bench request arrivals, agentic conversation starts)
allocators:                   # default: [{kind: paged, block_size: 16}]
  - {kind: contiguous, policy: max, max_len: 8192}   # max|pow2|oracle; max_len: max_model_len
  - {kind: paged, block_size: [16, 32]}              # a list gives one allocator each
scheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_model_len: 8192,
            chunked_prefill: false, preemption: recompute, swap_space: 4GiB}  # or swap_slots
timing: {model: physical, profile: h100-8b.yaml}  # or roofline {bandwidth_efficiency: 0.8,
                              #   flops_efficiency: 0.5, step_overhead_ms: 0.0}
prefix: {...}                 # shared prompts (read by kvplan/workload/prefixes.py)
sampling: {...}               # experiment sharing: parallel sampling / beam search groups
replicas: [{count: 2, gpu: L40S}, ...]  # experiment fleet: replica groups (kvplan/fleet/run.py)
router: round_robin           # experiment fleet: kvplan/workload/routing.ROUTERS (llm_d, sglang ...)
transfer: {gb_per_s: 50, latency_s: 0.001, proxy_s: 0.005}  # experiment fleet, disaggregated: the KV link, the proxy
offload: {kv_offloading_size: 8GiB, gb_per_s: 25}  # serve and fleet: a CPU KV tier per replica, its PCIe load bandwidth
engine: vllm                  # serve: vllm | sglang (SGLang's scheduler and radix cache: kvplan/sim/sglang.py)
sglang: {schedule_policy: lpm, chunked_prefill_size: 8192}  # engine: sglang: its flags (workloads/SCHEMA.md)
```

The YAML file is one reader of the records in kvplan/workload/spec.py: `read_spec` checks every
key's type and bounds where it stands and makes the records; `load_workload` then builds the
workload (kvplan/workload/build.py: the model resolved, the pool sized) and locates whatever the
records or the builder refuse at its line. Every unknown key, wrong type and impossible value is a
WorkloadError naming the key and its line.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvplan.errors import KvplanError, WorkloadError
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.workload.build import build_workload, ResolveModel
from kvplan.workload.distributions import parse_arrival, parse_lengths
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec
from kvplan.workload.routing import LLM_D_INDEXES, POLICY_KEYS, PREFIX_SCORES, ROUTER_KEYS, ROUTER_NAMES, RouterSpec
from kvplan.workload.chunks import MAX_TOKENS
from kvplan.workload.spec import (
    BEAM_PARENTS, DEFAULT_PROXY_S, EXPERIMENTS, GROUP_OVERRIDES, MAX_LINK_GB_PER_S, MAX_OFFLOAD_BYTES, MAX_REPLICAS,
    MAX_REQUESTS, MAX_SLO_S, MAX_SLOTS, MIN_OFFLOAD_GB_PER_S, PARALLEL_KEYS, ParallelSpec,
    MIN_EFFICIENCY, POOL_ENGINES, DEFAULT_FRACTION, ENGINES, SCHEDULE_POLICIES, SglangSpec, POOL_KEYS, POPULARITY, PREEMPTIONS, ROLES, SAMPLING_MODES, SLO_KEYS, TIMING_MODELS,
    TOO_LONG, FleetSpec, GroupSpec, PoolRequest, PrefixSection, PrefixSpec, SamplingSpec, SchedulerSpec, SloSpec,
    SyntheticRequests, TimingSpec, TraceRequests, Transfer, WorkloadSpec, OffloadSpec, SpeculativeSpec,
)  # fmt: skip
from kvplan.workload.traces import TRACE_FORMATS
from kvplan.workload.traces.columns import COLUMN_KEYS, TIMESTAMP_UNITS, TraceColumns
from kvplan.workload.yaml_nodes import YamlList, YamlMap, YamlNode, as_float, as_int, as_map, load_yaml

TOP_KEYS = ("name", "seed", "experiment", "model", "kv_dtype", "tp", "gpu", "pool", "requests",
            "allocators", "scheduler", "timing", "prefix", "sampling", "replicas", "router", "transfer", "slo",
            "offload", "engine", "sglang", "speculative", "parallel")  # fmt: skip
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "chunked_prefill", "preemption",
                  "swap_space", "swap_slots", "null_block", "prefix_caching",
                  "hybrid_kv_cache_manager", "allow_long_max_model_len")
REQUEST_KEYS = ("count", "prompt", "output", "arrival")
TRACE_KEYS = ("format", "path", "limit", "time_scale", "repeat", "too_long", "history", "columns", "timestamp_unit")
FORMAT_TRACE_KEYS = {"history": ("sharegpt",), "columns": ("csv",), "timestamp_unit": ("csv",)}  # keys of some formats
TIMING_KEYS = ("model", "bandwidth_efficiency", "flops_efficiency", "step_overhead_ms", "profile")
GROUP_KEYS = ("name", "count", "role", *GROUP_OVERRIDES)
TRANSFER_KEYS = ("gb_per_s", "latency_s", "proxy_s")
OFFLOAD_KEYS = ("kv_offloading_size", "gb_per_s")
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "acceptance")
SGLANG_KEYS = ("schedule_policy", "schedule_conservativeness", "chunked_prefill_size", "max_prefill_tokens",
               "max_running_requests", "disable_radix_cache")
PREFIX_KEYS = ("system_prompts", "system_prompt_len", "popularity", "zipf_a", "turns", "sessions",
               "hash_block_size", "max_prompt_len")
REPLAY_KEYS = ("max_running", "hold_output")  # experiment: prefix only
SAMPLING_KEYS = ("mode", "widths", "parent")
MAX_PREFIX_COUNT = 1 << 20  # system prompts, sessions, turns: beyond a million nothing changes
# prefix: key -> its least value
_PREFIX_INTS = {"system_prompts": 0, "turns": 1, "sessions": 1, "hash_block_size": 1, "max_prompt_len": 1}


def load_workload(path: str | Path, *, resolve_model: ResolveModel | None = None, seed: int | None = None,
                  engine: str | None = None) -> Workload:
    """Read and validate a workload file; requests are generated lazily by `make_requests()`.
    `seed`: instead of the file's `seed:` (a fresh sample of the same traffic); `engine`: instead
    of its `engine:` (a refusal of the engine names `--engine`)."""
    spec = read_spec(path, seed=seed)
    if engine is not None and engine != spec.engine:
        spec = with_engine(spec, engine)
    try:
        return build_workload(spec, resolve_model)
    except KvplanError as exc:
        raise locate(exc, spec) from None


def with_engine(spec: WorkloadSpec, engine: str) -> WorkloadSpec:
    """`spec` served by `engine` (a command line's --engine), refused in one line naming the flag."""
    from dataclasses import replace

    from kvplan.errors import UsageError

    try:
        return replace(spec, engine=engine, sglang=spec.sglang if engine == "sglang" else None)
    except KvplanError as exc:
        where = f"{spec.path}: " if spec.path else ""
        field = f"{exc.field}: " if exc.field and exc.field != "engine" else ""
        raise UsageError(f"{where}{field}{exc.message}", field="--engine") from None


def locate(exc: KvplanError, spec: WorkloadSpec) -> KvplanError:
    """`exc`, about a field of `spec`, located in the file `spec` was read from (an error about
    another file, such as a trace's, is left as it is)."""
    if exc.file is None and spec.path:
        exc.file = spec.path
        if exc.line is None and exc.field and spec.locate is not None:
            exc.line = spec.locate(exc.field)
    return exc


def read_spec(path: str | Path, *, seed: int | None = None) -> WorkloadSpec:
    """The records a workload file declares, every value checked where it stands."""
    path = Path(path)
    doc = load_yaml(path)
    doc.expect_keys(*TOP_KEYS)
    base = path.parent
    experiment = doc.get_choice("experiment", EXPERIMENTS, "serve")
    for key in ("replicas", "router", "transfer"):
        if key in doc and experiment != "fleet":
            raise doc.node(key).error(f"applies to experiment: fleet, and this is experiment: {experiment}")
    for key in ("slo", "offload"):
        if key in doc and experiment not in ("serve", "fleet"):
            raise doc.node(key).error(f"applies to experiments serve and fleet, and this is experiment: {experiment}")
    values = dict(
        name=doc.get_str("name", path.stem),
        seed=doc.get_int("seed", 0, ge=0) if seed is None else seed,
        experiment=experiment,
        kv_dtype=doc.get_choice("kv_dtype", KV_DTYPE_CHOICES, "auto"),
        tp=doc.get_int("tp", 1, ge=1, le=4096),
        gpu=doc.get_str("gpu", None),
        model=doc.get_str("model", None),
        pool=_pool(doc.get_map("pool")),
        scheduler=_scheduler(doc.get_map("scheduler", None)),
        requests=_requests(doc.get_map("requests"), base),
        timing=_timing(doc.get_map("timing", None), base),
        prefix=_prefix(doc.get_map("prefix"), experiment) if "prefix" in doc else None,
        sampling=_sampling(doc.get_map("sampling")) if "sampling" in doc else None,
        fleet=_fleet(doc, base) if "replicas" in doc else None,
        slo=_slo(doc.get_map("slo")) if "slo" in doc else None,
        offload=_offload(doc.get_map("offload")) if "offload" in doc else None,
        speculative=_speculative(doc.get_map("speculative")) if "speculative" in doc else None,
        engine=doc.get_choice("engine", ENGINES, "vllm"),
        sglang=_sglang(doc.get_map("sglang")) if "sglang" in doc else None,
        parallel=_parallel(doc.get_map("parallel")) if "parallel" in doc else None,
        path=str(path), locate=Locator(doc),
    )
    if "allocators" in doc:
        values["allocators"] = _allocators(doc.get_list("allocators"))
    return _make(doc, WorkloadSpec, values)


def _make(node: YamlMap, cls, values: dict):
    """`cls(**values)`, a record whose refusal (a field relative to it) is located under `node`."""
    try:
        return cls(**values)
    except KvplanError as exc:
        if exc.file is not None:
            raise
        field = exc.field or ""
        raise WorkloadError(exc.message, file=node.file, field=node.child_path(field) if field else node.path or None,
                            line=_line(node, field) if field else node.line) from None


class Locator:
    """The line of a field (dotted, with [i] for list items) in the file a spec was read from:
    `_line` over the file's nodes (a class, not a closure, so that a spec pickles)."""

    __slots__ = ("root",)

    def __init__(self, root: YamlMap) -> None:
        self.root = root

    def __call__(self, field: str) -> int | None:
        return _line(self.root, field)


_PART = re.compile(r"\[(\d+)\]|[^.\[\]]+")


def _line(node: YamlNode, field: str) -> int | None:
    """The line of `field` (dotted, with [i] for list items) under `node`, or of the deepest part of
    it that the file has; None when the file has none of it."""
    line = None
    for m in _PART.finditer(field):
        index = m.group(1)
        if index is not None and isinstance(node, YamlList) and int(index) < len(node.items):
            node = node.items[int(index)]
        elif index is None and isinstance(node, YamlMap) and m.group(0) in node.entries:
            node = node.entries[m.group(0)]
        else:
            break
        line = node.line
    return line


def _pool(node: YamlMap) -> PoolRequest:
    node.expect_keys(*POOL_KEYS, "engine")
    key = node.exactly_one(*POOL_KEYS)
    if key == "slots":
        value = node.get_int("slots", ge=1, le=MAX_SLOTS)
    elif key == "kv_memory":
        value = node.get_size("kv_memory", gt=0)
    elif key == "mem_fraction_static" and isinstance(node.node(key).to_python(), str):
        if node.node(key).to_python() != DEFAULT_FRACTION:  # SGLang's own for the GPU and TP
            raise node.node(key).error(f"expected a number in (0, 1] or {DEFAULT_FRACTION} (SGLang's for the GPU "
                                       f"and TP), got {node.node(key).to_python()!r}")
        value = DEFAULT_FRACTION
    else:
        value = node.get_float(key, gt=0, le=1)
    values = {key: value}
    if "engine" in node:
        values["engine"] = node.get_choice("engine", POOL_ENGINES)
    return _make(node, PoolRequest, values)


def _scheduler(node: YamlMap | None) -> SchedulerSpec:
    if node is None:
        return SchedulerSpec()
    node.expect_keys(*SCHEDULER_KEYS)
    if "swap_space" in node and "swap_slots" in node:
        node.exactly_one("swap_space", "swap_slots")
    values = {key: node.get_int(key, ge=1, le=high) for key, high in
              (("max_num_seqs", 2**20), ("max_num_batched_tokens", 2**31), ("max_model_len", 2**31)) if key in node}
    if "preemption" in node:
        values["preemption"] = node.get_choice("preemption", PREEMPTIONS)
    if "swap_space" in node:
        values["swap_space"] = node.get_size("swap_space", ge=0)
    if "swap_slots" in node:
        values["swap_slots"] = node.get_int("swap_slots", ge=0, le=MAX_SLOTS)
    for key in ("chunked_prefill", "null_block", "prefix_caching", "hybrid_kv_cache_manager", "allow_long_max_model_len"):
        if key in node:
            values[key] = node.get_bool(key)
    return _make(node, SchedulerSpec, values)


def _requests(node: YamlMap, base: Path) -> SyntheticRequests | TraceRequests:
    if "trace" in node:
        node.expect_keys("trace", "arrival")
        return _trace(node, base)
    node.expect_keys(*REQUEST_KEYS)
    values = dict(count=node.get_int("count", ge=1), prompt=parse_lengths(node.node("prompt"), base, default_min=1),
                  output=parse_lengths(node.node("output"), base, default_min=0))
    if "arrival" in node:
        values["arrival"] = parse_arrival(node.node("arrival"))
    return _make(node, SyntheticRequests, values)


def _trace(node: YamlMap, base: Path) -> TraceRequests:
    t = node.get_map("trace")
    fmt = t.get_choice("format", TRACE_FORMATS)
    for key, formats in FORMAT_TRACE_KEYS.items():
        if key in t and fmt not in formats:
            raise t.node(key).error(f"applies to {' and '.join(formats)} traces, not {fmt}")
    t.expect_keys(*(k for k in TRACE_KEYS if fmt in FORMAT_TRACE_KEYS.get(k, (fmt,))))
    values = dict(format=fmt, arrival=parse_arrival(node.node("arrival")) if "arrival" in node else None)
    values["limit"] = t.get_int("limit", None, ge=1)
    values["repeat"] = t.get_int("repeat", 1, ge=1, le=MAX_REQUESTS)
    values["path"] = t.get_input_path("path", base, folder_ok=fmt == "agentic")
    values["time_scale"] = t.get_float("time_scale", None, gt=0)
    values["too_long"] = t.get_choice("too_long", TOO_LONG, "error")
    values["history"] = t.get_bool("history", False)
    if fmt == "csv":
        values["columns"] = _columns(node, t)
    return _make(node, TraceRequests, values)


def _columns(node: YamlMap, t: YamlMap) -> TraceColumns:
    """A csv trace's `columns: {timestamp, prompt_tokens, output_tokens}` and `timestamp_unit`."""
    names = {}
    if "columns" in t:
        cols = t.get_map("columns")
        cols.expect_keys(*COLUMN_KEYS)
        names = {k: cols.get_str(k) for k in COLUMN_KEYS if k in cols}
    unit = t.get_choice("timestamp_unit", TIMESTAMP_UNITS, "s")
    return _make(node, TraceColumns, {**names, "unit": unit})


def _allocators(items: YamlList) -> tuple[AllocatorSpec, ...]:
    if not len(items):
        raise items.error("expected at least one allocator")
    specs: list[AllocatorSpec] = []
    for item in items:
        m = as_map(item)
        kind = m.get_choice("kind", ("contiguous", "paged"))
        if kind == "contiguous":
            m.expect_keys("kind", "policy", "max_len")
            policy = m.get_choice("policy", ("max", "pow2", "oracle"), "max")
            specs.append(_make(m, AllocatorSpec, dict(kind=kind, policy=policy,
                                                      max_len=m.get_int("max_len", None, ge=1, le=MAX_SLOTS))))
            continue
        m.expect_keys("kind", "block_size", "hybrid")
        sizes = m.node("block_size")
        sizes = list(sizes) if isinstance(sizes, YamlList) else [sizes]
        if not sizes:
            raise m.node("block_size").error("expected at least one block size")
        hybrid = m.get_bool("hybrid", True) if "hybrid" in m else None  # vLLM's layer groups or not
        specs += [AllocatorSpec(kind, block_size=as_int(s, ge=1, le=2**20), hybrid=hybrid) for s in sizes]
    return tuple(specs)


def _timing(node: YamlMap | None, base: Path) -> TimingSpec:
    """The step-time model: "physical" (kvplan/model/step_time.py, its fitted constants, or a timing
    profile's from `kvplan calibrate`, unless the file overrides them) or "roofline" (overhead +
    max(memory, compute), efficiencies 0.8 and 0.5 unless given)."""
    if node is None:
        return TimingSpec()
    node.expect_keys(*TIMING_KEYS)
    values: dict = {"model": node.get_choice("model", TIMING_MODELS, "physical")}
    if "profile" in node:
        values["profile"] = node.get_input_path("profile", base)
    for key in ("bandwidth_efficiency", "flops_efficiency"):
        if key in node:
            values[key] = node.get_float(key, ge=MIN_EFFICIENCY, le=1)
    if "step_overhead_ms" in node:
        values["step_overhead_ms"] = node.get_float("step_overhead_ms", ge=0, le=1e6)
    return _make(node, TimingSpec, values)


def _prefix(node: YamlMap, experiment: str) -> PrefixSection:
    """`prefix:`: synthetic shared prefixes (any of PREFIX_KEYS), and with experiment: prefix the
    replay's options. max_prompt_len is checked against max_model_len by the builder."""
    node.expect_keys(*PREFIX_KEYS, *(REPLAY_KEYS if experiment == "prefix" else ()))
    shared: dict = {}
    for key, lo in _PREFIX_INTS.items():
        if key in node:
            shared[key] = node.get_int(key, ge=lo, le=2**31 if key == "max_prompt_len" else MAX_PREFIX_COUNT)
    if "system_prompt_len" in node:
        lens = node.node("system_prompt_len")
        shared["system_prompt_len"] = (
            tuple(as_int(n, ge=1, le=MAX_TOKENS) for n in node.get_list("system_prompt_len"))
            if isinstance(lens, YamlList) else node.get_int("system_prompt_len", ge=1, le=MAX_TOKENS))
    if "popularity" in node:
        shared["popularity"] = node.get_choice("popularity", POPULARITY)
    if "zipf_a" in node:
        shared["zipf_a"] = node.get_float("zipf_a", gt=0, le=100)
    values = {"shared": _make(node, PrefixSpec, shared) if shared else None,
              "max_running": node.get_int("max_running", 1, ge=1, le=1_000_000),
              "hold_output": node.get_bool("hold_output", False)}
    return _make(node, PrefixSection, values)


def _sampling(node: YamlMap) -> SamplingSpec:
    """`sampling:` of experiment sharing: {mode, widths, parent}."""
    node.expect_keys(*SAMPLING_KEYS)
    values = {"mode": node.get_choice("mode", (*SAMPLING_MODES, "both"), "both"),
              "parent": node.get_choice("parent", BEAM_PARENTS, "random")}
    if "widths" in node:
        values["widths"] = tuple(as_int(w, ge=1, le=64) for w in node.get_list("widths"))
    return _make(node, SamplingSpec, values)


def _slo(node: YamlMap) -> SloSpec:
    """`slo: {ttft_s, tpot_s, e2e_s}`: the limits goodput counts against (at least one)."""
    node.expect_keys(*SLO_KEYS)
    return _make(node, SloSpec, {key: node.get_float(key, None, gt=0, le=MAX_SLO_S) for key in SLO_KEYS})


def _offload(node: YamlMap) -> OffloadSpec:
    """`offload: {kv_offloading_size, gb_per_s}`: vLLM's CPU tier (its size with a unit) and PCIe bandwidth."""
    node.expect_keys(*OFFLOAD_KEYS)
    return _make(node, OffloadSpec, {"kv_offloading_size": node.get_size("kv_offloading_size", gt=0, le=MAX_OFFLOAD_BYTES),
                                     "gb_per_s": node.get_float("gb_per_s", ge=MIN_OFFLOAD_GB_PER_S,
                                                                le=MAX_LINK_GB_PER_S)})


def _speculative(node: YamlMap) -> SpeculativeSpec:
    """`speculative: {method, num_speculative_tokens, acceptance}`: vLLM's --speculative-config and
    the per-position acceptance rates (a list; default: the method's published rate)."""
    node.expect_keys(*SPECULATIVE_KEYS)
    values = {"method": node.get_str("method"),
              "num_speculative_tokens": node.get_int("num_speculative_tokens", None, ge=1, le=32)}
    if "acceptance" in node:
        values["acceptance"] = tuple(as_float(x, ge=0, le=1) for x in node.get_list("acceptance"))
    return _make(node, SpeculativeSpec, values)


def _parallel(node: YamlMap) -> ParallelSpec:
    """`parallel: {dp, pp, enable_expert_parallel, all2all_backend, expert_imbalance, network_gbps}`:
    vLLM's DP and EP flags and the step-time options of `kvplan step` (kvplan/model/parallel_step.py)."""
    node.expect_keys(*PARALLEL_KEYS)
    values = {}
    for key in ("dp", "pp"):
        if key in node:
            values[key] = node.get_int(key)
    if "enable_expert_parallel" in node:
        values["enable_expert_parallel"] = node.get_bool("enable_expert_parallel")
    if "all2all_backend" in node:
        values["all2all_backend"] = node.get_str("all2all_backend")
    for key in ("expert_imbalance", "network_gbps"):
        if key in node:
            values[key] = node.get_float(key)
    return _make(node, ParallelSpec, values)


def _sglang(node: YamlMap) -> SglangSpec:
    """`sglang: {schedule_policy, ...}`: SGLang's scheduler flags (engine: sglang)."""
    node.expect_keys(*SGLANG_KEYS)
    values = {}
    if "schedule_policy" in node:
        values["schedule_policy"] = node.get_choice("schedule_policy", SCHEDULE_POLICIES)
    if "schedule_conservativeness" in node:
        values["schedule_conservativeness"] = node.get_float("schedule_conservativeness", gt=0, le=100)
    if "chunked_prefill_size" in node:
        values["chunked_prefill_size"] = node.get_int("chunked_prefill_size", ge=-1, le=2**31)
    for key, high in (("max_prefill_tokens", 2**31), ("max_running_requests", 2**20)):
        if key in node:
            values[key] = node.get_int(key, ge=1, le=high)
    if "disable_radix_cache" in node:
        values["disable_radix_cache"] = node.get_bool("disable_radix_cache")
    return _make(node, SglangSpec, values)


def _fleet(doc: YamlMap, base: Path) -> FleetSpec:
    """`replicas:` (groups whose keys mean what they mean at the top level), `router:`, `transfer:`."""
    items = doc.get_list("replicas")
    groups = []
    for i, item in enumerate(items):
        node = as_map(item)
        node.expect_keys(*GROUP_KEYS)
        values = dict(name=node.get_str("name", f"group{i}"), count=node.get_int("count", 1, ge=1, le=MAX_REPLICAS),
                      role=node.get_choice("role", ROLES, "both"))
        for key in ("model", "gpu"):
            if key in node:
                values[key] = node.get_str(key)
        if "tp" in node:
            values["tp"] = node.get_int("tp", ge=1, le=4096)
        if "kv_dtype" in node:
            values["kv_dtype"] = node.get_choice("kv_dtype", KV_DTYPE_CHOICES)
        if "pool" in node:
            values["pool"] = _pool(node.get_map("pool"))
        if "scheduler" in node:
            values["scheduler"] = _scheduler(node.get_map("scheduler"))
        if "allocators" in node:
            values["allocators"] = _allocators(node.get_list("allocators"))
        if "timing" in node:
            values["timing"] = _timing(node.get_map("timing"), base)
        groups.append(_make(node, GroupSpec, values))
    values = {"groups": tuple(groups), "router": _router(doc.node("router")) if "router" in doc else RouterSpec()}
    if "transfer" in doc:
        node = doc.get_map("transfer")
        node.expect_keys(*TRANSFER_KEYS)
        values["transfer"] = _make(node, Transfer, dict(gb_per_s=node.get_float("gb_per_s", ge=0, le=1e6),
                                                        latency_s=node.get_float("latency_s", 0.0, ge=0, le=60),
                                                        proxy_s=node.get_float("proxy_s", DEFAULT_PROXY_S, ge=0,
                                                                               le=60)))
    return _make(doc, FleetSpec, values)


def _router(node: YamlNode) -> RouterSpec:
    """`router: NAME`, or `{policy, sync_interval_s, gateway_s, ...}` with the policy's own keys
    (kvplan/workload/routing.py); a key of another policy is refused naming the one it belongs to."""
    from kvplan.workload.yaml_nodes import YamlScalar

    if isinstance(node, YamlScalar):
        if node.value not in ROUTER_NAMES:
            raise node.error(f"expected one of {', '.join(ROUTER_NAMES)}, got {node.value!r}")
        return RouterSpec(node.value)
    if not isinstance(node, YamlMap):
        raise node.error(f"expected a router name or a mapping, got {node.describe()}")
    node.expect_keys(*ROUTER_KEYS)
    policy = node.get_choice("policy", ROUTER_NAMES, "round_robin")
    values = dict(policy=policy)
    if "sync_interval_s" in node:
        values["sync_interval_s"] = node.get_float("sync_interval_s", gt=0, le=3600)
    if "gateway_s" in node:
        values["gateway_s"] = node.get_float("gateway_s", ge=0, le=60)
    for owner, keys in POLICY_KEYS.items():
        for key in keys:
            if key not in node:
                continue
            if owner != policy:
                raise node.node(key).error(f"applies to router policy {owner}, and this router is {policy}")
            if key in ("index", "prefix_score"):
                values[key] = node.get_choice(key, LLM_D_INDEXES if key == "index" else PREFIX_SCORES)
            elif key in ("max_prefix_tokens", "lru_capacity_blocks", "balance_abs_threshold"):
                values[key] = node.get_int(key, ge=0 if key == "balance_abs_threshold" else 1, le=2**31)
            else:
                values[key] = node.get_float(key, ge=0)
    return _make(node, RouterSpec, values)


__all__ = ["load_workload", "locate", "read_spec", "MAX_REQUESTS", "MAX_SLOTS", "WorkloadError"]
