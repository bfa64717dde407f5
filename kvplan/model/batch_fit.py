"""When a model does not fit: does a smaller vLLM batch make it fit on the same GPU?

vLLM's start-up profiles one forward pass of `max_num_batched_tokens` tokens and captures CUDA
graphs up to 2 x `max_num_seqs` (kvplan/model/vllm_memory.py); what that takes is not left for
the KV cache. Its defaults differ by GPU (`default_batch`: 8,192 tokens and 1,024 sequences on
GPUs of 70 GiB and more other than the A100, else 2,048 and 256), which is why a model that does
not fit on an H100-80GB may fit on an A100-80GB of the same memory. The cheap fix is the smaller
batch on the GPU one has: `--max-num-batched-tokens` and `--max-num-seqs`. The values suggested
here are the mildest reduction that fits, each one checked by sizing the model with it.
"""

from __future__ import annotations

from typing import Callable

from kvplan.model.gpus import get_gpu
from kvplan.model.vllm_memory import default_batch

SMALLEST_TOKENS = 256  # halvings of the defaults go no lower than these
SMALLEST_SEQS = 16


def batch_defaults(gpu_name: str) -> tuple[int, int]:
    """vLLM's (max_num_batched_tokens, max_num_seqs) on a catalog GPU."""
    gpu = get_gpu(gpu_name)
    return default_batch(gpu.name, gpu.cuda_memory_bytes)


def _halvings(start: int, lowest: int) -> list[int]:
    out = [start]
    while out[-1] // 2 >= lowest:
        out.append(out[-1] // 2)
    return out


def smaller_batch(fits: Callable[[int, int], bool], gpu_name: str, tokens_given: int | None,
                  seqs_given: int | None) -> dict | None:
    """The mildest (max_num_batched_tokens, max_num_seqs) below the batch asked for (vLLM's
    defaults where not given) with which `fits(tokens, seqs)` holds, or None: the pairs are tried
    from the least reduced (the product of both, then more tokens) down, each flag halved
    towards SMALLEST_*; vLLM requires max_num_batched_tokens >= max_num_seqs."""
    t0, s0 = batch_defaults(gpu_name)
    t0, s0 = tokens_given or t0, seqs_given or s0
    pairs = [(t, s) for t in _halvings(t0, min(SMALLEST_TOKENS, t0)) for s in _halvings(s0, min(SMALLEST_SEQS, s0))
             if t >= s and (t, s) != (t0, s0)]
    pairs.sort(key=lambda p: (-p[0] * p[1], -p[0]))
    if not pairs or not fits(*pairs[-1]):  # not even the smallest batch: one sizing, not all
        return None
    for tokens, seqs in pairs:
        if fits(tokens, seqs):
            return {"max_num_batched_tokens": tokens, "max_num_seqs": seqs}
    return None
