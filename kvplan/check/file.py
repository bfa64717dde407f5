"""Reading a check file (schema: workloads/CHECKS.md) into validated `Check` records.

Every mistake is a WorkloadError with file, field and line; nothing is run here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from kvplan.check.expr import METRIC, parse_expect
from kvplan.check.records import Check, Tracked
from kvplan.errors import WorkloadError
from kvplan.workload.yaml_nodes import (
    YamlList,
    YamlMap,
    YamlNode,
    YamlScalar,
    as_int,
    as_map,
    as_str,
    load_yaml,
)

FAIL_ON = ("change", "drop", "rise")
SIZE_KEYS = ("model", "tokens", "kv_dtype", "tp", "batch", "gpu", "gpu_memory_utilization",
             "kv_memory", "block_size", "engine", "quantization", "max_num_batched_tokens",
             "max_num_seqs", "enforce_eager")  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,99}")


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
    expects = tuple(parse_expect(e) for e in _list_of(node, "expect"))
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
            "tokens": spec.get_count("tokens", None, ge=1, le=2**31),
            "kv_dtype": spec.get_choice("kv_dtype", KV_DTYPE_CHOICES, "auto"),
            "tp": spec.get_int("tp", 1, ge=1, le=4096), "batch": spec.get_int("batch", 1, ge=1, le=2**31),
            "gpu": spec.get_str("gpu", None),
            "gpu_memory_utilization": spec.get_float("gpu_memory_utilization", None, gt=0, le=1),
            "kv_memory": spec.get_size("kv_memory", None, gt=0),
            "block_size": spec.get_int("block_size", 16, ge=1, le=2**20),
            "engine": spec.get_choice("engine", ("vllm", "none"), "vllm"),
            "quantization": spec.get_str("quantization", None),
            "max_num_batched_tokens": spec.get_count("max_num_batched_tokens", None, ge=1, le=2**31),
            "max_num_seqs": spec.get_int("max_num_seqs", None, ge=1, le=2**31),
            "enforce_eager": spec.get_bool("enforce_eager", False)}  # fmt: skip
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
        if not METRIC.fullmatch(metric):
            raise where.error(f"expected a metric name like admitted or ttft_s.p99, got {metric!r}")
        if metric in (t.metric for t in out):
            raise where.error(f"metric {metric!r} is listed twice")
        out.append(Tracked(metric, r, a, f, where.path, where.line))
    return tuple(out)


def _tolerances(node: YamlMap, rel: float, abs_: float, fail_on: str) -> tuple[float, float, str]:
    return (node.get_float("rel_tol", rel, ge=0, le=1e6), node.get_float("abs_tol", abs_, ge=0),
            node.get_choice("fail_on", FAIL_ON, fail_on))  # fmt: skip
