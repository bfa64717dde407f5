"""The free lists of the paged allocators: give from the front, take back at the back.

FreeBlockQueue threads a doubly linked list through Python lists, one step per block (the plain
BlockManager's). ArrayFreeQueue keeps the same queue (same methods, same order: tested against it)
in numpy arrays so that a request's blocks move in a few array operations (the prefix cache's).
paged and prefix_cache re-export them.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np


class FreeBlockQueue:
    """The free list: take from the front, give back at the back, remove any block in O(1).

    A doubly linked list threaded through two arrays indexed by block id, as in vLLM v1's
    FreeKVCacheBlockQueue. The O(1) `remove` is what prefix caching needs: a cached block with
    no owner stays in this queue (the queue is then also its eviction order, least recently freed
    first) and is pulled out of the middle when a new request hits it. A block can be in the queue
    at most once; `append` of a queued block is a bug and raises.
    """

    def __init__(self, num_blocks: int) -> None:
        n = num_blocks
        self._head, self._tail = n, n + 1  # sentinel ids; -1 marks "not linked"
        # Start as head, 0, 1, ..., n - 1, tail without a Python loop per block.
        self._next = list(range(1, n + 2)) + [-1]
        self._prev = list(range(-1, n + 1))
        if n:
            self._next[n - 1], self._next[n] = n + 1, 0
            self._prev[0], self._prev[n], self._prev[n + 1] = n, -1, n - 1
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: int) -> bool:
        return self._prev[block] != -1

    def __iter__(self) -> Iterator[int]:
        block = self._next[self._head]
        while block != self._tail:
            yield block
            block = self._next[block]

    def popleft(self) -> int:
        block = self._next[self._head]
        if block == self._tail:
            raise IndexError("pop from an empty free list")
        self.remove(block)
        return block

    def append(self, block: int) -> None:
        if self._prev[block] != -1:
            raise ValueError(f"block {block} is already in the free list")
        last = self._prev[self._tail]
        self._next[last], self._prev[block] = block, last
        self._next[block], self._prev[self._tail] = self._tail, block
        self._len += 1

    def remove(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        if prev == -1:
            raise ValueError(f"block {block} is not in the free list")
        self._next[prev], self._prev[nxt] = nxt, prev
        self._prev[block] = self._next[block] = -1
        self._len -= 1


class ArrayFreeQueue:
    """paged.FreeBlockQueue's free list (same methods, same order), kept in numpy arrays.

    `_queue` holds block ids in order and `_pos[block]` the block's index there (-1: not
    queued). Removing a block from the middle only clears its `_pos`; the stale entry is skipped
    when the front reaches it and dropped when the array fills and is compacted. A request's
    blocks are taken (`popleft_n`) and given back (`extend`) in a few array operations instead
    of a Python step per block, which lets a trace of millions of blocks replay in seconds. As
    in vLLM, the queue is also the eviction order of cached blocks.
    """

    def __init__(self, num_blocks: int) -> None:
        self._queue = np.empty(max(2 * num_blocks, 16), dtype=np.int64)
        self._queue[:num_blocks] = np.arange(num_blocks)
        self._pos = np.arange(num_blocks, dtype=np.int64)
        self._head, self._tail, self._len = 0, num_blocks, num_blocks

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: int) -> bool:
        return bool(self._pos[block] >= 0)

    def __iter__(self) -> Iterator[int]:
        entries = self._queue[self._head : self._tail]
        live = self._pos[entries] == np.arange(self._head, self._tail)
        return iter(entries[live].tolist())

    def popleft(self) -> int:
        if not self._len:
            raise IndexError("pop from an empty free list")
        return int(self.popleft_n(1)[0])

    def popleft_n(self, n: int) -> np.ndarray:
        """The first n blocks, removed: n calls of popleft."""
        if n > self._len:
            raise IndexError(f"pop {n} from a free list of {self._len}")
        if n <= 0:
            return np.empty(0, dtype=np.int64)
        head, width = self._head, n
        while True:  # widen the window until it holds n live entries
            stop = min(head + width, self._tail)
            entries = self._queue[head:stop]
            live = np.flatnonzero(self._pos[entries] == np.arange(head, stop))
            if len(live) >= n:
                break
            width += 2 * (n - len(live)) + 16
        taken = entries[live[:n]]
        self._pos[taken] = -1
        self._head = head + int(live[n - 1]) + 1
        self._len -= n
        return taken

    def append(self, block: int) -> None:
        self.extend(np.array([block], dtype=np.int64))

    def extend(self, blocks: np.ndarray) -> None:
        """Append each of `blocks` in turn (distinct blocks, none of them queued)."""
        m = len(blocks)
        if not m:
            return
        queued = blocks[self._pos[blocks] >= 0]
        if len(queued):
            raise ValueError(f"block {int(queued[0])} is already in the free list")
        self._room(m)
        where = np.arange(self._tail, self._tail + m)
        self._queue[where] = blocks
        self._pos[blocks] = where
        if (self._pos[blocks] != where).any():
            raise ValueError(f"extend got a block twice: {blocks.tolist()}")
        self._tail += m
        self._len += m

    def remove(self, block: int) -> None:
        self.remove_many(np.array([block], dtype=np.int64))

    def remove_many(self, blocks: np.ndarray) -> None:
        """Remove each of `blocks` (distinct, all queued) from wherever it is, O(1) per block."""
        missing = blocks[self._pos[blocks] < 0]
        if len(missing):
            raise ValueError(f"block {int(missing[0])} is not in the free list")
        self._pos[blocks] = -1
        self._len -= len(blocks)

    def _room(self, m: int) -> None:
        """Make room for m more entries at the back, compacting the live ones to the front."""
        if self._tail + m <= len(self._queue):
            return
        live = np.fromiter(self, dtype=np.int64, count=self._len)
        if self._len + m > len(self._queue):
            self._queue = np.empty(2 * (self._len + m), dtype=np.int64)
        self._queue[: self._len] = live
        self._pos[live] = np.arange(self._len)
        self._head, self._tail = 0, self._len
