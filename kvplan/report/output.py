"""One output object for every command: human (rich) or machine (JSON), never bare print calls."""

from __future__ import annotations

import json
import math
import os
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


MAX_COLUMNS = 99_999  # a larger $COLUMNS or $LINES is no terminal (and 5,000 digits do not parse)


def _size_variable(value: str | None) -> bool:
    """Whether $COLUMNS or $LINES holds a size rich may use: a whole number from 1 to MAX_COLUMNS.
    rich takes any digits: 0 prints nothing at all, and '²' (a digit to str.isdigit) raises."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value.lstrip("0")) > len(str(MAX_COLUMNS)):
        return False
    return 0 < int(value) <= MAX_COLUMNS


def console(stderr: bool = False):
    """The console of every human output: no highlighting, no :emoji: codes (a name holding
    `:smile:` prints as written), and a $COLUMNS or $LINES that is 0, negative or not a number
    treated as unset (rich then measures the terminal, or takes 80 columns on a pipe)."""
    from rich.console import Console

    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES") or _size_variable(v)}
    return Console(highlight=False, emoji=False, stderr=stderr, _environ=environ)


def _natural(col) -> int:
    """The width of a column's longest cell or header, plus padding 2 and border 1."""
    return max([len(str(c)) for c in col._cells] + [len(str(col.header))]) + 3


def _longest_word(col) -> int:
    return max((len(word) for text in (*map(str, col._cells), str(col.header)) for word in text.split()), default=1)


def print_table(out, table, wrap: tuple[str, ...] = ()) -> None:
    """Print a rich Table without cutting a header or a number.

    Every column is kept whole (no wrapping), but those whose header is in `wrap` (labels and
    prose) and, in a table of two columns (a label and its value), the first: these wrap at their
    spaces, never inside a word. When the table does not fit the console (a pipe is 80 columns,
    or $COLUMNS), its wrapping columns wrap; a table without one is folded into several tables
    side by side in reading order, each repeating the first (label) column. A table that cannot
    fit even so is printed as wide as it needs: a longer line, never a cut number."""
    columns = table.columns
    widths = [_natural(col) for col in columns]
    wrapping = [i for i, col in enumerate(columns) if str(col.header) in wrap] or ([0] if len(columns) <= 2 else [])
    whole = [i for i in range(len(columns)) if i not in wrapping]
    for i in whole:
        columns[i].no_wrap, columns[i].min_width = True, widths[i] - 3
    if sum(widths) + 1 <= out.width:
        for i in wrapping:
            columns[i].no_wrap, columns[i].min_width = True, widths[i] - 3
        _print_at_least(out, table, sum(widths) + 1)
        return
    if wrapping:
        room = out.width - 1 - sum(widths[i] for i in whole) - 3 * len(wrapping)
        natural = sum(widths[i] - 3 for i in wrapping)
        for i in wrapping:  # the room shared in proportion to their text, each at least its longest word
            share = room * (widths[i] - 3) // natural
            columns[i].width = max(_longest_word(columns[i]), min(widths[i] - 3, share))
        _print_at_least(out, table, sum(widths[i] for i in whole) + sum(columns[i].width + 3 for i in wrapping) + 1)
        return
    from rich.table import Table

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
        part = Table(title=table.title if n == 0 else None, title_justify=table.title_justify,
                     show_header=table.show_header)
        for i in (0, *group):
            col = columns[i]
            part.add_column(col.header, justify=col.justify, no_wrap=True, min_width=widths[i] - 3)
        for r in range(rows):
            part.add_row(*(columns[i]._cells[r] for i in (0, *group)))
        _print_at_least(out, part, sum(widths[i] for i in (0, *group)) + 1)


def _print_at_least(out, table, width: int) -> None:
    """Print `table` on a console at least `width` columns wide (rich would cut a wider table to
    the console's width: the columns kept whole would lose their last characters)."""
    if width <= out.width:
        out.print(table)
        return
    saved = out.width
    out.width = width
    try:
        out.print(table)
    finally:
        out.width = saved
