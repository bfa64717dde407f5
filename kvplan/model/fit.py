"""How many tokens and concurrent requests fit on a GPU: `kvplan size` as a library function.

Definitions (printed by the CLI as well):
- kv_pool_bytes: --kv-memory per GPU, or gpu memory x utilization minus this GPU's share of the weights.
  (vLLM also subtracts its profiled activation peak; kvplan cannot run the model, so it does not.)
- num_blocks: kv_pool_bytes // (block_size x bytes_per_token); one of them is vLLM's null block,
  so usable_blocks = num_blocks - 1 and max_tokens = usable_blocks x block_size.
- max_concurrency: whole requests of `tokens` tokens that fit at once in the usable blocks (each
  per-token layer group rounds its tokens up to whole blocks; sliding layers keep at most their
  window, recurrent state is added per request).
- vllm_concurrency and vllm_kv_cache_tokens: vLLM's startup log line, computed as vLLM does:
  num_blocks / ceil(tokens / block_size) (all blocks, null included) and int(concurrency x tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvplan.errors import UsageError
from kvplan.model.gpus import GPU
from kvplan.model.layout import KVLayout


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
    gpu_memory_utilization: float = 0.92,
    kv_memory: int | None = None,
) -> SizeReport:
    for name, value in (("tokens", tokens), ("batch", batch), ("block-size", block_size)):
        if not 1 <= value <= 2**40:
            raise UsageError(f"expected an integer from 1 to 2^40, got {value}", field=name)
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError(f"expected a fraction in (0, 1], got {gpu_memory_utilization}", field="gpu-memory-utilization")
    per_gpu_weights = -(-weight_bytes // layout.tp)
    base = dict(
        model=layout.model, kv_dtype=layout.kv_dtype, tp=layout.tp, tokens=tokens, batch=batch,
        block_size=block_size, bytes_per_token=layout.bytes_per_token, kv_bytes=layout.kv_bytes(tokens),
        batch_kv_bytes=batch * layout.kv_bytes(tokens), state_bytes=layout.state_bytes,
        weight_bytes=per_gpu_weights, params=params,
    )
    if kv_memory is None and gpu is None:
        return SizeReport(**base)
    if kv_memory is not None:
        pool = kv_memory
    else:  # weights larger than the GPU's share leave no pool at all (never a negative one)
        pool = max(int(gpu.memory_bytes * gpu_memory_utilization) - per_gpu_weights, 0)
    fit = pool_fit(layout, pool, tokens, block_size)
    return SizeReport(
        **base,
        gpu=gpu.name if gpu else None,
        gpu_memory_bytes=gpu.memory_bytes if gpu else None,
        gpu_memory_utilization=gpu_memory_utilization if gpu and kv_memory is None else None,
        kv_pool_bytes=pool,
        fits=fit["max_concurrency"] >= batch,
        **fit,
    )


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


def longest_context(layout: KVLayout, usable_bytes: int, block_size: int) -> int:
    """The longest single request, up to the model's context, that fits in `usable_bytes` (0 if none)."""
    if layout.seq_bytes_in_blocks(1, block_size) > usable_bytes:
        return 0
    limit = layout.max_context
    if layout.seq_bytes_in_blocks(limit, block_size) <= usable_bytes:
        return limit
    lo, hi = 1, limit
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if layout.seq_bytes_in_blocks(mid, block_size) <= usable_bytes:
            lo = mid
        else:
            hi = mid
    return lo
