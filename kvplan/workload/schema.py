"""Read a workload file into a validated `Workload` (the full schema: workloads/SCHEMA.md).

```yaml
name: lesson                  # default: the file name without .yaml
seed: 0                       # default 0; one numpy default_rng(seed) per workload
experiment: capacity          # capacity | serve | prefix | sharing (default serve)
model: meta-llama/Meta-Llama-3-8B   # any `kvplan size` model argument (optional with pool.slots)
kv_dtype: auto                # auto|fp32|bf16|fp16|fp8|int8|int4
tp: 1
gpu: H100-80GB                # optional, needs model; enables the roofline time model
pool:                         # exactly one of slots | kv_memory | gpu_memory_utilization
  slots: 131072
  # kv_memory: 16GiB          #   needs model: slots = kv_memory // layout.bytes_per_token
  # gpu_memory_utilization: 0.92  # needs model+gpu: KV = util x GPU memory - weights
requests:                     # synthetic: count (<= 50M), prompt, output, arrival; or a trace
  count: 500
  prompt: {dist: uniform, low: 100, high: 2000}   # + optional min (>= 1) / max
  output: {dist: fixed, value: 0}                 # + optional min (>= 0) / max
  # dists: fixed {value} | uniform {low, high} inclusive | normal {mean, std}
  #   | lognormal {sigma, mean | median} | exponential {mean} | zipf {a > 1, scale, max}
  #   | histogram {edges, weights} | csv {path, column}
  arrival: {process: all_at_once}  # | poisson {rate} | gamma {rate, cv}
  # trace: {format: azure|mooncake|vidur|sharegpt|agentic|vllm-bench|vllm-bench-timed, path: ../traces/x.csv,
  #         limit: 1000, time_scale: 1.0, repeat: 1, too_long: error|clip, history: false}
  #   (arrival with a trace: sharegpt/vllm-bench request arrivals, agentic conversation starts)
allocators:                   # default: [{kind: paged, block_size: 16}]
  - {kind: contiguous, policy: max, max_len: 8192}   # max|pow2|oracle; max_len: max_model_len
  - {kind: paged, block_size: [16, 32]}              # a list gives one allocator each
scheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_model_len: 8192,
            chunked_prefill: false, preemption: recompute, swap_space: 4GiB}  # or swap_slots
timing: {bandwidth_efficiency: 0.8, flops_efficiency: 0.5, step_overhead_ms: 0.0}
prefix: {...}                 # experiment prefix: shared prompts (read by sim/sharing_runs.py)
sampling: {...}               # experiment sharing: parallel sampling / beam search groups
```

Model-dependent values come from a `resolve_model(model, kv_dtype, tp, gpu_name)` callback that
returns a dict with `layout` (KVLayout), `weight_bytes`, `gpu` (an object with memory_bytes,
hbm_bytes_per_s, peak_bf16_flops; None without a GPU) and `flops_per_token`, so that `sim` does
not depend on how models are resolved. Every unknown key, wrong type and impossible value is a
WorkloadError naming the key and its line.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from kvplan.errors import KvplanError, WorkloadError
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.model.vllm_memory import default_batch
from kvplan.workload.distributions import (
    AllAtOnce, Fixed, Lengths, Uniform, parse_arrival, parse_lengths, synthetic_requests,
)  # fmt: skip
from kvplan.workload.traces import TRACE_FORMATS, open_trace
from kvplan.workload.records import (
    AllocatorSpec, PoolSpec, SchedulerConfig, TimingConfig, Workload,
)  # fmt: skip
from kvplan.workload.yaml_nodes import YamlList, YamlMap, as_int, as_map, load_yaml

EXPERIMENTS = ("capacity", "serve", "prefix", "sharing", "fleet")
MAX_REQUESTS = 50_000_000
MIN_EFFICIENCY = 0.01  # no GPU serves at under 1% of its bandwidth or peak; below it times stop being numbers
MAX_SLOTS = 2**40
DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_BATCH = (8192, 256)  # (max_num_batched_tokens, max_num_seqs) without a GPU
DEFAULT_SWAP_SPACE = 4 * 2**30
TOP_KEYS = ("name", "seed", "experiment", "model", "kv_dtype", "tp", "gpu", "pool", "requests",
            "allocators", "scheduler", "timing", "prefix", "sampling", "replicas", "router", "transfer")  # fmt: skip

POOL_KEYS = ("slots", "kv_memory", "gpu_memory_utilization")
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "chunked_prefill", "preemption",
                  "swap_space", "swap_slots", "null_block", "prefix_caching",
                  "hybrid_kv_cache_manager")
REQUEST_KEYS = ("count", "prompt", "output", "arrival")
TRACE_KEYS = ("format", "path", "limit", "time_scale", "repeat", "too_long", "history")
TIMING_KEYS = ("model", "bandwidth_efficiency", "flops_efficiency", "step_overhead_ms", "profile")

ResolveModel = Callable[[str, str, int, "str | None"], dict]


def load_workload(path: str | Path, *, resolve_model: ResolveModel | None = None, seed: int | None = None) -> Workload:
    """Read and validate a workload file; requests are generated lazily by `make_requests()`.
    `seed`: instead of the file's `seed:` (a fresh sample of the same traffic)."""
    path = Path(path)
    doc = load_yaml(path)
    doc.expect_keys(*TOP_KEYS)
    name = doc.get_str("name", path.stem)
    seed = doc.get_int("seed", 0, ge=0) if seed is None else seed
    experiment = doc.get_choice("experiment", EXPERIMENTS, "serve")
    for key in ("replicas", "router", "transfer"):
        if key in doc and experiment != "fleet":
            raise doc.node(key).error(f"applies to experiment: fleet, and this is experiment: {experiment}")
    model = _model(doc, resolve_model)
    layout = model.get("layout")
    bytes_per_slot = layout.bytes_per_token if layout is not None else None
    pool = _pool(doc.get_map("pool"), model, bytes_per_slot)
    scheduler = _scheduler(doc.get_map("scheduler", None), doc, layout, bytes_per_slot, model.get("gpu"))
    mml = scheduler.max_model_len
    num_requests, make = _requests(doc.get_map("requests"), path, seed, mml)
    allocators = _allocators(doc, mml)
    contiguous = [a.max_len for a in allocators if a.max_len is not None]
    return Workload(
        name=name, path=str(path), seed=seed, experiment=experiment, num_requests=num_requests,
        pool=pool, allocators=allocators, scheduler=scheduler,
        timing=_timing(doc.get_map("timing", None), model, doc.get_str("gpu", None), path.parent),
        make_requests=make, layout=layout,
        contiguous_max_len=contiguous[0] if contiguous else mml, extras=_extras(doc),
    )


def _model(doc: YamlMap, resolve_model: ResolveModel | None) -> dict:
    kv_dtype = doc.get_choice("kv_dtype", KV_DTYPE_CHOICES, "auto")
    tp = doc.get_int("tp", 1, ge=1, le=4096)
    gpu = doc.get_str("gpu", None)
    if "model" not in doc:
        if gpu is not None:
            raise doc.node("gpu").error("a gpu needs a model (weights and FLOPs come from it)")
        return {}
    node = doc.node("model")
    model = doc.get_str("model")
    if resolve_model is None:
        raise node.error("this reader was given no model resolver (resolve_model=...); give "
                         "pool.slots without a model, or load the file through the kvplan CLI")
    try:
        resolved = dict(resolve_model(model, kv_dtype, tp, gpu))
    except KvplanError as e:  # point at the key it is about: gpu, kv_dtype, tp, else model
        key = (e.field or "model").replace("-", "_")
        where = doc.node(key) if key in ("gpu", "kv_dtype", "tp") and key in doc else node
        if e.file is None:
            e.field, e.line = None, None
        raise e.located(file=where.file, field=where.path, line=where.line)
    if resolved.get("layout") is None:
        raise node.error("the model resolver returned no layout")
    return resolved


def _pool(node: YamlMap, model: dict, bytes_per_slot: int | None) -> PoolSpec:
    node.expect_keys(*POOL_KEYS)
    key = node.exactly_one("slots", "kv_memory", "gpu_memory_utilization")
    where = node.node(key)
    if key == "slots":
        slots = node.get_int("slots", ge=1, le=MAX_SLOTS)
        kv = slots * bytes_per_slot if bytes_per_slot else None
        return PoolSpec(slots, bytes_per_slot, kv)
    if not bytes_per_slot:
        raise where.error(f"{key} needs a model with per-token KV (to turn bytes into slots)")
    if key == "kv_memory":
        kv = node.get_size("kv_memory", gt=0)
    else:
        util = node.get_float(key, gt=0, le=1)
        gpu = model.get("gpu")
        if gpu is None:
            raise where.error("gpu_memory_utilization needs a gpu")
        weights = int(model.get("weight_bytes") or 0)
        kv = int(util * gpu.memory_bytes) - weights
        if kv <= 0:
            raise where.error(f"the weights ({weights / 2**30:.1f} GiB) do not fit in {util:g} of "
                              f"the GPU's {gpu.memory_bytes / 2**30:.1f} GiB")  # fmt: skip
    slots = kv // bytes_per_slot
    if not 1 <= slots <= MAX_SLOTS:
        raise where.error(f"gives {slots} token slots; expected 1 to 2^40 ({MAX_SLOTS})")
    return PoolSpec(slots, bytes_per_slot, kv)


def _scheduler(node: YamlMap | None, doc: YamlMap, layout, bytes_per_slot, gpu=None) -> SchedulerConfig:
    """vLLM V1's scheduler, with its defaults: chunked prefill on, the batch limits `vllm serve`
    sets for the GPU (kvplan/model/vllm_memory.default_batch; 8,192 tokens and 256 sequences
    without one), and the null block kept out of the pool."""
    if node is None:
        node = YamlMap({}, {}, "scheduler", doc.line, doc.file, doc.error_cls)
    node.expect_keys(*SCHEDULER_KEYS)
    limit = layout.max_context if layout is not None else None
    mml = node.get_int("max_model_len", limit or DEFAULT_MAX_MODEL_LEN, ge=1, le=2**31)
    if limit is not None and mml > limit:
        raise node.node("max_model_len").error(f"{mml} is above the model's context of {limit}")
    chunked = node.get_bool("chunked_prefill", True)
    default_tokens, default_seqs = DEFAULT_BATCH
    if gpu is not None:
        default_tokens, default_seqs = default_batch(getattr(gpu, "name", ""), getattr(gpu, "cuda_memory_bytes", 0) or getattr(gpu, "memory_bytes", 0))
    seqs = node.get_int("max_num_seqs", default_seqs, ge=1, le=2**20)
    batched = node.get_int("max_num_batched_tokens", default_tokens if chunked else max(default_tokens, mml),
                           ge=1, le=2**31)  # fmt: skip
    if not chunked and batched < mml:
        raise node.node("max_num_batched_tokens").error(
            f"{batched} is below max_model_len {mml}: without chunked_prefill a long prompt "
            "could never be scheduled (vLLM refuses this too)")
    if batched < seqs:
        raise node.node("max_num_batched_tokens").error(f"{batched} is below max_num_seqs {seqs}")
    preemption = node.get_choice("preemption", ("recompute", "swap"), "recompute")
    return SchedulerConfig(seqs, batched, mml, chunked, preemption,
                           _swap_slots(node, preemption, bytes_per_slot),
                           node.get_bool("null_block", True),
                           node.get_bool("prefix_caching", True),
                           node.get_bool("hybrid_kv_cache_manager", True))  # fmt: skip


def _swap_slots(node: YamlMap, preemption: str, bytes_per_slot: int | None) -> int:
    if "swap_space" in node and "swap_slots" in node:
        node.exactly_one("swap_space", "swap_slots")
    if "swap_slots" in node:
        return node.get_int("swap_slots", ge=0, le=MAX_SLOTS)
    if "swap_space" not in node and preemption != "swap":
        return 0
    if not bytes_per_slot:
        where = node.node("swap_space") if "swap_space" in node else node.node("preemption")
        raise where.error("swap space in bytes needs a model; give swap_slots instead")
    return node.get_size("swap_space", DEFAULT_SWAP_SPACE, ge=0) // bytes_per_slot


def _check_count(where, count: int) -> int:
    if count > MAX_REQUESTS:
        raise where.error(f"{count:,} requests is above the limit of {MAX_REQUESTS:,}")
    return count


def _requests(node: YamlMap, path: Path, seed: int, mml: int):
    if "trace" in node:
        node.expect_keys("trace", "arrival")
        return _trace(node, path, seed, mml)
    node.expect_keys(*REQUEST_KEYS)
    count = _check_count(node.node("count"), node.get_int("count", ge=1))
    base = path.parent
    prompt = parse_lengths(node.get_map("prompt"), base, default_min=1)
    output = parse_lengths(node.get_map("output"), base, default_min=0)
    if prompt.min + output.min > mml:
        raise node.node("prompt").error(
            f"min prompt {prompt.min} + min output {output.min} exceeds max_model_len {mml}")
    _check_fits(node.node("prompt"), prompt, mml - output.min, "max_model_len - output min")
    _check_fits(node.node("output"), output, mml - prompt.min, "max_model_len - prompt min")
    arrival = parse_arrival(node.get_map("arrival")) if "arrival" in node else AllAtOnce()

    def make():
        return synthetic_requests(count, seed, prompt, output, arrival, max_model_len=mml)

    return count, make


def _check_fits(where, lengths: Lengths, top: int, what: str) -> None:
    """Bounded distributions must fit; unbounded ones are clipped (documented)."""
    d = lengths.dist
    high = d.value if isinstance(d, Fixed) else d.high if isinstance(d, Uniform) else None
    if high is not None and high > top:
        raise where.error(f"lengths up to {high} exceed {what} ({top}); lower them or raise "
                          "scheduler.max_model_len")  # fmt: skip


def _trace(node: YamlMap, path: Path, seed: int, mml: int):
    t = node.get_map("trace")
    fmt = t.get_choice("format", TRACE_FORMATS)
    t.expect_keys("format", "path", "limit", "time_scale", "repeat", "too_long",
                  *(("history",) if fmt == "sharegpt" else ()))  # fmt: skip
    arrival = parse_arrival(node.get_map("arrival")) if "arrival" in node else None
    if arrival is not None and fmt not in ("sharegpt", "agentic", "vllm-bench"):
        raise node.node("arrival").error(f"a {fmt} trace has its own timestamps; remove arrival")
    limit = t.get_int("limit", None, ge=1)
    if fmt in ("sharegpt", "vllm-bench") and "time_scale" in t:
        raise t.node("time_scale").error(f"a {fmt} trace has no timestamps to scale")
    repeat = t.get_int("repeat", 1, ge=1, le=MAX_REQUESTS)
    starts = None
    if arrival is not None and fmt == "agentic":  # one arrival per conversation (file)
        starts = lambda k: arrival.times(np.random.default_rng(seed), k, 0.0)[0]  # noqa: E731
    trace_path = t.get_input_path("path", path.parent, folder_ok=fmt == "agentic")
    trace = open_trace(
        fmt, trace_path, limit=limit,
        time_scale=t.get_float("time_scale", 1.0, gt=0), repeat=repeat, max_model_len=mml,
        too_long=t.get_choice("too_long", ("error", "clip"), "error"),
        history=t.get_bool("history", False), session_starts=starts,
    )  # fmt: skip
    count = _check_count(t, trace.num_requests)
    if trace.timed:
        return count, trace.chunks
    process = arrival or AllAtOnce()

    def chunks():
        rng, start = np.random.default_rng(seed), 0.0
        for chunk in trace.chunks():
            times, start = process.times(rng, len(chunk), start)
            yield replace(chunk, arrival=times)

    return count, chunks


def _allocators(doc: YamlMap, mml: int) -> tuple[AllocatorSpec, ...]:
    if "allocators" not in doc:
        return (AllocatorSpec("paged", block_size=16),)
    items = doc.get_list("allocators")
    if not len(items):
        raise items.error("expected at least one allocator")
    specs: list[AllocatorSpec] = []
    for item in items:
        m = as_map(item)
        kind = m.get_choice("kind", ("contiguous", "paged"))
        if kind == "contiguous":
            m.expect_keys("kind", "policy", "max_len")
            policy = m.get_choice("policy", ("max", "pow2", "oracle"), "max")
            specs.append(AllocatorSpec(kind, policy, max_len=m.get_int("max_len", mml, ge=1, le=MAX_SLOTS)))
            continue
        m.expect_keys("kind", "block_size", "hybrid")
        sizes = m.node("block_size")
        sizes = list(sizes) if isinstance(sizes, YamlList) else [sizes]
        if not sizes:
            raise m.node("block_size").error("expected at least one block size")
        hybrid = m.get_bool("hybrid", True) if "hybrid" in m else None  # vLLM's layer groups or not
        specs += [AllocatorSpec(kind, block_size=as_int(s, ge=1, le=2**20), hybrid=hybrid) for s in sizes]
    return tuple(specs)


def _timing(node: YamlMap | None, model: dict, gpu_name: str | None, base_dir: Path) -> TimingConfig:
    """The step-time model: "physical" (kvplan/model/step_time.py, its fitted constants, or a timing
    profile's from `kvplan calibrate`, unless the file overrides them) or "roofline" (overhead +
    max(memory, compute), efficiencies 0.8 and 0.5 unless given)."""
    values: dict = {}
    step = model.get("step_model")
    if node is not None:
        node.expect_keys(*TIMING_KEYS)
        kind = node.get_choice("model", ("physical", "roofline"), "physical")
        if "profile" in node:
            from kvplan.model.timing_profile import load_profile_settings

            if kind != "physical" or step is None:
                raise node.node("profile").error("a timing profile applies to model: physical, with a model "
                                                 "and a gpu")
            profile = node.get_input_path("profile", base_dir)
            try:
                constants, overlap = load_profile_settings(profile)
            except KvplanError as exc:
                raise node.node("profile").error(f"{profile}: {exc.field}: {exc.message}") from None
            step = replace(step.with_constants(constants), async_scheduling=overlap)
        given = {key: node.get_float(key, None, ge=MIN_EFFICIENCY, le=1) if key != "step_overhead_ms"
                 else node.get_float(key, None, ge=0, le=1e6)
                 for key in ("bandwidth_efficiency", "flops_efficiency", "step_overhead_ms") if key in node}
        values = {"model": kind,
                  "bandwidth_efficiency": given.get("bandwidth_efficiency", 0.8),
                  "flops_efficiency": given.get("flops_efficiency", 0.5),
                  "step_overhead_s": given.get("step_overhead_ms", 0.0) / 1000}
        if step is not None and kind == "physical" and given:
            c = step.constants
            step = step.with_constants(replace(
                c, bandwidth_efficiency=given.get("bandwidth_efficiency", c.bandwidth_efficiency),
                gemm_efficiency=given.get("flops_efficiency", c.gemm_efficiency),
                step_overhead_s=given["step_overhead_ms"] / 1000 if "step_overhead_ms" in given
                else c.step_overhead_s))
    values["step"] = step
    layout, gpu = model.get("layout"), model.get("gpu")
    if layout is not None:
        values.update(weight_bytes=int(model.get("weight_bytes") or 0),
                      flops_per_token=float(model.get("flops_per_token") or 0.0),
                      kv_bytes_per_token=layout.bytes_per_token)  # fmt: skip
    if gpu is not None:
        values.update(gpu_name=getattr(gpu, "name", gpu_name), hbm_bytes_per_s=gpu.hbm_bytes_per_s,
                      peak_flops=gpu.peak_bf16_flops)  # fmt: skip
    return TimingConfig(**values)


def _extras(doc: YamlMap) -> dict:
    """Reserved sections, stored raw; their nodes (with lines) for the feature that reads them."""
    extras: dict = {}
    for key in ("prefix", "sampling"):
        if key in doc:
            section = doc.get_map(key)
            extras[key] = section.to_python()
            extras.setdefault("yaml_nodes", {})[key] = section
    if "replicas" in doc:  # experiment: fleet (kvplan/fleet/run.py reads them)
        extras.setdefault("yaml_nodes", {})["replicas"] = doc.get_list("replicas")
    for key in ("router", "transfer"):
        if key in doc:
            extras.setdefault("yaml_nodes", {})[key] = doc.node(key)
    return extras


__all__ = ["load_workload", "MAX_REQUESTS", "MAX_SLOTS", "WorkloadError"]
