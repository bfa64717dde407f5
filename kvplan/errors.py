"""The error hierarchy: every user-facing failure is a KvplanError that names where it came from.

The CLI turns any KvplanError into one line on stderr and exit code 2; set KVPLAN_DEBUG=1 to see
the traceback instead. A line is at most MAX_MESSAGE characters (a huge value is cut in the
middle), and characters a terminal would not print are shown as escapes (kvplan/text.py, the one
sanitiser of displayed text).
"""

from __future__ import annotations

from pathlib import Path

from kvplan.text import MAX_MESSAGE, cut  # noqa: F401  (MAX_MESSAGE: the limit of an error line)


class KvplanError(Exception):
    """A problem with the user's input, located by file, field and line where known."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        field: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = str(file) if file is not None else None
        self.field = field
        self.line = line

    def located(self, *, file=None, field=None, line=None) -> "KvplanError":
        """Fill in location details that a lower layer did not know; returns self."""
        if self.file is None and file is not None:
            self.file = str(file)
        if self.field is None and field is not None:
            self.field = field
        if self.line is None and line is not None:
            self.line = line
        return self

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line is not None else "") + ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        field = f"{self.field}: " if self.field else ""
        return cut(" ".join(f"{where}{field}{self.message}".split()))


class ConfigError(KvplanError):
    """A model config.json that cannot be read or lacks a needed field."""


class ModelNotFoundError(KvplanError):
    """A model argument that no source (path, catalog, cache, hub) could resolve."""


class WorkloadError(KvplanError):
    """A workload or check file with a bad key, type or value."""


class TraceError(KvplanError):
    """A request trace with a bad row or column."""


class UsageError(KvplanError):
    """A bad command-line option value."""
