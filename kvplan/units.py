"""Byte sizes: parse "40GiB" / "12 GB" / "1e9", and print bytes with binary units; token
counts the way vLLM reads them ("32k", "128K")."""

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


def parse_size(text: str | int | float, *, field: str = "size", require_unit: bool = False) -> int:
    """Bytes from a number or a string with a unit (KB/MB/GB decimal, KiB/MiB/GiB binary).

    With `require_unit` a bare number is refused (on a command line "20" is more likely 20 GiB
    than 20 bytes): the message says which unit to add."""
    if isinstance(text, bool):
        raise UsageError(f"expected a size such as 40GiB, got {text!r}", field=field)
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        match = _SIZE.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise UsageError(f"expected a size such as 40GiB or 12GB, got {text!r}", field=field)
        value, unit = float(match.group(1)), match.group(2).lower()
        if require_unit and unit in ("", "b") and value >= 1 and not match.group(2):
            number = match.group(1)
            raise UsageError(f"{number!r} has no unit; write {number}GiB (or {number}GB, {number}MiB; "
                             f"{number}B for bytes)", field=field)
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


_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)([kKmMgGtT]?)\s*$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_count(text: str | int, *, field: str, low: int = 1, high: int = 2**40) -> int:
    """A token count as vLLM's human_readable_int reads it: "32k" = 32,000 (lower case is
    decimal), "32K" = 32,768 (upper case is binary, whole numbers only), or a plain integer."""
    if isinstance(text, bool):
        raise UsageError(f"expected a number of tokens such as 8192 or 32k, got {text!r}", field=field)
    if isinstance(text, int):
        value = text
    else:
        match = _COUNT.match(str(text)) if len(str(text)) <= 40 else None  # no 5,000-digit parse
        if not match:
            raise UsageError(f"expected a number of tokens such as 8192, 32k (32,000) or 32K (32,768), "
                             f"got {str(text)[:40]!r}", field=field)
        number, suffix = match.groups()
        if suffix in _BINARY and "." in number:
            raise UsageError(f"decimals go with decimal suffixes only: {number}{suffix.lower()}, not "
                             f"{number}{suffix}", field=field)
        if "." in number and not suffix:
            raise UsageError(f"expected a whole number of tokens, got {text!r}", field=field)
        scale = _DECIMAL.get(suffix) or _BINARY.get(suffix) or 1
        value = int(float(number) * scale) if "." in number else int(number) * scale
    if not low <= value <= high:
        top = f"2^{high.bit_length() - 1}" if high & (high - 1) == 0 else f"{high:,}"
        raise UsageError(f"expected an integer from {low} to {top} tokens, got {value:,}", field=field)
    return value
