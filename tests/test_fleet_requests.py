"""A fleet's rows per request (`kvplan simulate FLEET --csv`) and goodput against an `slo:`:
the rows agree with the fleet's own percentiles and routing, goodput is the hand count of the
rows within every limit, and the serve engine counts it the same way."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from kvplan.experiments import load
from kvplan.fleet.run import simulate_fleet

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REQUESTS = ("requests:\n  count: 400\n  prompt: {dist: lognormal, mean: 900, sigma: 0.8}\n"
            "  output: {dist: lognormal, mean: 150, sigma: 0.8}\n  arrival: {process: poisson, rate: 9}\n")
SLO = "slo: {ttft_s: 0.1, tpot_s: 0.04}\n"


def _file(tmp_path, body: str, name: str = "f.yaml", experiment: str = "fleet"):
    path = tmp_path / name
    path.write_text(f"name: f\nexperiment: {experiment}\nmodel: {MODEL}\ngpu: L40S\n"
                    "pool: {gpu_memory_utilization: 0.9}\nscheduler: {max_model_len: 8192, prefix_caching: false}\n"
                    + REQUESTS + body)
    return path


def _rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _hand_goodput(rows, ttft: float, tpot: float) -> int:
    return sum(float(r["ttft_s"]) <= ttft and (r["tpot_s"] == "" or float(r["tpot_s"]) <= tpot) for r in rows)


def test_a_fleets_rows_agree_with_its_result(tmp_path, run_cli):
    """One row per request, numbered in arrival order; the replica column routes as the result
    says; the TTFT and E2E percentiles of the rows are the fleet's; goodput is the hand count of
    rows within 100 ms TTFT and 40 ms TPOT, over the fleet's span."""
    path = _file(tmp_path, "replicas:\n  - {name: a, count: 2}\n  - {name: b, count: 1}\nrouter: least_outstanding\n"
                 + SLO)
    out = tmp_path / "rows.csv"
    code, stdout, err = run_cli("simulate", str(path), "--csv", str(out), "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    rows = _rows(out)
    assert [int(r["request"]) for r in rows] == list(range(400))
    assert [sum(r["replica"] == str(i) for r in rows) for i in range(3)] == [x["routed"] for x in doc["replicas"]]
    assert {r["group"] for r in rows if r["replica"] == "2"} == {"b"}
    ttft = np.array([float(r["ttft_s"]) for r in rows])
    e2e = np.array([float(r["e2e_s"]) for r in rows])
    assert np.percentile(ttft, 99) == pytest.approx(doc["fleet"]["ttft_s"]["p99"], rel=1e-9)
    assert np.percentile(e2e, 50) == pytest.approx(doc["fleet"]["e2e_s"]["p50"], rel=1e-9)
    met = _hand_goodput(rows, 0.1, 0.04)
    good = doc["fleet"]["goodput"]
    assert 0 < met < 400  # the limits split the requests
    assert good["requests"] == met == sum(int(r["within_slo"]) for r in rows)
    assert good["share"] == pytest.approx(met / 400)
    assert good["rps"] == pytest.approx(met / doc["fleet"]["makespan"])
    assert sum(x["goodput"]["requests"] for x in doc["replicas"]) == met
    assert "goodput" in run_cli("simulate", str(path))[1]


def test_a_fleet_of_one_counts_goodput_as_serve_does(tmp_path, run_cli):
    fleet = _file(tmp_path, "replicas:\n  - {count: 1}\n" + SLO)
    serve = _file(tmp_path, SLO, name="s.yaml", experiment="serve")
    a = json.loads(run_cli("simulate", str(fleet), "--json")[1])
    b = json.loads(run_cli("simulate", str(serve), "--json")[1])
    assert a["replicas"][0]["goodput"] == b["results"][0]["goodput"]
    assert a["fleet"]["goodput"]["requests"] == b["results"][0]["goodput"]["requests"]


def test_a_disaggregated_fleets_rows_name_both_replicas_and_the_transfer(tmp_path):
    path = _file(tmp_path, "transfer: {gb_per_s: 10, latency_s: 0.001}\nreplicas:\n"
                 "  - {name: p, role: prefill, count: 1}\n  - {name: d, role: decode, count: 2}\n" + SLO)
    result = simulate_fleet(load(path), record=True)
    rows = result.requests
    assert set(rows["prefill_replica"].tolist()) == {0} and set(rows["replica"].tolist()) == {1, 2}
    assert np.percentile(rows["transfer_s"], 50) == pytest.approx(result.transfer.p50, rel=1e-12)
    assert np.percentile(rows["ttft_s"], 99) == pytest.approx(result.ttft.p99, rel=1e-12)
    # each transfer: its wait for the link + the prompt's KV over 10 GB/s + 1 ms
    alone = rows["prompt"] * 131072 / 10e9 + 0.001
    assert np.allclose(rows["transfer_s"] - rows["transfer_wait_s"], alone, atol=2e-9)
    ok = (rows["ttft_s"] <= 0.1) & (np.isnan(rows["tpot_s"]) | (rows["tpot_s"] <= 0.04))
    assert result.goodput["requests"] == int(ok.sum()) == int(rows["within_slo"].sum())
    out = tmp_path / "pd.csv"
    from kvplan.report.fleet_view import write_fleet_csv

    write_fleet_csv(result, out)
    first = _rows(out)[0]
    assert first["prefill_group"] == "p" and first["group"] == "d" and float(first["transfer_s"]) > 0


@pytest.mark.parametrize("body,needle", [
    ("slo: {}\n", "at least one"),
    ("slo: {ttft_s: -1}\n", "ttft_s"),
    ("slo: {ttft: 2}\n", "ttft"),
    ("slo: 2\n", "slo"),
])
def test_a_bad_slo_is_one_line(tmp_path, run_cli, body, needle):
    path = _file(tmp_path, "replicas:\n  - {count: 1}\n" + body)
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and needle in err and str(path) in err and len(err.strip().splitlines()) == 1, err


def test_an_slo_needs_seconds_and_a_serve_or_fleet_run(tmp_path, run_cli):
    path = tmp_path / "nogpu.yaml"
    path.write_text(f"name: n\nmodel: {MODEL}\npool: {{slots: 100000}}\n" + REQUESTS + SLO)
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "slo" in err and "gpu" in err and len(err.strip().splitlines()) == 1, err
    path.write_text(f"name: n\nexperiment: capacity\nmodel: {MODEL}\npool: {{slots: 100000}}\n" + REQUESTS + SLO)
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "slo" in err and "serve and fleet" in err, err
