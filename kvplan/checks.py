"""`kvplan check`: CI regression checks on the numbers kvplan prints (schema: workloads/CHECKS.md).

A check file lists named checks. Each runs `size` or `simulate` and gets the very dict their
`--json` prints; a simulate check may `select` one entry of the document's `results`. Assertions
are thresholds (``max_concurrency >= 40``) and comparisons with a stored baseline within a
tolerance. An assertion is parsed by one regular expression and compared with `operator`; no text
from a check file is ever evaluated. A bad check file, workload or baseline is a KvplanError
(exit 2); a failed assertion is an outcome (exit 1 in the CLI).
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError, WorkloadError
from kvplan.sim.yamlio import YamlList, YamlMap, YamlNode, YamlScalar, as_int, as_map, as_str, load_yaml

OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
       ">": operator.gt, "<": operator.lt}  # fmt: skip
FAIL_ON = ("change", "drop", "rise")
BASELINE_FORMAT = 1
MAX_BASELINE_BYTES = 10 * 1024 * 1024
SIZE_KEYS = ("model", "tokens", "kv_dtype", "tp", "batch", "gpu", "gpu_memory_utilization",
             "kv_memory", "block_size")  # fmt: skip
_PATH = r"[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*(?:\[\d+\])*)*"
_EXPR = re.compile(rf"\s*(?P<metric>{_PATH})\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<bound>[^\s<>=!](?:.*\S)?)\s*")
_METRIC = re.compile(_PATH)
_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]")
_NUMBER = re.compile(r"[-+]?(\d+(_\d+)*(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
_INTEGER = re.compile(r"[-+]?\d+(_\d+)*")
_SIZE_TEXT = re.compile(r"\d[\d.]*\s*[KMGTP]i?B", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z][\w./-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")


@dataclass(frozen=True, slots=True)
class Expect:
    """A threshold, `metric op bound`, as written at `line`."""

    metric: str
    op: str
    bound: Any  # int | float | bool | str
    text: str
    key_path: str  # where in the check file, e.g. checks[0].expect[1]
    line: int


@dataclass(frozen=True, slots=True)
class Tracked:
    """A metric compared with the baseline: allowed = max(abs_tol, rel_tol x |baseline|)."""

    metric: str
    rel_tol: float
    abs_tol: float
    fail_on: str  # change | drop | rise
    key_path: str
    line: int


@dataclass(frozen=True, slots=True, eq=False)
class Check:
    """One validated check: what to run (`options` of size or simulate) and what to assert."""

    name: str
    kind: str  # size | simulate
    options: dict
    select: dict | None
    expects: tuple[Expect, ...]
    tracked: tuple[Tracked, ...]
    file: str
    key_path: str  # checks[i]
    line: int
    option_lines: dict  # line of each key of the size/simulate mapping, and of select

    def error(self, message: str, key_path: str | None = None, line: int | None = None) -> KvplanError:
        """An error in this check, at `key_path` and `line` (default: the check's own)."""
        return WorkloadError(message, file=self.file, field=key_path or self.key_path, line=line or self.line)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One assertion's result: a threshold (`kind` expect) or a baseline comparison."""

    kind: str
    metric: str
    op: str
    bound: Any  # the threshold, or the baseline value
    value: Any
    passed: bool
    text: str
    detail: str = ""
    tolerance: float | None = None  # baseline comparisons: the allowed difference

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "metric": self.metric, "op": self.op, "bound": self.bound,
               "value": self.value, "passed": self.passed, "text": self.text, "detail": self.detail}
        if self.kind == "baseline":
            out["tolerance"] = self.tolerance
        return out


@dataclass(frozen=True, slots=True, eq=False)
class CheckResult:
    name: str
    kind: str
    outcomes: tuple[Outcome, ...]
    tracked: dict  # baseline metric -> this run's value

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)


@dataclass(frozen=True, slots=True)
class CheckReport:
    file: str
    baseline: str | None  # the baseline compared with, if any
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def outcomes(self) -> list[tuple[str, Outcome]]:
        return [(r.name, o) for r in self.results for o in r.outcomes]

    def to_dict(self) -> dict:
        failed = [o for _, o in self.outcomes if not o.passed]
        return {"file": self.file, "baseline": self.baseline, "passed": self.passed,
                "num_checks": len(self.results), "num_assertions": len(self.outcomes),
                "num_failed": len(failed),
                "checks": [{"name": r.name, "kind": r.kind, "passed": r.passed,
                            "assertions": [o.to_dict() for o in r.outcomes]} for r in self.results]}

    def baseline_document(self) -> dict:
        """What `--update-baseline` writes: each tracked metric's value in this run."""
        return {"kvplan_check_baseline": BASELINE_FORMAT,
                "checks": {r.name: dict(r.tracked) for r in self.results if r.tracked}}


# ---- reading a check file ----------------------------------------------------------------------


def load_checks(path: str | Path) -> list[Check]:
    """Read and validate a check file; every mistake is a WorkloadError with file, field and line."""
    path = Path(path)
    doc = load_yaml(path, error_cls=WorkloadError)
    doc.expect_keys("checks")
    items = doc.get_list("checks")
    if not len(items):
        raise items.error("expected at least one check")
    checks: list[Check] = []
    seen: dict[str, int] = {}
    for node in items:
        check = _check(as_map(node), path.parent)
        if check.name in seen:
            raise node.error(f"duplicate check name {check.name!r} (first at line {seen[check.name]})")
        seen[check.name] = check.line
        checks.append(check)
    return checks


def _check(node: YamlMap, base: Path) -> Check:
    node.expect_keys("name", "size", "simulate", "select", "expect", "baseline")
    name = node.get_str("name")
    if not _NAME.fullmatch(name):
        raise node.node("name").error(f"expected letters, digits and . _ / - (at most 100), got {name!r}")
    kind = node.exactly_one("size", "simulate")
    spec = node.get_map(kind)
    options = _size_options(spec, base) if kind == "size" else _simulate_options(spec, base)
    select = None
    if "select" in node:
        if kind != "simulate":
            raise node.node("select").error("select picks an entry of a simulate document's results")
        select = {k: _scalar(v) for k, v in node.get_map("select").entries.items()}
    expects = tuple(_expect(e) for e in _list_of(node, "expect"))
    tracked = _tracked(node.get_map("baseline")) if "baseline" in node else ()
    if not expects and not tracked:
        raise node.error("a check needs expect, baseline, or both")
    lines = {**spec.key_lines, **({"select": node.key_lines["select"]} if select is not None else {})}
    return Check(name, kind, options, select, expects, tracked, node.file or "", node.path, node.line, lines)


def _list_of(node: YamlMap, key: str) -> list[YamlNode]:
    """A list under `key`, a single value standing for a list of one, or nothing."""
    value = node.node(key, None)
    if value is None:
        return []
    return list(value) if isinstance(value, YamlList) else [value]


def _scalar(node: YamlNode) -> Any:
    if not isinstance(node, YamlScalar) or node.value is None:
        raise node.error(f"expected a number, string or true/false, got {node.describe()}")
    if isinstance(node.value, float) and not math.isfinite(node.value):
        raise node.error(f"expected a finite number, got {node.text}")
    return node.value


def _size_options(spec: YamlMap, base: Path) -> dict:
    spec.expect_keys(*SIZE_KEYS)
    from kvplan.model.dtypes import KV_DTYPE_CHOICES

    opts = {"model": _model_arg(spec.get_str("model"), base),
            "tokens": spec.get_int("tokens", None, ge=1, le=2**31),
            "kv_dtype": spec.get_choice("kv_dtype", KV_DTYPE_CHOICES, "auto"),
            "tp": spec.get_int("tp", 1, ge=1, le=4096), "batch": spec.get_int("batch", 1, ge=1, le=2**31),
            "gpu": spec.get_str("gpu", None),
            "gpu_memory_utilization": spec.get_float("gpu_memory_utilization", None, gt=0, le=1),
            "kv_memory": spec.get_size("kv_memory", None, gt=0),
            "block_size": spec.get_int("block_size", 16, ge=1, le=2**20)}  # fmt: skip
    if opts["gpu"] is None and opts["kv_memory"] is None and "gpu_memory_utilization" in spec:
        raise spec.node("gpu_memory_utilization").error("needs a gpu")
    return opts


def _model_arg(model: str, base: Path) -> str:
    """A model path is relative to the check file; anything else is a catalog or hub id."""
    if model.startswith(("./", "../", "/", "~")) or model.endswith(".json"):
        return str(base / Path(model).expanduser())
    return str(base / model) if model.strip() and _exists(base / model) else model


def _exists(path: Path, kind: str = "any") -> bool:
    """Path.exists / is_file / is_dir that say no for a name the OS refuses (too long, NUL)."""
    try:
        return {"any": path.exists, "file": path.is_file, "dir": path.is_dir}[kind]()
    except (OSError, ValueError):
        return False


def _simulate_options(spec: YamlMap, base: Path) -> dict:
    spec.expect_keys("workload", "block_sizes")
    path = base / Path(spec.get_str("workload")).expanduser()
    if not _exists(path, "file"):
        what = "is a directory; expected a workload file" if _exists(path, "dir") else "no such workload file"
        raise spec.node("workload").error(f"{what}: {path}")
    opts: dict = {"workload": str(path)}
    if "block_sizes" in spec:
        sizes = [as_int(n, ge=1, le=2**20) for n in _list_of(spec, "block_sizes")]
        if not sizes:
            raise spec.node("block_sizes").error("expected at least one block size")
        opts["block_sizes"] = sorted(set(sizes))
    return opts


def _expect(node: YamlNode) -> Expect:
    text = as_str(node)
    m = _EXPR.fullmatch(text)
    if m is None:
        raise node.error(f"expected 'metric op value' with op one of {', '.join(OPS)} "
                         f"(e.g. 'max_concurrency >= 40'), got {text!r}")  # fmt: skip
    bound = _bound(node, m["bound"])
    if m["op"] not in ("==", "!=") and not _is_number(bound):
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


def _tracked(node: YamlMap) -> tuple[Tracked, ...]:
    node.expect_keys("metrics", "rel_tol", "abs_tol", "fail_on")
    rel, abs_, fail_on = _tolerances(node, 0.0, 0.0, "change")
    items = node.get_list("metrics")
    if not len(items):
        raise items.error("expected at least one metric")
    out: list[Tracked] = []
    for item in items:
        if isinstance(item, YamlMap):
            item.expect_keys("metric", "rel_tol", "abs_tol", "fail_on")
            metric, where = item.get_str("metric"), item.node("metric")
            r, a, f = _tolerances(item, rel, abs_, fail_on)
        else:
            metric, where, (r, a, f) = as_str(item), item, (rel, abs_, fail_on)
        if not _METRIC.fullmatch(metric):
            raise where.error(f"expected a metric name like admitted or ttft_s.p99, got {metric!r}")
        if metric in (t.metric for t in out):
            raise where.error(f"metric {metric!r} is listed twice")
        out.append(Tracked(metric, r, a, f, where.path, where.line))
    return tuple(out)


def _tolerances(node: YamlMap, rel: float, abs_: float, fail_on: str) -> tuple[float, float, str]:
    return (node.get_float("rel_tol", rel, ge=0, le=1e6), node.get_float("abs_tol", abs_, ge=0),
            node.get_choice("fail_on", FAIL_ON, fail_on))  # fmt: skip


# ---- the baseline file ------------------------------------------------------------------------


def load_baseline(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a baseline JSON written by `--update-baseline`: {check name: {metric: number}}."""
    path = Path(path)

    def fail(message: str, field: str | None = None, line: int | None = None) -> KvplanError:
        return WorkloadError(message, file=path, field=field, line=line)

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BASELINE_BYTES + 1)
    except OSError as e:
        raise fail(f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BASELINE_BYTES:
        raise fail(f"file is larger than the {MAX_BASELINE_BYTES >> 20} MiB limit")
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise fail(f"not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise fail(f"invalid JSON: {e.msg}", line=e.lineno) from None
    except ValueError as e:
        raise fail(f"invalid JSON: {e}") from None
    except RecursionError:
        raise fail("invalid JSON: nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("kvplan_check_baseline") != BASELINE_FORMAT:
        raise fail(f"expected an object with \"kvplan_check_baseline\": {BASELINE_FORMAT} (written by "
                   "kvplan check --update-baseline)", field="kvplan_check_baseline")  # fmt: skip
    checks = doc.get("checks")
    if not isinstance(checks, dict):
        raise fail("expected an object of checks", field="checks")
    for name, metrics in checks.items():
        if not isinstance(metrics, dict):
            raise fail("expected an object of metric values", field=f"checks.{name}")
        for metric, value in metrics.items():
            if value is not None and not _is_number(value):
                raise fail(f"expected a number or null, got {json.dumps(value)}", field=f"checks.{name}.{metric}")
    return checks


def _no_duplicates(pairs: list) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(text: str):
    raise ValueError(f"{text} is not a number JSON allows")


# ---- running --------------------------------------------------------------------------------


def run_checks(checks: list[Check], baseline: str | Path | dict | None = None) -> CheckReport:
    """Run every check; compare tracked metrics with `baseline` (a file or its loaded dict) if given."""
    stored = load_baseline(baseline) if isinstance(baseline, (str, Path)) else baseline
    cache: dict = {}
    results = tuple(_run_one(c, stored, cache) for c in checks)
    where = str(baseline) if isinstance(baseline, (str, Path)) else ("<dict>" if baseline is not None else None)
    return CheckReport(checks[0].file if checks else "", where, results)


def _run_one(check: Check, stored: dict | None, cache: dict) -> CheckResult:
    doc = _document(check, cache)
    target = _select(check, doc)
    outcomes = [_threshold(check, e, _lookup(check, target, doc, e.metric, e.key_path, e.line))
                for e in check.expects]
    tracked = {}
    for t in check.tracked:
        value = _lookup(check, target, doc, t.metric, t.key_path, t.line)
        if value is not None and not _is_number(value):
            raise check.error(f"{t.metric} is {_kind(value)}; a baseline compares numbers", t.key_path, t.line)
        tracked[t.metric] = value
        if stored is not None:
            outcomes.append(_compare(t, value, stored.get(check.name, {})))
    return CheckResult(check.name, check.kind, tuple(outcomes), tracked)


def _document(check: Check, cache: dict) -> dict:
    """The JSON document the check's command prints (as `--json` would print it), cached per run."""
    from kvplan.report.output import dumps

    key = (check.kind, json.dumps(check.options, sort_keys=True))
    if key not in cache:
        try:
            raw = _size_doc(check.options) if check.kind == "size" else _simulate_doc(
                Path(check.options["workload"]), check.options)
        except KvplanError as e:
            raise _locate(check, e)
        cache[key] = json.loads(dumps(raw))
    return cache[key]


def _locate(check: Check, e: KvplanError) -> KvplanError:
    """An error without a file (a bad option, an unknown GPU or model) points at the check's key."""
    if e.file is not None:
        return e
    key = (e.field or "").lstrip("-").replace("-", "_")
    line = check.option_lines.get(key)
    if line is None:
        key = "model" if check.kind == "size" else "workload"
        line = check.option_lines.get(key, check.line)
    return check.error(e.message, f"{check.key_path}.{check.kind}.{key}", line)


def _size_doc(opts: dict) -> dict:
    from kvplan.model.size import size

    return size(**opts).to_dict()


def _simulate_doc(path: Path, opts: dict) -> dict:
    """What `kvplan simulate PATH --json` prints (`--block-sizes` as `block_sizes`)."""
    from kvplan.sim.load import document, load

    return document(load(path), block_sizes=opts.get("block_sizes"))


def _select(check: Check, doc: dict) -> dict:
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


def _lookup(check: Check, target: dict, doc: dict, metric: str, where: str, line: int) -> Any:
    """A dotted path into the selected entry, falling back to the whole document's top level."""
    steps = [m[1] if m[1] is not None else int(m[2]) for m in _STEP.finditer(metric)]
    if target is not doc and isinstance(steps[0], str) and steps[0] not in target and steps[0] in doc:
        target = doc
    value: Any = target
    for i, step in enumerate(steps):
        sofar = metric_path(steps[:i]) or "the result"
        if isinstance(step, int):
            if not isinstance(value, list) or step >= len(value):
                size = f"a list of {len(value)}" if isinstance(value, list) else _kind(value)
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
        raise check.error(f"{metric} is {_kind(value)}{inner}", where, line)
    return value


def metric_path(steps: list) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else (f".{s}" if i else s) for i, s in enumerate(steps))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, str):
        return f"a string ({json.dumps(value)})"
    return {dict: "a mapping", list: "a list"}.get(type(value), "a number")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _threshold(check: Check, e: Expect, value: Any) -> Outcome:
    if value is None:
        return Outcome("expect", e.metric, e.op, e.bound, None, False, e.text, "no value (null)")
    if _is_number(e.bound) != _is_number(value) or isinstance(e.bound, bool) != isinstance(value, bool):
        raise check.error(f"{e.metric} is {_kind(value)}; it cannot be compared with {json.dumps(e.bound)}",
                          e.key_path, e.line)  # fmt: skip
    return Outcome("expect", e.metric, e.op, e.bound, value, bool(OPS[e.op](value, e.bound)), e.text)


def _compare(t: Tracked, value: Any, stored: dict) -> Outcome:
    text = f"{t.metric} vs baseline"
    base = stored.get(t.metric, _MISSING)
    op = {"change": "~", "drop": ">~", "rise": "<~"}[t.fail_on]
    if base is _MISSING or base is None:
        return Outcome("baseline", t.metric, op, None, value, False, text,
                       "not in the baseline; run kvplan check --update-baseline")  # fmt: skip
    allowed = max(t.abs_tol, t.rel_tol * abs(base))
    if value is None:
        return Outcome("baseline", t.metric, op, base, None, False, text, "no value (null)", allowed)
    low_ok, high_ok = value >= base - allowed, value <= base + allowed
    passed = {"change": low_ok and high_ok, "drop": low_ok, "rise": high_ok}[t.fail_on]
    moved = f"{'fell' if value < base else 'rose'} by {abs(value - base):.6g}"
    detail = "" if passed else f"{moved} (allowed {allowed:.6g})"
    return Outcome("baseline", t.metric, op, base, value, passed, text, detail, allowed)


_MISSING = object()
