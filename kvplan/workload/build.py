"""Turn a `WorkloadSpec` into the `Workload` the experiments run: the model resolved, the pool
sized, vLLM's defaults filled in for the GPU, requests made lazily.

Model-dependent values come from a `resolve_model(model, kv_dtype, tp, gpu_name)` callback that
returns a `ModelFacts` (kvplan/model/facts.py: `layout`, `weight_bytes`, `gpu`, an object with
memory_bytes, hbm_bytes_per_s, peak_bf16_flops, or None, `flops_per_token` and the physical
`step_model`), so that workload/ does not depend on how models are resolved. An error names the field of the spec it is about (`scheduler.max_model_len`); the
reader the spec came from locates it (a line of the file, a flag).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from kvplan.errors import KvplanError, WorkloadError
from kvplan.model.facts import ModelFacts
from kvplan.model.step_time import engine_constants
from kvplan.model.vllm_memory import default_batch
from kvplan.workload.distributions import AllAtOnce, Fixed, Lengths, Uniform, synthetic_requests
from kvplan.workload.records import (OffloadConfig, ParallelRun, PoolSpec, SchedulerConfig, SglangConfig, SpeculativeRun, TimingConfig,
                                     Workload)
from kvplan.workload.checks import check_int
from kvplan.model.sglang_memory import SPECULATIVE_MAX_RUNNING, SGLangMemory
from kvplan.workload.spec import (DEFAULT_FRACTION, MAX_REQUESTS, MAX_SLOTS, PrefixSection, SglangSpec, TraceRequests,
                                  WorkloadSpec)
from kvplan.workload.traces import open_trace

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_BATCH = (8192, 256)  # (max_num_batched_tokens, max_num_seqs) without a GPU
DEFAULT_SWAP_SPACE = 4 * 2**30

ResolveModel = Callable[[str, str, int, "str | None"], ModelFacts]


def _fail(where: str, message: str) -> WorkloadError:
    return WorkloadError(message, field=where)


def build_workload(spec: WorkloadSpec, resolve_model: ResolveModel | None = None) -> Workload:
    """The workload `spec` declares, its model resolved by `resolve_model` (needed with a model)."""
    model = _model(spec, resolve_model)
    parallel = None
    if spec.parallel is not None:
        model, parallel = _parallel(spec, model)
    layout = model.layout if model is not None else None
    bytes_per_slot = layout.bytes_per_token if layout is not None else None
    scheduler = _scheduler(spec, layout, bytes_per_slot, model.gpu if model is not None else None)
    started = _sglang_startup(spec, model) if spec.pool.mem_fraction_static is not None else None
    if started is not None and spec.scheduler.max_model_len is None and started.serving_tokens <= scheduler.max_model_len:
        # SGLang starts with a pool smaller than the context and takes requests of up to
        # min(context_len, max_total_num_tokens) - 1 tokens (Scheduler.max_req_len)
        scheduler = replace(scheduler, max_model_len=started.serving_tokens - 1)
    pool = _pool(spec, model, bytes_per_slot, scheduler, started)
    speculative = None
    if spec.speculative is not None:
        speculative, pool = _speculative(spec, model, pool)
    mml = scheduler.max_model_len
    num_requests, make = _requests(spec, mml)
    allocators = tuple(replace(a, max_len=mml) if a.kind == "contiguous" and a.max_len is None else a
                       for a in spec.allocators)
    contiguous = [a.max_len for a in allocators if a.max_len is not None]
    timing = _timing(spec, model)
    if parallel is not None and timing.step is not None:
        parallel = replace(parallel, step=_parallel_step(spec, model, parallel.par, timing.step))
    return Workload(
        name=spec.name, path=spec.path, seed=spec.seed, experiment=spec.experiment,
        num_requests=num_requests, pool=pool, allocators=allocators, scheduler=scheduler,
        timing=timing, make_requests=make, layout=layout, parallel=parallel,
        contiguous_max_len=contiguous[0] if contiguous else mml, prefix=_prefix(spec, mml), sampling=spec.sampling,
        offload=_offload(spec, layout, bytes_per_slot), sglang=_sglang(spec, scheduler, started), spec=spec,
        speculative=speculative,
    )  # fmt: skip


SGLANG_CHUNKED_PREFILL_SIZE = 8192  # server_args.py: chunked_prefill_size on a GPU of 60-160 GB
# (H100, A100-80GB, H200: ServerArgs._handle_gpu_memory_settings); a flag gives another
SGLANG_MAX_PREFILL_TOKENS = 16384  # server_args.py: max_prefill_tokens: int = 16384


def _sglang(spec: WorkloadSpec, scheduler: SchedulerConfig, started: SGLangMemory | None = None) -> SglangConfig | None:
    """SGLang's scheduler settings of an `engine: sglang` run: its flags, else its defaults. With
    pool.mem_fraction_static (`started`: SGLang's start-up, which takes the flags given) its
    chunked_prefill_size and max_running_requests are SGLang's own for the GPU and pool; with a
    pool of slots or bytes, 8192 and the scheduler's max_num_seqs (48 with speculative decoding,
    as SGLang's _handle_speculative_decoding sets it)."""
    if spec.engine != "sglang":
        return None
    g = spec.sglang
    if g is None:
        g = SglangSpec()
    if started is not None:
        g = replace(g, chunked_prefill_size=started.chunked_prefill_size,
                    max_running_requests=started.max_running_requests)
    chunk = SGLANG_CHUNKED_PREFILL_SIZE if g.chunked_prefill_size is None else g.chunked_prefill_size
    return SglangConfig(
        schedule_policy=g.schedule_policy, schedule_conservativeness=g.schedule_conservativeness,
        chunked_prefill_size=0 if chunk == -1 else chunk,
        max_prefill_tokens=SGLANG_MAX_PREFILL_TOKENS if g.max_prefill_tokens is None else g.max_prefill_tokens,
        max_running_requests=g.max_running_requests if g.max_running_requests is not None
        else SPECULATIVE_MAX_RUNNING if spec.speculative is not None else scheduler.max_num_seqs,
        radix_cache=not g.disable_radix_cache)  # fmt: skip


def _speculative(spec: WorkloadSpec, model: ModelFacts | None, pool: PoolSpec):
    """The setting and its draft (kvplan/model/speculative.py). The draft's layers keep KV of their
    own and their own weights, so a pool vLLM sizes at start-up (gpu_memory_utilization) holds (KV
    bytes - the draft's weights) // (the target's + the draft's bytes per token); a pool given in
    bytes (kv_memory, vLLM's --kv-cache-memory-bytes) keeps its bytes, less nothing for the weights,
    and one given in slots stays as given. SGLang keeps the draft's KV in a pool of its own."""
    setting = spec.speculative.setting()
    draft = None
    if model is not None and model.step_model is not None and model.spec is not None and model.weights is not None:
        from kvplan.model.speculative import draft_of

        draft = draft_of(model.spec, model.layout, model.weights, model.step_model, setting,
                         field="speculative.method")
        # SGLang's pool is its start-up's (the draft's KV outside it: sglang_memory rule 4) or as given
        if spec.engine != "sglang" and spec.pool.key != "slots" and pool.bytes_per_slot and pool.kv_bytes is not None:
            kv = pool.kv_bytes - (draft.weight_bytes_per_gpu if spec.pool.key == "gpu_memory_utilization" else 0)
            slots = kv // (pool.bytes_per_slot + draft.kv_bytes_per_token)
            if not 1 <= slots <= MAX_SLOTS:
                raise _fail("speculative", f"leaves {slots} token slots beside the draft's weights and KV")
            pool = PoolSpec(slots, pool.bytes_per_slot, kv)
    return SpeculativeRun(setting, draft), pool


def _offload(spec: WorkloadSpec, layout, bytes_per_slot: int | None) -> OffloadConfig | None:
    """The CPU tier `offload:` asks for, sized in the model's KV bytes (a gpu, checked by the
    spec, needs a model, so bytes_per_slot is known)."""
    from kvplan.model.vllm_kv_groups import is_hybrid

    o = spec.offload
    if o is None:
        return None
    if not bytes_per_slot or layout is None:
        raise _fail("offload", "a CPU tier needs a model: its blocks are sized in the model's KV bytes")
    if is_hybrid(layout) and spec.scheduler.hybrid_kv_cache_manager and any(a.hybrid is not False for a in spec.allocators):
        raise _fail("offload", "a CPU tier needs prefix caching, which this model's hybrid layer groups run "
                               "without (set scheduler.hybrid_kv_cache_manager: false to serve every layer as full attention)")
    for a in spec.allocators:  # refused here, located at its line, rather than when the run starts
        block_bytes = bytes_per_slot * a.block_size * spec.tp
        if o.kv_offloading_size < block_bytes:
            raise _fail("offload.kv_offloading_size", f"{o.kv_offloading_size:,} bytes hold no CPU block of "
                                                      f"{a.block_size} tokens ({block_bytes:,} bytes across the TP group)")
    return OffloadConfig(o.kv_offloading_size, o.gb_per_s, bytes_per_slot, spec.tp)


def _parallel(spec: WorkloadSpec, model: ModelFacts) -> tuple[ModelFacts, ParallelRun]:
    """One DP rank of a `parallel:` run (kvplan/model/parallel.py's rules, as `kvplan size --dp`
    applies them): its GPU's weights (the routed experts split over T x D ranks, whole under EP),
    its start-up shape (the process groups DP adds) and its own step without the routed experts
    (kvplan/model/parallel_step.py: they are priced over the tokens of every rank, per global step,
    by kvplan/sim/data_parallel.py). A model without routed experts is refused: vLLM runs its DP
    ranks as independent engines (EngineCoreProc, data_parallel_size 1 each), which a fleet of
    replicas models."""
    from kvplan.model.parallel import Parallelism, check, communicators, stage_weight_bytes
    from kvplan.model.weights import moe_shape

    asked = spec.parallel
    if model.spec is None or model.weights is None:
        raise _fail("parallel", "needs the model's config (its routed experts and weights)")
    par = Parallelism(tp=spec.tp, dp=asked.dp, pp=1, expert_parallel=asked.enable_expert_parallel)
    try:
        check(model.spec, par)
    except KvplanError as exc:
        raise _fail("parallel.enable_expert_parallel" if "expert" in (exc.field or "") else "parallel",
                    exc.message) from None
    experts, _ = moe_shape(model.spec)
    if not experts:
        raise _fail("parallel.dp", f"{model.spec.name} has no routed experts: vLLM runs its DP ranks as "
                                   "independent engines (no lockstep); simulate them as a fleet of "
                                   f"{asked.dp} replicas behind vLLM's DP balancer (experiment: fleet, "
                                   "router: vllm_dp)")
    if model.gpu is not None and spec.timing.model != "physical":
        raise _fail("timing.model", "a parallel run is timed by the physical model (its MoE terms); remove "
                                    "timing.model: roofline")
    at_init, in_profile = communicators(model.spec, par)
    facts = replace(model, weight_bytes=stage_weight_bytes(model.spec, model.weights, par, 0, model.gpu),
                    shape_extra={"sampler": True, "groups_at_init": at_init, "groups_in_profile": in_profile})
    if model.gpu is not None:
        step = _parallel_step(spec, model, par, model.step_model)
        facts = replace(facts, step_model=step.stages[0][2])
    return facts, ParallelRun(par, asked)


def _parallel_step(spec: WorkloadSpec, model: ModelFacts, par, like):
    """kvplan/model/parallel_step.py's model of one DP rank, with the constants and the scheduling
    of the step model `like` (a timing profile's, once applied)."""
    from kvplan.model.parallel_step import ParallelStep

    asked = spec.parallel
    return ParallelStep(model.spec, model.weights, model.gpu, par, kv_dtype=spec.kv_dtype,
                        enforce_eager=like.enforce_eager, constants=like.constants,
                        async_scheduling=like.async_scheduling, all2all_backend=asked.all2all_backend,
                        expert_imbalance=asked.expert_imbalance,
                        network_bytes_per_s=asked.network_gbps * 1e9 / 8 if asked.network_gbps else None)


def _model(spec: WorkloadSpec, resolve_model: ResolveModel | None) -> ModelFacts | None:
    if spec.model is None:
        return None
    if resolve_model is None:
        raise _fail("model", "this reader was given no model resolver (resolve_model=...); give "
                             "pool.slots without a model, or load the file through the kvplan CLI")
    try:
        resolved = resolve_model(spec.model, spec.kv_dtype, spec.tp, spec.gpu)
    except KvplanError as e:  # point at the key it is about: gpu, kv_dtype, tp, else model
        if e.file is None:
            key = (e.field or "model").replace("-", "_")
            e.field = key if key in ("gpu", "kv_dtype", "tp") and getattr(spec, key, None) is not None else "model"
            e.line = None
        raise
    if getattr(resolved, "layout", None) is None:
        raise _fail("model", "the model resolver returned no layout")
    return resolved


def _pool(spec: WorkloadSpec, model: ModelFacts | None, bytes_per_slot: int | None,
          scheduler: SchedulerConfig, started: SGLangMemory | None = None) -> PoolSpec:
    asked = spec.pool
    key = asked.key
    where = f"pool.{key}"
    if key in ("slots", "mem_fraction_static"):
        slots = asked.slots if started is None else started.serving_tokens
        return PoolSpec(slots, bytes_per_slot, slots * bytes_per_slot if bytes_per_slot else None)
    if not bytes_per_slot:
        raise _fail(where, f"{key} needs a model with per-token KV (to turn bytes into slots)")
    if key == "kv_memory":
        kv = asked.kv_memory
    else:
        util = asked.gpu_memory_utilization
        gpu = model.gpu if model is not None else None
        if gpu is None:
            raise _fail(where, "gpu_memory_utilization needs a gpu")
        weights = int(model.weight_bytes or 0)
        kv = int(util * gpu.memory_bytes) - weights if asked.engine == "none" else _startup_pool(
            model, util, scheduler, where)
        if kv <= 0:
            raise _fail(where, f"the weights ({weights / 2**30:.1f} GiB) do not fit in {util:g} of "
                               f"the GPU's {gpu.memory_bytes / 2**30:.1f} GiB")  # fmt: skip
    slots = kv // bytes_per_slot
    if not 1 <= slots <= MAX_SLOTS:
        raise _fail(where, f"gives {slots} token slots; expected 1 to 2^40 ({MAX_SLOTS})")
    return PoolSpec(slots, bytes_per_slot, kv)


def _sglang_startup(spec: WorkloadSpec, model: ModelFacts | None) -> SGLangMemory:
    """What SGLang allocates at start-up for pool.mem_fraction_static (a fraction, or SGLang's default
    for the GPU and TP), with the `sglang:` flags that enter it (chunked_prefill_size,
    max_running_requests): `kvplan size --engine sglang`'s rule (kvplan/model/sglang_memory.py), the
    server launched without --context-length (the model's context); an error in SGLang's words where
    it would not start."""
    from kvplan.model.sglang_memory import model_identity, startup_on

    where = "pool.mem_fraction_static"
    gpu = model.gpu if model is not None else None
    if model is None or gpu is None:
        raise _fail(where, "needs a model and a gpu: SGLang sizes its pool from the GPU's memory and the weights")
    if model.spec is None:
        raise _fail(where, "the pool SGLang allocates at start-up needs the model's config; give pool.slots")
    asked = spec.pool.mem_fraction_static
    g = spec.sglang if spec.sglang is not None else SglangSpec()
    # sglang_memory rule 4: the drafts' headroom and reserve (the draft's own KV pool, which the run
    # does not read, is left unsized here; `kvplan size --engine sglang --speculative` reports it)
    steps = spec.speculative.setting().k if spec.speculative is not None else 0
    try:
        m = startup_on(gpu, layout=model.layout, weights=int(model.weight_bytes or 0), tp=spec.tp,
                       context_len=model.spec.max_context or DEFAULT_MAX_MODEL_LEN,
                       mem_fraction_static=None if asked == DEFAULT_FRACTION else asked,
                       chunked_prefill_size=g.chunked_prefill_size, max_running_requests=g.max_running_requests,
                       speculative_steps=steps, **model_identity(model.spec))
    except KvplanError as exc:  # a model SGLang's pool rule does not cover
        raise _fail("engine" if exc.field == "--engine" else where, exc.message) from None
    if not m.starts:
        raise _fail(where, f"SGLang would not start: {m.reason}")
    return m


def _startup_pool(model: ModelFacts, util: float, scheduler: SchedulerConfig, where: str) -> int:
    """The KV pool vLLM allocates at start-up at `util` with the scheduler's settings (`kvplan size`'s,
    kvplan/model/vllm_memory.py); an error in vLLM's words where it would not start."""
    report = model.startup(max_model_len=scheduler.max_model_len, gpu_memory_utilization=util,
                           max_num_batched_tokens=scheduler.max_num_batched_tokens,
                           max_num_seqs=scheduler.max_num_seqs, enable_prefix_caching=scheduler.prefix_caching)
    if report is None:
        raise _fail(where, "the pool vLLM allocates at start-up needs the model's config; give `engine: none` "
                           "for the bare bound (utilization x GPU memory - weights)")
    if report.reason is not None:
        raise _fail(where, f"vLLM would not start: {report.reason}")
    return int(report.kv_pool_bytes)


def _scheduler(spec: WorkloadSpec, layout, bytes_per_slot, gpu=None) -> SchedulerConfig:
    """vLLM V1's scheduler, with its defaults: chunked prefill on, the batch limits `vllm serve`
    sets for the GPU (kvplan/model/vllm_memory.default_batch; 8,192 tokens and 256 sequences
    without one), and the null block kept out of the pool."""
    s = spec.scheduler
    limit = layout.max_context if layout is not None else None
    mml = s.max_model_len if s.max_model_len is not None else (limit or DEFAULT_MAX_MODEL_LEN)
    if limit is not None and mml > limit and not s.allow_long_max_model_len:
        raise _fail("scheduler.max_model_len", f"{mml} is above the model's context of {limit}, which vLLM refuses "
                                               "unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (here "
                                               "scheduler.allow_long_max_model_len: true)")
    default_tokens, default_seqs = DEFAULT_BATCH
    if gpu is not None:
        default_tokens, default_seqs = default_batch(getattr(gpu, "name", ""), getattr(gpu, "cuda_memory_bytes", 0)
                                                     or getattr(gpu, "memory_bytes", 0))
    seqs = default_seqs if s.max_num_seqs is None else s.max_num_seqs
    batched = s.max_num_batched_tokens
    if batched is None:
        batched = default_tokens if s.chunked_prefill else max(default_tokens, mml)
    if not s.chunked_prefill and batched < mml:
        raise _fail("scheduler.max_num_batched_tokens",
                    f"{batched} is below max_model_len {mml}: without chunked_prefill a long prompt "
                    "could never be scheduled (vLLM refuses this too)")
    if batched < seqs:
        raise _fail("scheduler.max_num_batched_tokens", f"{batched} is below max_num_seqs {seqs}")
    return SchedulerConfig(seqs, batched, mml, s.chunked_prefill, s.preemption,
                           _swap_slots(spec, bytes_per_slot), s.null_block, s.prefix_caching,
                           s.hybrid_kv_cache_manager)  # fmt: skip


def _swap_slots(spec: WorkloadSpec, bytes_per_slot: int | None) -> int:
    s = spec.scheduler
    if s.swap_slots is not None:
        return s.swap_slots
    if s.swap_space is None and s.preemption != "swap":
        return 0
    if not bytes_per_slot:
        where = "scheduler.swap_space" if s.swap_space is not None else "scheduler.preemption"
        raise _fail(where, "swap space in bytes needs a model; give swap_slots instead")
    return (DEFAULT_SWAP_SPACE if s.swap_space is None else s.swap_space) // bytes_per_slot


def _requests(spec: WorkloadSpec, mml: int):
    r = spec.requests
    if isinstance(r, TraceRequests):
        return _trace(r, spec.seed, mml)
    prompt, output, seed = r.prompt, r.output, spec.seed
    if prompt.min + output.min > mml:
        raise _fail("requests.prompt", f"min prompt {prompt.min} + min output {output.min} exceeds "
                                       f"max_model_len {mml}")
    _check_fits("requests.prompt", prompt, mml - output.min, "max_model_len - output min")
    _check_fits("requests.output", output, mml - prompt.min, "max_model_len - prompt min")

    def make():
        return synthetic_requests(r.count, seed, prompt, output, r.arrival, max_model_len=mml)

    return r.count, make


def _check_fits(where: str, lengths: Lengths, top: int, what: str) -> None:
    """Bounded distributions must fit; unbounded ones are clipped (documented)."""
    d = lengths.dist
    high = d.value if isinstance(d, Fixed) else d.high if isinstance(d, Uniform) else None
    if high is not None and high > top:
        raise _fail(where, f"lengths up to {high} exceed {what} ({top}); lower them or raise "
                           "scheduler.max_model_len")  # fmt: skip


def _trace(t: TraceRequests, seed: int, mml: int):
    arrival = t.arrival
    starts = None
    if arrival is not None and t.format == "agentic":  # one arrival per conversation (file)
        starts = lambda k: arrival.times(np.random.default_rng(seed), k, 0.0)[0]  # noqa: E731
    trace = open_trace(
        t.format, t.path, limit=t.limit, time_scale=1.0 if t.time_scale is None else t.time_scale,
        repeat=t.repeat, max_model_len=mml, too_long=t.too_long, history=t.history, session_starts=starts,
        columns=t.columns,
    )  # fmt: skip
    if trace.num_requests > MAX_REQUESTS:
        raise _fail("requests.trace", f"{trace.num_requests:,} requests is above the limit of {MAX_REQUESTS:,}")
    if trace.timed:
        return trace.num_requests, trace.chunks
    process = arrival or AllAtOnce()

    def chunks():
        rng, start = np.random.default_rng(seed), 0.0
        for chunk in trace.chunks():
            times, start = process.times(rng, len(chunk), start)
            yield replace(chunk, arrival=times)

    return trace.num_requests, chunks


def _timing(spec: WorkloadSpec, model: ModelFacts | None) -> TimingConfig:
    """The step-time model: "physical" (kvplan/model/step_time.py, its fitted constants, or a timing
    profile's from `kvplan calibrate`, unless the spec overrides them) or "roofline" (overhead +
    max(memory, compute), efficiencies 0.8 and 0.5 unless given)."""
    t = spec.timing
    step = model.step_model if model is not None else None
    if t.profile is not None:
        from kvplan.model.timing_profile import load_profile_settings

        if step is None:
            raise _fail("timing.profile", "a timing profile applies to model: physical, with a model and a gpu")
        try:
            constants, overlap = load_profile_settings(t.profile)
        except KvplanError as exc:
            raise _fail("timing.profile", f"{t.profile}: {exc.field}: {exc.message}") from None
        step = replace(step.with_constants(constants), async_scheduling=overlap)
    given = t.given()
    values: dict = {"model": t.model, "bandwidth_efficiency": given.get("bandwidth_efficiency", 0.8),
                    "flops_efficiency": given.get("flops_efficiency", 0.5),
                    "step_overhead_s": given.get("step_overhead_ms", 0.0) / 1000}
    if step is not None and t.model == "physical" and given:
        c = step.constants
        step = step.with_constants(replace(
            c, bandwidth_efficiency=given.get("bandwidth_efficiency", c.bandwidth_efficiency),
            gemm_efficiency=given.get("flops_efficiency", c.gemm_efficiency),
            step_overhead_s=given["step_overhead_ms"] / 1000 if "step_overhead_ms" in given
            else c.step_overhead_s))
    if step is not None and spec.engine == "sglang":
        step = step.with_constants(engine_constants(step.constants, "sglang"))
        if spec.speculative is not None:  # SGLang's EAGLE worker runs without the overlap scheduler
            step = replace(step, async_scheduling=False)  # (kvplan/sim/sglang.py)
    values["step"] = step
    layout, gpu = (model.layout, model.gpu) if model is not None else (None, None)
    if layout is not None:
        values.update(weight_bytes=int(model.weight_bytes or 0),
                      flops_per_token=float(model.flops_per_token or 0.0),
                      kv_bytes_per_token=layout.bytes_per_token)  # fmt: skip
    if gpu is not None:
        values.update(gpu_name=getattr(gpu, "name", spec.gpu), hbm_bytes_per_s=gpu.hbm_bytes_per_s,
                      peak_flops=gpu.peak_bf16_flops)  # fmt: skip
    return TimingConfig(**values)


def _prefix(spec: WorkloadSpec, mml: int) -> PrefixSection | None:
    """The prefix section, a conversation's longest prompt at most (by default) max_model_len:
    vLLM could not serve a longer one, and the hash ids of every turn stay bounded."""
    section = spec.prefix
    if section is None or section.shared is None:
        return section
    longest = section.shared.max_prompt_len
    if longest is None:
        return replace(section, shared=replace(section.shared, max_prompt_len=mml))
    check_int(longest, "prefix.max_prompt_len", ge=1, le=mml)
    return section


__all__ = ["build_workload", "DEFAULT_MAX_MODEL_LEN", "ResolveModel"]
