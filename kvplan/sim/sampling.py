"""The downsampled timeline: point samples of the state at origin + k x delta.

A sample at time s records the step in progress at s (start <= s < end), or the idle pool. The
buffer holds at most `points - 1` samples: when it fills, every other sample is dropped and delta
doubles, so the kept samples stay on the coarser grid and any run ends with between points/2 and
points - 1 samples, evenly spaced, without knowing its length in advance. The fast engine's
kernel applies the same rule (`kernel.tl_record`).
"""

from __future__ import annotations

import numpy as np

from kvplan.sim.timing import StepClock

TIMELINE_POINTS = 2048


def initial_delta(clock: StepClock) -> int:
    """The finest spacing: one step, or one microsecond."""
    return 10**6 if clock.timed else 1


class TimelineSampler:
    """Collects samples; `record(start, end, state)` is called for every step and idle gap."""

    def __init__(self, origin: int, clock: StepClock, points: int = TIMELINE_POINTS):
        if points < 2 or points % 2:
            raise ValueError(f"timeline points must be an even number >= 2, got {points}")
        self.origin, self.delta, self.points = origin, initial_delta(clock), points
        self.rows: list[tuple[int, ...]] = []
        self.k = 0

    def record(self, start: int, end: int, state: tuple[int, ...]) -> None:
        """Sample `state` (running, waiting, then the five breakdown parts) inside [start, end)."""
        while self.origin + self.k * self.delta < end:
            when = self.origin + self.k * self.delta
            assert when >= start, "timeline sample skipped"
            self.rows.append((when, *state))
            self.k += 1
            if len(self.rows) == self.points:
                self.rows = self.rows[::2]
                self.delta *= 2
                self.k = len(self.rows)

    def array(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.int64).reshape(-1, 8)
