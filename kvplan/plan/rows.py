"""The records of `kvplan plan`: the targets, the rules of a plan, one configuration's row, and
how rows compare (rank, frontier, and when a simulated row beats another's bounds)."""

from __future__ import annotations

from dataclasses import KW_ONLY, asdict, dataclass
from typing import Iterable

from kvplan.plan.space import Config, Traffic

DEFAULT_HEADROOM = 0.10  # see Rules.headroom
DEFAULT_SEEDS = (1, 2)  # the fresh samples an answer is checked on (the search runs seed 0)
DEFAULT_SPAN = 2.0  # the frontier shows what up to twice the answer's cost buys (--frontier-span)


@dataclass(frozen=True, slots=True)
class Targets:
    """Latency targets in seconds (None: no target): p99s of TTFT, TPOT and E2E; or, with
    `goodput`, limits that at least that share of the requests must meet all at once (DistServe's
    SLO attainment: a request counts when its TTFT, its TPOT and its E2E are each within the limit
    given)."""

    ttft_p99: float | None = None
    tpot_p99: float | None = None
    e2e_p99: float | None = None
    goodput: float | None = None

    def limits(self):
        """The per-request limits a goodput target counts against, as a workload's `slo:` (None
        without a goodput or without any limit)."""
        from kvplan.workload.spec import SloSpec

        if self.goodput is None or (self.ttft_p99 is None and self.tpot_p99 is None and self.e2e_p99 is None):
            return None
        return SloSpec(self.ttft_p99, self.tpot_p99, self.e2e_p99)

    @property
    def unconstrained(self) -> list[str]:
        """The metrics no target bounds."""
        return [name for name, v in (("TTFT", self.ttft_p99), ("TPOT", self.tpot_p99), ("E2E", self.e2e_p99))
                if v is None]

    def met_by(self, result, frontend_s: float = 0.0) -> bool:
        """`frontend_s`: the API server's latency the engine adds to TTFT and E2E (goodput counts
        per request from the records, so it adds it the same way)."""
        if result is None:  # a run stopped once it was certain to miss
            return False
        if self.goodput is not None:
            counted = getattr(result, "goodput", None)  # a fleet's, counted against `limits()` as it ran
            share = counted["share"] if counted is not None else attainment(self, result, frontend_s)
            return share >= self.goodput
        for target, stats in ((self.ttft_p99, result.ttft), (self.tpot_p99, result.tpot),
                              (self.e2e_p99, result.e2e)):
            if target is not None and (stats.p99 is None or stats.p99 > target):
                return False
        return True


def attainment(targets: Targets, result, frontend_s: float = 0.0) -> float:
    """The share of a run's requests within every limit of `targets` (needs its request records),
    counted as a workload's `slo:` is (kvplan/sim/slo.within)."""
    from kvplan.sim.slo import client_latencies, within
    from kvplan.workload.spec import SloSpec

    cols = result.requests.columns
    arrival, first, finish, out = cols["arrival"], cols["first_token"], cols["finish"], cols["output"]
    if not len(out) or (targets.ttft_p99 is None and targets.tpot_p99 is None and targets.e2e_p99 is None):
        return 1.0
    frontend_s = cols.get("frontend", frontend_s)  # per request where the API server streams at a cost
    ok = within(SloSpec(targets.ttft_p99, targets.tpot_p99, targets.e2e_p99),
                **client_latencies(arrival, first, finish, out, frontend_s))
    return float(ok.mean())


@dataclass(frozen=True, slots=True)
class Rules:
    """How the plan is made, beyond the targets.

    `headroom`: the share of a replica's capacity left unplanned. 10% by default, for two reasons
    measured by bench/plan_holdout.py: the edge the search finds is its sample's, and the edges
    of fresh samples of 10,000 requests scatter around it (across seeds 0-9 of three scenarios,
    up to 9% from the lowest to the highest, and up to 4.2% below the searched one); and traffic
    is never exactly the rate planned. `seeds`: the fresh samples every answer shown is
    re-simulated on at its planned load (it gains replicas until they all meet the targets).
    `gpus` / `budget`: at most so many GPUs, or $/hour (None: no limit).
    `frontier_span`: configurations that cost more than this many times the cheapest answer are
    not simulated for the frontier (the cost objective; with --budget the limit is the span)."""

    headroom: float = DEFAULT_HEADROOM
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    gpus: int | None = None
    budget: float | None = None
    frontier_span: float = DEFAULT_SPAN  # the frontier reaches up to this many times the answer's cost

    def objective(self, traffic: Traffic) -> str:
        if traffic.rate is None:
            return "traffic"  # the most requests/s within the limit
        return "latency" if self.gpus is not None or self.budget is not None else "cost"


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One configuration, judged: why it is left out, or its capacity, plan, price and p99s."""

    config: Config
    fits: bool
    _: KW_ONLY
    reason: str | None = None  # why it was left out or cannot meet the targets
    left_out: str | None = None  # the step that left it out: memory, floor, limit, price, bounded, missed
    #   (kvplan/report/plan_view.LEFT_OUT words them; None: planned, or not settled yet)
    capacity: float = 0.0  # requests/s one replica serves within the targets on the search's sample
    saturated: float = 0.0  # requests/s it drains a standing backlog at, as measured: of the scouts' requests
    #   (a floor of it) unless the edge rose above that, then of all of them (the ceiling of `capacity`)
    load_per_replica: float = 0.0  # requests/s each replica carries in the plan
    served: float = 0.0  # requests/s the plan serves in all (the rate asked, or what the limit serves)
    replicas: int = 0
    gpus: int = 0
    usd_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    usd_per_million_tokens: float | None = None  # input + output tokens
    usd_per_million_output_tokens: float | None = None
    rental: dict | None = None  # the offer, its tier and instances (kvplan/plan/prices.Rental)
    ttft_p99: float | None = None  # at load_per_replica: the worst of the fresh seeds
    tpot_p99: float | None = None
    e2e_p99: float | None = None
    seeds: tuple[int, ...] = ()  # the fresh seeds checked at the planned load
    seed_p99s: tuple = ()  # each run's (TTFT, TPOT, E2E) p99s at the planned load: their spread
    evaluations: int = 0  # serve runs made (the fresh seeds' included)
    reused: int = 0  # of them, runs a configuration of its group had made already (identical, see Runs)
    simulated: bool = False  # False: settled by its bounds, or by memory, without a run
    bound_cost: float | None = None  # the bounds: its cost per hour at least,
    bound_ttft: float | None = None  # its p99 TTFT at least,
    bound_served: float | None = None  # and (for the most traffic) the requests/s it serves at most
    bound_rate: float | None = None  # the requests/s one replica sustains at most
    router: str | None = None  # replicas checked by a fleet simulation behind this router (kvplan/plan/fleet_check.py)
    replicas_estimate: int = 0  # with a router: the replicas before the fleet's check
    prefill_replicas: int = 0  # disaggregated: of the replicas, the prefill pool's (0: colocated)

    @property
    def feasible(self) -> bool:
        return self.cost_per_hour is not None

    def to_dict(self, engine: bool = True) -> dict:
        """`engine`: keep the config's engine (a plan that searched vLLM alone leaves it out)."""
        d = asdict(self)
        d["config"] = {**asdict(self.config), "label": self.config.label}
        if not self.config.parallel:  # a plan without DP or EP: its rows as before
            del d["config"]["dp"], d["config"]["expert_parallel"]
        if not engine:
            del d["config"]["engine"]
        d["seeds"] = list(self.seeds)
        d["seed_p99s"] = [list(x) for x in self.seed_p99s]
        d["feasible"] = self.feasible
        return d


def rank(evaluations: Iterable[Evaluation], objective: str = "cost") -> list[Evaluation]:
    """Feasible first: by cost per hour (latency: p99 E2E; traffic: the most requests/s), then
    fewer GPUs, then lower p99 TTFT, then the config; then the rest in the configs' order."""
    def key(e: Evaluation):
        if not e.feasible:
            return (1, 0.0, 0.0, 0, 0.0, e.config)
        first_key = {"cost": e.cost_per_hour, "latency": e.e2e_p99 or 0.0, "traffic": -e.served}[objective]
        return (0, first_key, e.cost_per_hour, e.gpus, e.ttft_p99 or 0.0, e.config)

    return sorted(evaluations, key=key)


def pareto(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """The feasible configurations no other beats on both cost per hour and p99 TTFT at their
    planned load (the frontier of cost against latency), cheapest first."""
    front: list[Evaluation] = []
    for e in rank(x for x in evaluations if x.feasible):
        if not front or e.ttft_p99 < front[-1].ttft_p99:
            front.append(e)
    return front


def beaten(x: Evaluation, found: list[Evaluation], objective: str, span: float) -> tuple | None:
    """(a simulated answer at least as good as anything `x`'s bounds allow, why) (None: none is)."""
    if x.bound_cost is None or x.bound_ttft is None:
        return None
    if objective == "cost" and found:
        cheapest = min(found, key=lambda a: (a.cost_per_hour, a.config))
        if x.bound_cost > span * cheapest.cost_per_hour * (1 + 1e-12):
            return cheapest, (f"costs at least ${x.bound_cost:,.2f}/hour by its bounds, over {span:g} x the "
                              f"${cheapest.cost_per_hour:,.2f}/hour of {cheapest.config.label} (the frontier's "
                              "span: --frontier-span)")
    for a in found:
        if a.cost_per_hour > x.bound_cost * (1 + 1e-12) or a.ttft_p99 > x.bound_ttft:
            continue
        if objective == "traffic" and not a.served >= x.bound_served:
            continue
        if objective == "latency":
            continue  # a floor under the E2E at the limit's load is not a bound on its ranking: simulate
        return a, (f"cannot beat {a.config.label}: at least ${x.bound_cost:,.2f}/hour and a p99 TTFT of at "
                   f"least {x.bound_ttft:.3g} s by its bounds")
    return None
