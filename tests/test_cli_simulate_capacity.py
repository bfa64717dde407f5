"""`kvplan simulate workloads/lesson.yaml`: the lesson's capacity experiment through the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT

LESSON = str(ROOT / "workloads" / "lesson.yaml")


def test_lesson_human_output(run_cli):
    """The lesson's sentences: 16 requests at 12.9%; 122 (7.6 times as many), 913 of 130,800 (0.7%)."""
    code, out, err = run_cli("simulate", LESSON)
    assert code == 0, err
    text = " ".join(out.split())
    assert "contiguous-max admits 16 requests that use 12.9% of the slots they reserved." in text
    assert "paged-B16 admits 122 (7.6 times as many) and wastes 913 of 130,800 allocated slots (0.7%)." in text
    assert "not a throughput benchmark" in text


def test_lesson_json(run_cli):
    """--json carries the integer keys the issue names, with the lesson's values."""
    code, out, _ = run_cli("simulate", LESSON, "--json")
    assert code == 0
    results = {r["allocator"]: r for r in json.loads(out)["results"]}
    c, p = results["contiguous"], results["paged"]
    assert (c["policy"], c["admitted"], c["allocated_slots"]) == ("max", 16, 16 * 8192)
    assert round(c["utilization"], 3) == 0.129
    assert (p["block_size"], p["admitted"], p["allocated_slots"], p["wasted_slots"]) == (16, 122, 130_800, 913)
    assert p["tokens_stored"] == p["allocated_slots"] - p["wasted_slots"]
    for r in results.values():
        assert sum(r["memory_breakdown"].values()) == pytest.approx(1.0)


def test_json_is_byte_identical(run_cli):
    """Same workload and seed: byte-identical JSON."""
    assert run_cli("simulate", LESSON, "--json")[1] == run_cli("simulate", LESSON, "--json")[1]


def test_block_size_sweep_and_plot(run_cli, tmp_path):
    """--block-sizes 1-64 sweeps seven block sizes beside the contiguous baseline and draws a PNG."""
    png = tmp_path / "sweep.png"
    code, out, err = run_cli("simulate", LESSON, "--block-sizes", "1-64", "--plot", str(png), "--json")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [r["block_size"] for r in results if r["allocator"] == "paged"] == [1, 2, 4, 8, 16, 32, 64]
    paged = {r["block_size"]: r for r in results if r["allocator"] == "paged"}
    assert paged[1]["wasted_slots"] == 0  # one-slot blocks waste nothing
    wastes = [paged[b]["wasted_slots"] for b in sorted(paged)]
    assert wastes == sorted(wastes)  # on this stream, waste grows with the block size
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]  # no temporary left behind


@pytest.mark.parametrize("args, field", [
    (["--block-sizes", "0"], "--block-sizes"),
    (["--block-sizes", "a,b"], "--block-sizes"),
    (["--plot", "/nonexistent-dir/x.png"], "--plot"),
    (["--plot", "chart.pdf"], "--plot"),
])
def test_bad_options(run_cli, args, field):
    """Bad sweep or plot options: one line naming the option, exit 2, nothing written."""
    code, out, err = run_cli("simulate", LESSON, *args)
    assert code == 2 and out == "" and field in err and err.count("\n") == 1


def test_plot_into_directory_is_refused(run_cli, tmp_path):
    """A directory where a file is expected is refused before any work."""
    code, _, err = run_cli("simulate", LESSON, "--plot", str(tmp_path))
    assert code == 2 and "directory" in err


def test_options_of_other_experiments_are_refused(run_cli, tmp_path):
    """--csv, --rates and --cache-blocks on a capacity workload are errors, not silently ignored."""
    for args in (["--csv", str(tmp_path / "r.csv")], ["--rates", "1,2"], ["--cache-blocks", "100"]):
        code, out, err = run_cli("simulate", LESSON, *args)
        assert code == 2 and args[0] in err and "capacity experiment" in err
    assert list(tmp_path.iterdir()) == []
