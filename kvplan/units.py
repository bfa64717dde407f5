"""Byte sizes: parse "40GiB" / "12 GB" / "1e9", and print bytes with binary units."""

from __future__ import annotations

import math
import re

from kvplan.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int | float, *, field: str = "size") -> int:
    """Bytes from a number or a string with a unit (KB/MB/GB decimal, KiB/MiB/GiB binary)."""
    if isinstance(text, bool):
        raise UsageError(f"expected a size such as 40GiB, got {text!r}", field=field)
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        match = _SIZE.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise UsageError(f"expected a size such as 40GiB or 12GB, got {text!r}", field=field)
        value, unit = float(match.group(1)), match.group(2).lower()
    result = value * _UNITS[unit]
    if not math.isfinite(result):
        raise UsageError(f"expected a finite size, got {text!r}", field=field)
    if result < 1:
        raise UsageError(f"expected a size of at least 1 byte, got {text!r}", field=field)
    if result > 2**60:
        raise UsageError(f"size {text!r} is absurdly large (limit 1 EiB)", field=field)
    return int(result)


def format_bytes(n: float) -> str:
    """Human form with binary units: 131072 -> '128 KiB', 1073741824 -> '1 GiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.4g} {unit}" if value != int(value) else f"{int(value)} {unit}"
    return f"{int(n)} B"
