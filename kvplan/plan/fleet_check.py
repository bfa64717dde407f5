"""The replica count checked on a fleet: `kvplan plan --router POLICY[,POLICY...] [--disaggregate GB/s]`.

`evaluate` sizes a deployment as ceil(rate wanted / rate one replica serves), as if the router
balanced perfectly. A real router does not (round robin ignores how long each request is; a
prefix-aware one trades balance for cache hits), so for the best configurations (`plan` checks
the 3 best behind round robin unless told otherwise) the fleet is simulated (kvplan/fleet/run.py)
at the rate the row serves, on a sample of its own (FLEET_SEED), behind each router given: N
replicas, N from the estimate up (in whole instances), until the fleet meets the targets (p99s,
or a goodput: the share of the fleet's requests within every limit at once); with a
fixed limit (--gpus, --budget) the row's replicas are all there is, and the check passes or the
row is out. An SGLang configuration's fleet is of SGLang's replicas (kvplan/sim/sglang_state.py).
With `--disaggregate`, fewer GPUs of a vLLM configuration are also tried as P prefill + (N - P)
decode replicas of that configuration over a link of that bandwidth: the smallest N below the
colocated count by bisection (assuming more GPUs never serve worse), each N split at a prefill
share of 1/4, 1/3, 1/2 and 2/3. The cheapest fleet that meets the
targets is the row's (ties: the colocated one, then the routers' order). Every fleet serves count x (estimate) requests, the same
ones for every N. The checks of different configurations run in parallel like the search.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.plan.evaluate import filled_replicas, priced
from kvplan.plan.rows import Evaluation, Targets, rank
from kvplan.plan.workers import run_jobs
from kvplan.plan.space import Traffic, config_workload, first

MAX_GROWTH = 2  # at most twice the estimate
SPLITS = (1 / 4, 1 / 3, 1 / 2, 2 / 3)  # shares of the prefill pool tried for N GPUs


FLEET_SEED = 3  # the fleet's requests: a sample neither the search nor the fresh seeds (search.DEFAULT_SEEDS) used


def check_on_fleet(model: str, traffic: Traffic, targets: Targets, e: Evaluation, router: str,
                   transfer=None, book=None, objective: str = "cost") -> Evaluation:
    """Row `e` checked behind `router` (colocated; also disaggregated over `transfer` when given),
    on a fresh sample (FLEET_SEED) at the rate the row serves. `book`: the prices to rent the fleet
    from (None: the row's $/GPU-hour, per GPU). With a fixed limit (`objective` latency or traffic)
    the replica count stays the row's: the check passes or the row is out."""
    from kvplan.workload.routing import RouterSpec
    from kvplan.fleet.run import Group, run_fleet
    from kvplan.workload.prefixes import request_stream

    estimate = e.replicas
    total = traffic.count * estimate
    wl = config_workload(model, replace(traffic, count=total) if traffic.workload is None else traffic, e.config,
                         FLEET_SEED)
    total = min(total, wl.num_requests)
    factor = traffic.base_rate / e.served  # the rate the row serves
    one = replace(wl, prefix=None, sampling=None)  # the fleet's stream has its prefixes
    decode = None
    if transfer is not None and e.config.engine == "vllm":  # a decode pool receives its KV: no prefix caching
        # there (SGLang's disaggregation is not modelled: an SGLang row is checked colocated)
        decode = replace(one, scheduler=replace(one.scheduler, prefix_caching=False))

    def chunks():
        for c in first(request_stream(wl), total):
            yield replace(c, arrival=c.arrival * factor)

    def met(groups):
        result = run_fleet(groups, RouterSpec(router), chunks(), wl.seed, total=total, transfer=transfer,
                           slo=targets.limits())
        return result if targets.met_by(result) else None

    colocated = None
    top = estimate if objective != "cost" else MAX_GROWTH * estimate
    tried = set()
    for n in range(estimate, top + 1):
        n = filled_replicas(book, e.config, n) if book is not None else n  # whole instances serve
        if n in tried:
            continue
        tried.add(n)
        result = met([Group("plan", n, one)])
        if result is not None:
            colocated = (n, 0, result)
            break
    best = colocated
    if decode is not None:  # fewer GPUs as prefill and decode pools? the smallest N by bisection
        def split(n: int):
            for p in sorted({min(n - 1, max(1, round(n * f))) for f in SPLITS}):
                result = met([Group("prefill", p, one, "prefill"), Group("decode", n - p, decode, "decode")])
                if result is not None:
                    return (n, p, result)
            return None

        lo, hi = 2, (colocated[0] - 1 if colocated else MAX_GROWTH * estimate)
        found = split(hi) if hi >= lo else None
        while found is not None and hi > lo:
            mid = (lo + hi) // 2
            trial = split(mid)
            if trial is not None:
                found, hi = trial, mid
            else:
                lo = mid + 1
        best = found or colocated
    if best is None:
        return replace(e, cost_per_hour=None, usd_per_million_tokens=None, usd_per_million_output_tokens=None,
                       router=router, replicas_estimate=estimate,
                       reason=f"{top} replicas behind {router} still miss the targets", left_out="missed")
    n, prefill, result = best
    row = replace(e, ttft_p99=result.ttft.p99, tpot_p99=result.tpot.p99, e2e_p99=result.e2e.p99, router=router,
                  replicas_estimate=e.replicas, prefill_replicas=prefill)
    if book is None:
        from kvplan.plan.prices import Offer, PriceBook

        book = PriceBook((Offer(e.config.gpu, e.usd_per_gpu_hour, "override", None, {}),))
    return priced(row, replace(traffic, rate=e.served) if traffic.rate is None else traffic, book, n, e.served / n)


def _check(job) -> Evaluation:
    """One row behind every router: the cheapest passing fleet (ties: the first)."""
    model, traffic, targets, e, routers, transfer, book, objective = job
    rows = [check_on_fleet(model, traffic, targets, e, r, transfer, book, objective) for r in routers]
    passing = [r for r in rows if r.feasible]
    return min(passing, key=lambda r: (r.cost_per_hour, r.prefill_replicas > 0)) if passing else rows[0]


def checked(model: str, traffic: Traffic, targets: Targets, rows: list[Evaluation], routers: list[str],
            top: int, transfer=None, *, book=None, objective: str = "cost", workers: int = 1,
            ray: bool = False) -> list[Evaluation]:
    """The rows re-ranked until the `top` best are all checked on the fleet."""
    rows = list(rows)
    while True:
        todo = [i for i, e in enumerate(rows[:top]) if e.feasible and e.router is None]
        if not todo:
            return rows
        jobs = [(model, traffic, targets, rows[i], tuple(routers), transfer, book, objective) for i in todo]
        for i, row in zip(todo, run_jobs(_check, jobs, workers, ray)):
            rows[i] = row
        rows = rank(rows, objective)


__all__ = ["check_on_fleet", "checked"]
