"""`kvplan plan` over TP x EP x DP (kvplan/plan/space.Config dp / expert_parallel): the rental of a
replica of DP ranks, its rows, and a plan whose replicas are lockstep runs (kvplan/sim/data_parallel.py)
that holds on a fresh seed."""

from __future__ import annotations

import json

from kvplan.plan.prices import Offer, PriceBook
from kvplan.plan.rows import Evaluation, Rules, Targets
from kvplan.plan.run import PlanRequest, plan_document
from kvplan.plan.space import Config, Traffic

MOE = "Qwen/Qwen3-30B-A3B"


def book_of(prices: dict, shapes=None) -> PriceBook:
    return PriceBook(tuple(Offer(g, usd, "on-demand", shapes, {"gpu": g}) for g, usd in prices.items()))


def test_a_dp_replica_rents_its_gpus_in_one_node_or_whole_nodes():
    """tp x dp GPUs in one instance up to a node of 8 (its all-to-all on NVLink), else whole nodes:
    tp 1 x dp 4 on 1-, 2-, 4- or 8-GPU instances takes a 4-GPU one ($4 x 4 = $16/hour a replica);
    tp 4 x dp 4 takes two 8-GPU nodes; tp 1 x dp 12 two nodes too (16 GPUs paid for 12 used)."""
    book = book_of({"H100-80GB": 4.0}, shapes=(1, 2, 4, 8))
    four = Config("H100-80GB", 1, dp=4, expert_parallel=True)
    assert four.label == "H100-80GB x1 dp4 ep" and four.rent_unit == (4, 1)
    r = four.rent(book, 3)  # 3 replicas of 4 GPUs: three 4-GPU instances (or one 8 + one 4: the same $48)
    assert r.usd_per_hour == 3 * 4 * 4.0
    wide = Config("H100-80GB", 4, dp=4)
    assert wide.rent_unit == (8, 2) and wide.rent(book, 1).usd_per_hour == 16 * 4.0
    assert Config("H100-80GB", 1, dp=12).rent_unit == (8, 2)
    plain = Config("H100-80GB", 2)
    assert plain.label == "H100-80GB x2" and plain.rent_unit == (2, 1)
    assert "dp" not in Evaluation(plain, True).to_dict()["config"]  # rows without DP or EP: as before
    assert Evaluation(four, True).to_dict()["config"]["dp"] == 4


def test_a_dp_plan_prices_every_gpu_of_a_replica_and_holds_on_a_fresh_seed():
    traffic = Traffic(rate=12.0, prompt=600, output=120, count=150)
    targets = Targets(ttft_p99=1.0, tpot_p99=0.06)
    configs = (Config("H100-80GB", 1, dp=2, expert_parallel=True),)
    request = PlanRequest(model=MOE, traffic=traffic, targets=targets, configs=configs,
                          book=book_of({"H100-80GB": 4.0}, shapes=(1, 2, 8)),
                          rules=Rules(headroom=0.1, seeds=(1,)))
    docs = [json.dumps(plan_document(request)) for _ in range(2)]
    assert docs[0] == docs[1]  # same inputs, same bytes
    a = json.loads(docs[0])["answer"]
    assert a is not None and a["config"]["label"] == "H100-80GB x1 dp2 ep"
    assert a["gpus"] == 2 * a["replicas"]
    assert a["rental"]["instance_gpus"] == 2 and a["cost_per_hour"] == a["replicas"] * 2 * 4.0
    assert a["seeds"] == [1]  # re-simulated on a fresh seed at its planned load, and within the targets there
    ttft, tpot, _ = a["seed_p99s"][0]
    assert ttft <= 1.0 and tpot <= 0.06


def test_a_dp_configuration_serves_the_plans_network_and_all_to_all():
    """--network-gbps 400 and --all2all-backend reach each replica's lockstep run: 400 Gb/s is
    50 GB/s a GPU (400e9 / 8 B), DeepEP's low-latency kernels the backend; a plain configuration
    of the same plan runs without `parallel`."""
    from kvplan.plan.space import config_workload

    traffic = Traffic(rate=4.0, prompt=500, output=50, count=20, network_gbps=400.0,
                      all2all_backend="deepep_low_latency")
    wl = config_workload(MOE, traffic, Config("H100-80GB", 1, dp=4, expert_parallel=True))
    assert wl.parallel.par.dp == 4 and wl.parallel.par.ep == 4
    assert wl.parallel.step.network == 50e9 and wl.parallel.step.backend == "deepep_low_latency"
    assert config_workload(MOE, traffic, Config("H100-80GB", 1)).parallel is None


def test_a_dp_configuration_drafts_with_the_plans_speculative_setting():
    """--speculative reaches a DP replica's lockstep run (kvplan/sim/data_parallel.py runs each
    rank's speculative steps): the workload keeps both, and with every draft accepted (n-gram, one
    draft at acceptance 1.0) the same requests finish in fewer steps than without."""
    from dataclasses import replace

    from kvplan.plan.space import config_workload
    from kvplan.sim.engine import simulate
    from kvplan.workload.spec import SpeculativeSpec

    base = Traffic(rate=4.0, prompt=500, output=50, count=20)
    config = Config("H100-80GB", 1, dp=2, expert_parallel=True)
    drafted = config_workload(MOE, replace(base, speculative=SpeculativeSpec("ngram", 1, (1.0,))), config)
    assert drafted.parallel.par.dp == 2 and drafted.speculative is not None
    plain = config_workload(MOE, base, config)
    steps = [simulate(wl, wl.allocators[0]).steps for wl in (drafted, plain)]
    assert steps[0] < steps[1]
