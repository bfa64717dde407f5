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


def print_table(out, table) -> None:
    """Print a rich Table without cutting a header or a number: when its columns do not fit the
    console (a pipe is 80 columns, or $COLUMNS), it is folded into several tables side by side
    in reading order, each repeating the first (label) column; no header or cell is cut."""
    from rich.table import Table

    columns = table.columns
    widths = []
    for col in columns:
        cells = [str(c) for c in col._cells]
        header = str(col.header)
        widths.append(max([len(c) for c in cells] + [len(header)]) + 3)  # padding 2, border 1
    if sum(widths) + 1 <= out.width or len(columns) <= 2:
        for col, width in zip(columns, widths):
            col.no_wrap, col.min_width = True, width - 3
        out.print(table)
        return
    groups, current, used = [], [], widths[0] + 1
    for i in range(1, len(columns)):
        if current and used + widths[i] > out.width:
            groups.append(current)
            current, used = [], widths[0] + 1
        current.append(i)
        used += widths[i]
    groups.append(current)
    rows = len(columns[0]._cells)
    for n, group in enumerate(groups):
        part = Table(title=table.title if n == 0 else None, title_justify=table.title_justify)
        for i in (0, *group):
            col = columns[i]
            part.add_column(col.header, justify=col.justify, no_wrap=True, min_width=widths[i] - 3)
        for r in range(rows):
            part.add_row(*(columns[i]._cells[r] for i in (0, *group)))
        out.print(part)
