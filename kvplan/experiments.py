"""Load a workload file with models resolved by kvplan.model, and run its experiment into a document.

The one entry point that `kvplan simulate` and `kvplan check` share: capacity, prefix and sharing
experiments go to kvplan/replay/, serve experiments to the engine in kvplan/sim/.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from kvplan.errors import KvplanError, UsageError
from kvplan.model.facts import model_facts
from kvplan.workload.records import Workload
from kvplan.workload.spec import AllocatorSpec
from kvplan.workload.spec import WorkloadSpec
from kvplan.workload.schema import load_workload


def load(path: str | Path, seed: int | None = None, engine: str | None = None) -> Workload:
    """A workload file, read and checked (`seed`, `engine`: instead of the file's own)."""
    return load_workload(path, resolve_model=model_facts, seed=seed, engine=engine)


def with_block_sizes(workload: Workload, block_sizes: Sequence[int] | None) -> Workload:
    """The workload with its paged allocators replaced by one per block size (contiguous kept)."""
    if not block_sizes:
        return workload
    kept = [s for s in workload.allocators if s.kind == "contiguous"]
    swept = [AllocatorSpec("paged", block_size=b) for b in block_sizes]
    return replace(workload, allocators=tuple(kept + swept))


def document(workload: Workload, *, block_sizes: Sequence[int] | None = None,
             cache_blocks: Sequence[int] | None = None, progress=None) -> dict:
    """What `kvplan simulate --json` prints for this workload, whatever its experiment.

    Errors raised while running (settings that can never serve a request) are located in the
    workload file. `progress(done, total)`, when given, is called now and then by the prefix,
    sharing and fleet experiments (work units: requests replayed, groups, requests routed).
    """
    workload = with_block_sizes(workload, block_sizes)
    try:
        if workload.experiment == "capacity":
            from kvplan.replay.capacity import capacity_document

            return capacity_document(workload)
        if workload.experiment == "prefix":
            from kvplan.replay.documents import prefix_document

            return prefix_document(workload, cache_blocks, progress=progress)
        if workload.experiment == "sharing":
            from kvplan.replay.documents import sharing_document

            return sharing_document(workload, progress=progress)
        if workload.experiment == "fleet":
            from kvplan.fleet.run import fleet_document

            return fleet_document(workload, progress=progress)
        from kvplan.sim.engine import serve_document

        return serve_document(workload)
    except KvplanError as exc:
        if workload.spec is not None and workload.spec.path:  # at the line of the field, where it has one
            from kvplan.workload.schema import locate

            raise locate(exc, workload.spec) from None
        raise exc.located(file=workload.path) from None


def flag_workload(model: str, gpu: str, tp: int, rate: float | None, prompt: str, output: str,
                  count: int, kv_dtype: str = "auto", max_num_seqs: int | None = None, *,
                  block_size: int = 16, prefix_caching: bool | None = None,
                  max_model_len: int | None = None, timing_profile: str | None = None, seed: int = 0,
                  max_num_batched_tokens: int | None = None, engine: str = "vllm") -> WorkloadSpec:
    """The workload of a flag-only run: fixed lengths, Poisson or all-at-once arrivals, one paged
    allocator (B = `block_size`), the KV pool vLLM would allocate at start-up (kvplan size's
    prediction at its defaults), vLLM's scheduler defaults (prefix caching on unless
    `prefix_caching` is False). `max_model_len` (default prompt + output) is the longest request
    the start-up check must fit. `engine` "sglang": served by SGLang as it starts instead
    (`sglang_spec`, no vLLM start-up check): `max_num_seqs` and `max_num_batched_tokens` are then
    its max_running_requests and chunked_prefill_size, `prefix_caching` its radix cache, and
    `block_size` unused (its pages hold one token)."""
    import math

    from kvplan.model.size import size
    from kvplan.units import parse_count
    from kvplan.workload.distributions import AllAtOnce, Fixed, Lengths, Poisson
    from kvplan.workload.spec import PoolRequest, SchedulerSpec, SyntheticRequests, TimingSpec

    p = parse_count(prompt, field="--prompt", high=2**31)
    o = parse_count(output, field="--output", high=2**31)
    if not 1 <= count <= 50_000_000:
        raise UsageError(f"expected 1 to 50,000,000 requests, got {count}", field="--count")
    if rate is not None and not (math.isfinite(rate) and 1e-6 <= rate <= 1e9):
        raise UsageError(f"expected a rate from 1e-6 to 1e9 requests/s, got {rate}", field="--rate")
    if not 1 <= tp <= 65_536:
        raise UsageError(f"expected a tensor-parallel degree from 1 to 65,536, got {tp}", field="--tp")
    if not gpu.strip():
        raise UsageError("expected a GPU of the catalog (kvplan gpus), got an empty name", field="--gpu")
    longest = p + o if max_model_len is None else max_model_len
    if engine == "sglang":
        return sglang_spec(flag_spec(lambda: WorkloadSpec(
            name="flags", experiment="serve", seed=int(seed), model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype,
            pool=PoolRequest(slots=1), requests=SyntheticRequests(count, Lengths(Fixed(p), 1), Lengths(Fixed(o), 0),
                                                                  Poisson(float(rate)) if rate is not None else AllAtOnce()),
            scheduler=SchedulerSpec(max_model_len=longest),
            timing=TimingSpec(profile=Path(timing_profile)) if timing_profile else TimingSpec(), path=FLAGS_PATH)),
            max_running_requests=max_num_seqs or None, chunked_prefill_size=max_num_batched_tokens or None,
            radix_cache=prefix_caching is not False)
    run = flag_spec(lambda: size(  # vLLM's start-up pool at the run's own scheduler settings
        model, gpu=gpu, tp=tp, tokens=longest, kv_dtype=kv_dtype, max_num_seqs=max_num_seqs or None,
        max_num_batched_tokens=max_num_batched_tokens or None, enable_prefix_caching=prefix_caching is not False,
        explore=False))
    report, context = run.report, run.layout.max_context
    if not report.fits:
        beyond = context is not None and longest > context  # the lengths asked for, not the model
        raise UsageError(f"vLLM would not serve it: {report.reason or 'one request does not fit'}",
                         field="--prompt" if beyond else "--model")
    return flag_spec(lambda: WorkloadSpec(
        name="flags", experiment="serve", seed=int(seed), model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype,
        pool=PoolRequest(kv_memory=report.kv_pool_bytes),  # vLLM's Available KV cache memory (kvplan size)
        requests=SyntheticRequests(count, Lengths(Fixed(p), 1), Lengths(Fixed(o), 0),
                                   Poisson(float(rate)) if rate is not None else AllAtOnce()),
        allocators=(AllocatorSpec("paged", block_size=block_size),),
        scheduler=SchedulerSpec(max_model_len=longest, max_num_seqs=max_num_seqs or None,
                                max_num_batched_tokens=max_num_batched_tokens or None,
                                prefix_caching=prefix_caching is not False),
        timing=TimingSpec(profile=Path(timing_profile)) if timing_profile else TimingSpec(), path=FLAGS_PATH))


def sglang_spec(spec: WorkloadSpec, *, max_running_requests: int | None = None,
                chunked_prefill_size: int | None = None, radix_cache: bool = True) -> WorkloadSpec:
    """A flag-made serve spec served by SGLang as it starts: the pool SGLang allocates at its default
    mem_fraction_static for the GPU and TP, its max_running_requests and chunked_prefill_size for
    them unless given (build.py's pool rule, `kvplan size --engine sglang`'s), one pool of token
    pages, the radix cache on unless `radix_cache` is False."""
    from kvplan.workload.spec import DEFAULT_FRACTION, PoolRequest, SglangSpec

    flags = SglangSpec(max_running_requests=max_running_requests, chunked_prefill_size=chunked_prefill_size,
                       disable_radix_cache=not radix_cache)
    return flag_spec(lambda: replace(
        spec, engine="sglang", sglang=flags, allocators=(AllocatorSpec("paged", block_size=16),),
        scheduler=replace(spec.scheduler, max_num_seqs=None, max_num_batched_tokens=None),
        pool=PoolRequest(mem_fraction_static=DEFAULT_FRACTION)))


FLAGS_PATH = "(the flags)"  # what a flag-made workload names as its file
FLAG_OF = {"max_model_len": "--prompt", "kv_memory": "--model", "mem_fraction_static": "--model",
           "profile": "--timing-profile"}


def _flag(field: str | None) -> str:
    """The flag a field of a flag-made spec came from (a flag already named stays)."""
    if field and field.startswith("--"):
        return field
    key = (field or "model").split(".")[-1]
    return FLAG_OF.get(key, "--" + key.replace("_", "-"))


def flag_spec(make):
    """`make()` (a spec from flags, or what one is made from), whose refusal names the flag, not a field."""
    try:
        return make()
    except KvplanError as exc:
        if exc.file is not None:
            raise
        raise UsageError(exc.message, field=_flag(exc.field)) from None


def build_flags(spec: WorkloadSpec) -> Workload:
    """The workload of a spec made from flags; an error names the flag it came from."""
    from kvplan.workload.build import build_workload

    return flag_spec(lambda: build_workload(spec, model_facts))
