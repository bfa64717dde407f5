"""One output object for every command: human (rich) or machine (JSON), never bare print calls."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe copy: floats rounded to 12 significant digits, NaN/inf as null, tuples as lists."""
    if isinstance(value, float):
        return float(f"{value:.12g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def dumps(obj: Any) -> str:
    """Deterministic JSON: the same object always gives the same bytes."""
    return json.dumps(_clean(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj))


def console():
    from rich.console import Console

    return Console(highlight=False)
