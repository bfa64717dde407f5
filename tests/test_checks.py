"""`kvplan check`: the check-file library (kvplan.check.run), its views and the CLI command."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from kvplan.check.run import load_checks, run_checks
from kvplan.errors import KvplanError
from tests.conftest import ROOT

CHECKS = ROOT / "workloads" / "checks.yaml"
BASELINE = ROOT / "workloads" / "checks-baseline.json"
LESSON = ROOT / "workloads" / "lesson.yaml"


@pytest.fixture
def cli(run_cli, monkeypatch):
    """run_cli with the hub off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return run_cli


def write_checks(tmp_path: Path, body: str, name: str = "checks.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def opt_check(*expect: str, baseline: str = "") -> str:
    """A size check on OPT-13B with 12 GiB of KV (token_slots 15,728, kv_dtype fp16, fits true)."""
    lines = ["checks:", "  - name: opt", "    size: {model: facebook/opt-13b, kv_memory: 12GiB}"]
    if expect:
        lines.append("    expect: [" + ", ".join(json.dumps(e) for e in expect) + "]")
    if baseline:
        lines.append(f"    baseline: {baseline}")
    return "\n".join(lines) + "\n"


# ---- the project's own check file ----------------------------------------------------------


def test_project_checks_pass_against_the_committed_baseline():
    """workloads/checks.yaml pins the lesson's and the catalog's numbers; all 41 assertions hold."""
    report = run_checks(load_checks(CHECKS), BASELINE)
    failed = [(name, o.text, o.value) for name, o in report.outcomes if not o.passed]
    assert failed == [] and len(report.outcomes) == 41 and len(report.results) == 6


def test_update_baseline_reproduces_the_committed_file(cli, tmp_path):
    """--update-baseline writes deterministic JSON: byte-identical to workloads/checks-baseline.json."""
    out = tmp_path / "baseline.json"
    code, stdout, err = cli("check", str(CHECKS), "--baseline", str(out), "--update-baseline")
    assert code == 0, err
    assert out.read_bytes() == BASELINE.read_bytes()
    assert "Wrote 10 baseline metrics" in stdout
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]


def test_human_output(cli):
    """One row per assertion with value and bound, then a one-line summary; exit 0."""
    code, out, err = cli("check", str(CHECKS), "--baseline", str(BASELINE))
    assert code == 0 and err == ""
    assert "lesson-paged" in out and "wasted_slots" in out and "== 913" in out and "baseline 122 ±0" in out
    assert "All 41 assertions of 6 checks passed." in out


def test_json_output(cli):
    """--json prints one object: per check, per assertion kind/metric/op/bound/value/passed."""
    code, out, _ = cli("check", str(CHECKS), "--baseline", str(BASELINE), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] is True and doc["num_failed"] == 0 and doc["num_assertions"] == 41
    paged = next(c for c in doc["checks"] if c["name"] == "lesson-paged")
    first = paged["assertions"][0]
    assert first == {"kind": "expect", "metric": "admitted", "op": "==", "bound": 122, "value": 122,
                     "passed": True, "text": "admitted == 122", "detail": ""}
    assert {"kind": "baseline", "metric": "wasted_slots", "bound": 913, "value": 913, "tolerance": 0.0}.items() \
        <= next(a for a in paged["assertions"] if a["kind"] == "baseline" and a["metric"] == "wasted_slots").items()


def test_without_baseline_the_comparisons_are_skipped(cli):
    """No --baseline: thresholds only, and a note that tracked metrics were not compared."""
    code, out, _ = cli("check", str(CHECKS))
    assert code == 0 and "All 31 assertions" in out and "10 baseline metrics not compared" in out


# ---- pass and fail -----------------------------------------------------------------------------


def test_failed_threshold_exits_1_and_writes_the_summary(cli, tmp_path):
    """A failing assertion: exit 1, FAIL in the table, nothing on stderr, Markdown written atomically."""
    path = write_checks(tmp_path, opt_check("token_slots >= 20000", "bytes_per_token == 819200"))
    md = tmp_path / "summary.md"
    code, out, err = cli("check", str(path), "--markdown", str(md))
    assert code == 1 and err == ""
    assert "FAIL" in out and "1 of 2 assertions failed, in 1 of 1 check: opt." in out
    text = md.read_text(encoding="utf-8")
    assert text.startswith("## ❌ kvplan check") and "| ❌ | opt | <code>token_slots &gt;= 20000</code> | 15728 |" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checks.yaml", "summary.md"]


def test_failed_threshold_in_json_mode(cli, tmp_path):
    """--json still prints the whole report, then exits 1."""
    code, out, _ = cli("check", str(write_checks(tmp_path, opt_check("token_slots < 100"))), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False and doc["checks"][0]["assertions"][0]["value"] == 15728


def test_the_command_function_raises_system_exit_1(tmp_path, monkeypatch):
    """cli_check.check returns on success and raises SystemExit(1) on a failed check."""
    from kvplan.cli.check import check

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check(write_checks(tmp_path, opt_check("token_slots == 15728"), "ok.yaml"), json=True)
    with pytest.raises(SystemExit) as info:
        check(write_checks(tmp_path, opt_check("token_slots != 15728"), "bad.yaml"), json=True)
    assert info.value.code == 1


@pytest.mark.parametrize("expr, passed", [
    ("token_slots >= 15728", True), ("token_slots > 15728", False), ("token_slots <= 15728", True),
    ("token_slots < 15728", False), ("token_slots == 15728", True), ("token_slots != 15728", False),
    ("token_slots == 15_728", True), ("token_slots >= 1.5e4", True), ("kv_bytes == 1.5625GiB", True),
    ("kv_pool_bytes == 12GiB", True), ("kv_dtype == fp16", True), ("kv_dtype != 'bf16'", True),
    ("fits == true", True), ("fits != false", True), ("token_slots>=15729", False),
])  # fmt: skip
def test_operators_and_bounds(tmp_path, expr, passed):
    """The six operators, numbers with _ and exponents, sizes with units, words, quoted text, booleans."""
    report = run_checks(load_checks(write_checks(tmp_path, opt_check(expr))))
    assert report.outcomes[0][1].passed is passed


def test_null_value_is_a_failure_not_an_error(tmp_path):
    """Without a GPU or kv_memory max_concurrency is null: the assertion fails, saying so."""
    path = write_checks(tmp_path, "checks:\n  - name: no-pool\n    size: {model: facebook/opt-13b}\n"
                                  "    expect: [max_concurrency >= 1]\n")  # fmt: skip
    outcome = run_checks(load_checks(path)).outcomes[0][1]
    assert outcome.passed is False and outcome.value is None and outcome.detail == "no value (null)"


def test_dotted_paths_indexes_and_top_level_fallback(tmp_path):
    """memory_breakdown.free in the selected entry, pool_slots from the document, results[1] unselected."""
    body = f"""checks:
  - name: selected
    simulate: {{workload: {LESSON}}}
    select: {{label: paged-B16}}
    expect: [memory_breakdown.free == 0.0020751953125, pool_slots == 131072, num_requests == 500]
  - name: whole-document
    simulate: {{workload: {LESSON}, block_sizes: [16, 32]}}
    expect: ["results[1].admitted == 122", "results[2].block_size == 32", "results[2].admitted == 121"]
"""
    report = run_checks(load_checks(write_checks(tmp_path, body)))
    assert report.passed and len(report.outcomes) == 6


def test_one_run_per_distinct_command(tmp_path, monkeypatch):
    """Two checks selecting from the same simulate run share one run."""
    import kvplan.check.run as checks_mod

    calls = []
    real = checks_mod._simulate_doc
    monkeypatch.setattr(checks_mod, "_simulate_doc", lambda p, o: calls.append(p) or real(p, o))
    body = f"""checks:
  - {{name: a, simulate: {{workload: {LESSON}}}, select: {{allocator: paged}}, expect: [admitted == 122]}}
  - {{name: b, simulate: {{workload: {LESSON}}}, select: {{allocator: contiguous}}, expect: [admitted == 16]}}
"""
    assert run_checks(load_checks(write_checks(tmp_path, body))).passed and len(calls) == 1


def test_model_path_is_relative_to_the_check_file(tmp_path, monkeypatch):
    """`model: ./config.json` is read beside the check file, whatever the working directory."""
    (tmp_path / "cfg").mkdir()
    src = ROOT / "models" / "meta-llama" / "Meta-Llama-3-8B" / "config.json"
    (tmp_path / "cfg" / "config.json").write_bytes(src.read_bytes())
    path = write_checks(tmp_path / "cfg", "checks:\n  - name: local\n    size: {model: ./config.json}\n"
                                          "    expect: [bytes_per_token == 131072]\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert run_checks(load_checks(path)).passed


# ---- baselines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stored, spec, passed", [
    (15728, "{metrics: [token_slots]}", True),
    (15729, "{metrics: [token_slots]}", False),
    (15729, "{metrics: [token_slots], abs_tol: 1}", True),
    (16000, "{metrics: [token_slots], rel_tol: 0.01}", False),     # allowed 160, fell 272
    (16000, "{metrics: [token_slots], rel_tol: 0.02}", True),      # allowed 320
    (15000, "{metrics: [token_slots], fail_on: drop}", True),      # it rose: fine when only drops fail
    (15000, "{metrics: [token_slots], fail_on: rise}", False),
    (16000, "{metrics: [token_slots], fail_on: rise}", True),
    (16000, "{metrics: [token_slots], fail_on: drop}", False),
    (16000, "{metrics: [{metric: token_slots, abs_tol: 300}], abs_tol: 0}", True),  # per-metric wins
])  # fmt: skip
def test_baseline_tolerance_and_direction(tmp_path, stored, spec, passed):
    """allowed = max(abs_tol, rel_tol x |baseline|); fail_on: change (both ways), drop or rise."""
    checks = load_checks(write_checks(tmp_path, opt_check(baseline=spec)))
    outcome = run_checks(checks, {"opt": {"token_slots": stored}}).outcomes[0][1]
    assert (outcome.kind, outcome.value, outcome.bound, outcome.passed) == ("baseline", 15728, stored, passed)


def test_metric_missing_from_the_baseline_fails(tmp_path):
    """A check added after the baseline was written fails with a hint to update it (exit 1, not 2)."""
    checks = load_checks(write_checks(tmp_path, opt_check(baseline="{metrics: [token_slots]}")))
    outcome = run_checks(checks, {"other": {"token_slots": 1}}).outcomes[0][1]
    assert outcome.passed is False and "--update-baseline" in outcome.detail


def test_baseline_regression_through_the_cli(cli, tmp_path):
    """A stored value the run no longer reaches: exit 1 and the difference in the report."""
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps({"kvplan_check_baseline": 1, "checks": {"opt": {"token_slots": 16000}}}))
    path = write_checks(tmp_path, opt_check(baseline="{metrics: [token_slots], fail_on: drop}"))
    code, out, _ = cli("check", str(path), "--baseline", str(baseline))
    assert code == 1 and "FAIL opt: token_slots vs baseline: fell by 272 (allowed 0)" in out


# ---- the serve engine hook ---------------------------------------------------------------------


def test_serve_workloads_use_the_engine_once_it_exists(tmp_path, monkeypatch):
    """_simulate_doc calls kvplan.sim.engine.serve_document when it exists (here a stand-in)."""
    fake = types.ModuleType("kvplan.sim.engine")
    fake.serve_document = lambda wl: {"workload": wl.name, "ttft_s": {"p99": 1.5}, "results": []}
    monkeypatch.setitem(sys.modules, "kvplan.sim.engine", fake)
    wl = tmp_path / "serve.yaml"
    wl.write_text("experiment: serve\npool: {slots: 1000}\n"
                  "requests: {count: 4, prompt: {dist: fixed, value: 8}, output: {dist: fixed, value: 2}}\n")
    body = "checks:\n  - name: latency\n    simulate: {workload: serve.yaml}\n    expect: [ttft_s.p99 <= 2.0]\n"
    assert run_checks(load_checks(write_checks(tmp_path, body))).passed


def test_prefix_workloads_are_checked_as_prefix(tmp_path):
    """A check on a prefix workload sees the prefix experiment's document (hit rate), not a serve run."""
    wl = tmp_path / "prefix.yaml"
    wl.write_text("experiment: prefix\npool: {slots: 4096}\nallocators: [{kind: paged, block_size: 16}]\n"
                  "requests: {count: 20, prompt: {dist: fixed, value: 8}, output: {dist: fixed, value: 2}}\n"
                  "prefix: {system_prompts: 1, system_prompt_len: 64, hash_block_size: 16}\n")
    body = ("checks:\n  - name: hits\n    simulate: {workload: prefix.yaml}\n"
            "    expect:\n      - experiment == prefix\n      - results[0].hits == 1216\n")  # 19 later requests x 64
    assert run_checks(load_checks(write_checks(tmp_path, body))).passed


# ---- safety --------------------------------------------------------------------------------------


def test_nothing_is_evaluated():
    """Assertions are parsed by a regular expression; no module of kvplan/check/ calls eval, exec
    or compile."""
    import ast

    modules = sorted((ROOT / "kvplan" / "check").glob("*.py"))
    assert len(modules) >= 6
    for module in modules:
        tree = ast.parse(module.read_text(encoding="utf-8"))
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not called & {"eval", "exec", "compile", "__import__", "getattr"}, module.name


def test_markdown_cells_are_escaped(tmp_path):
    """A quoted bound with a pipe and angle brackets cannot break the summary table."""
    from kvplan.report.check_view import render_markdown

    report = run_checks(load_checks(write_checks(tmp_path, opt_check("kv_dtype != 'a|<b>'"))))
    row = render_markdown(report).splitlines()[-1]
    assert "a\\|&lt;b&gt;" in row and row.count(" | ") == 4


def test_report_json_is_deterministic(tmp_path):
    """The same check file gives byte-identical JSON."""
    from kvplan.report.output import dumps

    path = write_checks(tmp_path, opt_check("token_slots >= 1", baseline="{metrics: [token_slots]}"))
    docs = [dumps(run_checks(load_checks(path), {"opt": {"token_slots": 15728}}).to_dict()) for _ in range(2)]
    assert docs[0] == docs[1]


@pytest.mark.parametrize("expr", ["token_slots >= 1_", "token_slots >= 1_.5", "token_slots >= " + "9" * 5000,
                                  "token_slots >= 0x10", "token_slots == 1,000", "token_slots >= nan",
                                  "token_slots >= 1e999", "token_slots >= -inf", "token_slots == null"])
def test_odd_bounds_are_bad_input(tmp_path, expr):
    """Bounds Python's own parsers would choke on are refused as bad input, located at the line."""
    with pytest.raises(KvplanError) as info:
        load_checks(write_checks(tmp_path, opt_check(expr)))
    assert info.value.line == 4 and info.value.field == "checks[0].expect[0]"


def test_names_the_os_refuses_are_not_paths(tmp_path):
    """A model or workload name too long for the file system is an unknown id or file, not a crash."""
    body = f"checks:\n  - name: long\n    size: {{model: {'m' * 300}}}\n    expect: [kv_bytes >= 1]\n"
    with pytest.raises(KvplanError, match="model"):
        run_checks(load_checks(write_checks(tmp_path, body)))
    body = f"checks:\n  - name: long\n    simulate: {{workload: {'w' * 300}.yaml}}\n    expect: [admitted >= 1]\n"
    with pytest.raises(KvplanError, match="no such workload file"):
        load_checks(write_checks(tmp_path, body))


def test_rich_markup_in_bounds_is_printed_literally(cli, tmp_path):
    """Text from the check file is escaped for rich: a bound like '[red]x' is shown, not styled."""
    code, out, _ = cli("check", str(write_checks(tmp_path, opt_check("kv_dtype != '[red]x'"))))
    assert code == 0 and "[red]x" in out


def test_serve_check_with_the_real_engine(tmp_path):
    """Once kvplan.sim.engine offers serve_document, latency keys like ttft_s.p99 can be asserted."""
    engine = pytest.importorskip("kvplan.sim.engine")
    if not hasattr(engine, "serve_document"):
        pytest.skip("the engine has no serve_document yet")
    (tmp_path / "serve.yaml").write_text(
        "experiment: serve\npool: {slots: 100000}\n"
        "requests: {count: 10, prompt: {dist: fixed, value: 10}, output: {dist: fixed, value: 5}}\n")
    body = """checks:
  - name: serve
    simulate: {workload: serve.yaml, block_sizes: [16, 32]}
    select: {block_size: 32}
    expect: [completed == 10, ttft_s.p99 >= 0]
"""
    report = run_checks(load_checks(write_checks(tmp_path, body)))
    assert report.passed and len(report.outcomes) == 2
