"""`kvplan size --engine sglang` as one library call: resolve, lay out, weigh, and size SGLang's pool."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import ConfigError, UsageError
from kvplan.model.dtypes import KV_DTYPE_CHOICES
from kvplan.model.sglang_memory import SGLANG_RELEASE, SGLangMemory, model_identity, startup_on

# kvplan size's options that only vLLM has, with the value that means "not given".
VLLM_ONLY = {"gpu_memory_utilization": ("--gpu-memory-utilization", None), "kv_memory": ("--kv-memory", None),
             "block_size": ("--block-size", 16), "max_num_batched_tokens": ("--max-num-batched-tokens", None),
             "max_num_seqs": ("--max-num-seqs", None), "enforce_eager": ("--enforce-eager", False),
             "enable_prefix_caching": ("--no-enable-prefix-caching", True), "flashinfer": ("--no-flashinfer", True),
             "allow_long_max_model_len": ("--allow-long-max-model-len", False),
             "mxfp4_backend": ("--mxfp4-backend", "auto")}
# ... and those only SGLang has.
SGLANG_ONLY = {"mem_fraction_static": ("--mem-fraction-static", None), "sglang_version": ("--sglang-version", None),
               "chunked_prefill_size": ("--chunked-prefill-size", None),
               "max_running_requests": ("--max-running-requests", None),
               "swa_full_tokens_ratio": ("--swa-full-tokens-ratio", None)}


def refuse_other_engine(engine: str, options: dict, vllm_version_given: bool = False) -> None:
    """One UsageError naming a flag of the other engine (vLLM's with --engine sglang, SGLang's without)."""
    if engine == "sglang":
        for key, (flag, unset) in VLLM_ONLY.items():
            if key in options and options[key] != unset:
                raise UsageError("is vLLM's; with --engine sglang give SGLang's flags (--mem-fraction-static, "
                                 "--chunked-prefill-size, --max-running-requests)", field=flag)
        if vllm_version_given:
            raise UsageError("is vLLM's; with --engine sglang give --sglang-version", field="--vllm-version")
        return
    for key, (flag, unset) in SGLANG_ONLY.items():
        if options.get(key, unset) != unset:
            raise UsageError("applies with --engine sglang only", field=flag)


@dataclass(frozen=True, slots=True)
class SGLangRun:
    """What `kvplan size --engine sglang` prints, as data."""

    model: str
    gpu: str
    tp: int
    kv_dtype: str
    weights_scheme: str
    params: int
    memory: SGLangMemory
    notes: tuple[str, ...]
    speculative: dict | None = None  # --speculative: the setting and its draft (sglang_memory rule 4)

    def to_dict(self) -> dict:
        m = self.memory
        extra = {"speculative": self.speculative} if self.speculative is not None else {}
        return {**extra, "model": self.model, "engine": "sglang", "gpu": self.gpu, "tp": self.tp, "kv_dtype": self.kv_dtype,
                "sglang_version": m.release, "weight_bytes": m.weights, "params": self.params,
                "weights_scheme": self.weights_scheme, "mem_fraction_static": m.mem_fraction_static,
                "mem_fraction_reason": m.mem_fraction_reason, "chunked_prefill_size": m.chunked_prefill_size,
                "cuda_graph_max_bs": m.cuda_graph_max_bs, "gpu_memory_bytes": m.gpu_memory,
                "pre_load_bytes": m.pre_load, "kv_pool_bytes": m.kv_pool, "bytes_per_token": m.cell_size,
                "max_total_num_tokens": m.max_total_num_tokens, "context_len": m.context_len,
                "max_running_requests": m.max_running_requests, "page_size": m.page_size, "fits": m.starts,
                "reason": m.reason, "notes": list(self.notes),
                **({"swa_full_tokens_ratio": m.swa_full_tokens_ratio, "full_layer_tokens": m.max_total_num_tokens,
                    "swa_layer_tokens": m.swa_tokens} if m.hybrid else {})}


def sglang_size(model: str, *, gpu: str, tp: int = 1, kv_dtype: str = "auto", quantization: str | None = None,
                context_length: int | None = None, mem_fraction_static: float | None = None,
                chunked_prefill_size: int | None = None, max_running_requests: int | None = None,
                sglang_version: str | None = None, speculative: str | None = None,
                num_speculative_tokens: int | None = None, swa_full_tokens_ratio: float | None = None) -> SGLangRun:
    """SGLang's start-up on `tp` GPUs of kind `gpu` (kvplan/model/sglang_memory.py), with
    `speculative` a server drafting `num_speculative_tokens` a step (EAGLE, EAGLE-3 or MTP as a
    chain: rule 4); bad options raise KvplanError naming the option."""
    from kvplan.model.build import build_layout
    from kvplan.model.gpus import get_gpu
    from kvplan.model.resolve import load_spec
    from kvplan.model.weights import estimate_weights

    if kv_dtype not in KV_DTYPE_CHOICES:
        raise UsageError(f"expected one of {', '.join(KV_DTYPE_CHOICES)}, got {kv_dtype!r}", field="--kv-dtype")
    if chunked_prefill_size is not None and chunked_prefill_size != -1 and not 1 <= chunked_prefill_size <= 2**31:
        raise UsageError(f"expected an integer from 1 to 2^31, or -1 (no chunking), got {chunked_prefill_size}",
                         field="--chunked-prefill-size")
    if max_running_requests is not None and not 1 <= max_running_requests <= 2**31:
        raise UsageError(f"expected an integer from 1 to 2^31, got {max_running_requests}",
                         field="--max-running-requests")
    gpu_spec = get_gpu(gpu)
    spec = load_spec(model)
    layout = build_layout(spec, kv_dtype, tp)
    weights = estimate_weights(spec, quantization)
    context = context_length or spec.max_context
    if context_length is not None and spec.max_context is not None and context_length > spec.max_context:
        # SGLang's ModelConfig refuses a --context-length above the config's unless
        # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
        raise UsageError(f"{context_length:,} is above the model's context of {spec.max_context:,}, which SGLang "
                         "refuses (unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)", field="--tokens")
    if context is None:
        raise ConfigError("missing; the config states no context length, so give --tokens (SGLang's "
                          "--context-length)", file=spec.source, field="max_position_embeddings")
    steps, draft, section = 0, None, None
    if speculative is not None:
        from kvplan.model.speculative import SGLANG_METHODS, draft_of, make_speculative, sglang_refusal
        from kvplan.model.step_time import step_model

        sp = make_speculative(speculative, num_speculative_tokens)
        if sp.method not in SGLANG_METHODS:
            raise UsageError(sglang_refusal("--engine sglang"), field="--speculative")
        draft = draft_of(spec, layout, weights, step_model(spec, layout, weights, gpu_spec, tp), sp)
        steps = sp.k
    elif num_speculative_tokens is not None:
        raise UsageError("needs --speculative METHOD (eagle, eagle3, mtp)", field="--num-speculative-tokens")
    memory = startup_on(gpu_spec, layout=layout, weights=weights.bytes_per_gpu(tp, gpu_spec), tp=tp, context_len=context,
                        release=sglang_version or SGLANG_RELEASE, mem_fraction_static=mem_fraction_static,
                        chunked_prefill_size=chunked_prefill_size, max_running_requests=max_running_requests,
                        speculative_steps=steps, swa_full_tokens_ratio=swa_full_tokens_ratio, **model_identity(spec),
                        draft_cell_size=draft.kv_bytes_per_token if draft is not None else 0)
    if draft is not None:
        section = {"method": sp.method, "num_speculative_tokens": sp.k, "speculative_eagle_topk": 1,
                   "speculative_num_draft_tokens": sp.k + 1, "draft_kv_bytes_per_token": draft.kv_bytes_per_token,
                   "draft_kv_pool_bytes": memory.draft_kv_pool, "draft_weight_bytes": draft.weight_bytes_per_gpu}
    notes = [spec.dtype_note] if spec.dtype_note else []
    if weights.scheme != "none":
        notes.append(f"weights as loaded: {weights.scheme}")
    return SGLangRun(model, gpu_spec.name, tp, layout.kv_dtype, weights.scheme, weights.params, memory, tuple(notes),
                     section)
