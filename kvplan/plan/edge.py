"""The rate search of one configuration: the highest request rate one replica serves within the
targets, on one grid of rates for every configuration, its runs shared among the configurations
of a group and stopped as soon as their miss is certain.

Rates lie on the grid 2^(k / STEPS_PER_OCTAVE) requests/s (2.2% apart), each replaying the same
requests with their arrival times scaled, so the search is deterministic. `walk_edge` walks from a
start to a step that passes whose neighbour above misses (doubling steps, then bisection);
`scout` bisects a bracket whose top moves up while it passes. `Runs` keeps a group's runs: a run
whose batch never reached a cap is the same run under any cap above its peak. `doomed` stops a
run once enough of its requests are certainly late that its p99 (or goodput) must miss.
"""

from __future__ import annotations

import math
from typing import Callable

STEPS_PER_OCTAVE = 32  # the rates tried lie on one grid for every configuration: 2^(k/32) requests/s, 2.2% apart
LONGEST_SPAN_S = 1e6  # no rate so low that the requests' arrivals would span more than 11.6 days
SCOUT_SHARE = 10  # scouting runs take the first count / 10 requests (at least SCOUT_MIN)
SCOUT_MIN = 1000
START_OFFSET = 4  # the full-count search starts this many steps below the scouts' edge (see evaluate)
STOP_CHUNK = 256  # requests per chunk of a rate run: how often it may stop early


def grid_rate(k: int) -> float:
    return 2.0 ** (k / STEPS_PER_OCTAVE)


def grid_step(rate: float, up: bool) -> int:
    """The grid step at or above (`up`) / at or below `rate`."""
    x = STEPS_PER_OCTAVE * math.log2(rate)
    return math.ceil(x - 1e-9) if up else math.floor(x + 1e-9)


class Runs:
    """The serve runs of one group of configurations, which differ only in max_num_seqs.

    A run is a pure function of its setup and requests; max_num_seqs enters the engine only as the
    cap on the running batch (and, through the start-up profile, the pool, which the key holds with
    every other setting of the setup). So a run whose batch never reached a cap is the same run
    under any cap above its peak: a sibling's run whose peak stays below both caps is reused as it
    is, never re-simulated."""

    def __init__(self) -> None:
        self.done: dict[tuple, list] = {}
        self.offset = START_OFFSET  # steps the full-count edge lay below the scouts' last time
        self.scout_edge: int | None = None  # the scouts' edge last time

    def get(self, key: tuple, cap: int):
        for other_cap, peak, result in self.done.get(key, ()):
            if other_cap == cap or peak < min(cap, other_cap):
                return True, result
        return False, None

    def put(self, key: tuple, cap: int, peak: int, result) -> None:
        """`peak`: the largest batch the run reached (up to its stop, for a run that stopped: the
        same run under another cap above it stops at the same point)."""
        self.done.setdefault(key, []).append((cap, peak, result))


def walk_edge(passes: Callable[[int], bool], start: int, floor: int, ceiling: int) -> int | None:
    """From `start`, the step that passes whose neighbour above misses: up while passing, down
    while missing, by doubling steps, then bisection. None: even `floor` misses."""
    if passes(start):
        lo, step = start, 1
        while True:
            hi = min(ceiling, lo + step)
            if hi == lo:
                return lo
            if not passes(hi):
                break
            lo, step = hi, step * 2
    else:
        hi, step = start, 1
        while True:
            lo = max(floor, hi - step)
            if passes(lo):
                break
            if lo == floor:
                return None
            hi, step = lo, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def small_chunks(chunks):
    for c in chunks:
        for s in range(0, len(c), STOP_CHUNK):
            yield c.take(slice(s, s + STOP_CHUNK))


def doomed(targets, count: int, per_unit: float):
    """A stop rule for a run of `count` requests: True once enough of them are certainly late
    that the run must miss. For p99s: count - floor(0.99 x (count - 1)) late values put numpy's
    p99 above a target (it is at least the value of that rank; for TPOT, counted over the requests
    with more than one output token, `count` bounds their number, and the rank's count only grows
    with it). For goodput g: count - ceil(g x count) + 1 requests late on any limit.

    A request is certainly late for TTFT or E2E once its first token (or its end) came later than
    the target after it reached the engine, or it is still waiting past that: the result measures
    from the client's send, no later, and adds the API server's latency. For TPOT, once the time
    since its first token, finished or not, passes target x (its output - 1). The rule never
    stops a run that would pass."""
    import numpy as np

    tol = 1 + 1e-9
    if targets.goodput is not None:
        need = count - math.ceil(targets.goodput * count - 1e-9) + 1
    else:
        need = count - math.floor(0.99 * (count - 1))
    limits = [(col, target * per_unit * tol + 1) for col, target in
              (("first_token", targets.ttft_p99), ("finish", targets.e2e_p99)) if target is not None]
    tpot = None if targets.tpot_p99 is None else targets.tpot_p99 * per_unit * tol
    if not limits and tpot is None:
        return None

    def lateness(cols, rows: slice, now: int) -> list:
        arrival = cols.arrival[rows]
        lates = []
        for col, limit in limits:
            at = getattr(cols, col)[rows]
            lates.append(((at >= 0) & (at - arrival > limit)) | ((at < 0) & (now - arrival > limit)))
        if tpot is not None:
            first, finish, out = cols.first_token[rows], cols.finish[rows], cols.output[rows]
            end = np.where(finish >= 0, finish, now)
            lates.append((first >= 0) & (out > 1) & (end - first > tpot * (out - 1) + 1))
        if targets.goodput is not None:
            lates = [np.logical_or.reduce(lates)]
        return lates

    settled = [0, None]  # rows before settled[0] have all finished: their counts, in settled[1], are final

    def stop(state) -> bool:
        cols, now = state.columns(), state.now
        start = settled[0]
        waiting = np.flatnonzero(cols.finish[start:] < 0)
        end = start + (int(waiting[0]) if len(waiting) else len(cols.finish) - start)
        if end > start:
            done = [int(x.sum()) for x in lateness(cols, slice(start, end), now)]
            settled[1] = done if settled[1] is None else [a + b for a, b in zip(settled[1], done)]
            settled[0] = end
        open_ = lateness(cols, slice(end, None), now)
        base = settled[1] or [0] * len(open_)
        return any(b + int(x.sum()) >= need for b, x in zip(base, open_))

    return stop
