"""`kvplan plan` as a library call: a `PlanRequest` in, the plan document out.

The document is what `kvplan plan --json` prints (and what the text, CSV, chart and HTML views
render): the traffic, targets and rules, the answer, every row ranked, the cost/latency frontier,
what the search settled at each step, and the prices searched.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from kvplan.plan.prices import PriceBook
from kvplan.plan.rows import Rules, Targets, pareto
from kvplan.plan.space import Config, Traffic
from kvplan.workload.spec import Transfer


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """What to plan: the model and traffic, the targets, the configurations to try, the prices to
    rent from, the rules; optionally a fleet check of the best rows behind `routers` (and
    disaggregated over `transfer`)."""

    model: str
    traffic: Traffic
    targets: Targets
    configs: tuple[Config, ...]
    book: PriceBook
    rules: Rules = Rules()
    routers: tuple[str, ...] = ()  # empty: no fleet check
    check_top: int = 3  # the best rows checked on the fleet
    transfer: Transfer | None = None
    workers: int = 1
    ray: bool = False


def plan_document(request: PlanRequest, progress: Callable[[int, int], None] | None = None) -> dict:
    """Search the configurations, check the best on a fleet when asked, and return the document."""
    from kvplan.plan.search import SearchStats, search

    r = request
    stats = SearchStats()
    results = search(r.model, r.traffic, r.targets, list(r.configs), r.book, r.rules, workers=r.workers,
                     ray=r.ray, progress=progress, stats=stats)
    objective = r.rules.objective(r.traffic)
    if r.routers:
        from kvplan.plan.fleet_check import checked

        results = checked(r.model, r.traffic, r.targets, results, list(r.routers), r.check_top, r.transfer,
                          book=r.book, objective=objective, workers=r.workers, ray=r.ray)
    front = pareto(results)
    gpus = list(dict.fromkeys(c.gpu for c in r.configs))
    engines = list(dict.fromkeys(c.engine for c in r.configs))
    compared = engines != ["vllm"]  # a plan of vLLM alone: its document as before, without engine keys
    optional = ("speculative", "network_gbps", "all2all_backend")  # keys a plan without them leaves out
    traffic = {k: v for k, v in asdict(r.traffic).items() if k not in optional or v is not None}
    doc = {"model": r.model, "traffic": traffic,
           "targets": {**asdict(r.targets), "unconstrained": r.targets.unconstrained},
           "rules": {**asdict(r.rules), "objective": objective, "price_tiers": list(r.book.tiers),
                     "router": ",".join(r.routers) if r.routers else None},
           "answer": results[0].to_dict(compared) if results and results[0].feasible else None,
           "results": [e.to_dict(compared) for e in results], "frontier": [e.config.label for e in front],
           "search": asdict(stats), "prices": r.book.rows(gpus)}
    if compared:
        doc["rules"]["engines"] = engines
        doc["engines"] = engine_comparison(results, engines, objective)
    return doc


def engine_comparison(results: list, engines: list[str], objective: str) -> dict:
    """Each engine's best row (the ranking's first of that engine: its label, $/hour, replicas, GPUs,
    p99s; None where none meets the targets), which engine wins, and by how much: the loser's cost
    over the winner's less 1 (the objective cost), its p99 E2E over the winner's (latency), the
    winner's requests/s over the loser's (traffic)."""
    best = {}
    for name in engines:
        row = next((e for e in results if e.feasible and e.config.engine == name), None)
        best[name] = None if row is None else {
            "label": row.config.label, "cost_per_hour": row.cost_per_hour, "replicas": row.replicas,
            "gpus": row.gpus, "served": row.served, "capacity": row.capacity,
            "usd_per_million_tokens": row.usd_per_million_tokens,
            "ttft_p99": row.ttft_p99, "tpot_p99": row.tpot_p99, "e2e_p99": row.e2e_p99}
    first = next((e for e in results if e.feasible), None)
    winner = None if first is None else first.config.engine
    margin = None
    others = [b for name, b in best.items() if name != winner and b is not None]
    if winner is not None and others:
        w, o = best[winner], others[0]
        key = {"cost": "cost_per_hour", "latency": "e2e_p99", "traffic": "served"}[objective]
        if w[key] and o[key]:
            margin = (w[key] / o[key] if objective == "traffic" else o[key] / w[key]) - 1
    return {"best": best, "winner": winner, "by": objective, "margin": margin}
