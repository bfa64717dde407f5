"""Files read and written with bounds (issue 29): every JSON reader goes through fileio.load_json,
a gzip trace may not unpack without end, and an output never replaces a symlink or a read-only
file. The refusals through the CLI are in tests/bad_inputs/cases-files.yaml."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from kvplan import fileio
from kvplan.errors import KvplanError, TraceError

ROOT = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
HOSTILE_JSON = {
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "a 5,000-digit number": '{"x": ' + "9" * 5000 + "}",
}


@pytest.fixture
def cli(run_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    return run_cli


def one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


# ---- every JSON file kvplan reads ----------------------------------------------------------------


@pytest.mark.parametrize("what", sorted(HOSTILE_JSON))
def test_a_hostile_prices_file_is_one_line(tmp_path, cli, what):
    prices = tmp_path / "prices.json"
    prices.write_text(HOSTILE_JSON[what])
    code, out, err = cli("plan", MODEL, "--rate", "1", "--ttft-p99", "1", "--prices", str(prices))
    one_line(code, out, err, "prices.json", "--prices", "not valid JSON")


@pytest.mark.parametrize("what", sorted(HOSTILE_JSON))
def test_a_hostile_model_config_is_one_line(tmp_path, cli, what):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(HOSTILE_JSON[what])
    code, out, err = cli("size", str(folder))
    one_line(code, out, err, "config.json", "not valid JSON")


@pytest.mark.parametrize("what", sorted(HOSTILE_JSON))
def test_a_hostile_baseline_is_one_line(tmp_path, cli, monkeypatch, what):
    baseline = tmp_path / "b.json"
    baseline.write_text(HOSTILE_JSON[what])
    monkeypatch.chdir(ROOT / "tests" / "bad_inputs" / "checks")
    code, out, err = cli("check", "ok.yaml", "--baseline", str(baseline))
    one_line(code, out, err, "b.json", "not valid JSON")


@pytest.mark.parametrize("number", ["1" + "0" * 400, "-1" + "0" * 400, "1e400"])
def test_a_baseline_number_past_a_float_is_refused(tmp_path, cli, monkeypatch, number):
    """10**400 raised OverflowError in the comparison; 1e400 would have been infinity."""
    baseline = tmp_path / "b.json"
    baseline.write_text('{"kvplan_check_baseline": 1, "checks": {"ok-paged": {"admitted": %s}}}' % number)
    monkeypatch.chdir(ROOT / "tests" / "bad_inputs" / "checks")
    code, out, err = cli("check", "ok.yaml", "--baseline", str(baseline))
    one_line(code, out, err, "b.json", "too large for a number")


def test_a_large_baseline_integer_that_a_float_holds_still_compares(tmp_path, cli, monkeypatch):
    baseline = tmp_path / "b.json"
    baseline.write_text('{"kvplan_check_baseline": 1, "checks": {"ok-paged": {"admitted": %d}}}' % 10**300)
    monkeypatch.chdir(ROOT / "tests" / "bad_inputs" / "checks")
    code, out, err = cli("check", "ok.yaml", "--baseline", str(baseline))
    assert code == 1 and "fell by" in out, out + err  # 100 admitted against 1e300: a drop, not a crash


def test_no_reader_parses_json_unbounded():
    """json.loads is called only inside fileio (or on text kvplan itself wrote)."""
    allowed = {ROOT / "kvplan" / "fileio.py", ROOT / "kvplan" / "check" / "run.py",
               ROOT / "kvplan" / "workload" / "traces" / "mooncake.py"}
    # check/run.py: a deep copy of a record kvplan built; mooncake.py: the scan of the first and last
    # line, whose failure is reported when the line is read through load_json.
    found = [p for p in (ROOT / "kvplan").rglob("*.py")
             if p not in allowed and ("json.loads(" in p.read_text() or "json.load(" in p.read_text())]
    assert found == []


# ---- text traces: gzip bombs and blank lines -----------------------------------------------------


def test_a_gzip_bomb_is_refused_past_the_ratio(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "GZIP_FREE_BYTES", 1000)
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b"00000007\n" * 100_000, 9))  # 900 kB in a few kB
    with pytest.raises(TraceError, match="unpacks to more than 200 times its size") as info:
        list(fileio.text_lines(path, TraceError))
    packed = path.stat().st_size
    assert info.value.line == max(fileio.GZIP_FREE_BYTES, 200 * packed) // 9 + 1  # the first line past it


def test_a_gzip_that_compresses_like_a_trace_is_read_whole(tmp_path, monkeypatch):
    """The cap is a ratio: a trace that compresses 3-35x, as real ones do, is never cut."""
    monkeypatch.setattr(fileio, "GZIP_FREE_BYTES", 1000)
    import random

    rng = random.Random(0)
    lines = [f"{i},{rng.random():.6f},{rng.randint(1, 9000)},{rng.randint(0, 900)}\n" for i in range(20_000)]
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress("".join(lines).encode(), 9))
    assert len(lines) * len(lines[0]) / path.stat().st_size < 200
    assert list(fileio.text_lines(path, TraceError)) == lines


def test_plain_files_have_no_ratio_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "GZIP_FREE_BYTES", 10)
    path = tmp_path / "t.txt"
    path.write_text("7\n" * 5000)
    assert len(list(fileio.text_lines(path, TraceError))) == 5000


def test_a_run_of_blank_lines_is_refused_and_shorter_runs_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "MAX_BLANK_RUN", 5)
    ok = tmp_path / "ok.txt"
    ok.write_text("a\n" + "\n" * 5 + "b\n" + " \t\r\n" * 5 + "c\n")
    assert [line.strip() for line in fileio.text_lines(ok, TraceError) if line.strip()] == ["a", "b", "c"]
    bad = tmp_path / "bad.txt"
    bad.write_text("a\n" + "\n" * 6 + "b\n")
    with pytest.raises(TraceError, match="more than 5 blank lines in a row") as info:
        list(fileio.text_lines(bad, TraceError))
    assert info.value.line == 7


# ---- outputs: symlinks and read-only files -------------------------------------------------------


@pytest.fixture
def check_file():
    return str(ROOT / "tests" / "bad_inputs" / "checks" / "ok.yaml")


def test_markdown_onto_a_symlink_to_a_read_only_file_is_refused(tmp_path, cli, check_file):
    """It used to replace the symlink with a regular file."""
    target = tmp_path / "kept.md"
    target.write_text("someone else's\n")
    target.chmod(0o444)
    link = tmp_path / "link.md"
    link.symlink_to(target.name)
    code, out, err = cli("check", check_file, "--markdown", str(link))
    one_line(code, out, err, "kept.md", "--markdown", "read-only")
    assert link.is_symlink() and os.readlink(link) == "kept.md"
    assert target.read_text() == "someone else's\n" and (target.stat().st_mode & 0o777) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.md", "link.md"]  # no temporary left


def test_a_read_only_output_is_refused(tmp_path, cli, check_file):
    target = tmp_path / "summary.md"
    target.write_text("mine\n")
    target.chmod(0o400)
    code, out, err = cli("check", check_file, "--markdown", str(target))
    one_line(code, out, err, "summary.md", "read-only")
    assert target.read_text() == "mine\n"


def test_an_output_symlink_is_written_through(tmp_path, cli, check_file):
    """A writable file behind a link is replaced; the link stays a link, the mode is kept."""
    target = tmp_path / "real.md"
    target.write_text("old\n")
    target.chmod(0o640)
    link = tmp_path / "link.md"
    link.symlink_to(target)
    code, out, err = cli("check", check_file, "--markdown", str(link))
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert "kvplan check" in target.read_text() and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.md", "real.md"]


def test_a_dangling_output_symlink_names_its_target(tmp_path, cli, check_file):
    link = tmp_path / "link.md"
    link.symlink_to(tmp_path / "missing" / "x.md")
    code, out, err = cli("check", check_file, "--markdown", str(link))
    one_line(code, out, err, "missing", "does not exist")
    assert link.is_symlink()


def test_load_json_refuses_what_json_loads_raises_on():
    for text in HOSTILE_JSON.values():
        with pytest.raises(KvplanError, match="not valid JSON"):
            fileio.load_json(text, Path("x.json"), KvplanError)
    assert fileio.load_json(json.dumps({"a": [1, 2.5]}), Path("x.json"), KvplanError) == {"a": [1, 2.5]}
