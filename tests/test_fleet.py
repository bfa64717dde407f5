"""Fleet simulation: a fleet of one is the serve run, round robin is N serve runs of the split
streams, the prefix-aware router keeps the cache hits, and bad fleet files are one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvplan.experiments import load
from kvplan.sim.engine import simulate
from kvplan.fleet.run import simulate_fleet
from kvplan.workload.routing import ROUTER_NAMES as ROUTERS
from tests.conftest import shared_dir

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SERVED = ("replica", "group", "role", "routed", "busy_s")  # what a fleet adds to a replica's serve result


def fleet_file(tmp_path, requests: str, replicas: str = "  - {count: 1}\n", router: str = "round_robin",
               extra: str = "", name: str = "fleet.yaml"):
    path = tmp_path / name
    path.write_text(f"name: fleet\nexperiment: fleet\nmodel: {MODEL}\ngpu: L40S\npool: {{gpu_memory_utilization: 0.9}}\n"
                    f"scheduler: {{max_model_len: 8192}}\nrequests:\n{requests}replicas:\n{replicas}router: {router}\n"
                    + extra)
    return path


POISSON = ("  count: 1500\n  prompt: {dist: lognormal, mean: 900, sigma: 0.8}\n"
           "  output: {dist: lognormal, mean: 150, sigma: 0.8}\n  arrival: {process: poisson, rate: 9}\n")
PREFIXED = ("  count: 1200\n  prompt: {dist: fixed, value: 1600}\n  output: {dist: fixed, value: 40}\n"
            "  arrival: {process: poisson, rate: 24}\n")
PREFIX = "prefix: {system_prompts: 8, system_prompt_len: 1536, hash_block_size: 16}\n"


def serve_of(path):
    """The same file served by one engine: `experiment: serve`, the fleet keys dropped."""
    wl = load(path)
    return replace(wl, experiment="serve")


def replica_rows(result) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in SERVED} for r in result.to_dict()["replicas"]]


@pytest.mark.parametrize("router", ROUTERS)
def test_a_fleet_of_one_is_the_serve_run_to_the_byte(tmp_path, router):
    """Whatever the router (those that look at the replicas stop it at every refresh), one replica
    gives the serve engine's result, with prefix caching and an API server in the clock."""
    path = fleet_file(tmp_path, PREFIXED, router=f"{{policy: {router}, sync_interval_s: 0.05}}", extra=PREFIX)
    fleet = simulate_fleet(load(path))
    wl = serve_of(path)
    alone = simulate(wl, wl.allocators[0]).to_dict()
    assert json.dumps(replica_rows(fleet)[0], sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert alone["prefix_cache"]["prefix_hit_rate"] > 0.3  # the case exercises the cache


def split_serve_runs(path, n: int) -> list[dict]:
    """The file's requests dealt round robin to n streams, each served alone (its serve result)."""
    import numpy as np

    wl = serve_of(path)
    chunks = list(wl.make_requests())
    arrival = np.concatenate([c.arrival for c in chunks])
    prompt = np.concatenate([c.prompt_len for c in chunks])
    output = np.concatenate([c.output_len for c in chunks])
    out = []
    for r in range(n):
        part = replace(chunks[0], arrival=arrival[r::n], prompt_len=prompt[r::n], output_len=output[r::n], cut=None)
        own = replace(wl, make_requests=lambda part=part: iter([part]), num_requests=len(part.arrival))
        out.append(simulate(own, own.allocators[0]).to_dict())
    return out


def test_round_robin_is_n_serve_runs_of_the_split_streams(tmp_path):
    n = 3
    path = fleet_file(tmp_path, POISSON, replicas=f"  - {{count: {n}}}\n")
    assert replica_rows(simulate_fleet(load(path))) == split_serve_runs(path, n)


def test_the_fleet_counts_every_request_once_and_measures_busy_time(tmp_path):
    path = fleet_file(tmp_path, POISSON, replicas="  - {count: 2}\n  - {count: 1, gpu: H100-80GB, name: big}\n",
                      router="least_outstanding")
    doc = simulate_fleet(load(path)).to_dict()
    f, reps = doc["fleet"], doc["replicas"]
    assert f["completed"] == 1500 == sum(r["routed"] for r in reps) == sum(r["completed"] for r in reps)
    assert [r["group"] for r in reps] == ["group0", "group0", "big"]
    assert all(0 < r["busy_s"] <= r["makespan"] + 1e-9 for r in reps)
    assert f["imbalance"] == pytest.approx(max(r["busy_s"] for r in reps) / (sum(r["busy_s"] for r in reps) / 3))
    # the faster H100 finishes its requests sooner, so a router counting outstanding ones sends it more
    assert reps[2]["routed"] > max(reps[0]["routed"], reps[1]["routed"])


def test_prefix_aware_keeps_the_hits_round_robin_scatters(tmp_path):
    """Prompts of one of 250 system prompts (1,536 tokens: 384k tokens in all) and 200 tokens of
    their own, over four L40S replicas whose pools hold about 209k tokens each: the prefix-aware
    router sends each system prompt back where it is cached (a quarter of them per replica); round
    robin sends every one everywhere, and the caches evict each other's prompts. (Prefill saved
    weighs 4x the KV held here: at Dynamo's default of 1, load evens out first.)"""
    rows = {}
    many = PREFIX.replace("system_prompts: 8", "system_prompts: 250").replace("}", ", popularity: uniform}")
    requests = PREFIXED.replace("count: 1200", "count: 2400").replace("value: 1600", "value: 200")
    for name, router in (("round_robin", "round_robin"), ("prefix_aware", "{policy: prefix_aware, overlap_weight: 4}")):
        path = fleet_file(tmp_path, requests, replicas="  - {count: 4}\n", router=router, name=f"{name}.yaml",
                          extra=many)
        rows[name] = simulate_fleet(load(path)).to_dict()["fleet"]
    assert rows["prefix_aware"]["prefix_hit_rate"] > rows["round_robin"]["prefix_hit_rate"] + 0.3
    assert rows["prefix_aware"]["ttft_s"]["p50"] < rows["round_robin"]["ttft_s"]["p50"]


@pytest.mark.parametrize("trace", ["agentic", "mooncake"])
def test_prefix_aware_beats_round_robin_on_the_shared_traces(tmp_path, trace):
    """On four H100s, the hit rate with the prefix-aware router is at least round robin's, and its
    p99 TTFT lower, on the agentic and the Mooncake conversation traces (the latter at 2.5x its
    recorded spacing: a quarter of what one H100 takes at 10x; skipped where ../shared is absent)."""
    base = shared_dir() / "traces"
    requests = {
        "agentic": "  trace: {format: agentic, path: %s, too_long: clip}\n" % (base / "kv-cache-tester-agentic"),
        "mooncake": "  trace: {format: mooncake, path: %s, too_long: clip, time_scale: 2.5}\n"
                    % (base / "mooncake-fast25" / "conversation_trace.jsonl"),
    }[trace]
    target = base / ("kv-cache-tester-agentic" if trace == "agentic" else "mooncake-fast25/conversation_trace.jsonl")
    if not target.exists():
        pytest.skip(f"{target} is not there")
    hit = {}
    for router in ("round_robin", "prefix_aware"):
        path = fleet_file(tmp_path, requests, replicas="  - {count: 4}\n", router=router, name=f"{router}.yaml")
        path.write_text(path.read_text().replace("max_model_len: 8192", "max_model_len: 131072")
                        .replace("gpu: L40S", "gpu: H100-80GB"))
        result = simulate_fleet(load(path))
        hit[router] = (result.prefix_hit_rate, result.ttft.p99)
    assert hit["prefix_aware"][0] >= hit["round_robin"][0]
    assert hit["prefix_aware"][1] < hit["round_robin"][1]


@pytest.mark.parametrize("replicas,router,needle", [
    ("  - {count: 0}\n", "round_robin", "replicas"),
    ("  - {count: 1, colour: red}\n", "round_robin", "colour"),
    ("  - {count: 1}\n", "fastest", "router"),
    ("  - {count: 1}\n", "{policy: round_robin, sync_interval_s: -1}", "sync_interval_s"),
    ("  - {count: 1}\n", "{policy: llm_d, gateway_s: -0.01}", "gateway_s"),
    ("  - {count: 1}\n", "{policy: random, gateway_s: fast}", "gateway_s"),
    ("  - {count: 1, gpu: NoSuchGPU}\n", "round_robin", "NoSuchGPU"),
])
def test_a_bad_fleet_file_is_one_line_naming_it(tmp_path, run_cli, replicas, router, needle):
    path = fleet_file(tmp_path, POISSON, replicas=replicas, router=router)
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and str(path) in err and needle in err and len(err.strip().splitlines()) == 1, err


def test_the_command_prints_the_fleet_and_its_replicas(tmp_path, run_cli):
    path = fleet_file(tmp_path, POISSON, replicas="  - {count: 2}\n", router="least_kv")
    code, out, err = run_cli("simulate", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["experiment"] == "fleet" and doc["router"]["policy"] == "least_kv" and len(doc["replicas"]) == 2
    code, out, err = run_cli("simulate", str(path), "--plot", str(tmp_path / "fleet.png"))
    assert code == 0 and "2 replicas behind least_kv" in out and (tmp_path / "fleet.png").stat().st_size > 0


@pytest.mark.parametrize("section,needle", [("replicas: 5\n", "replicas"), ("replicas: [3]\n", "replicas"),
                                            ("replicas:\n  - {count: 300}\n", "count")])
def test_a_malformed_replicas_section_is_one_line(tmp_path, run_cli, section, needle):
    path = tmp_path / "fleet.yaml"
    path.write_text(f"name: f\nexperiment: fleet\nmodel: {MODEL}\ngpu: L40S\npool: {{gpu_memory_utilization: 0.9}}\n"
                    f"requests:\n{POISSON}{section}")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and str(path) in err and needle in err and len(err.strip().splitlines()) == 1, err


def test_fleet_keys_in_a_serve_file_are_refused(tmp_path, run_cli):
    path = tmp_path / "serve.yaml"
    path.write_text(f"name: s\nmodel: {MODEL}\ngpu: L40S\npool: {{gpu_memory_utilization: 0.9}}\n"
                    f"requests:\n{POISSON}router: round_robin\n")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "router" in err and "experiment: fleet" in err and len(err.strip().splitlines()) == 1


def _pd_file(tmp_path, name: str, transfer: str, disaggregated: bool = True, count: int = 1):
    replicas = ("  - {name: prefill, role: prefill, count: 1}\n  - {name: decode, role: decode, count: 1}\n"
                if disaggregated else "  - {count: 1}\n")
    path = tmp_path / name
    path.write_text(f"name: pd\nexperiment: fleet\nmodel: {MODEL}\ngpu: H100-80GB\npool: {{gpu_memory_utilization: 0.9}}\n"
                    "scheduler: {prefix_caching: false, max_model_len: 8192}\n"
                    f"requests:\n  count: {count}\n  prompt: {{dist: fixed, value: 3000}}\n"
                    "  output: {dist: fixed, value: 50}\n  arrival: {process: poisson, rate: 0.05}\n"
                    f"replicas:\n{replicas}" + (f"transfer: {transfer}\n" if disaggregated else ""))
    return path


def test_disaggregation_by_hand_one_request(tmp_path):
    """One request of 3,000 + 50 tokens on a prefill H100 and a decode H100, counted by hand along
    its real path. The colocated run's TTFT holds one API server pass (the frontend) and the engine
    to the first token. Disaggregated over a link of no cost, it adds the prefill server's own
    pass (its frontend again: the prefill server answers the proxy), the proxy's 5 ms, and the
    decode replica's first step, which computes the last prompt token with the other 2,999 sent
    (a 1-token step, by the step-time clock); every later step is the colocated one: the same TPOT.
    Over 25 GB/s and 2 ms, the TTFT rises by the transfer, 2 ms + 3,000 x 128 KiB / 25 GB/s."""
    colocated = simulate_fleet(load(_pd_file(tmp_path, "c.yaml", "", disaggregated=False)))
    free = simulate_fleet(load(_pd_file(tmp_path, "f.yaml", "{gb_per_s: 0, latency_s: 0}")))
    bare = simulate_fleet(load(_pd_file(tmp_path, "b.yaml", "{gb_per_s: 0, latency_s: 0, proxy_s: 0}")))
    link = simulate_fleet(load(_pd_file(tmp_path, "l.yaml", "{gb_per_s: 25, latency_s: 0.002}")))
    wl = load(_pd_file(tmp_path, "c.yaml", "", disaggregated=False))
    from kvplan.sim.inputs import make_setup

    clock = make_setup(wl, wl.allocators[0]).clock
    one_token = clock.step_ticks(kv_read=2999, tokens=1, requests=1, pairs=3000) / clock.ticks_per_unit
    prefill_pass = clock.frontend / clock.ticks_per_unit  # one request: its API server streams nothing else
    assert prefill_pass == pytest.approx(0.010)
    assert free.ttft.p50 == pytest.approx(colocated.ttft.p50 + one_token + prefill_pass + 0.005, abs=1e-9)
    assert bare.ttft.p50 == pytest.approx(colocated.ttft.p50 + one_token + prefill_pass, abs=1e-9)
    assert free.tpot.p50 == pytest.approx(colocated.tpot.p50, abs=1e-12)
    assert free.e2e.p50 - colocated.e2e.p50 == pytest.approx(one_token + prefill_pass + 0.005, abs=1e-9)
    moved = 0.002 + 3000 * wl.layout.bytes_per_token / 25e9
    assert wl.layout.bytes_per_token == 131072  # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x 2 x 2 B
    assert link.transfer.p50 == pytest.approx(moved, abs=1e-11)
    assert link.transfer_wait.p50 == 0
    assert link.ttft.p50 - free.ttft.p50 == pytest.approx(moved, abs=1e-9)
    doc = link.to_dict()["fleet"]
    assert doc["transfer_s"]["p50"] == pytest.approx(moved, abs=1e-11) and doc["proxy_s"] == 0.005


def test_the_prefill_replicas_link_carries_one_transfer_at_a_time(tmp_path):
    """60 requests of 3,000 tokens at 20/s on one prefill replica over 1 GB/s: each KV (393 MB)
    holds the link 0.39 s, longer than the 0.05 s between arrivals, so transfers queue behind each
    other. Every request's transfer is its wait for the link + 0.39 s + the 1 ms latency, and the
    link's transfers never overlap: the last one ends no earlier than 60 x 0.39 s after the first
    began."""
    path = _pd_file(tmp_path, "q.yaml", "{gb_per_s: 1, latency_s: 0.001}", count=60)
    path.write_text(path.read_text().replace("rate: 0.05", "rate: 20"))
    result = simulate_fleet(load(path))
    alone = 3000 * 131072 / 1e9
    assert result.transfer_wait.p99 > 10 * alone  # the link is the bottleneck
    assert result.transfer.mean - result.transfer_wait.mean == pytest.approx(alone + 0.001, abs=1e-6)


def test_transfer_links_by_hand():
    """Replicas 0, 1 prefill and 2, 3 decode; latency 1. Asked in this order: 0 -> 2 ready at 0
    for 5 ticks ends at 5; 1 -> 2 ready at 1 waits for replica 2's link and ends at 10; 0 -> 3
    ready at 2 waits for replica 0's link (busy to 5) and ends at 8; 1 -> 3 ready at 3 waits for
    both (1 busy to 10, 3 to 8) and ends at 12. Each lands 1 tick after it ends. A second call
    carries on from the links' state."""
    import numpy as np

    from kvplan.fleet.run import TransferLinks

    links = TransferLinks(4, latency=1)
    land = links.carry(np.array([0, 1, 2, 3]), np.array([5, 5, 3, 2]), np.array([0, 1, 0, 1]), np.array([2, 2, 3, 3]))
    assert land.tolist() == [6, 11, 9, 13]
    assert links.carry(np.array([4]), np.array([1]), np.array([0]), np.array([2])).tolist() == [12]


def test_a_decode_replicas_link_carries_one_transfer_at_a_time(tmp_path):
    """Two prefill replicas feed one decode replica over 1 GB/s: 40 requests of 3,000 tokens at
    20/s, round robin, so the prefill links each carry a transfer every 0.1 s while the decode
    link takes one every 0.05 s, each holding it 0.39 s. The decode link is the bottleneck: waits
    grow to many transfers, and the link's transfers never overlap, so the last KV lands no
    earlier than 40 transfers after the first began (a model of the prefill links alone has each
    carry 20, waits about half as long). With two decode replicas (round robin pairs prefill i
    with decode i) each link carries every other transfer and the waits shrink."""
    one = _pd_file(tmp_path, "one.yaml", "{gb_per_s: 1, latency_s: 0.001}", count=40)
    body = one.read_text().replace("rate: 0.05", "rate: 20")
    alone = 3000 * 131072 / 1e9
    one.write_text(body.replace("role: prefill, count: 1", "role: prefill, count: 2"))
    result = simulate_fleet(load(one))
    assert result.transfer.mean - result.transfer_wait.mean == pytest.approx(alone + 0.001, abs=1e-6)
    assert result.transfer_wait.p99 > 25 * alone  # the last wait for most of the transfers before them
    two = tmp_path / "two.yaml"
    two.write_text(body.replace("role: prefill, count: 1", "role: prefill, count: 2")
                   .replace("role: decode, count: 1", "role: decode, count: 2"))
    spread = simulate_fleet(load(two))
    assert spread.transfer_wait.p99 < result.transfer_wait.p99 / 1.5


def test_a_disaggregated_fleet_splits_the_work_by_pool(tmp_path):
    """Prefill replicas run every prompt with one output token; decode replicas every output."""
    doc = simulate_fleet(load(_pd_file(tmp_path, "p.yaml", "{gb_per_s: 50, latency_s: 0.001}", count=40))).to_dict()
    pre, dec = doc["replicas"]
    assert (pre["role"], dec["role"]) == ("prefill", "decode")
    assert pre["routed"] == dec["routed"] == doc["fleet"]["completed"] == 40
    assert pre["throughput_tps"] * pre["makespan"] == pytest.approx(40)  # one token each
    assert dec["throughput_tps"] * dec["makespan"] == pytest.approx(40 * 50)


@pytest.mark.parametrize("replicas,extra,needle", [
    ("  - {role: prefill, count: 1}\n", "transfer: {gb_per_s: 10}\n", "prefill and decode"),
    ("  - {role: prefill, count: 1}\n  - {role: decode, count: 1}\n", "", "transfer"),
    ("  - {role: prefill, count: 1}\n  - {role: decode, count: 1, scheduler: {prefix_caching: true}}\n",
     "transfer: {gb_per_s: 10}\n", "prefix_caching"),
    ("  - {role: prefill, count: 1}\n  - {role: decode, count: 1}\n", "transfer: {gb_per_s: -1}\n", "gb_per_s"),
])
def test_a_bad_disaggregated_fleet_is_one_line(tmp_path, run_cli, replicas, extra, needle):
    path = tmp_path / "pd.yaml"
    path.write_text(f"name: pd\nexperiment: fleet\nmodel: {MODEL}\ngpu: L40S\npool: {{gpu_memory_utilization: 0.9}}\n"
                    f"scheduler: {{prefix_caching: false}}\nrequests:\n{POISSON}replicas:\n{replicas}{extra}")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and str(path) in err and needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("decode,needle", [
    ("{role: decode, count: 1, model: Qwen/Qwen2.5-7B-Instruct}", "replicas[1].model"),
    ("{role: decode, count: 1, kv_dtype: fp8}", "replicas[1].kv_dtype"),
])
def test_prefill_and_decode_pools_of_different_kv_are_refused(tmp_path, run_cli, decode, needle):
    """The decode side reads the KV the prefill side wrote: another model or KV dtype is one line
    naming the group's field; another TP degree is accepted (vLLM reshards heads)."""
    path = tmp_path / "pd.yaml"
    body = (f"name: pd\nexperiment: fleet\nmodel: {MODEL}\ngpu: L40S\npool: {{gpu_memory_utilization: 0.9}}\n"
            f"scheduler: {{prefix_caching: false, max_model_len: 8192}}\nrequests:\n{POISSON}"
            "transfer: {gb_per_s: 25}\nreplicas:\n  - {role: prefill, count: 1}\n")
    path.write_text(body + f"  - {decode}\n")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and needle in err and str(path) in err and len(err.strip().splitlines()) == 1, err
    path.write_text(body + "  - {role: decode, count: 1, tp: 2}\n")
    code, out, err = run_cli("simulate", str(path), "--json")
    assert code == 0, err


def test_transfer_on_a_colocated_fleet_is_refused(tmp_path, run_cli):
    path = fleet_file(tmp_path, POISSON, extra="transfer: {gb_per_s: 25}\n")
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "transfer" in err and "prefill" in err and len(err.strip().splitlines()) == 1, err


def test_max_model_len_above_the_context_follows_vllms_override(tmp_path, run_cli):
    """vLLM refuses a max_model_len above the model's context unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1:
    without scheduler.allow_long_max_model_len the file is one line naming the key; with it the
    replicas serve 150,000-token prompts past Llama-3.1's 131,072, none clipped."""
    body = (f"name: long\nexperiment: fleet\nmodel: {MODEL}\ngpu: H100-80GB\npool: {{{{gpu_memory_utilization: 0.9}}}}\n"
            "scheduler: {{max_model_len: 200000{allow}}}\nrequests:\n  count: 6\n  prompt: {{dist: fixed, value: 150000}}\n"
            "  output: {{dist: fixed, value: 4}}\n  arrival: {{process: poisson, rate: 0.2}}\nreplicas:\n  - {{count: 2}}\n")
    path = tmp_path / "long.yaml"
    path.write_text(body.format(allow=""))
    code, out, err = run_cli("simulate", str(path))
    assert code == 2 and "allow_long_max_model_len" in err and "131072" in err, err
    path.write_text(body.format(allow=", allow_long_max_model_len: true"))
    doc = simulate_fleet(load(path)).to_dict()
    assert doc["fleet"]["completed"] == 6
    assert all(r["clipped"] == 0 for r in doc["replicas"])
