"""Paged attention read through block tables, and the dense attention it must equal.

Every function takes queries `q` shaped (batch, n_q, q_heads, head_dim): query i of request b sits
at position seq_lens[b] - n_q + i (decode: n_q = 1, the newest token; prefill: n_q = the length).
Key j is visible to a query at position p when j <= p and, with a window W, p - j < W (the query
itself counts, as in Hugging Face and vLLM). K/V pools are in storage form, (num_blocks,
block_size, kv_heads, dim) or (num_blocks, block_size, dim) for an MLA latent (one shared head);
`codec` turns stored elements into values. Grouped-query attention: query head h reads KV head
h // (q_heads // kv_heads).

- `paged_attention_reference`: per request, gather its slots through the table, plain fp32 matmul.
- `paged_attention_sdpa`: one batched gather of every request's blocks, then one
  scaled_dot_product_attention call (query heads of a KV head folded into query rows).
- `dense_attention`: float64 over each request's contiguous K/V; the ground truth.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from kvplan.backends.torch.codec import Codec


def as_heads(pool: torch.Tensor, latent: bool) -> torch.Tensor:
    """An MLA latent pool (..., D) read as one KV head (..., 1, D); a K or V pool as it is."""
    return pool.unsqueeze(-2) if latent else pool


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Mask (..., n_q, n_k): key position k_pos visible to query position q_pos."""
    diff = q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)
    ok = diff >= 0
    if window is not None:
        ok &= diff < window
    return ok


def _slots(block_tables: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot of logical position(s) `pos` through each row's block table: table[p // B] * B + p % B."""
    return block_tables[..., pos // block_size] * block_size + pos % block_size


def paged_attention_reference(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, *, codec: Codec, window: int | None = None, scale: float | None = None,
    latent: bool = False,
) -> torch.Tensor:
    """The plain way: for each request, gather its slots, softmax(q k^T) v in fp32; returns fp32."""
    k_flat, v_flat = (as_heads(codec.raw(t), latent).flatten(0, 1) for t in (k_pool, v_pool))
    block_size = k_pool.shape[1]
    n_q, q_heads = q.shape[1], q.shape[2]
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out = []
    for b, length in enumerate(seq_lens.tolist()):
        pos = torch.arange(length, device=q.device)
        slots = _slots(block_tables[b], pos, block_size)
        k = codec.decode(codec.unraw(k_flat[slots]), torch.float32)  # (L, Hkv, D)
        v = codec.decode(codec.unraw(v_flat[slots]), torch.float32)
        group = q_heads // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[b].float(), k) * scale
        q_pos = torch.arange(length - n_q, length, device=q.device)
        scores = scores.masked_fill(~visible(q_pos, pos, window), float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.stack(out)


def gather_kv(
    k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
    *, codec: Codec, latent: bool = False, dtype: torch.dtype | None = None, max_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every request's K/V gathered through its table into (B, Hkv, T, D), T the longest length.

    Returns (k, v, key positions (T,)); slots past a request's length are padding to be masked.
    `max_len` is the longest length when the caller knows it (saves a device-to-host sync).
    """
    block_size = k_pool.shape[1]
    longest = int(seq_lens.max()) if max_len is None else max_len
    pos = torch.arange(longest, device=k_pool.device)
    slots = _slots(block_tables, pos, block_size)  # (B, T)
    out = []
    for t in (k_pool, v_pool):
        flat = as_heads(codec.raw(t), latent).flatten(0, 1)
        out.append(codec.decode(codec.unraw(flat[slots]), dtype).transpose(1, 2))
    return out[0], out[1], pos


def paged_attention_sdpa(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, *, codec: Codec, window: int | None = None, scale: float | None = None,
    latent: bool = False, uniform_len: int | None = None,
) -> torch.Tensor:
    """The faster way: one gather for the whole batch, one fused SDPA call.

    `uniform_len`: every request is known (on the host) to hold exactly this many tokens, so a
    decode step needs no padding mask and SDPA may pick its flash kernel; no device sync either.
    """
    n_q = q.shape[1]
    k, v, pos = gather_kv(k_pool, v_pool, block_tables, seq_lens, codec=codec, latent=latent, dtype=q.dtype,
                          max_len=uniform_len)
    uniform = uniform_len is not None or bool((seq_lens == seq_lens[0]).all())
    mask = None
    if not (uniform and n_q == 1 and window is None):  # otherwise every key is visible
        q_pos = seq_lens.unsqueeze(1) - n_q + torch.arange(n_q, device=q.device)  # (B, n_q)
        mask = (visible(q_pos, pos, window) & (pos < seq_lens.unsqueeze(1)).unsqueeze(1)).unsqueeze(1)
    return sdpa_folded(q, k, v, mask, scale)


def sdpa_folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                scale: float | None) -> torch.Tensor:
    """SDPA for q (B, n_q, Hq, D) over k/v (B, Hkv, T, D), the Hq / Hkv query heads of each KV head
    folded into extra query rows, so no backend needs GQA support and K/V are never repeated.

    mask: bool (B, 1, n_q, T) or None. Returns (B, n_q, Hq, Dv).
    """
    batch, n_q, q_heads, dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    rows = q.reshape(batch, n_q, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * n_q, dim)
    if mask is not None:
        mask = mask.repeat(1, 1, group, 1)  # row (g, i) sees what query i sees
    out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=scale)
    out = out.reshape(batch, kv_heads, group, n_q, -1).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, n_q, q_heads, -1)


def dense_attention(
    q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], *,
    window: int | None = None, scale: float | None = None,
) -> torch.Tensor:
    """Ground truth in float64: each request attends over its own contiguous K/V (L, Hkv, D)."""
    n_q, q_heads = q.shape[1], q.shape[2]
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out = []
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        if k.dim() == 2:  # MLA latent: one head
            k, v = k.unsqueeze(1), v.unsqueeze(1)
        length, group = k.shape[0], q_heads // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[b].double(), k) * scale
        pos = torch.arange(length, device=q.device)
        scores = scores.masked_fill(~visible(pos[length - n_q:], pos, window), float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.stack(out)
