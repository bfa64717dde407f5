"""`kvplan plan`: the cheapest deployment that serves a traffic within latency targets.

For each configuration of the search space (GPU, tensor-parallel degree, KV dtype, max_num_seqs):
1. memory first: `kvplan size`'s start-up verdict (weights, activations, CUDA graphs, one request
   of prompt + output in the KV pool); a configuration vLLM would not start is pruned;
2. the highest request rate one replica serves within the targets, by bisection on the rate
   (Poisson arrivals; each rate replays the same draws scaled, so the search is deterministic):
   a first run with every request at once gives the replica's saturated throughput, which sets
   the bracket (a short run may be served above it, so the bracket's top doubles while the
   targets hold); the targets are p99s of the serve engine's TTFT, TPOT and E2E;
3. replicas = ceil(rate wanted / rate per replica), cost per hour = replicas x tp x $/GPU-hour,
   cost per million output tokens = cost per hour / (output tokens per hour at the wanted rate).

Results are ranked by cost per hour (ties: fewer GPUs, then lower p99 TTFT); `pareto` keeps the
configurations no other one beats on both cost and p99 latency. Evaluations are independent
and deterministic: 1 worker and N workers give the same rows in the same order.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Sequence

BISECTION_STEPS = 8  # rate search: the bracket [saturated / 64, 2 x saturated] narrowed 8 times (to 1.4%)
LOW_FRACTION = 1 / 64
MAX_ABOVE = 64  # the bracket's top doubles while the targets still hold, up to 64 x saturated


@dataclass(frozen=True, slots=True)
class Traffic:
    """What arrives: fixed prompt and output lengths, `count` requests, Poisson at `rate`/s."""

    rate: float
    prompt: int
    output: int
    count: int = 2000


@dataclass(frozen=True, slots=True)
class Targets:
    """p99 latency targets in seconds (None: no target)."""

    ttft_p99: float | None = None
    tpot_p99: float | None = None
    e2e_p99: float | None = None

    def met_by(self, result) -> bool:
        if result is None:  # a run stopped once it was certain to miss
            return False
        for target, stats in ((self.ttft_p99, result.ttft), (self.tpot_p99, result.tpot),
                              (self.e2e_p99, result.e2e)):
            if target is not None and (stats.p99 is None or stats.p99 > target):
                return False
        return True


@dataclass(frozen=True, slots=True, order=True)
class Config:
    gpu: str
    tp: int = 1
    kv_dtype: str = "auto"
    max_num_seqs: int | None = None  # None: vllm serve's default for the GPU

    @property
    def label(self) -> str:
        seqs = f" seqs {self.max_num_seqs}" if self.max_num_seqs else ""
        kv = f" kv {self.kv_dtype}" if self.kv_dtype != "auto" else ""
        return f"{self.gpu} x{self.tp}{kv}{seqs}"


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
    evaluations: int = 0  # serve simulations run

    @property
    def feasible(self) -> bool:
        return self.cost_per_hour is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["config"] = {**asdict(self.config), "label": self.config.label}
        d["feasible"] = self.feasible
        return d


def evaluate(model: str, traffic: Traffic, targets: Targets, config: Config,
             price: float | None) -> Evaluation:  # fmt: skip
    """One configuration: memory verdict, then the highest rate per replica within the targets."""
    from kvplan.errors import KvplanError
    from kvplan.experiments import flag_workload, load_text
    from kvplan.sim.engine import simulate

    try:
        text = flag_workload(model, config.gpu, config.tp, 1.0, str(traffic.prompt), str(traffic.output),
                             traffic.count, kv_dtype=config.kv_dtype, max_num_seqs=config.max_num_seqs)
        wl = load_text(text)
    except KvplanError as exc:
        return Evaluation(config, False, exc.message)
    from kvplan.sim.inputs import make_setup

    spec = wl.allocators[0]
    setup = make_setup(wl, spec)  # one clock for every rate: the step times do not depend on it
    base = wl.make_requests
    runs = 0

    doomed = _doomed(targets, traffic.count, setup.clock.ticks_per_unit)

    def at(rate: float | None):
        nonlocal runs
        runs += 1
        if rate is None:  # every request at once: the replica's saturated throughput
            make = lambda: (replace(c, arrival=c.arrival * 0.0) for c in base())  # noqa: E731
            return simulate(replace(wl, make_requests=make), spec, setup=setup)
        # the rate-1 Poisson draws scaled: the same requests, arriving 1 / rate as often, in small
        # chunks so that a run stops as soon as its verdict is certain (None: it misses)
        make = lambda: _small_chunks(replace(c, arrival=c.arrival / rate) for c in base())  # noqa: E731
        return simulate(replace(wl, make_requests=make), spec, setup=setup, stop=doomed)

    saturated = at(None).throughput_rps
    lo, hi = saturated * LOW_FRACTION, saturated
    best = at(lo)
    if not targets.met_by(best):
        return Evaluation(config, True, f"misses the targets even at {lo:.3g} requests/s", evaluations=runs,
                          usd_per_gpu_hour=price)
    best_rate = lo
    hi = saturated * 2  # a short run can outpace the all-at-once throughput: start above it
    top = at(hi)
    while targets.met_by(top) and hi < saturated * MAX_ABOVE:  # still within the targets: go higher
        lo, best, best_rate = hi, top, hi
        hi *= 2
        top = at(hi)
    if not targets.met_by(top):
        for _ in range(BISECTION_STEPS):
            mid = math.sqrt(lo * hi)
            result = at(mid)
            if targets.met_by(result):
                lo, best, best_rate = mid, result, mid
            else:
                hi = mid
    replicas = math.ceil(traffic.rate / best_rate)
    gpus = replicas * config.tp
    cost = cost_m = None
    if price is not None:
        cost = gpus * price
        cost_m = cost / (traffic.rate * traffic.output * 3600) * 1e6
    return Evaluation(config, True, None if price is not None else "no price for this GPU", best_rate, replicas,
                      gpus, price, cost, cost_m, best.ttft.p99, best.tpot.p99, best.e2e.p99, runs)


STOP_CHUNK = 256  # requests per chunk of a rate run: how often it may stop early


def _small_chunks(chunks):
    for c in chunks:
        for s in range(0, len(c), STOP_CHUNK):
            yield replace(c, arrival=c.arrival[s:s + STOP_CHUNK], prompt_len=c.prompt_len[s:s + STOP_CHUNK],
                          output_len=c.output_len[s:s + STOP_CHUNK],
                          hash_ids=None if c.hash_ids is None else c.hash_ids[s:s + STOP_CHUNK],
                          cut=None if c.cut is None else c.cut[s:s + STOP_CHUNK])


def _doomed(targets: Targets, count: int, per_unit: float):
    """A stop rule for a run of `count` requests: True once enough of them are certain to pass the
    TTFT or E2E target that the p99 must (numpy's p99 is at least the value of rank
    floor(0.99 x (count - 1)), so count - that rank values above a target put it above). A
    request counts once its first token (or its end) came later than the target after it reached
    the engine, or it is still waiting past that: the result measures from the client's send, no
    later, and adds the API server's latency, so the rule never stops a run that would pass."""
    from kvplan.sim import kernel as K

    need = count - math.floor(0.99 * (count - 1))
    limits = [(col, target * per_unit * (1 + 1e-9) + 1) for col, target in
              ((K.FIRST_TOKEN_AT, targets.ttft_p99), (K.FINISHED_AT, targets.e2e_p99)) if target is not None]
    if not limits:
        return None

    def stop(state) -> bool:
        req = state.req[:state.loaded]
        now, arrival = int(state.st[K.NOW]), req[:, K.ARRIVAL]
        for col, limit in limits:
            at = req[:, col]
            late = ((at >= 0) & (at - arrival > limit)) | ((at < 0) & (now - arrival > limit))
            if int(late.sum()) >= need:
                return True
        return False

    return stop


def _evaluate_args(args) -> Evaluation:
    return evaluate(*args)


def search(model: str, traffic: Traffic, targets: Targets, configs: Sequence[Config],
           prices: dict[str, float], *, workers: int = 1, ray: bool = False,
           progress: Callable[[int, int], None] | None = None) -> list[Evaluation]:
    """Every configuration evaluated (in a process pool when workers > 1, or on Ray), ranked."""
    jobs = [(model, traffic, targets, c, prices.get(c.gpu)) for c in configs]
    results: list[Evaluation] = []
    if ray:
        results = _on_ray(jobs, workers, progress)
    elif workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            results.append(_evaluate_args(job))
            if progress:
                progress(i + 1, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, result in enumerate(pool.map(_evaluate_args, jobs)):  # map keeps the order
                results.append(result)
                if progress:
                    progress(i + 1, len(jobs))
    return rank(results)


def _on_ray(jobs: list, workers: int, progress) -> list[Evaluation]:
    """The evaluations as Ray tasks: on the cluster at RAY_ADDRESS (or one already initialised),
    else on a local instance of `workers` CPUs. Results come back in the jobs' order."""
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
    task = ray.remote(_evaluate_args)
    pending = [task.remote(job) for job in jobs]
    results = []
    for i, ref in enumerate(pending):
        results.append(ray.get(ref))
        if progress:
            progress(i + 1, len(jobs))
    return results


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
