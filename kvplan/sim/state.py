"""What both serving engines' states share (engine.KernelState for vLLM's scheduler,
sglang_state.SglangState for SGLang's): the scalars a caller reads of a run in progress and its
`advance`, the per-request columns, the growth of their tables, when the prefix identities are
compacted, and how many kernel events run between progress reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvplan.errors import WorkloadError
from kvplan.sim import kernel as K
from kvplan.sim.prefix_ids import PrefixTrie, compaction_due, worth_dropping

EVENTS_PER_CALL = 200_000  # kernel events between progress reports


def grown(a: np.ndarray, size: int, fill: int) -> np.ndarray:
    """`a` if it holds `size` items, else a copy at least twice as long, padded with `fill`."""
    if size <= len(a):
        return a
    out = np.full(max(2 * len(a), size), fill, dtype=np.int64)
    out[:len(a)] = a
    return out


def grown_rows(table: np.ndarray, rows: int) -> np.ndarray:
    """`table` (rows of int64 columns) if it has `rows` rows, else a zeroed copy at least twice as
    tall (1,024 rows at least) holding its rows."""
    if rows <= len(table):
        return table
    out = np.zeros((max(2 * len(table), rows, 1024), table.shape[1]), dtype=np.int64)
    out[:len(table)] = table
    return out


def segment_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions [starts[i], starts[i] + counts[i]) of every segment i, concatenated in order."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total, dtype=np.int64)


def packed(values: np.ndarray) -> np.ndarray:
    """`values` as a fresh int64 array of one item at least (the kernel's arrays are never empty)."""
    out = np.zeros(max(len(values), 1), dtype=np.int64)
    out[:len(values)] = values
    return out


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """Per loaded request, views (not copies) of the engine's table, in ticks; -1: not yet."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output: np.ndarray


class EngineState:
    """The clock and counters of an engine's state (its `st`, the kernel's scalars) as a caller
    reads them, and `advance`; a subclass loads chunks and runs its own kernel (`run`)."""

    st: np.ndarray
    acc: np.ndarray
    clipped: int
    sent: list
    ids: np.ndarray
    n_ids: int
    ids_kept = 0  # identity entries kept by the last compaction
    open_from = 0  # every request before it had finished at the last compaction

    def _kernel(self) -> int:
        """One call of the engine's kernel (at most EVENTS_PER_CALL events): its return code."""
        raise NotImplementedError

    def _stalled(self) -> WorkloadError:
        """The error of a run that can never go on (the kernel's code 4)."""
        raise NotImplementedError

    def run(self, final: bool, progress: Callable[[int, int], None] | None = None) -> None:
        """Simulate as far as the loaded requests allow (to the end when `final`)."""
        if self.loaded == 0:
            return
        self.st[K.ALL_LOADED] = int(final)
        while True:
            code = self._kernel()
            if progress is not None:
                progress(int(self.st[K.DONE]), self.loaded)
            if code == 3:
                raise WorkloadError("the simulated time passed 2^62 ticks (53 days at the picosecond "
                                    "ticks of a timed run): arrivals or steps too far apart", field="timing")
            if code == 4:
                raise self._stalled()
            if code != 2:
                return

    def _load_ids(self, rows: np.ndarray, ids) -> None:
        raise NotImplementedError

    def _compact(self, trie: PrefixTrie) -> None:
        """Drop the identities of the finished requests and the trie nodes nothing refers to any
        more (PrefixTrie.compact), renumbering what the state holds."""
        raise NotImplementedError

    def _open_ids(self, table: np.ndarray, finish: int, start: int, count: int,
                  per: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The loaded requests not finished (column `finish` still -1), in order; how many
        identities each has (column `count` / `per`); their identities in `ids` (from column
        `start`), concatenated."""
        rows = self.open_from + np.flatnonzero(table[self.open_from:self.loaded, finish] < 0)
        self.open_from = int(rows[0]) if len(rows) else self.loaded
        counts = table[rows, count] // per
        return rows, counts, self.ids[segment_index(table[rows, start], counts)]

    def _keep_ids(self, table: np.ndarray, start: int, rows: np.ndarray, counts: np.ndarray,
                  nodes: np.ndarray, remap: np.ndarray | None) -> None:
        """`ids` packed to the open requests' identities (`_open_ids`), renumbered by the trie's
        `remap`, when it renumbered or enough of them are finished."""
        if remap is not None or worth_dropping(len(nodes), self.n_ids):
            self.ids, self.n_ids = packed(nodes if remap is None else remap[nodes]), len(nodes)
            table[rows, start] = np.cumsum(counts) - counts

    def _took(self, chunk, rows: np.ndarray, n: int) -> None:
        """The rest of loading a chunk whose rows (after the n loaded before) are written: its
        block identities (compacted now and then: prefix_ids.py), the clock at the first arrival,
        the counts."""
        ids = chunk.ids
        if ids is not None:
            if ids.epoch != ids.trie.epoch:
                raise AssertionError("a chunk numbered before its trie was compacted was loaded")
            self._load_ids(rows, ids)
        if n == 0:
            self.st[K.NOW] = self.st[K.ORIGIN] = chunk.arrival[0]
        self.st[K.LOADED] = n + len(chunk)
        self.clipped += chunk.clipped
        if chunk.sent is not None:
            self.sent.append(chunk.sent)
        if ids is not None and (ids.trie.crowded() or compaction_due(self.n_ids, self.ids_kept)):
            self._compact(ids.trie)
            self.ids_kept = self.n_ids

    def _integrals(self) -> list[int]:
        """The run's integrals (kernel.NUM_INTEGRALS, each kept in 31-bit limbs), once every loaded
        request finished."""
        n, done = self.loaded, int(self.st[K.DONE])
        if n and done != n:
            raise AssertionError(f"the simulation ended with {n - done} requests unfinished")
        return [sum(int(limb) << (31 * i) for i, limb in enumerate(self.acc[row])) for row in range(K.NUM_INTEGRALS)]

    @property
    def loaded(self) -> int:
        """Requests loaded so far."""
        return int(self.st[K.LOADED])

    @property
    def now(self) -> int:
        """The engine's clock, in ticks."""
        return int(self.st[K.NOW])

    @property
    def origin(self) -> int:
        """The tick of the first arrival."""
        return int(self.st[K.ORIGIN])

    @property
    def outstanding(self) -> int:
        """Requests loaded and not finished."""
        return self.loaded - int(self.st[K.DONE])

    @property
    def peak_running(self) -> int:
        """The most requests that ran in one step so far."""
        return int(self.st[K.PEAK_RUNNING])

    def busy_ticks(self) -> int:
        """Ticks from the first arrival to now less those with nothing running or waiting."""
        return int(self.st[K.NOW] - self.st[K.ORIGIN] - self.st[K.IDLE]) if self.loaded else 0

    def advance(self, horizon: int | None) -> None:
        """Simulate up to tick `horizon` (nothing arrives before it that is not loaded), or, with
        None, every loaded request to its end."""
        if self.loaded:
            self.st[K.HORIZON] = 0 if horizon is None else horizon
            self.run(final=horizon is None)
