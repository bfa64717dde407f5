"""Finding an assertion's value in the document a check's command prints.

`select` picks one entry of a simulate document's `results`; a metric is a dotted path with list
indexes into that entry, falling back to the document's top level.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from kvplan.check.records import Check, kind_of

_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]")


def select_entry(check: Check, doc: dict) -> dict:
    if check.select is None:
        return doc
    entries = doc.get("results")
    line, here = check.option_lines.get("select", check.line), f"{check.key_path}.select"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise check.error("this document has no list of results to select from", here, line)
    known = {k for e in entries for k in e}
    for key in check.select:
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            extra = f"did you mean {hint[0]!r}?" if hint else f"expected one of {', '.join(sorted(known))}"
            raise check.error(f"unknown key {key!r}; {extra}", f"{here}.{key}", line)
    found = [e for e in entries if all(_same(e.get(k), v) for k, v in check.select.items())]
    if len(found) != 1:
        labels = ", ".join(str(e.get("label", i)) for i, e in enumerate(found or entries))
        what = "no entry" if not found else f"{len(found)} entries"
        raise check.error(f"{what} of results match {_show_select(check.select)} "
                          f"({'entries' if not found else 'matching'}: {labels}); select exactly one",
                          here, line)  # fmt: skip
    return found[0]


def _show_select(select: dict) -> str:
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in select.items()) + "}"


def _same(a: Any, b: Any) -> bool:
    """Equality that keeps booleans apart from numbers (true is not 1)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def lookup(check: Check, target: dict, doc: dict, metric: str, where: str, line: int) -> Any:
    """A dotted path into the selected entry, falling back to the whole document's top level."""
    steps = [m[1] if m[1] is not None else int(m[2]) for m in _STEP.finditer(metric)]
    if target is not doc and isinstance(steps[0], str) and steps[0] not in target and steps[0] in doc:
        target = doc
    value: Any = target
    for i, step in enumerate(steps):
        sofar = metric_path(steps[:i]) or "the result"
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                size = f"a list of {len(value)}" if isinstance(value, list) else kind_of(value)
                raise check.error(f"{sofar} is {size}; [{step}] does not exist", where, line)
        elif not isinstance(value, dict) or step not in value:
            keys = sorted(value) if isinstance(value, dict) else []
            hint = difflib.get_close_matches(step, keys, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else (f"; it has {', '.join(keys)}" if keys else "")
            raise check.error(f"no key {step!r} in {sofar} of this {check.kind} run{extra}",
                              where, line)  # fmt: skip
        value = value[step]
    if isinstance(value, (dict, list)):
        inner = f"; name one of its keys: {', '.join(value)}" if isinstance(value, dict) else "; index it"
        raise check.error(f"{metric} is {kind_of(value)}{inner}", where, line)
    return value


def metric_path(steps: list) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else (f".{s}" if i else s) for i, s in enumerate(steps))
