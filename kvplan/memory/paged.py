"""The paged allocator of the lesson (Kwon et al., SOSP'23): a free list, block tables, ref counts.

The pool is cut into `num_blocks` blocks of `block_size` token slots. A request owns a block table,
the physical blocks holding its tokens in logical order: position p lives in block
`table[p // B]` at slot `p % B`. Blocks are handed out one at a time as a request grows, so the
only waste is the unfilled tail of each request's last block. Requests may share blocks (`fork`);
a request writes only into a block it owns alone, copying a shared block that still has room
first (copy-on-write); a full shared block is never written, so it stays shared.

Pure bookkeeping: no K/V data. Every call that places tokens says where they went and which block
copy a data holder (the tests' numpy store, the torch backend) must make, so the data can live
anywhere. Every call that would need a block checks first and raises `OutOfBlocks` before changing
anything; the `can_*` methods let a scheduler ask first instead.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple

from kvplan.memory.free_queue import FreeBlockQueue


class OutOfBlocks(Exception):
    """No free block for an allocation; raised before anything changed."""


class TokenWrite(NamedTuple):
    """Where `append` put a token: physical `block`, slot `offset`.

    `copy` is (src, dst) when the write first copied a shared block (copy-on-write): the data
    holder must copy block src to block dst before writing the token. A NamedTuple rather than a
    frozen dataclass because one is built per decoded token: it costs half as much and unpacks.
    """

    block: int
    offset: int
    copy: tuple[int, int] | None = None


class BlockManager:
    """Block tables over a pool of `num_blocks` blocks of `block_size` slots, with sharing.

    Per-block state lives in arrays indexed by block id (`ref_count`, the free list's links) so
    that later per-block fields (a prefix-cache hash) slot in beside them.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"need num_blocks >= 0 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_list = FreeBlockQueue(num_blocks)
        self.ref_count = [0] * num_blocks  # how many block tables name each block
        self.tables: dict[Hashable, list[int]] = {}  # request -> physical blocks, logical order
        self.lengths: dict[Hashable, int] = {}  # request -> tokens stored
        self._stored = 0  # distinct token slots holding data (a shared block counted once)

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_list)

    @property
    def num_stored_tokens(self) -> int:
        """Token slots holding data, counting a shared block once."""
        return self._stored

    def wasted_slots(self) -> int:
        """Allocated slots minus stored tokens, a shared block counted once: the unfilled tails."""
        return self.num_used_blocks * self.block_size - self._stored

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a new request of `num_tokens` tokens takes: ceil(num_tokens / B)."""
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, rid: Hashable, n: int) -> int:
        """New blocks that appending `n` tokens to `rid` takes, one more if it must copy-on-write."""
        if n <= 0:
            return 0
        length, table = self.lengths[rid], self.tables[rid]
        grow = self.blocks_for(length + n) - len(table)
        return grow + self._must_copy(table, length)

    def _must_copy(self, table: list[int], length: int) -> bool:
        """Whether the next write lands in a shared block with room (copy-on-write)."""
        return length % self.block_size != 0 and self.ref_count[table[-1]] > 1

    def can_add_request(self, num_tokens: int = 0) -> bool:
        return self.blocks_for(num_tokens) <= len(self.free_list)

    def can_append(self, rid: Hashable, n: int = 1) -> bool:
        return self.blocks_needed(rid, n) <= len(self.free_list)

    def slot_of(self, rid: Hashable, pos: int) -> tuple[int, int]:
        """(physical block, slot) of token position `pos`: (table[pos // B], pos % B)."""
        if not 0 <= pos < self.lengths[rid]:
            raise IndexError(f"request {rid!r} holds {self.lengths[rid]} tokens; no position {pos}")
        return self.tables[rid][pos // self.block_size], pos % self.block_size

    # -- changes -------------------------------------------------------------------------------

    def _take_block(self) -> int:
        block = self.free_list.popleft()
        if self.ref_count[block] != 0:
            raise AssertionError(f"free block {block} still has {self.ref_count[block]} owners")
        self.ref_count[block] = 1
        return block

    def add_request(self, rid: Hashable, num_tokens: int = 0) -> None:
        """Start `rid` holding `num_tokens` tokens (its prompt): all of its blocks or none."""
        if rid in self.tables:
            raise ValueError(f"request {rid!r} already exists")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if not self.can_add_request(num_tokens):
            raise OutOfBlocks(rid)
        self.tables[rid] = [self._take_block() for _ in range(self.blocks_for(num_tokens))]
        self.lengths[rid] = num_tokens
        self._stored += num_tokens

    def append(self, rid: Hashable) -> TokenWrite:
        """Store one more token of `rid` (a decode step); say where it went and what was copied.

        A new block is taken exactly when the token count is a multiple of B (including 0). A last
        block shared with another request and still with room is first replaced by a private copy.
        """
        table, n = self.tables[rid], self.lengths[rid]
        offset = n % self.block_size
        copy = None
        if offset == 0:
            if not self.free_list:
                raise OutOfBlocks(rid)
            table.append(self._take_block())
        elif self.ref_count[table[-1]] > 1:
            if not self.free_list:
                raise OutOfBlocks(rid)
            copy = self._copy_last_block(table, offset)
        self.lengths[rid] = n + 1
        self._stored += 1
        return TokenWrite(table[-1], offset, copy)

    def _copy_last_block(self, table: list[int], filled: int) -> tuple[int, int]:
        """Copy-on-write: give the table a private copy of its shared last block."""
        src, dst = table[-1], self._take_block()
        self.ref_count[src] -= 1  # still >= 1: another table keeps the original
        table[-1] = dst
        self._stored += filled
        return src, dst

    def append_tokens(self, rid: Hashable, n: int) -> tuple[int, int] | None:
        """Store `n` more tokens of `rid` at once (a prompt chunk): all of them or none.

        Returns the (src, dst) block copy to make before writing, if copy-on-write happened (at
        most one: only a table's last block can have room). The tokens sit at positions
        old length .. old length + n - 1; `slot_of` maps them.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if not self.can_append(rid, n):
            raise OutOfBlocks(rid)
        if n == 0:
            return None
        table, length = self.tables[rid], self.lengths[rid]
        copy = None
        if self._must_copy(table, length):
            copy = self._copy_last_block(table, length % self.block_size)
        table.extend(self._take_block() for _ in range(self.blocks_for(length + n) - len(table)))
        self.lengths[rid] = length + n
        self._stored += n
        return copy

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """Start `child` sharing all of `parent`'s blocks; nothing is copied or allocated."""
        if child in self.tables:
            raise ValueError(f"request {child!r} already exists")
        table = self.tables[parent]
        for block in table:
            self.ref_count[block] += 1
        self.tables[child] = list(table)
        self.lengths[child] = self.lengths[parent]

    def free(self, rid: Hashable) -> None:
        """Finish `rid`: each block no other table names joins the back of the free list.

        Blocks go back in table order (the lesson's step 7). Nothing is cleared: readers only look
        at the slots a request's length marks as valid, so stale data in a free block is harmless.
        """
        table, length = self.tables.pop(rid), self.lengths.pop(rid)
        size = self.block_size
        for j, block in enumerate(table):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self._stored -= min(size, length - j * size)
                self.free_list.append(block)

    # -- checking ------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests and debugging).

        No block lost or double-booked (each is free with no owner, or owned and not free), none
        listed twice in the free list, every ref count equals the number of tables naming the
        block, every table has ceil(length / B) blocks, and every block's sharers agree on how
        many of its slots hold data (which makes the stored-token count well defined).
        """
        listed = list(self.free_list)
        if len(listed) != len(set(listed)) or len(listed) != len(self.free_list):
            raise AssertionError(f"free list is inconsistent: {listed}")
        names = [0] * self.num_blocks
        fill: dict[int, int] = {}
        for rid, table in self.tables.items():
            length = self.lengths[rid]
            if len(table) != self.blocks_for(length):
                raise AssertionError(f"{rid!r} holds {length} tokens in {len(table)} blocks")
            for j, block in enumerate(table):
                names[block] += 1
                held = min(self.block_size, length - j * self.block_size)
                if fill.setdefault(block, held) != held:
                    raise AssertionError(f"sharers of block {block} disagree on its fill")
        free = set(listed)
        for block in range(self.num_blocks):
            if names[block] != self.ref_count[block]:
                raise AssertionError(f"block {block}: ref count {self.ref_count[block]}, "
                                     f"named by {names[block]} tables")
            if (block in free) == (names[block] > 0):
                raise AssertionError(f"block {block} is {'both' if block in free else 'neither'} "
                                     "free and owned")
        if self._stored != sum(fill.values()):
            raise AssertionError(f"stored-token count {self._stored} != {sum(fill.values())}")
