"""`kvplan plan`: the cheapest deployment that serves a traffic within latency targets.

For each configuration of the search space (GPU, tensor-parallel degree, KV dtype, max_num_seqs,
block size, prefix caching):
1. memory first: `kvplan size`'s start-up verdict (weights, activations, CUDA graphs, one request
   of the longest prompt + output in the KV pool); a configuration vLLM would not start is pruned;
2. the highest request rate one replica serves within the targets (`evaluate`): a search on one
   grid of rates 2.2% apart, scouted on a tenth of the requests and decided on all of them, each
   rate replaying the same requests with their arrival times scaled, so the search is
   deterministic; the targets are p99s of the serve engine's TTFT, TPOT and E2E;
3. replicas = ceil(rate wanted / rate per replica), cost per hour = replicas x tp x $/GPU-hour,
   cost per million output tokens = cost per hour / (output tokens per hour at the wanted rate).

Results are ranked by cost per hour (ties: fewer GPUs, then lower p99 TTFT); `pareto` keeps the
configurations no other one beats on both cost and p99 latency. Configurations that differ only in
max_num_seqs are evaluated together, in one worker, sharing their identical runs; the groups are
independent and deterministic: 1 worker, N workers and Ray give the same rows in the same order.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Sequence

from kvplan.plan.space import Config, Traffic, config_workload, first

__all__ = ["Config", "Evaluation", "Targets", "Traffic", "evaluate", "pareto", "rank", "search"]

STEPS_PER_OCTAVE = 32  # the rates tried lie on one grid for every configuration: 2^(k/32) requests/s, 2.2% apart
LOW_FRACTION = 1 / 64  # the scouting bracket: [saturated / 64, 2 x saturated]
LONGEST_SPAN_S = 1e6  # no rate so low that the requests' arrivals would span more than 11.6 days
MAX_ABOVE = 64  # the bracket's top doubles while the targets still hold, up to 64 x saturated
SCOUT_SHARE = 10  # scouting runs take the first count / 10 requests (at least SCOUT_MIN)
SCOUT_MIN = 1000
START_OFFSET = 4  # the full-count search starts this many steps below the scouts' edge (see evaluate)
STOP_CHUNK = 256  # requests per chunk of a rate run: how often it may stop early


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

    def met_by(self, result, frontend_s: float = 0.0) -> bool:
        """`frontend_s`: the API server's latency the engine adds to TTFT and E2E (goodput counts
        per request from the records, so it adds it the same way)."""
        if result is None:  # a run stopped once it was certain to miss
            return False
        if self.goodput is not None:
            return attainment(self, result, frontend_s) >= self.goodput
        for target, stats in ((self.ttft_p99, result.ttft), (self.tpot_p99, result.tpot),
                              (self.e2e_p99, result.e2e)):
            if target is not None and (stats.p99 is None or stats.p99 > target):
                return False
        return True


def attainment(targets: Targets, result, frontend_s: float = 0.0) -> float:
    """The share of a run's requests within every limit of `targets` (needs its request records)."""
    import numpy as np

    cols = result.requests.columns
    arrival, first, finish, out = cols["arrival"], cols["first_token"], cols["finish"], cols["output"]
    frontend_s = cols.get("frontend", frontend_s)  # per request where the API server streams at a cost
    ok = np.ones(len(out), dtype=bool)
    if targets.ttft_p99 is not None:
        ok &= (first < 0) | (first - arrival + frontend_s <= targets.ttft_p99)
    if targets.e2e_p99 is not None:
        ok &= finish - arrival + frontend_s <= targets.e2e_p99
    if targets.tpot_p99 is not None:
        many = out > 1
        ok[many] &= (finish[many] - first[many]) / (out[many] - 1) <= targets.tpot_p99
    return float(ok.mean()) if len(ok) else 1.0


@dataclass(frozen=True, slots=True)
class Evaluation:
    config: Config
    fits: bool
    reason: str | None = None  # why it was pruned or cannot meet the targets
    rate_per_replica: float = 0.0  # requests/s one replica serves within the targets
    replicas: int = 0
    gpus: int = 0
    usd_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_million_tokens: float | None = None
    ttft_p99: float | None = None  # at rate_per_replica
    tpot_p99: float | None = None
    e2e_p99: float | None = None
    evaluations: int = 0  # serve runs the search used
    reused: int = 0  # of them, runs a configuration of its group had made already (identical, see _Runs)
    router: str | None = None  # replicas checked by a fleet simulation behind this router (kvplan/plan/fleet_check.py)
    replicas_estimate: int = 0  # with a router: ceil(rate / rate per replica), before the fleet's check
    prefill_replicas: int = 0  # disaggregated: of the replicas, the prefill pool's (0: colocated)

    @property
    def feasible(self) -> bool:
        return self.cost_per_hour is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = {**asdict(self.config), "label": self.config.label}
        d["feasible"] = self.feasible
        return d


def grid_rate(k: int) -> float:
    return 2.0 ** (k / STEPS_PER_OCTAVE)


def grid_step(rate: float, up: bool) -> int:
    """The grid step at or above (`up`) / at or below `rate`."""
    x = STEPS_PER_OCTAVE * math.log2(rate)
    return math.ceil(x - 1e-9) if up else math.floor(x + 1e-9)


class _Runs:
    """The serve runs of one group of configurations, which differ only in max_num_seqs.

    A run is a pure function of its setup and requests; max_num_seqs enters the engine only as the
    cap on the running batch (and, through the start-up profile, the pool, which the key holds with
    every other setting of the setup). So a run whose batch never reached a cap is the same run
    under any cap above its peak: a sibling's run whose peak stays below both caps is reused as it
    is, never re-simulated."""

    def __init__(self) -> None:
        self.done: dict[tuple, list] = {}
        self.offset = START_OFFSET  # steps the full-count edge lay below the scouts' last time
        self.scout_edge: int | None = None  # the scouts' edge last time

    def get(self, key: tuple, cap: int):
        for other_cap, peak, result in self.done.get(key, ()):
            if other_cap == cap or peak < min(cap, other_cap):
                return True, result
        return False, None

    def put(self, key: tuple, cap: int, peak: int, result) -> None:
        """`peak`: the largest batch the run reached (up to its stop, for a run that stopped: the
        same run under another cap above it stops at the same point)."""
        self.done.setdefault(key, []).append((cap, peak, result))


def evaluate(model: str, traffic: Traffic, targets: Targets, config: Config,
             price: float | None, runs_of_group: _Runs | None = None) -> Evaluation:  # fmt: skip
    """One configuration: the memory verdict, then the highest rate per replica within the targets.

    The rate search, on the grid of grid_rate (the same rates for every configuration):
    1. scouting, on the first count / SCOUT_SHARE requests (at least SCOUT_MIN): every request at
       once gives the saturated throughput; the bracket [saturated / 64, 2 x saturated] (its top
       doubling while the targets hold) is bisected to two neighbouring grid steps, or, after a
       sibling of the group, searched from the sibling's edge outwards (_edge);
    2. the verdict, on all `count` requests: from the scouts' step, less the steps the group's
       previous full-count edge lay below its scouts' (short runs pass at higher rates: fewer
       requests reach the queue's tail), up while the targets hold or down while they miss
       (doubling steps, then bisection), to a step that meets them whose neighbour above misses
       them. Only runs of all `count` requests decide the answer; scouting only saves runs.
    Runs stop as soon as their miss is certain (_doomed), and a sibling's identical run is reused
    (_Runs).
    """
    from kvplan.errors import KvplanError
    from kvplan.sim import kernel as K
    from kvplan.sim.engine import simulate
    from kvplan.sim.inputs import make_setup

    try:
        wl = config_workload(model, traffic, config)
        spec = wl.allocators[0]
        setup = make_setup(wl, spec)  # one clock for every rate: the step times do not depend on it
    except KvplanError as exc:  # vLLM would not start it, or the traffic cannot run on it
        return Evaluation(config, False, exc.message)
    base, scale = wl.make_requests, traffic.base_rate
    runs = runs_of_group if runs_of_group is not None else _Runs()
    cap = setup.sched.max_num_seqs
    uncapped = replace(setup, sched=replace(setup.sched, max_num_seqs=0))  # all but the cap
    total = min(traffic.count, wl.num_requests)
    scout = total if total <= SCOUT_MIN else max(SCOUT_MIN, total // SCOUT_SHARE)
    used = reused = 0
    records = targets.goodput is not None  # goodput counts per request
    frontend_s = setup.clock.frontend / setup.clock.ticks_per_unit  # at least what a request gets
    # (a streaming API server stretches it per request), so the early stop stays a sure one

    def at(n: int, k: int | None):
        nonlocal used, reused
        used += 1
        key = (uncapped, n, k)
        known, result = runs.get(key, cap)
        if known:
            reused += 1
            return result
        if k is None:  # every request at once: the replica's saturated throughput
            make = lambda: (replace(c, arrival=c.arrival * 0.0) for c in first(base(), n))  # noqa: E731
            result = simulate(replace(wl, make_requests=make), spec, setup=setup)
            runs.put(key, cap, result.peak_running, result)
            return result
        # the same requests, arriving rate / base_rate as often, in small chunks so that a run
        # stops as soon as its verdict is certain (None: it misses)
        f = scale / grid_rate(k)
        make = lambda: _small_chunks(replace(c, arrival=c.arrival * f) for c in first(base(), n))  # noqa: E731
        rule, peak = _doomed(targets, n, setup.clock.ticks_per_unit), [0]

        def stop(state) -> bool:
            if rule(state):
                peak[0] = int(state.st[K.PEAK_RUNNING])
                return True
            return False

        result = simulate(replace(wl, make_requests=make), spec, setup=setup, record_requests=records,
                          stop=None if rule is None else stop)
        runs.put(key, cap, peak[0] if result is None else result.peak_running, result)
        return result

    def passes(n: int, k: int) -> bool:
        return targets.met_by(at(n, k), frontend_s)

    saturated = max(at(scout, None).throughput_rps, 1e-9)
    # the lowest rate tried: none so low that the arrivals would span more than LONGEST_SPAN_S
    # (the clock's range is about 53 days)
    floor = grid_step(total / LONGEST_SPAN_S, up=True)
    low = max(floor, grid_step(saturated * LOW_FRACTION, up=False))
    ceiling = max(low, grid_step(saturated * MAX_ABOVE, up=True))
    if runs.scout_edge is None:
        best = _scout(lambda k: passes(scout, k), low, max(low + 1, grid_step(saturated * 2, up=True)), ceiling)
        if best is None:  # even saturated / 64 misses: lower still
            best = _edge(lambda k: passes(scout, k), low, floor, ceiling)
    else:  # a sibling's edge is the likeliest place of this one's
        best = _edge(lambda k: passes(scout, k), min(max(floor, runs.scout_edge), ceiling), floor, ceiling)
    runs.scout_edge = best
    start = floor if best is None else best - runs.offset
    edge = _edge(lambda k: passes(total, k), min(max(floor, start), ceiling), floor, ceiling)
    if best is not None and edge is not None:
        runs.offset = best - edge
    best = edge
    if best is None:
        return Evaluation(config, True, f"misses the targets even at {grid_rate(floor):.3g} requests/s "
                          f"({1 / grid_rate(floor):,.0f} s apart)",
                          evaluations=used, reused=reused, usd_per_gpu_hour=price)
    result, best_rate = at(total, best), grid_rate(best)
    replicas = math.ceil(traffic.rate / best_rate * (1 - 1e-12))
    gpus = replicas * config.tp
    cost = cost_m = None
    if price is not None:
        cost = gpus * price
        cost_m = cost / (traffic.rate * traffic.output * 3600) * 1e6 if traffic.output > 0 else None
    return Evaluation(config, True, None if price is not None else "no price for this GPU", best_rate, replicas,
                      gpus, price, cost, cost_m, result.ttft.p99, result.tpot.p99, result.e2e.p99, used, reused)


def _scout(passes: Callable[[int], bool], lo: int, hi: int, ceiling: int) -> int | None:
    """Bisect [lo, hi] on the grid to a step that passes below one that misses; the top moves up
    (doubling its distance) while it still passes, up to `ceiling`. None: `lo` misses."""
    if not passes(lo):
        return None
    while passes(hi):
        if hi >= ceiling:
            return hi
        lo, hi = hi, min(ceiling, hi + 2 * (hi - lo))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def _edge(passes: Callable[[int], bool], start: int, floor: int, ceiling: int) -> int | None:
    """From `start`, the step that passes whose neighbour above misses: up while passing, down
    while missing, by doubling steps, then bisection. None: even `floor` misses."""
    if passes(start):
        lo, step = start, 1
        while True:
            hi = min(ceiling, lo + step)
            if hi == lo:
                return lo
            if not passes(hi):
                break
            lo, step = hi, step * 2
    else:
        hi, step = start, 1
        while True:
            lo = max(floor, hi - step)
            if passes(lo):
                break
            if lo == floor:
                return None
            hi, step = lo, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def _small_chunks(chunks):
    for c in chunks:
        for s in range(0, len(c), STOP_CHUNK):
            yield c.take(slice(s, s + STOP_CHUNK))


def _doomed(targets: Targets, count: int, per_unit: float):
    """A stop rule for a run of `count` requests: True once enough of them are certainly late
    that the run must miss. For p99s: count - floor(0.99 x (count - 1)) late values put numpy's
    p99 above a target (it is at least the value of that rank; for TPOT, counted over the requests
    with more than one output token, `count` bounds their number, and the rank's count only grows
    with it). For goodput g: count - ceil(g x count) + 1 requests late on any limit.

    A request is certainly late for TTFT or E2E once its first token (or its end) came later than
    the target after it reached the engine, or it is still waiting past that: the result measures
    from the client's send, no later, and adds the API server's latency. For TPOT, once the time
    since its first token, finished or not, passes target x (its output - 1). The rule never
    stops a run that would pass."""
    import numpy as np

    from kvplan.sim import kernel as K

    tol = 1 + 1e-9
    if targets.goodput is not None:
        need = count - math.ceil(targets.goodput * count - 1e-9) + 1
    else:
        need = count - math.floor(0.99 * (count - 1))
    limits = [(col, target * per_unit * tol + 1) for col, target in
              ((K.FIRST_TOKEN_AT, targets.ttft_p99), (K.FINISHED_AT, targets.e2e_p99)) if target is not None]
    tpot = None if targets.tpot_p99 is None else targets.tpot_p99 * per_unit * tol
    if not limits and tpot is None:
        return None

    def lateness(req, now: int) -> list:
        arrival = req[:, K.ARRIVAL]
        lates = []
        for col, limit in limits:
            at = req[:, col]
            lates.append(((at >= 0) & (at - arrival > limit)) | ((at < 0) & (now - arrival > limit)))
        if tpot is not None:
            first, finish, out = req[:, K.FIRST_TOKEN_AT], req[:, K.FINISHED_AT], req[:, K.OUTPUT]
            end = np.where(finish >= 0, finish, now)
            lates.append((first >= 0) & (out > 1) & (end - first > tpot * (out - 1) + 1))
        if targets.goodput is not None:
            lates = [np.logical_or.reduce(lates)]
        return lates

    settled = [0, None]  # rows before settled[0] have all finished: their counts, in settled[1], are final

    def stop(state) -> bool:
        req, now = state.req[:state.loaded], int(state.st[K.NOW])
        start = settled[0]
        waiting = np.flatnonzero(req[start:, K.FINISHED_AT] < 0)
        end = start + (int(waiting[0]) if len(waiting) else len(req) - start)
        if end > start:
            done = [int(x.sum()) for x in lateness(req[start:end], now)]
            settled[1] = done if settled[1] is None else [a + b for a, b in zip(settled[1], done)]
            settled[0] = end
        open_ = lateness(req[end:], now)
        base = settled[1] or [0] * len(open_)
        return any(b + int(x.sum()) >= need for b, x in zip(base, open_))

    return stop


def _evaluate_group(args) -> list[Evaluation]:
    """The configurations of one group, in turn, sharing their runs."""
    model, traffic, targets, configs, prices = args
    runs = _Runs()
    return [evaluate(model, traffic, targets, c, prices.get(c.gpu), runs) for c in configs]


def groups_of(model: str, traffic: Traffic, targets: Targets, configs: Sequence[Config],
              prices: dict[str, float]) -> list[tuple]:
    """The jobs: one per group of configurations (in the order each group first appears)."""
    order: dict[tuple, list[Config]] = {}
    for c in configs:
        order.setdefault(c.group, []).append(c)
    return [(model, traffic, targets, tuple(cs), dict(prices)) for cs in order.values()]


def search(model: str, traffic: Traffic, targets: Targets, configs: Sequence[Config],
           prices: dict[str, float], *, workers: int = 1, ray: bool = False,
           progress: Callable[[int, int], None] | None = None) -> list[Evaluation]:
    """Every configuration evaluated (groups in a process pool when workers > 1, or on Ray), ranked.
    The rows do not depend on the workers: each group runs in one worker, in the same order."""
    results: list[Evaluation] = []
    for group in run_jobs(_evaluate_group, groups_of(model, traffic, targets, configs, prices), workers, ray):
        results.extend(group)
        if progress:
            progress(len(results), len(configs))
    return rank(results)


def run_jobs(fn: Callable, jobs: list, workers: int = 1, ray: bool = False):
    """fn(job) for every job, in the jobs' order: in this process, in a pool of `workers`
    processes, or as Ray tasks (on the cluster at RAY_ADDRESS or one already initialised, else on a
    local instance of `workers` CPUs). Each result is yielded as soon as it and those before it
    are ready."""
    if ray:
        yield from _on_ray(fn, jobs, workers)
    elif workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield fn(job)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            yield from pool.map(fn, jobs)  # map keeps the order


def _on_ray(fn: Callable, jobs: list, workers: int):
    import os

    try:
        import ray
    except ImportError:
        from kvplan.errors import UsageError

        raise UsageError("needs Ray: pip install 'kvplan[ray]'", field="--ray") from None
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    task = ray.remote(fn)
    pending = [task.remote(job) for job in jobs]
    for ref in pending:
        yield ray.get(ref)


def rank(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """Feasible first, by cost per hour, then fewer GPUs, then lower p99 TTFT, then the config."""
    def key(e: Evaluation):
        if not e.feasible:
            return (1, 0.0, 0, 0.0, e.config)
        return (0, e.cost_per_hour, e.gpus, e.ttft_p99 or 0.0, e.config)

    return sorted(evaluations, key=key)


def pareto(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """The feasible configurations no other beats on both cost per hour and p99 TTFT (the
    frontier of cost against latency), cheapest first."""
    front: list[Evaluation] = []
    for e in rank(x for x in evaluations if x.feasible):
        if not front or e.ttft_p99 < front[-1].ttft_p99:
            front.append(e)
    return front
