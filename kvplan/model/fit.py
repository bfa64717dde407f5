"""How many tokens and concurrent requests fit on a GPU: `kvplan size` as a library function.

Definitions (printed by the CLI as well):
- kv_pool_bytes: --kv-memory per GPU; with engine "vllm" the "Available KV cache memory" vLLM will
  log (kvplan/model/vllm_memory.py); with engine "none" gpu memory x utilization minus this GPU's
  share of the weights.
- num_blocks: kv_pool_bytes // (block_size x bytes_per_token); one of them is vLLM's null block,
  so usable_blocks = num_blocks - 1 and max_tokens = usable_blocks x block_size.
- max_concurrency: whole requests of `tokens` tokens that fit at once in the usable blocks (each
  per-token layer group rounds its tokens up to whole blocks; sliding layers keep at most their
  window, recurrent state is added per request).
- vllm_concurrency and vllm_kv_cache_tokens: vLLM's startup log lines, computed as vLLM does:
  num_blocks / ceil(tokens / block_size) (all blocks, null included) and int(concurrency x tokens);
  for hybrid layouts (sliding windows, recurrent state) by vLLM's KV cache groups
  (kvplan/model/vllm_kv_groups.py), with vllm_block_size the attention block size vLLM sets and
  vllm_num_blocks the blocks of its layer groups (what the serve engine runs on; num_blocks and
  usable_blocks stay in blocks of every layer, the plain arithmetic).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kvplan.errors import UsageError
from kvplan.model.gpus import GPU
from kvplan.model.layout import KVLayout
from kvplan.model.vllm_kv_groups import KVGroups, is_hybrid, kv_groups, longest_fitting
from kvplan.model.vllm_memory import (SERVE_BATCH_LARGE, EngineOptions, StartupMemory, default_batch, max_len_reason,
                                      no_kv_reason, startup_memory, warmup_reason, weights_reason)

MAX_TOKENS = 2**31  # the longest request searched for when a model states no context
BARE_UTILIZATION = 0.92  # engine "none": the share of the device's memory kvplan has always used


@dataclass(frozen=True, slots=True)
class SizeReport:
    model: str
    kv_dtype: str
    tp: int
    tokens: int
    batch: int
    block_size: int
    bytes_per_token: int
    kv_bytes: int
    batch_kv_bytes: int
    state_bytes: int
    weight_bytes: int
    params: int
    gpu: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    kv_pool_bytes: int | None = None
    token_slots: int | None = None
    num_blocks: int | None = None
    usable_blocks: int | None = None
    max_tokens: int | None = None
    max_concurrency: int | None = None
    vllm_concurrency: float | None = None
    vllm_kv_cache_tokens: int | None = None
    fits: bool | None = None
    longest_context: int | None = None
    engine: str | None = None  # "vllm": the pool and verdict vLLM would find; "none": the bare bound
    reason: str | None = None  # why vLLM would not start, in its words
    memory_breakdown: dict | None = None  # vLLM's start-up memory on one GPU (engine "vllm")
    vllm_block_size: int | None = None  # hybrid layouts: the attention block size vLLM sets
    vllm_num_blocks: int | None = None  # hybrid layouts: vLLM's blocks of its layer groups (its
    # num_gpu_blocks; one is the null block): the pool the serve engine runs on

    def to_dict(self) -> dict:
        return asdict(self)


def size_model(
    layout: KVLayout,
    *,
    tokens: int,
    batch: int = 1,
    block_size: int = 16,
    weight_bytes: int = 0,
    params: int = 0,
    gpu: GPU | None = None,
    gpu_memory_utilization: float | None = None,
    kv_memory: int | None = None,
    weight_bytes_per_gpu: int | None = None,
    engine: str = "none",
    engine_options: EngineOptions | None = None,
    engine_shape: dict | None = None,
) -> SizeReport:
    """The fit of a model on a GPU (or a stated KV memory); see the module docstring.

    engine "none": the pool is the GPU's memory (as the device reports it) x utilization (0.92
    by default) less the weights. engine "vllm" (with `engine_options` and `engine_shape`): the
    pool vLLM itself will find, from kvplan/model/vllm_memory.py, with its verdict.
    """
    engine_options = engine_options or EngineOptions()
    if gpu_memory_utilization is None:
        gpu_memory_utilization = engine_options.utilization if engine == "vllm" else BARE_UTILIZATION
    elif engine_options.gpu_memory_utilization != gpu_memory_utilization:
        engine_options = replace(engine_options, gpu_memory_utilization=gpu_memory_utilization)
    for name, value in (("tokens", tokens), ("batch", batch), ("block-size", block_size)):
        if not 1 <= value <= 2**40:
            raise UsageError(f"expected an integer from 1 to 2^40, got {value}", field=name)
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(f"expected a fraction in (0, 1], got {gpu_memory_utilization}", field="gpu-memory-utilization")
    per_gpu_weights = weight_bytes_per_gpu if weight_bytes_per_gpu is not None else -(-weight_bytes // layout.tp)
    base = dict(
        model=layout.model, kv_dtype=layout.kv_dtype, tp=layout.tp, tokens=tokens, batch=batch,
        block_size=block_size, bytes_per_token=layout.bytes_per_token, kv_bytes=layout.kv_bytes(tokens),
        batch_kv_bytes=batch * layout.kv_bytes(tokens), state_bytes=layout.state_bytes,
        weight_bytes=per_gpu_weights, params=params,
    )
    if kv_memory is None and gpu is None:
        return SizeReport(**base)
    memory, reason = None, None
    groups = kv_groups(layout, block_size, engine_options.state_pages) if is_hybrid(layout) else None
    if kv_memory is not None:
        pool = kv_memory
        if gpu is not None and engine == "vllm":  # vLLM's --kv-cache-memory-bytes on this GPU
            reason = _given_pool_verdict(per_gpu_weights, kv_memory, gpu.cuda_memory_bytes)
    elif engine == "vllm":
        memory = startup_memory(total=gpu.cuda_memory_bytes, gpu_name=gpu.name, weights=per_gpu_weights,
                                tp=layout.tp, options=engine_options, **engine_shape)
        pool = max(memory.kv, 0)
        reason = _verdict(layout, groups, memory, tokens, block_size)
    else:  # weights larger than the GPU's share leave no pool at all (never a negative one)
        pool = max(int(gpu.memory_bytes * gpu_memory_utilization) - per_gpu_weights, 0)
    fit = pool_fit(layout, pool, tokens, block_size)
    batched = sliding_batch(memory.max_num_batched_tokens if memory else engine_options.max_num_batched_tokens, gpu)
    if groups is not None:
        fit["vllm_concurrency"] = groups.concurrency(pool, tokens, batched)
        fit["vllm_kv_cache_tokens"] = groups.kv_cache_tokens(pool, tokens, batched,
                                                             engine_options.rules.group_aware_tokens)
    return SizeReport(
        **base,
        gpu=gpu.name if gpu else None,
        gpu_memory_bytes=(memory.total if memory else gpu.memory_bytes) if gpu else None,
        gpu_memory_utilization=gpu_memory_utilization if gpu and kv_memory is None else None,
        kv_pool_bytes=pool,
        fits=fit["max_concurrency"] >= batch and reason is None,
        engine=engine if gpu and kv_memory is None else None,
        reason=reason,
        memory_breakdown=memory.breakdown() if memory else None,
        vllm_block_size=groups.attention_block_size if groups is not None else None,
        vllm_num_blocks=groups.num_blocks(pool) if groups is not None else None,
        **fit,
    )


def sliding_batch(max_num_batched_tokens: int | None, gpu: GPU | None) -> int:
    """The batch a sliding-window group's blocks per request follow: the one vLLM runs with (asked
    for, or its default for the GPU), or without either the H100 default."""
    if max_num_batched_tokens:
        return max_num_batched_tokens
    return default_batch(gpu.name, gpu.cuda_memory_bytes)[0] if gpu else SERVE_BATCH_LARGE[0]


def _verdict(layout: KVLayout, groups: KVGroups | None, memory: StartupMemory, max_model_len: int,
             block_size: int) -> str | None:
    """vLLM's start-up failure for this memory, in vLLM's words, or None when it starts."""
    if memory.weights > memory.total:
        return weights_reason(memory.weights, memory.total)
    if memory.kv <= 0:
        return no_kv_reason()
    if groups is not None:
        batched = memory.max_num_batched_tokens
        needed = groups.request_bytes(max_model_len, batched)
        if needed > memory.kv:
            longest = groups.longest_context(memory.kv, batched, layout.max_context or MAX_TOKENS)
            return max_len_reason(max_model_len, needed, memory.kv, longest)
    else:
        needed = layout.seq_bytes_in_blocks(max_model_len, block_size)
        if needed > memory.kv:
            return max_len_reason(max_model_len, needed, memory.kv, longest_context(layout, memory.kv, block_size))
    if memory.warmup > memory.free_after_sizing:  # the pool is allocated, then the warm-up runs short
        return warmup_reason(min(memory.max_num_seqs, memory.max_num_batched_tokens))
    return None


def pool_fit(layout: KVLayout, pool: int, tokens: int, block_size: int) -> dict:
    """Blocks, tokens and concurrency of a pool of `pool` bytes (see the module docstring)."""
    page = block_size * layout.bytes_per_token
    per_request = layout.seq_bytes_in_blocks(tokens, block_size)
    if page:
        num_blocks = pool // page
        usable_blocks = max(num_blocks - 1, 0)
        usable_bytes = usable_blocks * page
        token_slots = pool // layout.bytes_per_token
    else:  # only recurrent state: no blocks, just whole states
        num_blocks = usable_blocks = token_slots = 0
        usable_bytes = pool
    vllm = (num_blocks * page if page else pool) / per_request if per_request else 0.0
    return dict(
        token_slots=token_slots,
        num_blocks=num_blocks,
        usable_blocks=usable_blocks,
        max_tokens=usable_blocks * block_size,
        max_concurrency=usable_bytes // per_request if per_request else 0,
        vllm_concurrency=vllm,
        vllm_kv_cache_tokens=int(vllm * tokens),
        longest_context=longest_context(layout, usable_bytes, block_size),
    )


def _given_pool_verdict(weights: int, pool: int, total: int) -> str | None:
    """A pool given in bytes on a GPU: the weights must load, and the pool must fit beside them."""
    if weights > total:
        return weights_reason(weights, total)
    if weights + pool > total:
        return (f"CUDA out of memory allocating the KV cache: the weights ({weights / 2**30:.2f} GiB) and the "
                f"pool asked for ({pool / 2**30:.2f} GiB) pass the GPU's {total / 2**30:.2f} GiB.")
    return None


def longest_context(layout: KVLayout, usable_bytes: int, block_size: int) -> int:
    """The longest single request, up to the model's context, that fits in `usable_bytes` (0 if none)."""
    return longest_fitting(lambda n: layout.seq_bytes_in_blocks(n, block_size), usable_bytes,
                           layout.max_context or MAX_TOKENS)
