"""The replica count checked on a fleet: `kvplan plan --router POLICY`.

`evaluate` sizes a deployment as ceil(rate wanted / rate one replica serves), as if the router
balanced perfectly. A real router does not (round robin ignores how long each request is; a
prefix-aware one trades balance for cache hits), so for the cheapest configurations the fleet is
simulated (kvplan/fleet/run.py): N replicas behind the router at the wanted rate, N from the
estimate up, until the fleet meets the targets; the row then carries that N and its cost. The
fleet serves count x (estimate) requests, the same ones for every N.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.plan.search import Evaluation, Targets, rank
from kvplan.plan.space import Traffic, config_workload, first

MAX_GROWTH = 2  # at most twice the estimate


def check_on_fleet(model: str, traffic: Traffic, targets: Targets, e: Evaluation, router: str) -> Evaluation:
    from kvplan.fleet.routers import RouterSpec
    from kvplan.fleet.run import Group, run_fleet
    from kvplan.workload.prefixes import request_stream

    estimate = e.replicas
    total = traffic.count * estimate
    if traffic.workload is None:
        fleet_traffic = replace(traffic, count=total)
    else:
        fleet_traffic = traffic
    wl = config_workload(model, fleet_traffic, e.config)
    total = min(total, wl.num_requests)
    factor = traffic.base_rate / traffic.rate  # the wanted rate

    def chunks():
        for c in first(request_stream(wl), total):
            yield replace(c, arrival=c.arrival * factor)

    result = None
    n = estimate
    for n in range(estimate, MAX_GROWTH * estimate + 1):
        result = run_fleet([Group("plan", n, replace(wl, extras={}))], RouterSpec(router), chunks(), wl.seed,
                           total=total)
        if targets.met_by(result):
            break
    else:
        return replace(e, cost_per_hour=None, cost_per_million_tokens=None, router=router, replicas_estimate=estimate,
                       reason=f"{MAX_GROWTH * estimate} replicas behind {router} still miss the targets")
    gpus = n * e.config.tp
    cost = gpus * e.usd_per_gpu_hour if e.usd_per_gpu_hour is not None else None
    cost_m = (cost / (traffic.rate * traffic.output * 3600) * 1e6 if cost is not None and traffic.output > 0
              else None)
    return replace(e, replicas=n, gpus=gpus, cost_per_hour=cost, cost_per_million_tokens=cost_m,
                   ttft_p99=result.ttft.p99, tpot_p99=result.tpot.p99, e2e_p99=result.e2e.p99, router=router,
                   replicas_estimate=estimate)


def checked(model: str, traffic: Traffic, targets: Targets, rows: list[Evaluation], router: str,
            top: int) -> list[Evaluation]:
    """The rows re-ranked until the `top` cheapest are all checked on the fleet."""
    rows = list(rows)
    while True:
        todo = [i for i, e in enumerate(rows[:top]) if e.feasible and e.router is None]
        if not todo:
            return rows
        for i in todo:
            rows[i] = check_on_fleet(model, traffic, targets, rows[i], router)
        rows = rank(rows)


__all__ = ["check_on_fleet", "checked"]
