"""The column mapping of a generic CSV trace (format `csv`): which header names hold the arrival
time and the token counts, and the unit of the time column.

A serving log exported to CSV rarely has Azure's or Vidur's header; `csv` reads any header once
told its three columns. Timestamps are seconds (`s`, the default), milliseconds (`ms`),
microseconds (`us`) or date-times (`datetime`: ISO 8601 text such as `2024-05-01 12:00:03.25` or
`2024-05-01T12:00:03Z`, read as Azure's TIMESTAMP is). Epoch times work in any numeric unit:
arrivals count from the first row.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import UsageError

TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "datetime": None}  # seconds per unit
COLUMN_KEYS = ("timestamp", "prompt_tokens", "output_tokens")
MAX_COLUMN_NAME = 256  # characters of a header name


@dataclass(frozen=True, slots=True)
class TraceColumns:
    """Header names of the three columns a `csv` trace is read from, and the time column's unit."""

    timestamp: str = "timestamp"
    prompt_tokens: str = "prompt_tokens"
    output_tokens: str = "output_tokens"
    unit: str = "s"

    def __post_init__(self) -> None:
        names = self.names()
        for key, name in zip(COLUMN_KEYS, names):
            if not isinstance(name, str) or not name.strip() or len(name) > MAX_COLUMN_NAME:
                raise UsageError(f"expected a header name of 1 to {MAX_COLUMN_NAME} characters, got {name!r:.60}",
                                 field=f"trace.columns.{key}")
        if len(set(n.strip() for n in names)) < len(names):
            raise UsageError("expected three different columns, got " + ", ".join(names),
                             field="trace.columns")
        if self.unit not in TIMESTAMP_UNITS:
            raise UsageError(f"expected one of {', '.join(TIMESTAMP_UNITS)}, got {self.unit!r:.60}",
                             field="trace.timestamp_unit")

    def names(self) -> tuple[str, str, str]:
        return self.timestamp, self.prompt_tokens, self.output_tokens

    def layout(self) -> tuple[str, str, str]:
        """The header names as the CSV reader matches them (surrounding spaces dropped)."""
        return tuple(n.strip() for n in self.names())  # type: ignore[return-value]


__all__ = ["COLUMN_KEYS", "TIMESTAMP_UNITS", "TraceColumns"]
