"""Do `kvplan plan`'s answers hold on traffic they have not seen? (issue 25)

Three plans, made as the CLI makes them (the search on its sample, seed 0; the default 10%
headroom; the answer re-simulated on seeds 1 and 2; the fleet check behind round robin on seed 3):
  A. Llama-3.1-8B-Instruct, 20 requests/s of 1,000 + 200 tokens, p99 TTFT 2 s and TPOT 50 ms, every
     on-demand GPU, TP 1-8;
  B. Qwen3-32B, 5 requests/s of 4,000 + 500 tokens, p99 TTFT 1 s and TPOT 30 ms, H100 and H200, TP 1-8;
  C. Llama-3.1-8B-Instruct, 30 requests/s of a workload file's lognormal prompts (median 600,
     sigma 1) and outputs (median 150, sigma 0.8), p99 TTFT 1.5 s and E2E 20 s, H100, L40S, A100.
Each answer is then re-simulated at its planned load per replica on seeds it never saw (101-105),
HOLDOUT requests each, and on the whole fleet behind round robin at the rate asked (seed 106); it
holds when every run meets every target. Then the headroom: the answer's configuration searched
for its edge on seeds 0-9 (the sample the search decides on changes); how far the fresh samples'
edges fall below seed 0's is what a headroom must cover.

Run: python bench/plan_holdout.py [--quick]   (--quick: 2 fresh seeds, no edge scatter)
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HOLDOUT = 10_000
SEEDS = (101, 102, 103, 104, 105)


def scenarios(tmp: Path):
    from kvplan.plan.search import Targets, Traffic
    from kvplan.plan.space import from_workload

    path = tmp / "lognormal.yaml"
    path.write_text("name: lognormal\npool: {slots: 100000}\nrequests:\n  count: 10000\n"
                    "  prompt: {dist: lognormal, median: 600, sigma: 1.0, max: 8000}\n"
                    "  output: {dist: lognormal, median: 150, sigma: 0.8, max: 2000}\n"
                    "  arrival: {process: poisson, rate: 30}\n")
    tps = (1, 2, 4, 8)
    return [
        ("A", "meta-llama/Llama-3.1-8B-Instruct", Traffic(20.0, 1000, 200, 10_000), Targets(2.0, 0.05), None, tps),
        ("B", "Qwen/Qwen3-32B", Traffic(5.0, 4000, 500, 10_000), Targets(1.0, 0.03), ["H100-80GB", "H200"], tps),
        ("C", "meta-llama/Llama-3.1-8B-Instruct", from_workload(path, None, None), Targets(1.5, None, 20.0),
         ["H100-80GB", "L40S", "A100-80GB"], tps),
    ]


def fleet_check_rate(model, traffic, targets, e, seed):
    """The answer's fleet behind round robin at the rate asked, on a fresh sample."""
    from kvplan.workload.routing import RouterSpec
    from kvplan.fleet.run import Group, run_fleet
    from kvplan.plan.space import config_workload, first
    from kvplan.workload.prefixes import request_stream

    total = traffic.count * e.replicas
    wl = config_workload(model, replace(traffic, count=total) if traffic.workload is None else traffic, e.config, seed)
    total = min(total, wl.num_requests)
    factor = traffic.base_rate / e.served

    def chunks():
        for c in first(request_stream(wl), total):
            yield replace(c, arrival=c.arrival * factor)

    return run_fleet([Group("plan", e.replicas, replace(wl, prefix=None, sampling=None))], RouterSpec("round_robin"), chunks(), seed,
                     total=total)


def main() -> None:
    from kvplan.plan.edge import Runs
    from kvplan.plan.fleet_check import checked
    from kvplan.plan.prices import load_prices
    from kvplan.plan.evaluate import Replica
    from kvplan.plan.search import Config, Rules, evaluate, search

    quick = "--quick" in sys.argv
    seeds = SEEDS[:2] if quick else SEEDS
    book = load_prices()
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, traffic, targets, gpus, tps in scenarios(Path(tmp)):
            configs = [Config(g, t) for g in (gpus or book.gpus()) for t in tps]
            t0 = time.perf_counter()
            rows = search(model, traffic, targets, configs, book, Rules(), workers=2)
            rows = checked(model, traffic, targets, rows, ["round_robin"], 3, book=book, workers=2)
            wall = time.perf_counter() - t0
            e = rows[0]
            if not e.feasible:
                print(f"{name}: no answer ({e.reason})")
                continue
            print(f"{name}: {model}, {traffic.rate:g} req/s: {e.replicas} x {e.config.label}, ${e.cost_per_hour:.2f}/h, "
                  f"capacity {e.capacity:.2f}, planned {e.load_per_replica:.2f} req/s per replica "
                  f"(planned in {wall:.1f} s)")
            r = Replica(model, replace(traffic, count=HOLDOUT) if traffic.workload is None else traffic, targets,
                         e.config, Runs())
            held = 0
            for s in seeds:
                res = r.at(r.total, e.load_per_replica, s)
                ok = targets.met_by(res)
                held += ok
                worst = [(n, getattr(res, n).p99, t) for n, t in (("ttft", targets.ttft_p99), ("tpot", targets.tpot_p99),
                                                               ("e2e", targets.e2e_p99)) if t is not None and res]
                words = ", ".join(f"{n} p99 {v:.3g} s ({v / t:.0%} of target)" for n, v, t in worst) if res \
                    else "stopped: a certain miss"
                print(f"   seed {s}, {r.total:,} requests at {e.load_per_replica:.2f} req/s: "
                      f"{'holds' if ok else 'MISSES'}: {words}")
            fleet = fleet_check_rate(model, traffic, targets, e, 106)
            fok = targets.met_by(fleet)
            print(f"   fleet of {e.replicas} behind round robin at {e.served:g} req/s, seed 106: "
                  f"{'holds' if fok else 'MISSES'} (ttft p99 {fleet.ttft.p99:.3g} s, tpot p99 "
                  f"{(fleet.tpot.p99 or 0) * 1e3:.1f} ms, e2e p99 {fleet.e2e.p99:.3g} s)")
            print(f"   {name} holds on {held + fok} of {len(seeds) + 1} unseen runs")
            if quick:
                continue
            edges = [evaluate(model, replace(traffic, seed=s), targets, e.config, book,
                              Rules(headroom=0.0, seeds=())).capacity for s in range(10)]
            base = edges[0]
            shortfall = sorted(max(0.0, 1 - x / base) for x in edges[1:])
            print(f"   capacity on seeds 0-9: {', '.join(f'{x:.2f}' for x in edges)}; below seed 0's by at most "
                  f"{shortfall[-1]:.1%} (median {shortfall[len(shortfall) // 2]:.1%})")


if __name__ == "__main__":
    main()
