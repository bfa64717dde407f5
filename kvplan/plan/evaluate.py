"""One configuration of `kvplan plan`, evaluated: its bounds, its capacity on the search's sample,
its plan (replicas, load, rental), and the plan re-simulated on fresh samples (`verify`).

kvplan/plan/search.py says how these steps make the search; kvplan/plan/edge.py holds the rate
grid, the walk to an edge, the shared runs and the early stop.
"""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan.plan.edge import (LONGEST_SPAN_S, SCOUT_MIN, SCOUT_SHARE, Runs, doomed, grid_rate, grid_step, small_chunks,
                              walk_edge)
from kvplan.plan.rows import Evaluation, Rules, Targets, beaten
from kvplan.plan.space import Config, Traffic, config_workload, first

MAX_EXTRA = 8  # at most this many replicas (or grid steps of load) added for the fresh seeds


def priced(e: Evaluation, traffic: Traffic, book, replicas: int, load: float) -> Evaluation:
    """`e` with `replicas` at `load` each, rented from `book` (no rental: not feasible, the reason)."""
    rental = e.config.rent(book, replicas)
    served = traffic.rate if traffic.rate is not None else replicas * load
    if rental is None:
        return replace(e, replicas=replicas, gpus=replicas * e.config.gpus_per_replica, load_per_replica=load,
                       served=served, cost_per_hour=None,
                       reason=book.no_rental_reason(e.config.gpu, e.config.rent_unit[0]), left_out="price")
    per_hour = served * 3600
    both = (traffic.prompt + traffic.output) * per_hour
    out = traffic.output * per_hour
    return replace(e, replicas=replicas, gpus=replicas * e.config.gpus_per_replica, load_per_replica=load,
                   served=served, usd_per_gpu_hour=rental.offer.usd_per_gpu_hour, cost_per_hour=rental.usd_per_hour,
                   usd_per_million_tokens=rental.usd_per_hour / both * 1e6 if both > 0 else None,
                   usd_per_million_output_tokens=rental.usd_per_hour / out * 1e6 if out > 0 else None,
                   rental=rental.to_dict())


def filled_replicas(book, config: Config, replicas: int) -> int:
    """`replicas`, or more where the instances that rent them hold more: a node paid for whole
    serves with all of its GPUs (the cost is the same, the load on each replica lower)."""
    rental = config.rent(book, replicas)
    if rental is None:
        return replicas
    unit, per = config.rent_unit
    return max(replicas, rental.instances * (rental.instance_gpus // unit) // per)


def most_replicas(config: Config, book, rules: Rules) -> int:
    """The most replicas of `config` within the GPU count and the budget (0: not one)."""
    top = 1 << 20
    if rules.gpus is not None:
        top = min(top, rules.gpus // config.gpus_per_replica)
    if rules.budget is not None:
        lo, hi = 0, top
        while lo < hi:  # rentals only grow with replicas
            mid = (lo + hi + 1) // 2
            r = config.rent(book, mid)
            lo, hi = (mid, hi) if r is not None and r.usd_per_hour <= rules.budget * (1 + 1e-12) else (lo, mid - 1)
        top = lo
    return top


class Sample:
    """The requests of one configuration's runs: the search's sample (seed 0, or the workload
    file's), or a fresh one (a seed), with their lengths."""

    def __init__(self, model: str, traffic: Traffic, config: Config, seed: int | None = None) -> None:
        import numpy as np

        self.wl = config_workload(model, traffic, config, seed)
        self.spec = self.wl.allocators[0]
        self.total = min(traffic.count, self.wl.num_requests)
        chunks = list(first(self.wl.make_requests(), self.total))
        self.prompts = np.concatenate([c.prompt_len for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)
        self.outputs = np.concatenate([c.output_len for c in chunks]) if chunks else np.zeros(0, dtype=np.int64)


def bounds_of(model: str, traffic: Traffic, targets: Targets, config: Config, book, rules: Rules) -> Evaluation:
    """A configuration settled without a run where memory or its bounds settle it; else its bounds."""
    from kvplan.errors import KvplanError
    from kvplan.sim.inputs import make_setup

    try:
        sample = Sample(model, traffic, config)
        setup = make_setup(sample.wl, sample.spec)
    except KvplanError as exc:  # vLLM would not start it, or the traffic cannot run on it
        return Evaluation(config, False, reason=exc.message, left_out="memory")
    return _bounded(sample, setup, traffic, targets, config, book, rules)


def _bounded(sample: Sample, setup, traffic: Traffic, targets: Targets, config: Config, book,
             rules: Rules) -> Evaluation:
    from kvplan.plan.bounds import bounds, miss_reason

    b = bounds(setup, sample.prompts, sample.outputs, setup.prefix_caching and traffic.workload is not None)
    if config.dp > 1:  # one rank's clock (its MoE share left out: lower floors, a higher ceiling), dp of them
        b = replace(b, rate=b.rate * config.dp)
    why = miss_reason(b, targets)
    known = dict(bound_ttft=b.ttft_s, bound_rate=b.rate)
    if why is not None:
        return Evaluation(config, True, reason=why, left_out="floor", **known)
    usable = b.rate * (1 - rules.headroom)
    if traffic.rate is not None:
        least = max(1, math.ceil(traffic.rate / usable * (1 - 1e-12))) if usable > 0 else 1 << 20
        most = most_replicas(config, book, rules) if rules.objective(traffic) == "latency" else None
        if most is not None and most < least:
            return Evaluation(config, True, reason=f"needs at least {least} replicas for {traffic.rate:g} "
                              f"requests/s (at most {b.rate:.3g} requests/s each, less {rules.headroom:.0%} headroom), "
                              f"more than the limit allows ({most})", left_out="limit", **known)
        rental = config.rent(book, least)
        if rental is None:
            return Evaluation(config, True, reason=book.no_rental_reason(config.gpu, config.rent_unit[0]),
                              left_out="price", **known)
        return Evaluation(config, True, reason=None, bound_cost=rental.usd_per_hour, **known)
    most = most_replicas(config, book, rules)
    if most < 1:
        return Evaluation(config, True, reason="not one replica within the limit", left_out="limit", **known)
    rental = config.rent(book, most)
    return Evaluation(config, True, reason=None, bound_cost=rental.usd_per_hour if rental else None,
                      bound_served=most * usable, **known)


class Replica:
    """One configuration's runs: its sample, its setup, the group's shared runs (edge.Runs)."""

    def __init__(self, model: str, traffic: Traffic, targets: Targets, config: Config, runs: Runs) -> None:
        from kvplan.sim.inputs import make_setup

        self.model, self.traffic, self.targets, self.config = model, traffic, targets, config
        self.sample = Sample(model, traffic, config)  # raises where vLLM would not start it
        self.setup = make_setup(self.sample.wl, self.sample.spec)  # one clock for every rate
        self.runs = runs
        g = self.setup.sglang  # SGLang's scheduler caps its running batch at max_running_requests
        self.cap = self.setup.sched.max_num_seqs if g is None else g.max_running_requests
        self.uncapped = replace(self.setup, sched=replace(self.setup.sched, max_num_seqs=0))  # all but the cap
        self.total = self.sample.total
        self.used = self.reused = 0
        self.records = targets.goodput is not None  # goodput counts per request
        # at least what a request gets from the API server (a streaming one stretches it per
        # request), so the early stop stays a sure one
        self.frontend_s = self.setup.clock.frontend / self.setup.clock.ticks_per_unit
        self.fresh: dict[int, object] = {}

    def _run(self, key: tuple, workload, stoppable: bool):
        from kvplan.sim.engine import simulate

        self.used += 1
        known, result = self.runs.get(key, self.cap)
        if known:
            self.reused += 1
            return result
        clock = self.setup.clock
        rule, peak = (doomed(self.targets, key[1], clock.ticks_per_unit) if stoppable else None), [0]

        def stop(state) -> bool:
            if rule(state):
                peak[0] = state.peak_running
                return True
            return False

        result = simulate(workload, self.sample.spec, setup=self.setup, record_requests=self.records,
                          stop=None if rule is None else stop)
        self.runs.put(key, self.cap, peak[0] if result is None else result.peak_running, result)
        return result

    def _source(self, seed: int | None):
        """The workload of the search's sample (None) or of a fresh one."""
        if seed is None:
            return self.sample.wl
        if seed not in self.fresh:
            self.fresh[seed] = Sample(self.model, self.traffic, self.config, seed).wl
        return self.fresh[seed]

    def at(self, n: int, rate: float | None, seed: int | None = None):
        """The first n requests at `rate` (None: all at once), of the search's sample or of a fresh
        one (`seed`); None when the run stopped at a certain miss."""
        source = self._source(seed)
        base = source.make_requests
        if rate is None:
            make = lambda: (replace(c, arrival=c.arrival * 0.0) for c in first(base(), n))  # noqa: E731
            return self._run((self.uncapped, n, None, seed), replace(source, make_requests=make), False)
        f = self.traffic.base_rate / rate
        make = lambda: small_chunks(replace(c, arrival=c.arrival * f) for c in first(base(), n))  # noqa: E731
        return self._run((self.uncapped, n, rate, seed), replace(source, make_requests=make), True)

    def drain_rate(self, n: int) -> float:
        """Requests/s the replica finishes a standing backlog at: the first n requests at once, over
        the whole run (a Poisson run above it finishes requests at this rate too, its queue growing
        the while: 24.18-24.19 requests/s at 25.5-27.5 offered for an 8B model on an H100 with
        max_num_seqs 256, against 24.19 here from 10,000 requests). Counted with its tail, when the
        batch empties, it errs low, never high, the more so the fewer the requests."""
        return max(self.at(n, None).throughput_rps, 1e-9)

    def is_fresh(self, seed: int) -> bool:
        """Whether `seed` draws other requests than the search's sample (a trace with its own
        timestamps and lengths draws the same ones whatever the seed)."""
        import numpy as np

        own = list(first(self.sample.wl.make_requests(), self.total))
        other = list(first(self._source(seed).make_requests(), self.total))
        cols = lambda chunks, name: np.concatenate([getattr(c, name) for c in chunks]) if chunks else np.zeros(0)  # noqa: E731
        return any(not np.array_equal(cols(own, n), cols(other, n)) for n in ("arrival", "prompt_len", "output_len"))

    def passes(self, n: int, rate: float, seed: int | None = None) -> bool:
        return self.targets.met_by(self.at(n, rate, seed), self.frontend_s)

    def plan(self, e: Evaluation, book, rules: Rules, seeds: tuple, found: tuple = ()) -> Evaluation:
        """`e` (its capacity known) planned: the replicas, each at its load, checked on `seeds`
        (None: the search's own sample), more replicas (or less load) while one misses. `found`:
        the search's simulated answers so far; a plan that costs more than they allow it to
        matter (rows.beaten, with its cost now known) is not run at its load."""
        traffic, capacity = self.traffic, e.capacity
        usable = capacity * (1 - rules.headroom)
        objective = rules.objective(traffic)
        seeds = tuple(s for s in seeds if s is None or self.is_fresh(s)) or (None,)

        def check(load: float):
            results = []
            for s in seeds:
                result = self.at(self.total, load, s)
                if not self.targets.met_by(result, self.frontend_s):
                    return None
                results.append(result)
            return results

        trials: list[tuple[int, float]] = []
        if objective == "traffic":
            n = most_replicas(self.config, book, rules)
            k = grid_step(usable, up=False)
            trials = [(n, min(grid_rate(step), usable)) for step in range(k, k - MAX_EXTRA - 1, -1)]
        else:
            n = max(e.replicas, math.ceil(traffic.rate / usable * (1 - 1e-12)))
            if objective == "latency":
                most = most_replicas(self.config, book, rules)
                if most < n:
                    return replace(e, evaluations=self.used, reused=self.reused, cost_per_hour=None,
                                   reason=f"needs {n} replicas (each serves {capacity:.3g} requests/s, {usable:.3g} "
                                          f"with {rules.headroom:.0%} headroom), more than the limit allows ({most})",
                                   left_out="limit")
                trials = [(most, traffic.rate / most)]
            else:
                counts = []
                for extra in range(MAX_EXTRA + 1):  # whole instances: every GPU paid for serves
                    filled = filled_replicas(book, self.config, n + extra)
                    if filled not in counts:
                        counts.append(filled)
                trials = [(m, traffic.rate / m) for m in counts]
        if found and objective == "cost":
            rental = self.config.rent(book, trials[0][0])
            if rental is not None:
                by = beaten(replace(e, bound_cost=rental.usd_per_hour), found, objective, rules.frontier_span)
                if by is not None:
                    return replace(e, evaluations=self.used, reused=self.reused, replicas=trials[0][0],
                                   reason=f"{trials[0][0]} replicas: {by[1].replace(' by its bounds', '')}; "
                                          "not simulated at its load", left_out="bounded")
        results = None
        for n, load in trials:
            results = check(load)
            if results is not None:
                break
        e = replace(e, evaluations=self.used, reused=self.reused)
        if results is None:
            named = "fresh seeds " + ", ".join(map(str, seeds)) if seeds != (None,) else "the search's sample"
            return replace(e, replicas=n, load_per_replica=load, cost_per_hour=None,
                           reason=f"misses the targets on {named} even at {load:.3g} requests/s per replica",
                           left_out="missed")
        worst = {name: max((getattr(r, name).p99 for r in results if getattr(r, name).p99 is not None),
                           default=None) for name in ("ttft", "tpot", "e2e")}
        e = replace(e, ttft_p99=worst["ttft"], tpot_p99=worst["tpot"], e2e_p99=worst["e2e"],
                    seeds=tuple(s for s in seeds if s is not None),
                    seed_p99s=tuple((r.ttft.p99, r.tpot.p99, r.e2e.p99) for r in results))
        return priced(e, traffic, book, n, load)


def evaluate(model: str, traffic: Traffic, targets: Targets, config: Config, book, rules: Rules = Rules(),
             runs_of_group: Runs | None = None, pre: Evaluation | None = None, found: tuple = ()) -> Evaluation:
    """One configuration: its bounds (`pre`, when the search has them), its capacity, then its plan
    on the search's own sample (the fresh seeds come after the search, for the rows that are
    shown: `verify`).

    The capacity, on the grid of edge.grid_rate (the same rates for every configuration), never
    above the drain rate (Replica.drain_rate):
    1. scouting, on the first count / SCOUT_SHARE requests (at least SCOUT_MIN): from the drain
       rate of those requests, or from a sibling's edge, outwards to two neighbouring grid steps;
    2. the verdict, on all `count` requests: from the scouts' step, less the steps the group's
       previous full-count edge lay below its scouts', up while the targets hold or down while
       they miss, to a step that meets them whose neighbour above misses them;
    3. the cap: an edge above the scouts' drain rate is held to the drain rate of all `count`
       requests (the scouts' errs low: their tail is a larger share of a shorter run, so an edge
       below it is below the full one, which is not run then).
    Runs stop as soon as their miss is certain (edge.doomed), and a sibling's identical run is
    reused (edge.Runs).
    """
    from kvplan.errors import KvplanError

    if pre is not None and (not pre.fits or pre.reason is not None):
        return pre
    runs = runs_of_group if runs_of_group is not None else Runs()
    try:
        r = Replica(model, traffic, targets, config, runs)
    except KvplanError as exc:  # vLLM would not start it, or the traffic cannot run on it
        return Evaluation(config, False, reason=exc.message, left_out="memory")
    if pre is None:
        pre = _bounded(r.sample, r.setup, traffic, targets, config, book, rules)
        if pre.reason is not None:
            return pre
    total = r.total
    scout_n = total if total <= SCOUT_MIN else max(SCOUT_MIN, total // SCOUT_SHARE)
    # the lowest rate tried: none so low that the arrivals would span more than LONGEST_SPAN_S
    # (the clock's range is about 53 days); the highest: the bounds' ceiling
    floor = grid_step(total / LONGEST_SPAN_S, up=True)
    ceiling = max(floor, grid_step(min(pre.bound_rate, 1e12), up=False))
    scout_drain = r.drain_rate(scout_n)
    guess = grid_step(scout_drain, up=False) if runs.scout_edge is None else runs.scout_edge
    best = walk_edge(lambda k: r.passes(scout_n, grid_rate(k)), min(max(floor, guess), ceiling), floor, ceiling)
    runs.scout_edge = best
    start = floor if best is None else best - runs.offset
    edge = walk_edge(lambda k: r.passes(total, grid_rate(k)), min(max(floor, start), ceiling), floor, ceiling)
    if best is not None and edge is not None:
        runs.offset = best - edge
    drain = scout_drain
    if edge is not None and grid_rate(edge) > scout_drain:
        drain = r.drain_rate(total) if total > scout_n else scout_drain
        if grid_rate(edge) > drain:  # the targets hold where the queue grows: held to the drain rate
            top = grid_step(drain, up=False)
            edge = walk_edge(lambda k: r.passes(total, grid_rate(k)), max(floor, top), floor, max(floor, top))
    e = replace(pre, simulated=True, saturated=drain)
    if edge is None:
        return replace(e, evaluations=r.used, reused=r.reused,
                       reason=f"misses the targets at every rate tried, down to {grid_rate(floor):.3g} requests/s "
                              f"({1 / grid_rate(floor):,.0f} s apart)", left_out="missed")
    return r.plan(replace(e, capacity=grid_rate(edge)), book, rules, (None,), found)


def verify(model: str, traffic: Traffic, targets: Targets, e: Evaluation, book, rules: Rules) -> Evaluation:
    """Row `e` re-simulated at its planned load on the fresh seeds, with replicas added (or, for the
    most traffic, load taken off) while one misses; the p99s become the worst of them."""
    if not rules.seeds or not e.feasible:
        return e
    r = Replica(model, traffic, targets, e.config, Runs())
    used = e.evaluations
    out = r.plan(replace(e, seeds=()), book, rules, tuple(rules.seeds))
    return replace(out, evaluations=used + r.used, reused=e.reused + r.reused)
