"""bench/engine_pairs.py: vLLM and SGLang on the same setup, as `plan --engine vllm,sglang` compares
them, against the pairs of tests/data/engine_pairs.yaml (no constant fitted to them)."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from tests.conftest import ROOT, bench_module

BASELINE = ROOT / "tests" / "data" / "engine_pairs_baseline.json"


@pytest.fixture(scope="module")
def bench():
    return bench_module("engine_pairs")


def test_every_pair_is_two_quoted_rows_of_the_same_setup(bench):
    """Each run is a whole CSV row of its cited line; the two rows of a pair share the model, the
    system, TP, lengths and concurrency (the file's selection rule), differ in the engine, and the
    figures are the rows' own."""
    pairs = bench.load()
    assert len(pairs) == 34 and len({p["id"] for p in pairs}) == 34
    for p in pairs:
        keys = set()
        for engine in ("vllm", "sglang"):
            run = p[engine]
            assert re.fullmatch(r"https://github\.com/ai-dynamo/aiconfigurator/blob/[0-9a-f]{40}/\S+\.csv#L\d+",
                                run["source"]), p["id"]
            row = next(csv.reader(io.StringIO(run["quote"])))
            concurrency = re.search(r"silicon_concurrency=(\d+)", row[1])[1]
            backend, version, model, system, mode, isl, osl = row[2], row[3], row[4], row[5], row[7], row[8], row[9]
            assert (backend, version, mode, row[6]) == (engine, run["version"], "agg", ""), p["id"]  # bf16 both
            assert run["ttft_ms"] == pytest.approx(float(row[-2]), abs=1e-4), p["id"]
            assert run["tpot_ms"] == pytest.approx(float(row[-1]), abs=1e-4), p["id"]
            keys.add((model, system, int(row[13]), int(isl), int(osl), int(concurrency)))
        assert keys == {(p["model"], "h100_sxm", p["tp"], p["input_len"], p["output_len"], p["concurrency"])}, p["id"]


def test_the_throughput_of_a_closed_loop_by_hand(bench):
    """16 clients, 128-token answers of TTFT 200 ms and TPOT 20 ms: each request takes 0.2 + 127 x
    0.02 = 2.74 s, so 16 x 128 / 2.74 = 747.4 output tokens/s."""
    pair = {"concurrency": 16, "output_len": 128}
    assert bench.throughput(pair, 200.0, 20.0) == pytest.approx(16 * 128 / 2.74)
    assert bench.better("throughput", 1.0, 2.0) == "sglang" and bench.better("tpot", 1.0, 2.0) == "vllm"


def test_no_score_gets_worse_than_the_stored_baseline(bench):
    """A guard, not a target: bench/engine_pairs.py --json stored each engine's median |error|, the
    SGLang / vLLM ratio's, and the clear pairs where kvplan names the measured engine. A change that
    makes an error worse by more than 2 points, or names the engine right less often, fails here."""
    _, results = bench.run(workers=1)
    got, stored = bench.scores(results), json.loads(BASELINE.read_text(encoding="utf-8"))
    assert set(got) == set(stored)
    worse = [f"{k}: {got[k]} against {v}" for k, v in stored.items()
             if (got[k] < v if k.startswith("named") else got[k] > v + 0.02)]
    assert worse == []


def test_the_silicon_rows_follow_their_selection_rule(bench):
    """tests/data/aiconfigurator_silicon_rows.yaml (bench/silicon_rows.py): every row satisfies the
    header's rule, none is a row the step-time corpus was fitted on, and every engine_pairs run is
    among them, quoted alike (the same line, the same text)."""
    silicon_rows = bench_module("silicon_rows")
    rows = silicon_rows.load()
    assert len(rows) == 720 and len({r["line"] for r in rows}) == 720
    models = {"Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B-FP8", "deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3",
              "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B", "nvidia/Llama-3.1-8B-Instruct-FP8",
              "openai/gpt-oss-120b"}
    for r in rows:
        assert r["mode"] == "agg" and r["backend"] in ("vllm", "sglang") and r["model_path"] in models, r["line"]
        assert r["system"] in silicon_rows.GPUS and r["concurrency"] > 0, r["line"]
        assert all(int(r[k] or 1) <= 1 for k in ("moe_ep_size", "attention_dp_size", "pp_size")), r["line"]
        assert r["precision"] != "fp4" or r["model_path"] == "openai/gpt-oss-120b", r["line"]
    corpus = (ROOT / "tests" / "data" / "step_time_measurements.yaml").read_text(encoding="utf-8")
    fitted = {int(n) for n in re.findall(r"silicon_sample\.csv#L(\d+)", corpus)}
    assert len(fitted) == 21 and not fitted & {r["line"] for r in rows}
    by_line = {r["line"]: r["raw"] for r in rows}
    for pair in bench.load():
        for engine in ("vllm", "sglang"):
            line = int(pair[engine]["source"].rsplit("#L", 1)[1])
            assert by_line.get(line) == pair[engine]["quote"], (pair["id"], engine)


def test_silicon_rows_set_reaches_the_prediction():
    """bench/silicon_rows.py --set: a constant given there is the one a row is predicted with. With the
    experts' width term off (expert_half_width 0) a dense row predicts what it did, and an MoE row at
    TP 8 (DeepSeek-R1's experts 256 columns wide a GPU) a shorter TPOT, its experts streaming at the
    full rate instead of 256 / (256 + 277) of it."""
    silicon_rows = bench_module("silicon_rows")
    rows = silicon_rows.load()
    dense = next(r for r in rows if r["model_path"] == "Qwen/Qwen3-32B" and r["backend"] == "vllm")
    moe = next(r for r in rows if r["model_path"] == "deepseek-ai/DeepSeek-R1" and r["tp_size"] == "8")
    shipped = {id(r): silicon_rows.predict(r) for r in (dense, moe)}
    silicon_rows.SETS.update(expert_half_width=0.0)
    try:
        assert silicon_rows.predict(dense) == shipped[id(dense)]
        assert silicon_rows.predict(moe)["tpot"] < shipped[id(moe)]["tpot"]
    finally:
        silicon_rows.SETS.clear()
    assert silicon_rows.predict(moe) == shipped[id(moe)]
