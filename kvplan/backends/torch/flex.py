"""Paged attention with flex attention reading the pool in place: no gathered copy of K/V.

The whole layer pool is one key sequence of num_blocks x block_size slots shared by the batch
(batch dim 1, broadcast); a mask maps each physical slot back to the request's logical position
through a physical-to-logical block map built from the block tables, the idea of torch's
experimental PagedAttention. The block mask skips flex tiles that hold none of a request's blocks.
Eager flex (CPU tests) materializes the scores; compiled (`compiled=True`, CUDA) is the fused kernel.
"""

from __future__ import annotations

import warnings

import torch

from kvplan.backends.torch.attention import as_heads
from kvplan.backends.torch.codec import Codec

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None

_compiled = None


def flex_available() -> bool:
    return flex_attention is not None


def physical_to_logical(block_tables: torch.Tensor, seq_lens: torch.Tensor, num_blocks: int,
                        block_size: int) -> torch.Tensor:
    """(B, num_blocks) int32: the logical index of each physical block in request b's table, or -1."""
    batch, width = block_tables.shape
    used = -(-seq_lens // block_size)  # blocks each request's length covers
    cols = torch.arange(width, device=block_tables.device).expand(batch, width)
    rows = torch.arange(batch, device=block_tables.device).unsqueeze(1).expand(batch, width)
    live = cols < used.unsqueeze(1)
    table = torch.full((batch, num_blocks), -1, dtype=torch.int32, device=block_tables.device)
    table[rows[live], block_tables[live]] = cols[live].to(torch.int32)
    return table


def paged_block_mask(block_tables: torch.Tensor, seq_lens: torch.Tensor, *, num_blocks: int, block_size: int,
                     n_q: int, window: int | None = None, compile_mask: bool = False):
    """A flex BlockMask over the physical pool for queries at the last n_q positions of each request."""
    to_logical = physical_to_logical(block_tables, seq_lens, num_blocks, block_size)
    q_start = seq_lens - n_q

    def mask_mod(b, h, q_idx, kv_idx):
        logical = to_logical[b, kv_idx // block_size]
        pos = logical * block_size + kv_idx % block_size
        q_pos = q_start[b] + q_idx
        ok = (logical >= 0) & (pos <= q_pos)
        if window is not None:
            ok = ok & (q_pos - pos < window)
        return ok

    return create_block_mask(mask_mod, block_tables.shape[0], None, n_q, num_blocks * block_size,
                             device=block_tables.device, _compile=compile_mask)


def paged_attention_flex(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, *, codec: Codec, window: int | None = None, scale: float | None = None,
    latent: bool = False, compiled: bool = False, block_mask=None,
) -> torch.Tensor:
    """q (B, n_q, Hq, D) over the pool in place; returns (B, n_q, Hq, Dv).

    A quantized pool (int8, int4, fp8 with a different compute dtype) is decoded whole first,
    which is fine for checking and not what a kernel would do.
    """
    if not flex_available():
        raise RuntimeError("flex attention needs torch >= 2.5")
    num_blocks, block_size = k_pool.shape[:2]
    if block_mask is None:
        block_mask = paged_block_mask(block_tables, seq_lens, num_blocks=num_blocks, block_size=block_size,
                                      n_q=q.shape[1], window=window)
    k, v = (_as_sequence(codec.decode(t, q.dtype), latent) for t in (k_pool, v_pool))
    fn = _compiled_flex() if compiled else flex_attention
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex warns that it is unfused; the CPU tests know
        out = fn(q.transpose(1, 2), k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def _as_sequence(pool: torch.Tensor, latent: bool) -> torch.Tensor:
    """(num_blocks, B, H, D) -> (1, H, num_blocks * B, D) as a strided view (no copy)."""
    pool = as_heads(pool, latent)
    return pool.flatten(0, 1).unsqueeze(0).transpose(1, 2)


def _compiled_flex():
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled
