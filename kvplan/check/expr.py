"""Assertions of a check file: parse `metric op bound` and compare a value with it.

One regular expression parses an assertion and `operator` compares; no text from a check file is
ever evaluated.
"""

from __future__ import annotations

import json
import math
import operator
import re
from typing import Any

from kvplan.check.records import Check, Expect, Outcome, is_number, kind_of
from kvplan.errors import KvplanError
from kvplan.workload.yaml_nodes import YamlNode, as_str

OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
       ">": operator.gt, "<": operator.lt}  # fmt: skip
_PATH = r"[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*"
_EXPR = re.compile(rf"\s*(?P<metric>{_PATH})\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<bound>[^\s<>=!](?:.*\S)?)\s*")
METRIC = re.compile(_PATH)
_NUMBER = re.compile(r"[-+]?(\d+(_\d+)*(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
_INTEGER = re.compile(r"[-+]?\d+(_\d+)*")
_SIZE_TEXT = re.compile(r"\d[\d.]*\s*[KMGTP]i?B", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][\w./-]*")


def parse_expect(node: YamlNode) -> Expect:
    text = as_str(node)
    m = _EXPR.fullmatch(text)
    if m is None:
        raise node.error(f"expected 'metric op value' with op one of {', '.join(OPS)} "
                         f"(e.g. 'max_concurrency >= 40'), got {text!r}")  # fmt: skip
    bound = _bound(node, m["bound"])
    if m["op"] not in ("==", "!=") and not is_number(bound):
        raise node.error(f"{m['op']} needs a number, got {m['bound']!r}")
    return Expect(m["metric"], m["op"], bound, " ".join(text.split()), node.path, node.line)


def _bound(node: YamlNode, text: str) -> Any:
    """A number (1e3, 0.5, 130_800), a size (40GiB), true/false, or a string (quoted or one word)."""
    if text in ("true", "false"):
        return text == "true"
    if _NUMBER.fullmatch(text):
        try:
            value = int(text) if _INTEGER.fullmatch(text) else float(text)
        except ValueError:  # an integer of more digits than Python converts
            value = math.inf
        if isinstance(value, float) and not math.isfinite(value):
            raise node.error(f"expected a finite number, got {text[:40]!r}")
        return value
    if _SIZE_TEXT.fullmatch(text):
        from kvplan.units import parse_size

        try:
            return parse_size(text)
        except KvplanError as e:
            raise node.error(e.message) from None
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if _WORD.fullmatch(text) and text.lower() not in ("nan", "inf", "infinity", "null", "none"):
        return text
    raise node.error(f"expected a number, a size like 40GiB, true/false or a word, got {text!r}")


def threshold(check: Check, e: Expect, value: Any) -> Outcome:
    if value is None:
        return Outcome("expect", e.metric, e.op, e.bound, None, False, e.text, "no value (null)")
    if is_number(e.bound) != is_number(value) or isinstance(e.bound, bool) != isinstance(value, bool):
        raise check.error(f"{e.metric} is {kind_of(value)}; it cannot be compared with {json.dumps(e.bound)}",
                          e.key_path, e.line)  # fmt: skip
    return Outcome("expect", e.metric, e.op, e.bound, value, bool(OPS[e.op](value, e.bound)), e.text)
