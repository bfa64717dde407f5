"""`kvplan plan`: the cheapest deployment that serves a traffic within latency targets, and holds.

For each configuration of the search space (GPU, tensor-parallel degree, KV dtype, max_num_seqs,
max_num_batched_tokens, block size, prefix caching, weights, and the serving engine: vLLM, or
SGLang on the pool it starts with, max_num_seqs and max_num_batched_tokens then being its
max_running_requests and chunked_prefill_size: kvplan/plan/space.Config):
1. memory first: `kvplan size`'s start-up verdict (`--engine sglang`'s for SGLang); a configuration
   its engine would not start is out;
2. closed-form bounds (kvplan/plan/bounds.py): floors under its p99s at any load and a ceiling over
   the rate one replica sustains. A floor above a target rules it out with the reason in words;
   the ceiling bounds its cost from below, which orders the search and prunes it (below);
3. its capacity (kvplan/plan/evaluate.py): the highest rate one replica serves within the targets on all
   `count` requests (kvplan/plan/edge.py), never above the rate at which it drains a standing
   backlog (evaluate.py: `Replica.drain_rate`): a rate above that grows the queue without bound however short
   a run hides it;
4. the plan: replicas = ceil(rate / (capacity x (1 - headroom))), each at the planned load
   rate / replicas, re-simulated on fresh seeds (`seeds`, requests the search never saw); while one
   misses a target, one more replica. The p99s reported are the worst of those runs, at the load
   each replica will carry, not at the edge;
5. the rental (kvplan/plan/prices.py): the cheapest offer of the tiers searched that rents the
   replicas in whole instances; $/hour, and $ per million tokens (input + output, and output alone).

With `--gpus` or `--budget` and a rate: the deployments within the limit, the lowest p99 E2E first,
each with as many replicas as the limit allows. Without a rate: the most traffic within the limit.

The search is best-first: configurations go in waves of WAVE groups in the order of the bound of
their objective (cost from below; for the most traffic, the traffic from above); after each wave
a configuration is left out (`bounded`) when a simulated answer is at least as good on the
objective, on cost and on p99 TTFT as its bounds allow it to be: it can be neither the answer nor
on the cost/latency frontier. Waves are fixed by the bounds and the results, never by timing, and
the configurations that differ only in max_num_seqs are evaluated together in one worker, sharing
their identical runs: 1 worker, N workers and Ray give the same rows in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from kvplan.plan.edge import Runs
from kvplan.plan.evaluate import bounds_of, evaluate, filled_replicas, most_replicas, priced, verify
from kvplan.plan.rows import Evaluation, Rules, Targets, attainment, beaten, pareto, rank
from kvplan.plan.space import Config, Traffic
from kvplan.plan.workers import Workers, run_jobs

__all__ = ["Config", "Evaluation", "Rules", "SearchStats", "Targets", "Traffic", "attainment", "bounds_of",
           "evaluate", "filled_replicas", "most_replicas", "pareto", "priced", "rank", "run_jobs", "search", "verify"]

WAVE = 8  # groups per wave of the best-first search
VERIFY_TOP = 5  # the best rows re-simulated on the fresh seeds, besides every row of the frontier
VERIFY_AHEAD = 3  # and, in the first round, the next ones (a row that gains replicas makes room)


def _evaluate_group(args) -> list[Evaluation]:
    """The configurations of one group (their bound rows), in turn, sharing their runs."""
    model, traffic, targets, pres, book, rules, found = args
    runs = Runs()
    return [evaluate(model, traffic, targets, p.config, book, rules, runs, p, found) for p in pres]


def _bound_group(args) -> list[Evaluation]:
    model, traffic, targets, configs, book, rules = args
    return [bounds_of(model, traffic, targets, c, book, rules) for c in configs]


def _score(e: Evaluation, objective: str, bound: bool):
    """What the search minimises: cost per hour; p99 E2E (latency); minus the requests/s (traffic).
    `bound`: the best the bounds allow."""
    if objective == "traffic":
        return -(e.bound_served if bound else e.served)
    if objective == "latency":
        return e.bound_cost if bound else e.e2e_p99  # the cost bounds the order; the E2E is ranked
    return e.bound_cost if bound else e.cost_per_hour


def groups_of(model: str, traffic: Traffic, targets: Targets, configs: Sequence[Config], book,
              rules: Rules) -> list[tuple]:
    """The jobs: one per group of configurations (in the order each group first appears)."""
    order: dict[tuple, list[Config]] = {}
    for c in configs:
        order.setdefault(c.group, []).append(c)
    return [(model, traffic, targets, tuple(cs), book, rules) for cs in order.values()]


@dataclass
class SearchStats:
    """What each step of the search settled (for the closing words and bench/plan.py)."""

    configurations: int = 0
    not_started: int = 0  # memory: vLLM would not start it
    ruled_out: int = 0  # a floor above a target, or the limit, without a run
    bounded: int = 0  # beaten by a simulated answer before its own run
    simulated: int = 0
    verified: int = 0  # rows re-simulated on the fresh seeds
    runs: int = 0
    reused: int = 0
    waves: int = 0


def search(model: str, traffic: Traffic, targets: Targets, configs: Sequence[Config], book,
           rules: Rules = Rules(), *, workers: int = 1, ray: bool = False,
           progress: Callable[[int, int], None] | None = None, stats: SearchStats | None = None) -> list[Evaluation]:
    """Every configuration settled (bounds for all, then best-first waves of runs), ranked. The rows
    do not depend on the workers: each group runs in one worker, in the same order, and a wave is
    fixed before it starts. No call has more jobs than there are configurations: the pool is no larger."""
    with Workers(workers, ray, tasks=len(configs)) as pool:
        return _search(model, traffic, targets, configs, book, rules, pool, progress,
                       stats if stats is not None else SearchStats())


def _search(model, traffic, targets, configs, book, rules, pool: Workers, progress, stats) -> list[Evaluation]:
    objective = rules.objective(traffic)
    jobs = groups_of(model, traffic, targets, configs, book, rules)
    bounded: list[list[Evaluation]] = list(pool.map(_bound_group, jobs))
    done: dict[Config, Evaluation] = {}
    open_: list[tuple[int, Evaluation]] = []  # (group, its bound row) still to settle
    for g, rows in enumerate(bounded):
        for e in rows:
            if not e.fits or e.reason is not None:
                done[e.config] = e
                stats.not_started += not e.fits
                stats.ruled_out += e.fits
            else:
                open_.append((g, e))
    stats.configurations = len(configs)

    def order(item):
        g, e = item
        s = _score(e, objective, bound=True)
        return (s is None, s if s is not None else 0.0, g)

    reported = 0
    while open_:
        found = [e for e in done.values() if e.feasible]
        keep = []
        for g, e in open_:
            by = beaten(e, found, objective, rules.frontier_span)
            if by is None:
                keep.append((g, e))
            else:
                stats.bounded += 1
                done[e.config] = replace(e, reason=by[1], left_out="bounded")
        open_ = sorted(keep, key=order)
        if not open_:
            break
        wave_groups: list[int] = []
        for g, _ in open_:
            if g not in wave_groups:
                wave_groups.append(g)
            if len(wave_groups) == WAVE:
                break
        position = {c: i for i, c in enumerate(configs)}
        todo = {g: sorted((e for gg, e in open_ if gg == g), key=lambda e: position[e.config]) for g in wave_groups}
        wave_jobs = [(model, traffic, targets, tuple(todo[g]), book, rules, tuple(found)) for g in wave_groups]
        for rows in pool.map(_evaluate_group, wave_jobs):
            for e in rows:
                done[e.config] = e
                stats.simulated += 1
                stats.runs += e.evaluations
                stats.reused += e.reused
        stats.waves += 1
        open_ = [(g, e) for g, e in open_ if g not in todo]
        if progress:
            reported = len(done)
            progress(reported, len(configs))
    if progress and reported != len(done):
        progress(len(done), len(configs))
    rows = rank([done[c] for c in configs], objective)
    return _verified(model, traffic, targets, rows, book, rules, objective, pool, stats)


def _verify_job(args) -> Evaluation:
    return verify(*args)


def _verified(model, traffic, targets, rows, book, rules, objective, pool: Workers, stats) -> list[Evaluation]:
    """The rows re-ranked until the VERIFY_TOP best and the frontier are all checked on the fresh
    seeds (a row that gains replicas may fall in the ranking, and another take its place)."""
    if not rules.seeds:
        return rows
    checked: set[Config] = set()
    ahead = VERIFY_AHEAD  # the first round also takes the rows likeliest to rise into the top
    while True:
        shown = {e.config for e in [e for e in rows if e.feasible][:VERIFY_TOP + ahead] + pareto(rows)}
        todo = [i for i, e in enumerate(rows) if e.config in shown and e.config not in checked]
        ahead = 0
        if not todo:
            return rows
        checked.update(rows[i].config for i in todo)
        jobs = [(model, traffic, targets, rows[i], book, rules) for i in todo]
        for i, row in zip(todo, pool.map(_verify_job, jobs)):
            stats.runs += row.evaluations - rows[i].evaluations
            stats.reused += row.reused - rows[i].reused
            stats.verified += 1
            rows[i] = row if row.feasible or row.seeds else replace(row, seeds=tuple(rules.seeds))
        rows = rank(rows, objective)
