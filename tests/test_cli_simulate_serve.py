"""`kvplan simulate` on serve workloads through the CLI: tables, JSON, CSV, plot, rate sweep."""

from __future__ import annotations

import csv
import json

import pytest

SERVE = """\
name: tiny-serve
seed: 3
experiment: serve
pool: {slots: 256}
requests:
  count: 40
  prompt: {dist: uniform, low: 4, high: 40}
  output: {dist: uniform, low: 1, high: 30}
  arrival: {process: poisson, rate: 0.5}
allocators:
  - {kind: contiguous, policy: max}
  - {kind: paged, block_size: 16}
scheduler: {max_num_seqs: 8, max_model_len: 64}
"""


@pytest.fixture
def serve_file(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(SERVE)
    return path


def test_serve_json_keys_and_conservation(run_cli, serve_file):
    """Every request completes once per allocator, and the breakdown partitions the pool."""
    code, out, err = run_cli("simulate", str(serve_file), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["experiment"] == "serve" and doc["time_unit"] == "step"
    for r in doc["results"]:
        assert r["completed"] == 40
        assert sum(r["memory_breakdown"].values()) == pytest.approx(1.0)
        for key in ("ttft_s", "tpot_s", "e2e_s", "normalized_latency_s", "queue_delay_s"):
            assert set(r[key]) == {"mean", "p50", "p90", "p99"}
    paged = [r for r in doc["results"] if r["allocator"] == "paged"][0]
    contiguous = [r for r in doc["results"] if r["allocator"] == "contiguous"][0]
    assert paged["mean_running"] >= contiguous["mean_running"]  # reserving 64 per request fits 4 at once


def test_serve_json_byte_identical(run_cli, serve_file):
    """Same workload and seed: byte-identical JSON."""
    assert run_cli("simulate", str(serve_file), "--json")[1] == run_cli("simulate", str(serve_file), "--json")[1]


def test_serve_csv_and_plot(run_cli, serve_file, tmp_path):
    """--csv writes one row per request per allocator; --plot writes a PNG."""
    rows_file, png = tmp_path / "req.csv", tmp_path / "mem.png"
    code, out, err = run_cli("simulate", str(serve_file), "--csv", str(rows_file), "--plot", str(png))
    assert code == 0, err
    rows = list(csv.DictReader(rows_file.open()))
    assert len(rows) == 80 and {r["allocator"] for r in rows} == {"contiguous-max", "paged-B16"}
    for r in rows:
        assert float(r["arrival"]) <= float(r["first_token"]) <= float(r["finish"])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "Serving simulation" in out


def test_rate_sweep(run_cli, serve_file):
    """--rates adds a sweep whose latency never falls as the rate rises past saturation."""
    code, out, err = run_cli("simulate", str(serve_file), "--rates", "0.1,1,10", "--latency-bound", "5", "--json")
    assert code == 0, err
    sweeps = json.loads(out)["rate_sweep"]
    assert [s["label"] for s in sweeps] == ["contiguous-max", "paged-B16"]
    for s in sweeps:
        latencies = [p["normalized_latency_s"] for p in s["points"]]
        assert latencies[0] <= latencies[-1]


def test_bad_rates(run_cli, serve_file):
    """Non-positive or non-numeric rates are refused in one line."""
    for bad in ("0", "-1", "fast", "nan"):
        code, out, err = run_cli("simulate", str(serve_file), "--rates", bad)
        assert code == 2 and "--rates" in err and out == ""


def test_run_errors_name_the_workload_file(run_cli, tmp_path):
    """A pool too small for one max_model_len request is refused in one line naming the file."""
    path = tmp_path / "tiny.yaml"
    path.write_text("experiment: serve\npool: {slots: 100}\n"
                    "requests: {count: 5, prompt: {dist: fixed, value: 10}, output: {dist: fixed, value: 5}}\n")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and out == "" and str(path) in err and "pool" in err


def test_unwritable_output_is_one_line(run_cli, serve_file):
    """An output path under a regular file cannot be written: one line, exit 2."""
    code, _, err = run_cli("simulate", str(serve_file), "--csv", "/dev/null/rows.csv")
    assert code == 2 and "--csv" in err and err.count("\n") == 1
