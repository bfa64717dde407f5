"""Safe YAML reading that remembers where every value came from.

`load_yaml(path)` returns a `YamlMap`: a mapping whose values are nodes that know their dotted
path ("requests.prompt.mean") and line, with typed getters that raise one located error
(`WorkloadError` by default) such as
``workload.yaml:7: requests.prompt.mean: expected a number > 0, got -3``.

Nothing is ever executed: the text is parsed with PyYAML's safe parser into a node graph
(`yaml.compose`), and only the plain tags (mapping, list, string, integer, float, boolean, null)
are turned into values. Limits keep hostile files cheap: a size cap, a cap on the number of values
after alias expansion and on alias uses (a "billion laughs" file fails after about a thousand
steps), a depth cap, and recursive aliases are refused. Duplicate keys, merge keys (``<<``),
non-string keys, NaN and infinity, booleans where numbers are expected and unknown keys
(`YamlMap.finish`) are errors. A later `kvplan check` reader reuses all of this.
"""

from __future__ import annotations

import os

import difflib
import math
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from kvplan.errors import KvplanError, WorkloadError
from kvplan.workload.checks import bounds_text
from kvplan.fileio import decode, expand, input_path, read_limited
from kvplan.units import parse_count, parse_size

MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_NODES = 1_000_000  # values after alias expansion
MAX_ALIAS_USES = 1_000
MAX_DIGITS = 40  # characters of one integer: 2^63 has 19 digits, so far more is never a count
MAX_DEPTH = 64

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_FLOAT_TEXT = re.compile(r"[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?$")
_MISSING = object()


class YamlNode:
    """One value of the document with its location; subclasses hold scalars, lists and mappings."""

    __slots__ = ("path", "line", "file", "error_cls")

    def __init__(self, path: str, line: int, file: str | None, error_cls: type[KvplanError]):
        self.path, self.line, self.file, self.error_cls = path, line, file, error_cls

    def error(self, message: str) -> KvplanError:
        """An error located at this node (returned, for the caller to raise)."""
        return self.error_cls(message, file=self.file, field=self.path or None, line=self.line)

    def describe(self) -> str:
        raise NotImplementedError

    def to_python(self) -> Any:
        raise NotImplementedError


class YamlScalar(YamlNode):
    """A string, integer, float, boolean or null, with its source text."""

    __slots__ = ("value", "text", "plain")

    def __init__(self, value: Any, text: str, plain: bool, *loc):
        super().__init__(*loc)
        self.value, self.text, self.plain = value, text, plain

    def describe(self) -> str:
        v = self.value
        if v is None:
            return "nothing (null)"
        if isinstance(v, bool):
            return f"{self.text} (a boolean)"
        if isinstance(v, str):
            return f"{v!r} (a string)"
        return self.text

    def to_python(self) -> Any:
        return self.value


class YamlList(YamlNode):
    """A YAML sequence of nodes."""

    __slots__ = ("items",)

    def __init__(self, items: list[YamlNode], *loc):
        super().__init__(*loc)
        self.items = items

    def describe(self) -> str:
        return "a list"

    def to_python(self) -> list:
        return [item.to_python() for item in self.items]

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


class YamlMap(YamlNode):
    """A YAML mapping with string keys; getters record what was asked, `finish` rejects the rest."""

    __slots__ = ("entries", "key_lines", "asked")

    def __init__(self, entries: dict[str, YamlNode], key_lines: dict[str, int], *loc):
        super().__init__(*loc)
        self.entries, self.key_lines, self.asked = entries, key_lines, set()

    def describe(self) -> str:
        return "a mapping"

    def to_python(self) -> dict:
        return {k: v.to_python() for k, v in self.entries.items()}

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def keys(self) -> list[str]:
        return list(self.entries)

    def child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def node(self, key: str, default: Any = _MISSING) -> Any:
        """The node under `key`; `default` when absent, or an error if required (no default)."""
        self.asked.add(key)
        if key in self.entries:
            return self.entries[key]
        if default is _MISSING:
            raise self.error_cls(
                "required key missing",
                file=self.file, field=self.child_path(key), line=self.line,
            )  # fmt: skip
        return default

    def _get(self, key, default, convert, *args, **kwargs):
        node = self.node(key, default)
        return convert(node, *args, **kwargs) if isinstance(node, YamlNode) else node

    def get_int(self, key, default=_MISSING, **bounds) -> int:
        return self._get(key, default, as_int, **bounds)

    def get_count(self, key, default=_MISSING, **bounds) -> int:
        return self._get(key, default, as_count, **bounds)

    def get_float(self, key, default=_MISSING, **bounds) -> float:
        return self._get(key, default, as_float, **bounds)

    def get_str(self, key, default=_MISSING) -> str:
        return self._get(key, default, as_str)

    def get_bool(self, key, default=_MISSING) -> bool:
        return self._get(key, default, as_bool)

    def get_input_path(self, key: str, base_dir: Path, *, folder_ok: bool = False) -> Path:
        """A file this value names, relative to `base_dir`, opened the one way (kvplan/fileio.py):
        it must exist and be a regular file (or a folder, with folder_ok); errors are located
        at this value's line."""
        raw = self.get_str(key)
        try:
            path = base_dir / expand(raw, WorkloadError)
            checked = input_path(path, WorkloadError, folder_ok=folder_ok)
        except KvplanError as exc:
            raise self.node(key).error(f"{exc.message}: {exc.file or raw}") from None
        return Path(os.path.realpath(checked))

    def get_choice(self, key, choices: Iterable[str], default=_MISSING) -> str:
        return self._get(key, default, as_choice, choices)

    def get_size(self, key, default=_MISSING, **bounds) -> int:
        return self._get(key, default, as_size, **bounds)

    def get_map(self, key, default=_MISSING) -> "YamlMap":
        return self._get(key, default, as_map)

    def get_list(self, key, default=_MISSING) -> YamlList:
        return self._get(key, default, as_list)

    def exactly_one(self, *keys: str) -> str:
        """The one of `keys` present; an error when none or several are."""
        present = [k for k in keys if k in self.entries]
        if len(present) == 1:
            return present[0]
        names = ", ".join(keys)
        if not present:
            raise self.error(f"needs exactly one of: {names}")
        raise self.error_cls(
            f"give only one of: {names} (found {', '.join(present)})",
            file=self.file, field=self.child_path(present[1]), line=self.key_lines[present[1]],
        )  # fmt: skip

    def expect_keys(self, *allowed: str) -> None:
        """Raise for the first key not in `allowed`, suggesting the nearest allowed key."""
        for key in self.entries:
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                extra = (f"did you mean {hint[0]!r}?" if hint else
                         f"expected {', '.join(allowed)}" if allowed else "no keys are taken here")
                raise self.error_cls(
                    f"unknown key {key!r}; {extra}",
                    file=self.file, field=self.child_path(key), line=self.key_lines[key],
                )  # fmt: skip

    def finish(self) -> None:
        """Raise for the first key that no getter asked for (see `expect_keys`)."""
        self.expect_keys(*sorted(self.asked))


# ---- typed conversions of one node ---------------------------------------------------------


def _check_bounds(node: YamlNode, value, kind: str, ge=None, gt=None, le=None, lt=None):
    bad = (
        (ge is not None and value < ge) or (gt is not None and value <= gt)
        or (le is not None and value > le) or (lt is not None and value >= lt)
    )  # fmt: skip
    if bad:
        raise node.error(f"expected {bounds_text(kind, ge, gt, le, lt)}, got {_show(node)}")
    return value


def _show(node: YamlNode) -> str:
    return node.describe()


MAX_NUMBER = 2**63


def _number(node: YamlNode, kind: str, bounds: dict) -> int | float:
    want = bounds_text(kind, **bounds)
    if not isinstance(node, YamlScalar) or isinstance(node.value, bool) or node.value is None:
        raise node.error(f"expected {want}, got {node.describe()}")
    value = node.value
    if isinstance(value, str):  # YAML 1.1 reads 1e3 as text; accept an unquoted number like it
        if not (node.plain and _FLOAT_TEXT.match(value) and any(c.isdigit() for c in value)):
            raise node.error(f"expected {want}, got {node.describe()}")
        value = float(value.replace("_", ""))
    if isinstance(value, float) and not math.isfinite(value):
        raise node.error(f"expected {want}, got {node.text} (not a finite number)")
    if abs(value) > MAX_NUMBER:
        raise node.error(f"expected {want}, got {node.text[:40]} (absurdly large; the limit is 2^63)")
    return value


def as_int(node: YamlNode, **bounds) -> int:
    """An integer (`ge`/`gt`/`le`/`lt` bounds); 1e6 or 2.0 is accepted when exactly integral."""
    value = _number(node, "an integer", bounds)
    if isinstance(value, float):
        if not value.is_integer():
            raise node.error(f"expected {bounds_text('an integer', **bounds)}, got {node.text}")
        value = int(value)
    return _check_bounds(node, value, "an integer", **bounds)


def as_float(node: YamlNode, **bounds) -> float:
    """A finite number (integers accepted) within the given bounds; -0.0 reads as 0.0."""
    return float(_check_bounds(node, _number(node, "a number", bounds), "a number", **bounds)) + 0.0


def as_str(node: YamlNode) -> str:
    if isinstance(node, YamlScalar) and isinstance(node.value, str):
        return node.value
    raise node.error(f"expected a string, got {node.describe()}")


def as_bool(node: YamlNode) -> bool:
    if isinstance(node, YamlScalar) and isinstance(node.value, bool):
        return node.value
    raise node.error(f"expected true or false, got {node.describe()}")


def as_choice(node: YamlNode, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if isinstance(node, YamlScalar) and isinstance(node.value, str) and node.value in choices:
        return node.value
    raise node.error(f"expected one of {', '.join(choices)}, got {node.describe()}")


def as_size(node: YamlNode, **bounds) -> int:
    """A byte count: an integer, or text with a unit as `kvplan.units.parse_size` reads it
    ("16GiB", "4 GB", "512MiB"; KB..TB decimal, KiB..TiB binary)."""
    if isinstance(node, YamlScalar) and isinstance(node.value, str):
        try:
            value = parse_size(node.value)
        except KvplanError as e:
            raise node.error(e.message) from None
        return _check_bounds(node, value, "a size in bytes", **bounds)
    return as_int(node, **bounds)


def as_count(node: YamlNode, **bounds) -> int:
    """A token count: an integer, or text as the command line and vLLM read it ("8k" = 8,000,
    "8K" = 8,192; `kvplan.units.parse_count`)."""
    if isinstance(node, YamlScalar) and isinstance(node.value, str):
        try:
            value = parse_count(node.value, field=node.path, low=0, high=2**62)
        except KvplanError as e:
            raise node.error(e.message) from None
        return _check_bounds(node, value, "a number of tokens", **bounds)
    return as_int(node, **bounds)


def as_map(node: YamlNode) -> YamlMap:
    if isinstance(node, YamlMap):
        return node
    raise node.error(f"expected a mapping, got {node.describe()}")


def as_list(node: YamlNode) -> YamlList:
    if isinstance(node, YamlList):
        return node
    raise node.error(f"expected a list, got {node.describe()}")


# ---- reading ------------------------------------------------------------------------------


class _Builder:
    """Turns a composed node graph into YamlNodes, counting expansions so bombs fail fast."""

    _constructor = yaml.constructor.SafeConstructor()

    def __init__(self, file: str | None, error_cls: type[KvplanError]):
        self.file, self.error_cls = file, error_cls
        self.seen: set[int] = set()
        self.active: set[int] = set()
        self.nodes = self.alias_uses = 0

    def fail(self, message: str, line: int | None, path: str = "") -> KvplanError:
        return self.error_cls(message, file=self.file, field=path or None, line=line)

    def build(self, node, path: str, depth: int) -> YamlNode:
        line = node.start_mark.line + 1
        if id(node) in self.active:
            raise self.fail("recursive YAML alias", line, path)
        if id(node) in self.seen:
            self.alias_uses += 1
            if self.alias_uses > MAX_ALIAS_USES:
                raise self.fail(f"more than {MAX_ALIAS_USES} alias expansions", line, path)
        self.seen.add(id(node))
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(f"more than {MAX_NODES} values (after alias expansion)", line, path)
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", line, path)
        loc = (path, line, self.file, self.error_cls)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, loc)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode) and node.tag == _TAG + "seq":
                items = [self.build(n, f"{path}[{i}]", depth + 1) for i, n in enumerate(node.value)]
                return YamlList(items, *loc)
            if isinstance(node, yaml.MappingNode) and node.tag == _TAG + "map":
                return self.mapping(node, path, depth, loc)
        finally:
            self.active.discard(id(node))
        raise self.fail(f"unsupported YAML tag {node.tag}", line, path)

    def scalar(self, node, loc) -> YamlScalar:
        tag, text = node.tag, node.value
        plain = node.style in (None, "")
        if tag in (_TAG + "str", _TAG + "timestamp"):
            value: Any = text
        elif tag == _TAG + "null":
            value = None
        elif tag in (_TAG + "bool", _TAG + "int", _TAG + "float"):
            if ":" in text:
                message = f"sexagesimal number {text!r}: quote it or write it plainly"
                raise self.fail(message, loc[1], loc[0])
            if tag == _TAG + "int" and len(text) > MAX_DIGITS:
                message = f"expected a number of at most {MAX_DIGITS} digits, got one of {len(text):,}"
                raise self.fail(message, loc[1], loc[0])
            value = self._constructor.construct_object(node)
        else:
            raise self.fail(f"unsupported YAML tag {tag}", loc[1], loc[0])
        return YamlScalar(value, text, plain, *loc)

    def mapping(self, node, path: str, depth: int, loc) -> YamlMap:
        entries: dict[str, YamlNode] = {}
        key_lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _TAG + "merge":
                raise self.fail("merge keys (<<) are not supported", key_line, path)
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == _TAG + "str"):
                raise self.fail(f"keys must be strings, got {key_node.value!r}", key_line, path)
            key = key_node.value
            child = f"{path}.{key}" if path else key
            if key in entries:
                raise self.fail(f"duplicate key {key!r} (first at line {key_lines[key]})",
                                key_line, child)  # fmt: skip
            key_lines[key] = key_line
            entries[key] = self.build(value_node, child, depth + 1)
        return YamlMap(entries, key_lines, *loc)


def load_yaml_text(
    text: str, *, file: str | Path | None = None, error_cls: type[KvplanError] = WorkloadError
) -> YamlMap:
    """Parse YAML text whose top level must be a mapping; see the module docstring for the rules."""
    name = str(file) if file is not None else None
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise error_cls(f"invalid YAML: {e.problem or e.context}", file=name, line=line) from None
    except yaml.YAMLError as e:
        raise error_cls(f"invalid YAML: {e}", file=name) from None
    except RecursionError:
        raise error_cls("invalid YAML: nested too deeply", file=name) from None
    if root is None:
        raise error_cls("the file is empty", file=name)
    node = _Builder(name, error_cls).build(root, "", 0)
    if not isinstance(node, YamlMap):
        raise node.error(f"expected a mapping of keys at the top level, got {node.describe()}")
    return node


def load_yaml(path: str | Path, *, error_cls: type[KvplanError] = WorkloadError) -> YamlMap:
    """Read a YAML file (at most MAX_FILE_BYTES, UTF-8) into a located `YamlMap`."""
    path = expand(path, error_cls)
    text = decode(read_limited(path, MAX_FILE_BYTES, error_cls), path, error_cls)
    return load_yaml_text(text, file=path, error_cls=error_cls)
