"""`kvplan plan --engine vllm,sglang`: SGLang as a dimension of the search. An SGLang configuration
is served by SGLang's scheduler on the pool SGLang starts with (`kvplan size --engine sglang`'s),
vLLM's batch options map to SGLang's, the rows and the answer say the engine, the fresh seeds
re-simulate it, and 1 worker and 2 give the same rows."""

from __future__ import annotations

import csv
import json

import pytest

from kvplan.model.sglang_size import sglang_size
from kvplan.plan.search import Config, Rules, Targets, Traffic, search
from kvplan.plan.space import config_workload
from tests.test_plan import BOOK, MODEL

TRAFFIC = Traffic(rate=6.0, prompt=800, output=100, count=300)
TARGETS = Targets(ttft_p99=1.0, tpot_p99=0.06)
SPACE = [Config("L40S", 1), Config("L40S", 1, engine="sglang"), Config("H100-80GB", 1, engine="sglang")]


def test_an_sglang_configuration_runs_sglang_on_its_startup_pool():
    """Breaks if an SGLang configuration keeps vLLM's scheduler, pool or limits: its pool is
    `kvplan size --engine sglang`'s max_total_num_tokens, its limits SGLang's for the GPU."""
    wl = config_workload(MODEL, TRAFFIC, Config("L40S", 1, engine="sglang"))
    m = sglang_size(MODEL, gpu="L40S").memory
    assert wl.sglang is not None and wl.pool.slots == m.max_total_num_tokens
    # an L40S's 46,068 MiB is in [35, 60) GiB: SGLang's chunk is 4096 (sglang_memory.batch_defaults)
    assert (wl.sglang.chunked_prefill_size, wl.sglang.max_running_requests) == (4096, m.max_running_requests)
    assert config_workload(MODEL, TRAFFIC, Config("L40S", 1)).sglang is None  # vLLM's, unchanged


def test_vllms_batch_options_map_to_sglangs():
    """Breaks if max_num_seqs / max_num_batched_tokens / prefix caching off are not SGLang's
    max_running_requests / chunked_prefill_size / radix cache off (the chunk also moves SGLang's
    default fraction, so the pool is size's with that chunk)."""
    c = Config("H100-80GB", 1, max_num_seqs=64, prefix_caching=False, max_num_batched_tokens=2048, engine="sglang")
    wl = config_workload(MODEL, TRAFFIC, c)
    m = sglang_size(MODEL, gpu="H100-80GB", chunked_prefill_size=2048, max_running_requests=64).memory
    assert (wl.sglang.max_running_requests, wl.sglang.chunked_prefill_size) == (64, 2048)
    assert wl.pool.slots == m.max_total_num_tokens and not wl.sglang.radix_cache
    assert c.label == "H100-80GB x1 sglang running 64 chunk 2048 no-cache"


@pytest.fixture(scope="module")
def planned():
    return search(MODEL, TRAFFIC, TARGETS, SPACE, BOOK, Rules(seeds=(1,)))


def test_sglang_rows_are_planned_within_their_bounds(planned):
    """Breaks if an SGLang row is left out for vLLM's reasons or beats its own closed-form ceiling
    (the bounds restated with SGLang's chunk and running cap must stay above what it serves)."""
    rows = {e.config.label: e for e in planned}
    assert set(rows) == {"L40S x1", "L40S x1 sglang", "H100-80GB x1 sglang"}
    for label in ("L40S x1 sglang", "H100-80GB x1 sglang"):
        e = rows[label]
        assert e.simulated and e.capacity > 0 and e.capacity <= e.bound_rate
        if e.feasible:
            assert e.seeds == (1,)  # re-simulated on the fresh seed like a vLLM row


def test_one_worker_and_two_give_the_same_rows_with_sglang(planned):
    two = search(MODEL, TRAFFIC, TARGETS, SPACE, BOOK, Rules(seeds=(1,)), workers=2)
    assert [e.to_dict() for e in two] == [e.to_dict() for e in planned]


def test_the_command_compares_the_engines(tmp_path, run_cli):
    """Breaks if the document, the CSV or the text stop saying each row's engine and which engine
    wins by how much; or if a vLLM-only plan's document gains engine keys (it stays as before)."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"prices": [{"gpu": "L40S", "usd_per_gpu_hour": 1.0}]}))
    args = ["plan", MODEL, "--rate", "6", "--prompt", "800", "--output", "100", "--count", "300", "--ttft-p99", "1",
            "--tpot-p99", "0.06", "--prices", str(prices), "--gpu", "L40S", "--tp", "1", "--workers", "1"]
    code, out, err = run_cli(*args, "--engine", "vllm,sglang", "--json", "--csv", str(tmp_path / "p.csv"))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["rules"]["engines"] == ["vllm", "sglang"] and doc["rules"]["router"] == "round_robin"
    assert {r["config"]["engine"] for r in doc["results"]} == {"vllm", "sglang"}
    cmp = doc["engines"]
    best = {e: b for e, b in cmp["best"].items() if b is not None}
    assert set(best) == {"vllm", "sglang"} and cmp["winner"] == doc["answer"]["config"]["engine"]
    loser = next(e for e in best if e != cmp["winner"])
    assert cmp["margin"] == pytest.approx(best[loser]["cost_per_hour"] / best[cmp["winner"]]["cost_per_hour"] - 1)
    with open(tmp_path / "p.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["engine"] for r in table] == [r["config"]["engine"] for r in doc["results"]]
    code, text, err = run_cli(*args, "--engine", "vllm,sglang")
    assert code == 0 and ("wins" in text or "tie on the cost" in text)
    code, out, err = run_cli(*args, "--router", "none", "--json")
    plain = json.loads(out)
    assert "engines" not in plain and all("engine" not in r["config"] for r in plain["results"])


def test_an_sglang_row_is_checked_on_a_fleet_of_sglang_servers(planned):
    """Breaks if the fleet check refuses an SGLang row, runs it on vLLM's replicas (a fleet of one
    SGLang server is its serve run: tests/test_fleet_sglang.py), or tries it as disaggregated pools
    (SGLang's disaggregation is not modelled: it is checked colocated)."""
    from kvplan.fleet.run import Replica, Group
    from kvplan.plan.fleet_check import checked
    from kvplan.sim.inputs import make_setup
    from kvplan.sim.sglang_state import SglangState
    from kvplan.workload.spec import Transfer

    wl = config_workload(MODEL, TRAFFIC, Config("L40S", 1, engine="sglang"))
    assert isinstance(Replica(0, Group("g", 1, wl), make_setup(wl, wl.allocators[0])).state, SglangState)
    rows = [e for e in planned if e.config.engine == "sglang" and e.feasible]
    assert rows
    fleets = checked(MODEL, TRAFFIC, TARGETS, rows, ["round_robin"], len(rows), Transfer(50.0, 0.001), book=BOOK)
    for e in fleets:
        assert e.config.engine == "sglang" and e.router == "round_robin" and e.prefill_replicas == 0
        assert e.feasible or "still miss the targets" in e.reason


def test_a_workload_traffic_counts_its_shared_prefixes(tmp_path):
    """Breaks if plan's traffic from a workload file measures its prompts without the prefix
    section's shared starts: each request is 1,000 system-prompt tokens + 200 of its own + 50
    out, so the mean prompt is 1,200 and the longest request (each configuration's
    max_model_len) 1,250, not 250 (which clipped every request to one output token)."""
    from kvplan.plan.space import from_workload

    path = tmp_path / "t.yaml"
    path.write_text(f"name: t\nmodel: {MODEL}\npool: {{slots: 100000}}\nrequests:\n  count: 40\n"
                    "  prompt: {dist: fixed, value: 200}\n  output: {dist: fixed, value: 50}\n"
                    "  arrival: {process: poisson, rate: 4}\nprefix: {system_prompts: 1, system_prompt_len: 1000}\n")
    t = from_workload(path, None, None)
    assert (t.prompt, t.output, t.max_model_len) == (1200, 50, 1250)
