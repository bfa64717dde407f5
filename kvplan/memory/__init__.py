"""The allocators of the lesson and their bookkeeping: pure data structures, no clock, no I/O.

contiguous: one run per request, reserved up front (policies max, pow2, oracle).
paged: a free list, block tables, reference counts, fork and copy-on-write.
prefix_cache: automatic prefix caching: vLLM's block pool (the serve reference's), its metrics, and
  the prefix replay's block manager on it; free_queue: their array free list.
capacity: the static capacity experiment in closed form, vectorized over a whole request stream.
"""

from kvplan.memory.capacity import (
    BLOCK_SIZES,
    CapacityResult,
    MemoryBreakdown,
    capacity_sweep,
    contiguous_capacity,
    contiguous_reservations,
    paged_capacity,
    paged_capacity_sweep,
)
from kvplan.memory.contiguous import POLICIES, Buffer, ContiguousPool, reservation
from kvplan.memory.paged import BlockManager, FreeBlockQueue, OutOfBlocks, TokenWrite
from kvplan.memory.prefix_cache import BlockPool, PrefixCacheStats, PrefixCachingBlockManager

__all__ = [
    "BLOCK_SIZES",
    "POLICIES",
    "BlockManager",
    "BlockPool",
    "Buffer",
    "CapacityResult",
    "ContiguousPool",
    "FreeBlockQueue",
    "MemoryBreakdown",
    "OutOfBlocks",
    "PrefixCacheStats",
    "PrefixCachingBlockManager",
    "TokenWrite",
    "capacity_sweep",
    "contiguous_capacity",
    "contiguous_reservations",
    "paged_capacity",
    "paged_capacity_sweep",
    "reservation",
]
