"""The baseline of the lesson: one contiguous run of slots per request, reserved up front.

Systems before vLLM (FasterTransformer, Orca) stored each request's KV cache in one run of slots
in a row, so that a kernel could read it as one array. The run must be reserved when the request
starts, before its length is known, which wastes memory two ways: reserved slots that never hold a
token (internal fragmentation) and free slots scattered in gaps too short for the next request
(external fragmentation). `ContiguousPool` keeps exactly the bookkeeping needed to show both.

Pure bookkeeping: slot numbers and counts, no K/V data, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Hashable

from kvplan.errors import KvplanError

POLICIES = ("max", "pow2", "oracle")


def reservation(policy: str, final_len: int, limit: int) -> int:
    """Slots a contiguous allocator reserves for a request that will end at `final_len` tokens.

    The policies are the baselines of Kwon et al. (SOSP'23, section 6): `max` reserves the
    per-request limit because the output length is unknown; `pow2` reserves the next power of two
    at or above the final length (at most twice too much), capped at the limit; `oracle` knows the
    final length and reserves exactly that, the best a contiguous allocator can do.
    """
    if policy not in POLICIES:
        raise KvplanError(f"unknown reservation policy {policy!r}; use one of {', '.join(POLICIES)}",
                          field="policy")
    if limit < 1:
        raise KvplanError(f"the per-request limit must be at least 1, got {limit}",
                          field="contiguous_max_len")
    if not 1 <= final_len <= limit:
        raise KvplanError(f"final length {final_len} is outside 1..{limit} (the per-request limit)",
                          field="contiguous_max_len")
    if policy == "max":
        return limit
    if policy == "pow2":
        return min(1 << (final_len - 1).bit_length(), limit)
    return final_len


@dataclass(frozen=True, slots=True)
class Buffer:
    """One request's reserved run: slots start .. start + reserved - 1."""

    start: int
    reserved: int


class ContiguousPool:
    """A pool of `num_slots` token slots handed out as one run per request, first fit.

    Free runs are kept sorted by start and coalesced on free, so `free_runs()` is the true picture
    of the gaps. A request whose reservation finds no run long enough is refused (`allocate`
    returns None) and nothing changes: that refusal with free slots to spare is external
    fragmentation made visible.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self.buffers: dict[Hashable, Buffer] = {}
        self.lengths: dict[Hashable, int] = {}  # tokens each request holds
        # Free runs, sorted by start; two parallel lists so that bisect works on the starts.
        self._run_starts: list[int] = [0] if num_slots else []
        self._run_lengths: list[int] = [num_slots] if num_slots else []
        self.num_free_slots = num_slots
        self.num_tokens = 0

    # -- placement -----------------------------------------------------------------------------

    def _first_fit(self, reserve: int) -> int | None:
        """Index of the first free run (lowest start) with at least `reserve` slots."""
        for i, length in enumerate(self._run_lengths):
            if length >= reserve:
                return i
        return None

    def can_allocate(self, reserve: int) -> bool:
        """Whether some free run could hold `reserve` slots in a row."""
        return reserve >= 1 and self._first_fit(reserve) is not None

    def allocate(self, rid: Hashable, reserve: int) -> int | None:
        """Reserve `reserve` slots in a row for `rid`; return the start, or None if no run fits.

        A refusal changes nothing, so a caller can try again later without undoing anything.
        """
        if rid in self.buffers:
            raise ValueError(f"request {rid!r} already holds a buffer")
        if reserve < 1:
            raise ValueError(f"a reservation must be at least 1 slot, got {reserve}")
        i = self._first_fit(reserve)
        if i is None:
            return None
        start = self._run_starts[i]
        if self._run_lengths[i] == reserve:
            del self._run_starts[i], self._run_lengths[i]
        else:
            self._run_starts[i] += reserve
            self._run_lengths[i] -= reserve
        self.buffers[rid] = Buffer(start, reserve)
        self.lengths[rid] = 0
        self.num_free_slots -= reserve
        return start

    # -- growth --------------------------------------------------------------------------------

    def set_tokens(self, rid: Hashable, n: int) -> None:
        """Set how many tokens `rid` holds; a buffer cannot grow past its reservation."""
        reserved = self.buffers[rid].reserved
        if not 0 <= n <= reserved:
            raise ValueError(f"request {rid!r} reserved {reserved} slots; cannot hold {n} tokens")
        self.num_tokens += n - self.lengths[rid]
        self.lengths[rid] = n

    def append(self, rid: Hashable, n: int = 1) -> None:
        """Add `n` tokens to `rid` in place (the point of reserving up front)."""
        self.set_tokens(rid, self.lengths[rid] + n)

    def slot_of(self, rid: Hashable, pos: int) -> int:
        """The slot holding token position `pos` of `rid`: start + pos."""
        if not 0 <= pos < self.lengths[rid]:
            raise IndexError(f"request {rid!r} holds {self.lengths[rid]} tokens; no position {pos}")
        return self.buffers[rid].start + pos

    # -- release -------------------------------------------------------------------------------

    def free(self, rid: Hashable) -> None:
        """Return `rid`'s run, merging it with a free neighbour on either side."""
        buf = self.buffers.pop(rid)
        self.num_tokens -= self.lengths.pop(rid)
        self.num_free_slots += buf.reserved
        starts, lengths = self._run_starts, self._run_lengths
        i = bisect_left(starts, buf.start)
        start, length = buf.start, buf.reserved
        if i < len(starts) and start + length == starts[i]:  # merge with the run after
            length += lengths[i]
            del starts[i], lengths[i]
        if i > 0 and starts[i - 1] + lengths[i - 1] == start:  # merge with the run before
            lengths[i - 1] += length
        else:
            starts.insert(i, start)
            lengths.insert(i, length)

    # -- accounting ----------------------------------------------------------------------------

    def free_runs(self) -> list[tuple[int, int]]:
        """The free runs as (start, length), sorted by start."""
        return list(zip(self._run_starts, self._run_lengths))

    def largest_free_run(self) -> int:
        """The longest reservation that would succeed now (0 when the pool is full)."""
        return max(self._run_lengths, default=0)

    @property
    def num_reserved_slots(self) -> int:
        return self.num_slots - self.num_free_slots

    @property
    def reserved_empty_slots(self) -> int:
        """Reserved slots holding no token: the internal fragmentation of the lesson's Figure 2."""
        return self.num_reserved_slots - self.num_tokens

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests and debugging).

        Every slot must be in exactly one buffer or one free run, free runs must be sorted,
        non-empty and coalesced, and the counters must match the records.
        """
        owner = [None] * self.num_slots
        spans = [(b.start, b.reserved, rid) for rid, b in self.buffers.items()]
        spans += [(s, n, "<free>") for s, n in self.free_runs()]
        for start, length, who in spans:
            for slot in range(start, start + length):
                if owner[slot] is not None:
                    raise AssertionError(f"slot {slot} claimed by {owner[slot]!r} and {who!r}")
                owner[slot] = who
        if None in owner:
            raise AssertionError(f"slot {owner.index(None)} is neither free nor reserved (lost)")
        runs = self.free_runs()
        for (s0, n0), (s1, _) in zip(runs, runs[1:]):
            if s0 + n0 >= s1:
                raise AssertionError(f"free runs at {s0} and {s1} overlap, touch or are unsorted")
        if any(n <= 0 for _, n in runs):
            raise AssertionError("an empty free run is listed")
        if self.num_free_slots != sum(n for _, n in runs):
            raise AssertionError("num_free_slots does not match the free runs")
        if self.num_tokens != sum(self.lengths.values()):
            raise AssertionError("num_tokens does not match the per-request lengths")
        if any(not 0 <= self.lengths[r] <= b.reserved for r, b in self.buffers.items()):
            raise AssertionError("a request holds more tokens than it reserved")
