"""The one progress bar of the commands: rich, on stderr, only on a terminal (on a pipe or in a log
a bar is noise, and an error must stay one line), and only once a run has lasted `delay_s`."""

from __future__ import annotations

import sys
import time


class StderrBar:
    """`update(completed)` moves the bar (with its ETA) towards `total`; use it as a context manager."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, delay_s: float = 0.0) -> None:
        self.label, self.total = label, max(total, 1)
        self.enabled = enabled and sys.stderr.isatty()
        self.delay_s, self.start = delay_s, time.monotonic()
        self.bar = self.task = None

    def __enter__(self) -> "StderrBar":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def set_total(self, total: int) -> None:
        """A new total (a run that learns how much work it has as it goes)."""
        self.total = max(total, 1)
        if self.bar is not None:
            self.bar.update(self.task, total=self.total)

    def report(self, completed: int, total: int) -> None:
        """`update` as a `progress(done, total)` hook."""
        if total != self.total:
            self.set_total(total)
        self.update(completed)

    def update(self, completed: int) -> None:
        if not self.enabled or time.monotonic() - self.start < self.delay_s:
            return
        if self.bar is None:
            from rich.progress import Progress

            from kvplan.report.output import console

            self.bar = Progress(console=console(stderr=True), transient=True)
            self.task = self.bar.add_task(self.label, total=self.total)
            self.bar.start()
        self.bar.update(self.task, completed=min(completed, self.total))
