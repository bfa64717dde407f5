"""`kvplan size` as one library call: resolve, read, lay out, weigh and fit a model."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvplan.errors import ConfigError, UsageError
from kvplan.model.build import build_layout
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.model.concurrency_note import concurrency_note
from kvplan.model.fit import SizeReport, size_model, sliding_batch
from kvplan.model.layout import KVLayout
from kvplan.model.mxfp4 import CHOICES as MXFP4_CHOICES, mxfp4_backend
from kvplan.model.resolve import load_spec
from kvplan.model.vllm_memory import (VLLM_RELEASE, EngineOptions, flashinfer_decides, long_max_len_reason,
                                      release_rules)
from kvplan.model.weights import engine_shape, estimate_weights
from kvplan.units import parse_count, parse_size


ENGINES = ("vllm", "none")


COMMON_CONTEXTS = (4096, 8192, 32768, 131072)  # the concurrency shown beside the requested length
TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class SizeRun:
    report: SizeReport
    layout: KVLayout
    notes: tuple[str, ...]
    concurrency_at: dict = field(default_factory=dict)  # tokens -> vLLM's concurrency, on a GPU
    would_fit: dict | None = None  # when it does not fit: the smallest TP, and GPU, that would
    parallel: dict | None = None  # --dp / --pp / --enable-expert-parallel: stages and DP ranks (parallel_size.py)

    def to_dict(self) -> dict:
        out = {**self.report.to_dict(), "notes": list(self.notes)}
        if self.parallel is not None:
            out["parallel"] = self.parallel
        if self.concurrency_at:
            out["concurrency_at"] = {str(k): v for k, v in self.concurrency_at.items()}
        if self.would_fit is not None:
            out["would_fit"] = self.would_fit
        return out


def memory_profiled(report: SizeReport) -> bool:
    """Whether the pool came from vLLM's start-up profile (a GPU, engine vllm, no --kv-memory)."""
    return report.memory_breakdown is not None


def size(
    model: str,
    *,
    tokens: int | str | None = None,
    kv_dtype: str = "auto",
    tp: int = 1,
    batch: int = 1,
    gpu: str | None = None,
    gpu_memory_utilization: float | None = None,
    kv_memory: str | int | None = None,
    block_size: int = 16,
    engine: str = "vllm",
    quantization: str | None = None,
    max_num_batched_tokens: int | str | None = None,
    max_num_seqs: int | None = None,
    enforce_eager: bool = False,
    vllm_version: str = VLLM_RELEASE,
    enable_prefix_caching: bool = True,
    flashinfer: bool = True,
    allow_long_max_model_len: bool = False,
    mxfp4_backend: str = "auto",
    explore: bool = True,
    dp: int = 1,
    pp: int = 1,
    enable_expert_parallel: bool = False,
) -> SizeRun:
    """Everything `kvplan size` prints, as data; bad options raise KvplanError naming the option.

    With a GPU and engine "vllm" the pool is what vLLM will log as "Available KV cache memory"
    (kvplan/model/vllm_memory.py) and `tokens` is vLLM's max_model_len; engine "none" keeps
    the bare bound: the GPU's memory x utilization less the weights. `dp`, `pp` and
    `enable_expert_parallel` are vLLM's data, pipeline and expert parallelism (kvplan/model/parallel.py):
    the report is then that of the pipeline stage that sets the pool, with a `parallel` section.
    """
    if isinstance(tokens, str):
        tokens = parse_count(tokens, field="--tokens")
    if isinstance(max_num_batched_tokens, str):
        max_num_batched_tokens = parse_count(max_num_batched_tokens, field="--max-num-batched-tokens", high=2**31)
    if engine not in ENGINES:
        raise UsageError(f"expected one of {', '.join(ENGINES + ('sglang',))}, got {engine!r}", field="--engine")
    for flag, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs)):
        if value is not None and not 1 <= value <= 2**31:
            raise UsageError(f"expected an integer from 1 to 2^31, got {value}", field=flag)
    release_rules(vllm_version)  # a bad release is refused before any work
    if mxfp4_backend not in MXFP4_CHOICES:
        raise UsageError(f"expected one of {', '.join(MXFP4_CHOICES)}, got {mxfp4_backend!r}", field="--mxfp4-backend")
    if kv_dtype not in KV_DTYPE_CHOICES:
        raise UsageError(f"expected one of {', '.join(KV_DTYPE_CHOICES)}, got {kv_dtype!r}", field="--kv-dtype")
    if gpu_memory_utilization is not None and gpu is None:
        raise UsageError("applies only with --gpu (the pool is then that share of its memory, less the weights)",
                         field="--gpu-memory-utilization")
    if gpu_memory_utilization is not None and kv_memory is not None:
        raise UsageError("give --gpu-memory-utilization or --kv-memory (the pool itself, as vLLM's "
                         "--kv-cache-memory-bytes), not both", field="--kv-memory")
    gpu_spec = None
    if gpu is not None:
        from kvplan.model.gpus import get_gpu

        gpu_spec = get_gpu(gpu)
    kv_bytes = parse_size(kv_memory, field="--kv-memory", require_unit=isinstance(kv_memory, str)) \
        if kv_memory is not None else None
    from kvplan.model.parallel import Parallelism, check as check_parallel, check_degrees

    check_degrees(dp, pp)
    par = Parallelism(tp, dp, pp, enable_expert_parallel)
    spec = load_spec(model)
    check_parallel(spec, par)
    layout = build_layout(spec, kv_dtype, tp)
    notes = [spec.dtype_note] if spec.dtype_note else []
    weights = estimate_weights(spec, quantization)
    if weights.scheme != "none":
        notes.append(f"weights as loaded: {weights.scheme}")
    if weights.mxfp4_experts is not None:
        notes.append(_mxfp4_note(gpu_spec, mxfp4_backend))
    elif mxfp4_backend != "auto":
        raise UsageError(f"applies to MXFP4 experts (gpt-oss); {model} has none", field="--mxfp4-backend")
    if tokens is None and spec.max_context is None:
        raise ConfigError("missing; the config states no context length (ALiBi models such as BLOOM "
                          "have none), so give --tokens", file=spec.source, field="max_position_embeddings")
    options = EngineOptions(
        gpu_memory_utilization=gpu_memory_utilization, max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, release=vllm_version,
        enable_prefix_caching=enable_prefix_caching, flashinfer=flashinfer)
    common = dict(block_size=block_size, weight_bytes=weights.bytes, weight_bytes_per_gpu=weights.bytes_per_gpu(tp, gpu_spec, mxfp4_backend),
                  params=weights.params, gpu=gpu_spec, gpu_memory_utilization=gpu_memory_utilization, engine=engine,
                  engine_options=options, engine_shape=engine_shape(spec))
    parallel = None
    if par.plain:
        report = size_model(layout, tokens=tokens if tokens is not None else spec.max_context, batch=batch,
                            kv_memory=kv_bytes, **common)
    else:
        from kvplan.model.parallel_size import parallel_fit, parallel_note

        report, layout, parallel = parallel_fit(
            spec, par, weights, gpu=gpu_spec, kv_dtype=kv_dtype,
            tokens=tokens if tokens is not None else spec.max_context, batch=batch, block_size=block_size,
            kv_memory=kv_bytes, engine=engine, options=options, gpu_memory_utilization=gpu_memory_utilization,
            mxfp4_backend=mxfp4_backend)
        notes.append(parallel_note(parallel))
    beyond = spec.max_context is not None and report.tokens > spec.max_context and not allow_long_max_model_len
    if spec.max_context is not None and report.tokens > spec.max_context:
        notes.append(f"{report.tokens:,} tokens is beyond the model's context of {spec.max_context:,}")
    if beyond and report.kv_pool_bytes is not None and engine == "vllm":
        report = replace(report, fits=False, reason=long_max_len_reason(report.tokens, spec.max_context))
    if report.kv_pool_bytes is not None:
        memory = report.memory_breakdown
        batched = sliding_batch(memory["max_num_batched_tokens"] if memory else max_num_batched_tokens, gpu_spec)
        note = concurrency_note(report, layout, batched,
                                batch_assumed=gpu_spec is None and not max_num_batched_tokens)
        if note:
            notes.append(note)
    if memory_profiled(report) and flashinfer_decides(vllm_version):
        notes.append(f"vLLM {vllm_version} samples with FlashInfer where it is installed, as in its Docker image "
                     "(taken here; --no-flashinfer for a pip install without it, whose profile sorts the logits)"
                     if flashinfer else
                     f"vLLM {vllm_version} without FlashInfer sorts the logits in its profile (--flashinfer: "
                     "installed, as in its Docker image)")
    run = SizeRun(report, layout, tuple(notes), parallel=parallel)
    if report.kv_pool_bytes is None or kv_bytes is not None or not explore or parallel is not None:
        return run
    fit_args = dict(tokens=report.tokens, kv_dtype=kv_dtype, batch=batch, gpu_memory_utilization=gpu_memory_utilization,
                    block_size=block_size, engine=engine, quantization=quantization,
                    max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                    enforce_eager=enforce_eager, vllm_version=vllm_version,
                    enable_prefix_caching=enable_prefix_caching, flashinfer=flashinfer,
                    allow_long_max_model_len=allow_long_max_model_len, mxfp4_backend=mxfp4_backend)
    at = {}
    for length in COMMON_CONTEXTS:
        if length != report.tokens and (spec.max_context is None or length <= spec.max_context):
            other = size_model(layout, tokens=length, batch=1, **common)
            at[length] = round(other.vllm_concurrency, 2) if other.reason is None else 0.0
    run = replace(run, concurrency_at=at)
    if not report.fits and not beyond:  # past the context no other GPU or TP degree would do
        would = _would_fit(model, gpu_spec.name, tp, fit_args)
        if engine == "vllm" and report.weight_bytes < gpu_spec.cuda_memory_bytes:
            would.update(_batch_fix(model, gpu_spec.name, tp, would.get("gpu"), fit_args))
        run = replace(run, would_fit=would)
    return run


def _mxfp4_note(gpu, choice: str) -> str:
    """Which kernels the MXFP4 experts are laid out for, and why (kvplan/model/mxfp4.py)."""
    backend = mxfp4_backend(gpu, choice)
    why = ("as --mxfp4-backend asks" if choice != "auto" else
           f"vLLM's pick on {gpu.name}" if gpu is not None else "vLLM's pick on a Hopper GPU; --gpu names yours")
    return (f"MXFP4 experts padded for vLLM's {backend.name} kernels ({why}): each rank's expert width to a "
            f"multiple of {backend.intermediate_align}")


def _batch_fix(model: str, gpu: str, tp: int, other_gpu: str | None, args: dict) -> dict:
    """vLLM's default batch on the GPU that would fit, where it differs from this GPU's (the
    reason a GPU of the same memory fits), and the smaller batch that fits on this GPU, checked
    by sizing with it (kvplan/model/batch_fit.py)."""
    from kvplan.model.batch_fit import batch_defaults, smaller_batch

    out: dict = {}
    defaults_used = args.get("max_num_batched_tokens") is None and args.get("max_num_seqs") is None
    if defaults_used and other_gpu is not None and batch_defaults(other_gpu) != batch_defaults(gpu):
        (t, s), (t0, s0) = batch_defaults(other_gpu), batch_defaults(gpu)
        out["batch_defaults"] = {other_gpu: {"max_num_batched_tokens": t, "max_num_seqs": s},
                                 gpu: {"max_num_batched_tokens": t0, "max_num_seqs": s0}}
    rest = {k: v for k, v in args.items() if k not in ("max_num_batched_tokens", "max_num_seqs")}

    def fits(tokens: int, seqs: int) -> bool:
        return size(model, gpu=gpu, tp=tp, max_num_batched_tokens=tokens, max_num_seqs=seqs, explore=False,
                    **rest).report.fits

    out["batch"] = smaller_batch(fits, gpu, args.get("max_num_batched_tokens"), args.get("max_num_seqs"))
    return out


def _would_fit(model: str, gpu: str, tp: int, args: dict) -> dict:
    """The smallest TP on this GPU, and the smallest-memory catalog GPU at this TP, that fit."""
    from kvplan.errors import KvplanError
    from kvplan.model.gpus import gpu_names, get_gpu

    found: dict = {"tp": None, "gpu": None}
    for degree in TP_CHOICES:
        if degree > tp:
            try:
                if size(model, gpu=gpu, tp=degree, explore=False, **args).report.fits:
                    found["tp"] = degree
                    break
            except KvplanError:  # heads that do not split over this many GPUs
                continue
    for name in sorted(gpu_names(), key=lambda n: get_gpu(n).memory_bytes):
        if name != gpu and get_gpu(name).memory_bytes > get_gpu(gpu).memory_bytes:
            try:
                fits = size(model, gpu=name, tp=tp, explore=False, **args).report.fits
            except KvplanError:
                continue
            if fits:
                found["gpu"] = name
                break
    return found


def parse_list(text: str, field: str, integers: bool = False) -> list:
    """A comma-separated list of GPUs or TP degrees (`--gpu H100-80GB,H200 --tp 1,2,4`)."""
    items = [t.strip() for t in str(text).split(",")]
    if not items or any(not t for t in items) or len(items) > 32:
        raise UsageError(f"expected one value or a comma-separated list of up to 32, got {str(text)[:60]!r}",
                         field=field)
    if integers:
        if not all(t.isascii() and t.isdigit() and 1 <= int(t) <= 65_536 for t in items):
            raise UsageError(f"expected whole numbers from 1 to 65,536, got {str(text)[:60]!r}", field=field)
        return [int(t) for t in items]
    return items


def size_grid(model: str, gpus: list, tps: list[int], options: dict) -> list[dict]:
    """One row per GPU and TP degree: the fit, or why there is none (a row, not an error)."""
    from kvplan.errors import KvplanError

    if gpus == [None] and options.get("kv_memory") is None:
        raise UsageError("a comparison of TP degrees needs a GPU (--gpu) or --kv-memory", field="--tp")
    rows = []
    for gpu in gpus:
        for tp in tps:
            row = {"gpu": gpu, "tp": tp}
            try:
                r = size(model, gpu=gpu, tp=tp, explore=False, **options).report
            except KvplanError as exc:
                if exc.field != "tp":  # only a TP degree that cannot split the heads is a row
                    raise
                rows.append({**row, "fits": False, "reason": str(exc)})
                continue
            rows.append({**row, "gpu": r.gpu or gpu, "fits": r.fits, "weight_bytes": r.weight_bytes,
                         "kv_pool_bytes": r.kv_pool_bytes, "vllm_concurrency": r.vllm_concurrency,
                         "max_concurrency": r.max_concurrency, "longest_context": r.longest_context,
                         "tokens": r.tokens, "reason": r.reason})
    return rows
