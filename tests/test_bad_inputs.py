"""The bad-input corpus (tests/bad_inputs/cases*.yaml) through the CLI: one located line, exit 2.

Each case must end with exit code 2, nothing on stdout, exactly one line on stderr naming the file,
the field (and line where there is one) and what was wrong, no traceback, and no file left in the
output folder or the working directory. Cases marked `xfail` are bugs in other modules: they flip
to strict XPASS failures once fixed, and the mark is then removed from cases.yaml.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
# Cases that used to hang run in a subprocess that is killed after this long. It is a guard
# against a hang, not a speed bound: a healthy run takes a second or two even on a busy machine.
HANG_GUARD_S = 300
# cases.yaml, and one cases-TOPIC.yaml per later round of hardening (same shape)
LONG_MODEL = "meta-llama/" + "Llama" * 1000  # a pasted blob on the command line: 5,011 characters
CASE_FILES = sorted(CORPUS.glob("cases*.yaml"))
CASES = [c for f in CASE_FILES for c in yaml.safe_load(f.read_text(encoding="utf-8"))["cases"]]

@pytest.fixture
def places(tmp_path, monkeypatch):
    """An empty working directory and an empty output folder; the hub is off."""
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    out.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    return cwd, out


def command_line(case: dict, out: Path) -> list[str]:
    args = [str(a).replace("{dir}", str(CORPUS)).replace("{out}", str(out)).replace("{long_model}", LONG_MODEL)
            for a in case["args"]]
    if args[0] == "simulate" and "--plot" not in args:
        args += ["--plot", str(out / "chart.png")]
        if _experiment(args[1]) == "serve":  # --csv applies to serve workloads only
            args += ["--csv", str(out / "rows.csv")]
    if args[0] == "check" and "--markdown" not in args:
        args += ["--markdown", str(out / "summary.md")]
    return args


def _experiment(path: str) -> str | None:
    """The experiment a workload file names (serve by default), or None when it cannot be read.

    Files above kvplan's size limit are refused before they are parsed; so are they here.
    """
    from kvplan.workload.yaml_nodes import MAX_FILE_BYTES

    try:
        if not Path(path).is_file() or Path(path).stat().st_size > MAX_FILE_BYTES:
            return None
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except Exception:  # the corpus is full of unreadable files; they fail before options matter
        return None
    return doc.get("experiment", "serve") if isinstance(doc, dict) else None


def run_in_process(args: list[str], capsys) -> tuple[int, str, str]:
    from kvplan.cli import main

    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_subprocess(args: list[str], cwd: Path, timeout: float) -> tuple[int, str, str]:
    """`python -m kvplan ARGS`, memory-capped."""
    head = [sys.executable, "-m", "kvplan"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("KVPLAN_DEBUG", None)
    proc = subprocess.run(head + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_limit_memory if sys.platform == "linux" else None)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def assert_one_located_line(case: dict, code: int, out: str, err: str, places) -> None:
    assert code == 2, f"exit {code}; stderr: {err[-2000:]}"
    assert "Traceback" not in err
    assert out == "", f"stdout not empty: {out[:500]}"
    assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("kvplan: error: ")
    assert len(err) <= 500 and err[:-1].isprintable(), f"not a sane line: {err[:300]!r}"
    wanted = [case["says"]]
    if case["file"] is not None:
        wanted.append(case["file"])
    if case["field"] is not None:
        wanted.append(f"{case['field']}")
    if "line" in case:
        wanted.append(f":{case['line']}: ")
    missing = [w for w in wanted if w not in err]
    assert not missing, f"{missing} not in {err!r}"
    for folder in places:
        assert list(folder.iterdir()) == [], f"left behind in {folder.name}: {list(folder.iterdir())}"


def _params():
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if "xfail" in case else []
        yield pytest.param(case, id=case["id"], marks=marks)


def test_manifest_is_complete():
    """Every case states file, field and a phrase; ids are unique; the corpus has at least 40 cases."""
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 40
    for case in CASES:
        assert {"id", "args", "file", "field", "says"} <= set(case), case["id"]
        assert set(case) <= {"id", "args", "file", "field", "line", "says", "xfail", "subprocess", "until"}, case["id"]


def test_every_corpus_file_is_used():
    """A file in the corpus that no case (or another corpus file) names is dead weight."""
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in CORPUS.rglob("*.yaml"))
    unused = [p.name for p in CORPUS.rglob("*") if p.is_file() and p not in CASE_FILES and p.name not in text]
    assert unused == []


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input(case, places, capsys):
    """The case exits 2 with one located line and writes nothing (see the module docstring)."""
    if "until" in case and _exists(case["until"]):
        pytest.skip(f"{case['until']} exists now: this input is no longer bad")
    args = command_line(case, places[1])
    if case.get("subprocess"):
        try:
            code, out, err = run_subprocess(args, places[0], HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {HANG_GUARD_S} s: a hang")
    else:
        code, out, err = run_in_process(args, capsys)
    assert_one_located_line(case, code, out, err, places)


def _exists(dotted: str) -> bool:
    import importlib

    module, _, attr = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False


SUBPROCESS_CASES = ["config-malformed", "workload-yaml-bomb", "workload-python-tag", "trace-azure-bad-row",
                    "model-id-path-traversal", "check-eval-injection", "baseline-malformed"]  # fmt: skip


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_real_entry_point(case_id, places):
    """The same line and exit code through `python -m kvplan`, the installed entry point's code path."""
    case = next(c for c in CASES if c["id"] == case_id)
    code, out, err = run_subprocess(command_line(case, places[1]), places[0], timeout=HANG_GUARD_S)
    assert_one_located_line(case, code, out, err, places)


# ---- cases generated at test time (too big, or binary) ------------------------------------------


def _huge(path: Path, head: str, filler: str, size: int = 11 << 20) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        f.write(head)
        f.write(filler * (size // len(filler) + 1))
    return path


GENERATED = {
    "workload-huge": lambda d: (["simulate", str(_huge(d / "huge.yaml", "experiment: capacity\nprefix:\n", "  # padding\n"))],
                                "huge.yaml", "larger than the 10 MiB limit"),
    "check-huge": lambda d: (["check", str(_huge(d / "huge-checks.yaml", "checks:\n", "# padding\n"))],
                             "huge-checks.yaml", "larger than the 10 MiB limit"),
    "config-huge-garbage": lambda d: (["size", str(_huge(d / "config.json", "{", "x"))], "config.json", "not valid JSON"),
    "baseline-huge": lambda d: (["check", str(CORPUS / "checks" / "ok.yaml"), "--baseline",
                                 str(_huge(d / "baseline.json", "{", " "))], "baseline.json", "10 MiB limit"),
    "config-not-utf8": lambda d: (["size", str(_write(d / "config.json", b"\xff\xfe{\x00"))], "config.json", "not UTF-8"),
    "workload-not-utf8": lambda d: (["simulate", str(_write(d / "w.yaml", b"name: \xff\xfe\n"))], "w.yaml", "not UTF-8"),
    "check-not-utf8": lambda d: (["check", str(_write(d / "c.yaml", b"checks: \xc3\x28\n"))], "c.yaml", "not UTF-8"),
    "baseline-deep-nesting": lambda d: (["check", str(CORPUS / "checks" / "ok.yaml"), "--baseline",
                                         str(_write(d / "b.json", b"[" * 100_000 + b"]" * 100_000))], "b.json", "nested too deeply"),
    "config-deep-nesting": lambda d: (["size", str(_write(d / "config.json", b"[" * 100_000 + b"]" * 100_000))],
                                      "config.json", "not valid JSON"),
}


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _loop(path: Path) -> Path:
    os.symlink(path, path)
    return path


def _trace_workload(d: Path, fmt: str, trace: Path, name: str = "w.yaml") -> Path:
    return _write(d / name, f"experiment: capacity\npool: {{slots: 100000}}\nrequests:\n"
                            f"  trace: {{format: {fmt}, path: {trace}}}\n".encode())


def _column_workload(d: Path, column: Path) -> Path:
    return _write(d / "w.yaml", ("experiment: capacity\npool: {slots: 100000}\nrequests:\n  count: 10\n"
                                 f"  prompt: {{dist: csv, path: {column}, column: tokens}}\n"
                                 "  output: {dist: fixed, value: 10}\n").encode())


def _opt_config(**changes) -> bytes:
    import json

    config = json.loads((CORPUS.parents[1] / "models" / "facebook" / "opt-13b" / "config.json").read_text())
    return json.dumps({**config, **changes}).encode()


def _agentic_folder(d: Path) -> Path:
    folder = d / "sessions"
    folder.mkdir()
    _fifo(folder / "a.json")
    return folder


DEEP = b"[" * 100_000 + b"]" * 100_000
OK_CHECKS = str(CORPUS / "checks" / "ok.yaml")
OK_SERVE = str(CORPUS / "workloads" / "ok-serve.yaml")
LONG_LINE = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10," + b"9" * (1 << 20) + b"\n"

GENERATED.update({
    # things that are not regular files: refused by what they are, never opened
    "fifo-workload": lambda d: (["simulate", str(_fifo(d / "w.yaml"))], "w.yaml", "not a FIFO or device"),
    "fifo-check": lambda d: (["check", str(_fifo(d / "c.yaml"))], "c.yaml", "not a FIFO or device"),
    "fifo-baseline": lambda d: (["check", OK_CHECKS, "--baseline", str(_fifo(d / "b.json"))], "b.json", "not a FIFO or device"),
    "fifo-trace": lambda d: (["simulate", str(_trace_workload(d, "azure", _fifo(d / "t.csv")))], "w.yaml", "not a FIFO or device"),
    "fifo-length-column": lambda d: (["simulate", str(_column_workload(d, _fifo(d / "l.csv")))], "w.yaml", "not a FIFO or device"),
    "fifo-agentic-session": lambda d: (["simulate", str(_trace_workload(d, "agentic", _agentic_folder(d)))], "a.json", "not a FIFO or device"),
    "fifo-config": lambda d: (["size", str(_fifo(d / "config.json"))], "config.json", "neither a file"),
    "fifo-csv-output": lambda d: (["simulate", OK_SERVE, "--plot", str(d / "p.png"), "--csv", str(_fifo(d / "rows.csv"))], "rows.csv", "not a regular file"),
    # symlink loops
    "loop-workload": lambda d: (["simulate", str(_loop(d / "w.yaml"))], "w.yaml", "symlink loop"),
    "loop-check": lambda d: (["check", str(_loop(d / "c.yaml"))], "c.yaml", "symlink loop"),
    "loop-trace": lambda d: (["simulate", str(_trace_workload(d, "azure", _loop(d / "t.csv")))], "w.yaml", "symlink loop"),
    "loop-baseline": lambda d: (["check", OK_CHECKS, "--baseline", str(_loop(d / "b.json"))], "b.json", "symlink loop"),
    "loop-csv-output": lambda d: (["simulate", OK_SERVE, "--plot", str(d / "p.png"), "--csv", str(_loop(d / "rows.csv"))], "rows.csv", "symlink loop"),
    "loop-config": lambda d: (["size", str(_loop(d / "config.json"))], "config.json", "neither a file"),
    # bounded reading
    "trace-line-too-long": lambda d: (["simulate", str(_trace_workload(d, "azure", _write(d / "t.csv", LONG_LINE)))], "t.csv", "line longer than 1 MiB"),
    "trace-gzip-line-too-long": lambda d: (["simulate", str(_trace_workload(d, "azure", _write(d / "t.csv.gz", gzip.compress(LONG_LINE))))], "t.csv.gz", "line longer than 1 MiB"),
    "trace-sharegpt-deep-nesting": lambda d: (["simulate", str(_trace_workload(d, "sharegpt", _write(d / "s.json", DEEP)))], "s.json", "nested too deeply"),
    "trace-sharegpt-jsonl-deep-nesting": lambda d: (["simulate", str(_trace_workload(d, "sharegpt", _write(d / "s.jsonl", DEEP + b"\n")))], "s.jsonl", "nested too deeply"),
    "trace-mooncake-deep-nesting": lambda d: (["simulate", str(_trace_workload(d, "mooncake", _write(d / "m.jsonl", b'{"hash_ids": ' + DEEP + b"}\n")))], "m.jsonl", "nested too deeply"),
    "trace-agentic-deep-nesting": lambda d: (["simulate", str(_trace_workload(d, "agentic", _write(d / "a.json", DEEP)))], "a.json", "nested too deeply"),
    # a huge value becomes a short line
    "config-10mb-string": lambda d: (["size", str(_write(d / "config.json", _opt_config(torch_dtype="x" * 10_000_000)))], "config.json", "characters cut"),
    "workload-5mb-string": lambda d: (["simulate", str(_write(d / "w.yaml", b"experiment: " + b"x" * 5_000_000 + b"\n"))], "w.yaml", "characters cut"),
    "check-5mb-name": lambda d: (["check", str(_write(d / "c.yaml", b"checks:\n  - name: " + b"n" * 5_000_000 + b"\n"))], "c.yaml", "characters cut"),
    "trace-path-nul-byte": lambda d: (["simulate", str(_write(d / "w.yaml", b'experiment: capacity\npool: {slots: 100000}\n'
                                                                  b'requests:\n  trace: {format: azure, path: "t\\0.csv"}\n'))],
                                      "w.yaml", "NUL byte"),
    "trace-control-characters": lambda d: (["simulate", str(_trace_workload(d, "azure", _write(d / "t.csv", b"\x1b[2J\x07,x\n")))], "t.csv", "missing column"),
})
# Generated cases that could block if they regressed: run them in a subprocess with the hang guard.
GENERATED_SUBPROCESS = {name for name in GENERATED if name.startswith("fifo-")}
GENERATED_BUGS: dict[str, str] = {}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=[pytest.mark.xfail(strict=True, reason=GENERATED_BUGS[n])] if n in GENERATED_BUGS else [])
    for n in GENERATED
])  # fmt: skip
def test_generated_bad_input(name, tmp_path, places, capsys, monkeypatch):
    """Huge, binary and deeply nested files: refused in one located line, with nothing written.

    Files above a size limit must be refused before they are parsed: the parsers are replaced by
    ones that fail the test if called (a property of the code, not of the machine's speed).
    """
    inputs = tmp_path / "in"
    inputs.mkdir()
    args, file, says = GENERATED[name](inputs)
    case = {"file": file, "field": None, "says": says}
    if name in REFUSED_UNPARSED:
        _forbid_parsing(monkeypatch, REFUSED_UNPARSED[name])
    line = command_line({"args": args}, places[1])
    if name in GENERATED_SUBPROCESS:
        code, out, err = run_subprocess(line, places[0], HANG_GUARD_S)
    else:
        code, out, err = run_in_process(line, capsys)
    assert_one_located_line(case, code, out, err, places)


# generated case -> the parser its huge file must never reach
REFUSED_UNPARSED = {"workload-huge": "yaml", "check-huge": "yaml", "baseline-huge": "json"}


def _forbid_parsing(monkeypatch, parser: str) -> None:
    import kvplan.check.baseline
    import kvplan.workload.yaml_nodes

    def parsed(*args, **kwargs):
        raise AssertionError("a file above the size limit was parsed")

    if parser == "yaml":
        monkeypatch.setattr(kvplan.workload.yaml_nodes, "load_yaml_text", parsed)
    else:
        monkeypatch.setattr(kvplan.check.baseline.json, "loads", parsed)


def test_huge_sparse_workload_is_never_read_whole(tmp_path, places):
    """A 64 GiB (sparse) workload file under a 4 GiB address-space limit: refused by its size.

    Reading it whole would need 16 times the memory the subprocess may have, so a reader that
    tried would die with MemoryError or worse instead of printing the one line.
    """
    path = tmp_path / "sparse.yaml"
    with open(path, "wb") as f:
        f.write(b"experiment: capacity\n")
        f.truncate(64 << 30)
    case = {"file": "sparse.yaml", "field": None, "says": "larger than the 10 MiB limit"}
    code, out, err = run_subprocess(["simulate", str(path)], places[0], HANG_GUARD_S)
    assert_one_located_line(case, code, out, err, places)


def test_python_tags_are_never_run(places, capsys):
    """A workload, a check file and a config that mention os.system are refused; the command never runs."""
    for case_id in ("workload-python-tag", "check-python-tag", "config-dtype-python-tag"):
        case = next(c for c in CASES if c["id"] == case_id)
        code, _, err = run_in_process(command_line(case, places[1]), capsys)
        assert code == 2 and ("unsupported YAML tag" in err or "unknown dtype" in err)
    assert not (places[0] / "PWNED").exists() and not (CORPUS / "PWNED").exists()


def test_a_billion_requests_are_refused_before_any_draw(places, capsys, monkeypatch):
    """10^9 requests are refused by the reader before a single random number is drawn."""
    import kvplan.workload.distributions
    import kvplan.workload.build

    def drawn(*args, **kwargs):
        raise AssertionError("requests were drawn")

    monkeypatch.setattr(kvplan.workload.build, "synthetic_requests", drawn)
    monkeypatch.setattr(kvplan.workload.distributions.np.random, "default_rng", drawn)
    case = next(c for c in CASES if c["id"] == "workload-count-billion")
    code, _, err = run_in_process(command_line(case, places[1]), capsys)
    assert code == 2 and "above the limit" in err
