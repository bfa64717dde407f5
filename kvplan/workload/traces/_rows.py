"""Shared pieces of the trace readers: the parsed-rows record and number parsing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvplan.workload.chunks import MAX_TOKENS

MOONCAKE_BLOCK = 512
MAX_JSON_BYTES = 1 << 30  # a whole-document JSON trace (sharegpt .json, one agentic file)

@dataclass(frozen=True, slots=True, eq=False)
class _Rows:
    """A parsed trace as arrays; `where(i)` locates row i for an error message."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    where: Callable[[int], dict]
    hash_ids: list[tuple[int, ...]] | None = None
    block_size: int = 0
    hash_partial: bool = True  # the last, partial block has an id (mooncake) or not (agentic)
    cut: np.ndarray | None = None  # per row: True where max_model_len cut the prompt or output




def _int_or_none(text) -> int | None:
    """An integer from text or JSON (an integral float like 12.0 counts); None if not one."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    try:
        return int(text)
    except (TypeError, ValueError):
        try:
            v = float(text)
        except (TypeError, ValueError):
            return None
        return int(v) if v.is_integer() else None


def _field_int(entry: dict, key: str, lo: int, fail) -> int:
    """entry[key] as an integer from lo to MAX_TOKENS, or fail(key, why)."""
    v = entry.get(key) if isinstance(entry, dict) else None
    n = _int_or_none(v) if isinstance(v, (int, float)) and abs(v) <= 2**62 else None
    if n is None or not lo <= n <= MAX_TOKENS:
        shown = json.dumps(v) if not isinstance(v, (int, float)) or abs(v) <= 2**62 else "a larger number"
        raise fail(key, f"expected an integer >= {lo} and at most {MAX_TOKENS:,}, got {shown[:40]}")
    return n
