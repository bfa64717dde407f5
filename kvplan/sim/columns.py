"""What both serving engines' states share (engine.KernelState for vLLM's scheduler,
sglang_state.SglangState for SGLang's): the per-request columns a caller reads of a run in
progress, the growth of their tables, and how many kernel events run between progress reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EVENTS_PER_CALL = 200_000  # kernel events between progress reports


def grown(a: np.ndarray, size: int, fill: int) -> np.ndarray:
    """`a` if it holds `size` items, else a copy at least twice as long, padded with `fill`."""
    if size <= len(a):
        return a
    out = np.full(max(2 * len(a), size), fill, dtype=np.int64)
    out[:len(a)] = a
    return out


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """Per loaded request, views (not copies) of the engine's table, in ticks; -1: not yet."""

    arrival: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    output: np.ndarray
