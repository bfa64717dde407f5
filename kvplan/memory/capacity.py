"""The lesson's static capacity experiment in closed form, vectorized over a whole request stream.

The experiment: requests arrive in order, each counted at its final length (no request grows or
finishes during it), and are admitted greedily into a pool of `slots` token slots until the first
one that does not fit; admission stops there, as in the lesson, so a shorter request further back
is never tried. Because nothing departs, the object models reduce to prefix sums: contiguous first
fit places buffers back to back, so request i fits iff the reservations of requests 0..i sum to at
most `slots`; the paged allocator admits request i iff ceil(len / B) block counts of 0..i sum to at
most `slots // B`. `tests/test_memory_capacity.py` checks this against `ContiguousPool` and
`BlockManager` driven request by request.

A million requests and seven block sizes take milliseconds: one cumulative sum per allocator and
one binary search for where it crosses the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from kvplan.errors import KvplanError
from kvplan.memory.contiguous import POLICIES

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Where every slot of the pool went, in the vocabulary of Kwon et al. (SOSP'23) Figure 2.

    The five counts partition the pool: they sum to its size.

    token_states: slots holding a token's K/V.
    reserved: slots set aside for tokens an admitted request will write later. In the static
        experiment every request is already at its final length, so this is 0; in a running
        system it is the part of an over-reservation that will still be used.
    internal_fragmentation: slots allocated to an admitted request that will never hold a token:
        a contiguous reservation beyond the final length, or the unfilled tail of a paged
        request's last block (fewer than B slots per request).
    external_fragmentation: slots that are not allocated and that no request could ever be given.
        Contiguous: 0 here, because nothing departs, so no holes open between buffers; the
        object model (`ContiguousPool`) shows holes once requests finish. Paged: the
        `slots % B` slots left over after cutting the pool into whole blocks (Kwon's
        "External frag. & Others").
    free: slots not allocated that a request could still be given. This includes the leftover
        too small for the refused request: a plain shortage (one run at the end for contiguous,
        whole blocks for paged), not fragmentation, and a shorter request would fit in it.
    """

    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int

    @property
    def total(self) -> int:
        return (self.token_states + self.reserved + self.internal_fragmentation
                + self.external_fragmentation + self.free)


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """What one allocator admitted from the stream, and how well it used what it allocated.

    allocator: "contiguous-<policy>" or "paged-B<block size>" (the AllocatorSpec labels).
    admitted: requests admitted before the first refusal.
    allocated_slots: slots reserved (contiguous) or in allocated blocks (paged).
    tokens_stored: the admitted requests' final lengths, summed.
    wasted_slots: allocated_slots - tokens_stored.
    utilization: tokens_stored / allocated_slots, and 0.0 when nothing was allocated.
    """

    allocator: str
    admitted: int
    allocated_slots: int
    tokens_stored: int
    wasted_slots: int
    utilization: float
    breakdown: MemoryBreakdown


def _lengths(lengths) -> np.ndarray:
    """The final lengths as a 1-D int64 array, each at least 1 token."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise KvplanError(f"request lengths must be a 1-D array of integers, got {arr.dtype} "
                          f"with shape {arr.shape}", field="lengths")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 1:
        i = int(np.argmax(arr < 1))
        raise KvplanError(f"request {i} has final length {int(arr[i])}; every request holds at "
                          "least 1 token", field="lengths")
    return arr


def _check_positive(value: int, field: str, minimum: int = 1) -> int:
    if int(value) != value or value < minimum:
        raise KvplanError(f"must be an integer >= {minimum}, got {value!r}", field=field)
    return int(value)


def contiguous_reservations(lengths, policy: str, limit: int) -> np.ndarray:
    """Vectorized `contiguous.reservation`: the slots each request reserves under `policy`.

    A request longer than `limit` is rejected, not clipped: a contiguous buffer cannot grow past
    its reservation, so such a request cannot be served at all, and clipping it would quietly
    compare the allocators on different workloads.
    """
    if policy not in POLICIES:
        raise KvplanError(f"unknown reservation policy {policy!r}; use one of "
                          f"{', '.join(POLICIES)}", field="policy")
    limit = _check_positive(limit, "contiguous_max_len")
    arr = _lengths(lengths)
    if arr.size and arr.max() > limit:
        i = int(np.argmax(arr > limit))
        raise KvplanError(f"request {i} has final length {int(arr[i])}, above the contiguous "
                          f"per-request limit {limit}; raise the limit or shorten the requests",
                          field="contiguous_max_len")
    if policy == "max":
        return np.full(arr.shape, limit, dtype=np.int64)
    if policy == "pow2":
        # frexp(x) gives x = m * 2**e with 0.5 <= m < 1, so e is x's bit length (exact below 2**53).
        _, bits = np.frexp((arr - 1).astype(np.float64))
        return np.minimum(np.left_shift(np.int64(1), bits.astype(np.int64)), limit)
    return arr.copy()


def _result(allocator: str, slots: int, admitted: int, allocated: int, tokens: int,
            unusable: int) -> CapacityResult:
    """Assemble a result; `unusable` is the external fragmentation (see MemoryBreakdown)."""
    breakdown = MemoryBreakdown(
        token_states=tokens,
        reserved=0,
        internal_fragmentation=allocated - tokens,
        external_fragmentation=unusable,
        free=slots - allocated - unusable,
    )
    return CapacityResult(
        allocator=allocator,
        admitted=admitted,
        allocated_slots=allocated,
        tokens_stored=tokens,
        wasted_slots=allocated - tokens,
        utilization=tokens / allocated if allocated else 0.0,
        breakdown=breakdown,
    )


def _admit(cost: np.ndarray, budget: int) -> tuple[int, int]:
    """Greedy admission in order: (how many fit before the first refusal, what they cost)."""
    cum = np.cumsum(cost)
    admitted = int(np.searchsorted(cum, budget, side="right"))
    return admitted, int(cum[admitted - 1]) if admitted else 0


def _tokens(cum_lengths: np.ndarray, admitted: int) -> int:
    return int(cum_lengths[admitted - 1]) if admitted else 0


def contiguous_capacity(lengths, slots: int, policy: str = "max", limit: int = 8192) -> CapacityResult:
    """The static experiment for a contiguous allocator reserving per `policy` up to `limit`."""
    slots = _check_positive(slots, "slots", minimum=0)
    arr = _lengths(lengths)
    admitted, allocated = _admit(contiguous_reservations(arr, policy, limit), slots)
    tokens = int(arr[:admitted].sum())
    return _result(f"contiguous-{policy}", slots, admitted, allocated, tokens, 0)


def _paged(arr: np.ndarray, cum_lengths: np.ndarray, slots: int, block_size: int,
           null_block: bool = False) -> CapacityResult:
    block_size = _check_positive(block_size, "block_size")
    num_blocks = max(slots // block_size - (1 if null_block else 0), 0)  # vLLM's null block
    admitted, blocks = _admit((arr + (block_size - 1)) // block_size, num_blocks)
    return _result(f"paged-B{block_size}", slots, admitted, blocks * block_size,
                   _tokens(cum_lengths, admitted), slots - num_blocks * block_size)


def paged_capacity(lengths, slots: int, block_size: int = 16, null_block: bool = False) -> CapacityResult:
    """The static experiment for a paged allocator with `slots // block_size` blocks (one fewer
    with vLLM's null block: its slots count as external fragmentation)."""
    return paged_capacity_sweep(lengths, slots, (block_size,), null_block=null_block)[0]


def paged_capacity_sweep(lengths, slots: int, block_sizes: Iterable[int] = BLOCK_SIZES, *,
                         null_block: bool = False) -> list[CapacityResult]:
    """`paged_capacity` for many block sizes at once, sharing the work that does not depend on B."""
    slots = _check_positive(slots, "slots", minimum=0)
    arr = _lengths(lengths)
    cum_lengths = np.cumsum(arr)
    return [_paged(arr, cum_lengths, slots, b, null_block) for b in block_sizes]


def grouped_capacity(cost: np.ndarray, kept: np.ndarray, num_blocks: int, block_size: int,
                     slots: int, label: str) -> CapacityResult:
    """The static experiment for blocks counted per request by a caller's rule (vLLM's hybrid
    layer groups): `cost` blocks and `kept` token slots per request, `num_blocks` usable of a
    pool of `slots` slots (the rest external)."""
    admitted, blocks = _admit(np.asarray(cost, dtype=np.int64), num_blocks)
    tokens = int(np.asarray(kept, dtype=np.int64)[:admitted].sum())
    return _result(label, slots, admitted, blocks * block_size, tokens, slots - num_blocks * block_size)


def capacity_sweep(lengths, slots: int, *, limit: int = 8192,
                   policies: Iterable[str] = POLICIES,
                   block_sizes: Iterable[int] = BLOCK_SIZES) -> list[CapacityResult]:
    """Every contiguous policy, then every paged block size, on the same stream and pool."""
    arr = _lengths(lengths)
    results = [contiguous_capacity(arr, slots, p, limit) for p in policies]
    return results + paged_capacity_sweep(arr, slots, block_sizes)
