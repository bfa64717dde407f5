"""The checks records make of their own values, worded as every reader words them.

A record raises `WorkloadError` with the field relative to itself (`max_num_seqs`); whoever made
it (the YAML reader, a flag, a plan configuration) says where that field came from.
"""

from __future__ import annotations

from kvplan.errors import WorkloadError


def fail(where: str, message: str) -> WorkloadError:
    """A WorkloadError about `where` (a field relative to the record; the reader locates it)."""
    return WorkloadError(message, field=where or None)


def bounds_text(kind: str, ge=None, gt=None, le=None, lt=None) -> str:
    """`an integer >= 1 and <= 4096`: the words of a bound, as every reader says it."""
    pairs = ((">=", ge), (">", gt), ("<=", le), ("<", lt))
    parts = [f"{op} {v:g}" if isinstance(v, float) else f"{op} {v}" for op, v in pairs if v is not None]
    return f"{kind} {' and '.join(parts)}".strip()


def check_int(value, where: str, *, ge=None, gt=None, le=None, lt=None, optional: bool = False) -> None:
    """An int (not a bool) within the bounds; None only when `optional`."""
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail(where, f"expected {bounds_text('an integer', ge, gt, le, lt)}, got {value!r}")
    _check_bounds(value, where, "an integer", ge, gt, le, lt)


def check_float(value, where: str, *, ge=None, gt=None, le=None, lt=None, optional: bool = False) -> None:
    """A finite int or float (not a bool) within the bounds; None only when `optional`."""
    if value is None and optional:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value in (
            float("inf"), float("-inf")):
        raise fail(where, f"expected {bounds_text('a number', ge, gt, le, lt)}, got {value!r}")
    _check_bounds(value, where, "a number", ge, gt, le, lt)


def _check_bounds(value, where, kind, ge, gt, le, lt) -> None:
    bad = ((ge is not None and value < ge) or (gt is not None and value <= gt)
           or (le is not None and value > le) or (lt is not None and value >= lt))
    if bad:
        raise fail(where, f"expected {bounds_text(kind, ge, gt, le, lt)}, got {value!r}")


def check_choice(value, choices, where: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value not in choices:
        raise fail(where, f"expected one of {', '.join(choices)}, got {value!r}")


def check_bool(value, where: str) -> None:
    if not isinstance(value, bool):
        raise fail(where, f"expected true or false, got {value!r}")


def check_text(value, where: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        raise fail(where, f"expected a non-empty string, got {value!r}")
