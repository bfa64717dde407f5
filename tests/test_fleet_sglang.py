"""Fleets of SGLang servers (`engine: sglang` in a fleet file): each replica is SGLang's scheduler
(kvplan/sim/sglang_state.py), so a fleet of one is the SGLang serve run to the byte whatever the
router, round robin is N SGLang serve runs, a run stopped at any horizon and resumed is the run
done at once, and what the routers read of a replica is what SGLang reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvplan.errors import WorkloadError
from kvplan.sim import kernel as K
from kvplan.experiments import load
from kvplan.fleet.run import simulate_fleet
from kvplan.sim.engine import new_state, simulate
from kvplan.sim.inputs import make_setup, prepared_chunks
from kvplan.sim.metrics import build_result
from kvplan.sim.sglang_state import SglangState
from kvplan.workload.records import SglangConfig
from kvplan.workload.routing import ROUTER_NAMES as ROUTERS
from tests.test_fleet import replica_rows, serve_of, split_serve_runs
from tests.test_sim_engine import as_json
from tests.test_sim_sglang import SPEC, hand_workload, random_sglang_workload
from tests.test_sim_sglang_speculative import with_speculation

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFIXED = ("  count: 900\n  prompt: {dist: uniform, low: 200, high: 1600}\n  output: {dist: uniform, low: 20, high: 200}\n"
            "  arrival: {process: poisson, rate: 20}\n")
PREFIX = "prefix: {system_prompts: 8, system_prompt_len: 1536, hash_block_size: 16}\n"


def sglang_fleet(tmp_path, replicas: str = "  - {count: 1}\n", router: str = "round_robin"):
    path = tmp_path / "fleet.yaml"
    path.write_text(f"name: fleet\nexperiment: fleet\nengine: sglang\nmodel: {MODEL}\ngpu: L40S\n"
                    f"pool: {{kv_memory: 2GiB}}\nscheduler: {{max_model_len: 8192}}\nrequests:\n{PREFIXED}"
                    f"replicas:\n{replicas}router: {router}\n{PREFIX}")
    return path


@pytest.mark.parametrize("router", ROUTERS)
def test_a_fleet_of_one_sglang_server_is_its_serve_run_to_the_byte(tmp_path, router):
    """Whatever the router (those that look stop the replica at every refresh), one SGLang replica
    gives SGLang's serve result, radix cache and API server included."""
    path = sglang_fleet(tmp_path, router=f"{{policy: {router}, sync_interval_s: 0.05}}")
    fleet = simulate_fleet(load(path))
    wl = serve_of(path)
    assert wl.sglang is not None
    alone = simulate(wl, wl.allocators[0]).to_dict()
    assert json.dumps(replica_rows(fleet)[0], sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert alone["prefix_cache"]["prefix_hit_rate"] > 0.3  # the case exercises the radix cache


def test_round_robin_over_sglang_servers_is_n_serve_runs_of_the_split_streams(tmp_path):
    n = 3
    path = sglang_fleet(tmp_path, replicas=f"  - {{count: {n}}}\n")
    path.write_text(path.read_text().replace(PREFIX, ""))  # plain prompts: each replica's split is its own stream
    assert serve_of(path).sglang is not None
    assert replica_rows(simulate_fleet(load(path))) == split_serve_runs(path, n)


def run_in_pieces(wl, points: int, rng) -> dict:
    """The workload through one SglangState, each chunk loaded then run to a random horizon
    between its last arrival and the next chunk's first (nothing unloaded arrives before a
    horizon: a fleet's refresh keeps that promise), the end run at last."""
    setup = make_setup(wl, SPEC)
    state = new_state(setup, points)
    assert isinstance(state, SglangState)
    chunks = list(prepared_chunks(wl, setup))
    for chunk, after in zip(chunks, chunks[1:] + [None]):
        state.load(chunk)
        last = int(chunk.arrival[-1])
        nxt = int(after.arrival[0]) if after is not None else last + 2 * max(last - state.origin, 1)
        state.advance(int(rng.integers(last, nxt + 1)))
    state.advance(None)
    return build_result(state.raw(), setup, record_requests=True)


@pytest.mark.parametrize("seed", range(60))
def test_a_run_stopped_at_horizons_and_resumed_is_the_run_at_once(seed):
    """Breaks if sg_run steps past what is loaded, or if a resumed iteration differs from an
    uninterrupted one (the radix tree, the queues and the clock all live in the state's arrays)."""
    wl, points = (with_speculation if seed % 3 == 0 else random_sglang_workload)(seed)
    rng = np.random.default_rng([seed, 7])
    assert as_json(run_in_pieces(wl, points, rng)) == as_json(simulate(wl, SPEC, record_requests=True,
                                                                          timeline_points=points))


def test_what_a_router_reads_is_what_sglang_reports():
    """token_usage leaves the radix tree's evictable tokens out. One request of a 12-token prompt
    (hash blocks x y z of 4 tokens) and 4 output tokens, in steps: it prefills at step 0 and
    holds 12 tokens, decodes at steps 1-3 (13, 14, 15 held) and finishes at 4; its three blocks
    then stay in the tree, 12 evictable tokens nobody holds, and its output tokens are freed."""
    wl = hand_workload([(0, 12, 4, (1, 2, 3))], 200, SglangConfig(chunked_prefill_size=0))
    setup = make_setup(wl, SPEC)
    state = new_state(setup)
    (chunk,) = prepared_chunks(wl, setup)
    state.load(chunk)
    assert (state.outstanding, state.waiting, state.blocks_in_use) == (1, 1, 0)  # sent, not yet taken in
    state.advance(2)  # steps 0 and 1 run: 13 tokens held
    assert (state.now, state.outstanding, state.waiting, state.blocks_in_use) == (2, 1, 0, 13)
    node = int(chunk.ids.nodes[0])
    assert state.holds_node(node, 4)  # inserted after its prefill
    state.advance(None)
    assert (state.now, state.outstanding, state.waiting, state.blocks_in_use) == (4, 0, 0, 0)
    assert state.holds_node(node, 4) and setup.slots - int(state.st[K.FREE_BLOCKS]) == 12


def test_a_disaggregated_fleet_of_sglang_servers_is_refused(tmp_path):
    path = tmp_path / "pd.yaml"
    path.write_text(f"name: pd\nexperiment: fleet\nengine: sglang\nmodel: {MODEL}\ngpu: L40S\npool: {{kv_memory: 2GiB}}\n"
                    "requests:\n  count: 10\n  prompt: {dist: fixed, value: 100}\n  output: {dist: fixed, value: 10}\n"
                    "replicas:\n  - {count: 1, role: prefill}\n  - {count: 1, role: decode}\n"
                    "transfer: {gb_per_s: 50}\n")
    with pytest.raises(WorkloadError) as info:
        load(path)
    assert info.value.field == "engine" and "disaggregated" in info.value.message
