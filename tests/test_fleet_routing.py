"""Routers as deployed: ties broken by a seeded random choice (not the lowest index), and the
KV-balance router no worse than random when replicas preempt."""

from __future__ import annotations

import pytest

from kvplan.experiments import load
from kvplan.fleet.run import simulate_fleet

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _fleet(tmp_path, router: str, *, count: int, prompt: str, output: str, rate: float, replicas: int,
           seed: int = 0, gpu: str = "L40S", extra: str = "", name: str = "fleet.yaml"):
    path = tmp_path / name
    path.write_text(f"name: fleet\nexperiment: fleet\nseed: {seed}\nmodel: {MODEL}\ngpu: {gpu}\n"
                    "pool: {gpu_memory_utilization: 0.9}\nscheduler: {max_model_len: 16384}\n"
                    f"requests:\n  count: {count}\n  prompt: {prompt}\n  output: {output}\n"
                    f"  arrival: {{process: poisson, rate: {rate}}}\nreplicas:\n  - {{count: {replicas}}}\n"
                    f"router: {router}\n{extra}")
    return load(path)


LOOKING = ("least_outstanding", "least_kv", "prefix_aware")


@pytest.mark.parametrize("router", LOOKING)
def test_an_idle_fleet_spreads_its_requests(tmp_path, router):
    """400 short requests, one every 2 s on average, over 8 replicas: each finds every replica
    idle, so every replica ties. A seeded random choice gives each about 400 / 8 = 50 (binomial,
    sd 6.6: 25 to 75 is beyond 3.7 sd); ties to the lowest index gave [241, 92, 40, 25 ...]."""
    wl = _fleet(tmp_path, f"{{policy: {router}, sync_interval_s: 0.1}}", count=400,
                prompt="{dist: fixed, value: 200}", output="{dist: fixed, value: 20}", rate=0.5, replicas=8)
    routed = simulate_fleet(wl).routed
    assert sum(routed) == 400
    assert all(25 <= n <= 75 for n in routed), routed


@pytest.mark.parametrize("router", LOOKING)
def test_the_tie_break_is_seeded(tmp_path, router):
    """The same file routes the same way every run; another seed draws other ties."""
    args = dict(count=200, prompt="{dist: fixed, value: 200}", output="{dist: fixed, value: 20}", rate=0.5,
                replicas=8)
    a = simulate_fleet(_fleet(tmp_path, router, name="a.yaml", **args)).to_dict()
    b = simulate_fleet(_fleet(tmp_path, router, name="b.yaml", **args)).to_dict()
    c = simulate_fleet(_fleet(tmp_path, router, name="c.yaml", seed=1, **args)).to_dict()
    assert a == b
    assert [r["routed"] for r in a["replicas"]] != [r["routed"] for r in c["replicas"]]


def test_least_kv_is_no_worse_than_random_when_replicas_preempt(tmp_path):
    """Long prompts and outputs near the 4 replicas' KV capacity: random routing overfills some
    replicas, which preempt; least_kv's view of KV in use (a preempting replica has just freed
    blocks) must not feed on itself into more preemption than random's."""
    args = dict(count=1500, prompt="{dist: lognormal, mean: 3000, sigma: 0.8}",
                output="{dist: lognormal, mean: 800, sigma: 0.8}", rate=2.6, replicas=4, seed=3)
    rand = simulate_fleet(_fleet(tmp_path, "random", name="r.yaml", **args))
    kv = simulate_fleet(_fleet(tmp_path, "least_kv", name="k.yaml", **args))
    preempted = [sum(r.preemptions for r in x.replicas) for x in (rand, kv)]
    assert preempted[0] > 0  # the case does preempt
    assert preempted[1] <= preempted[0]
    assert kv.ttft.p99 <= rand.ttft.p99 and kv.e2e.p99 <= rand.e2e.p99
