"""Fitting the step-time constants to measured runs, and leave-one-group-out validation.

A *case* is one measured run: a function from constants to {metric: (predicted, measured)}, run
by kvplan's serve engine, with the group it comes from (a source of the published corpus, or one
file of a user's own benchmark results). The objective is the mean over metrics (throughput, E2E,
TTFT, ITL) of the median |log(predicted / measured)|: every metric counts alike, and one wild case
moves a median little.

Each engine run takes a fraction of a second, and a fit needs hundreds of evaluations of the whole
set, so the fit works on a local linear model of the engine (Gauss-Newton in spirit): around a
point u0 (each constant in its own coordinate: the log of a constant whose range is positive, the
constant itself where the range starts at 0), one engine run per constant gives how every case's
log prediction moves (J, by one-sided differences), and

    log predicted(u) ~ log predicted(u0) + J (u - u0)

is minimized cheaply (coordinate descent, each constant within its physical range and within a
trust region around u0). The point is moved there and the model taken again, a few times. A
leave-one-group-out fit minimizes the same linear model on every row but the group's, and the
group's runs are then simulated for real with those constants: the error reported for a group
never saw that group (its constants did not, and nor did the step it was simulated with). What the
held-out group does share is the point u0 the linear model was taken at, fitted on everything; the
trust region keeps each fit near it, and that is said where the numbers are printed.

A constant that no training row moves (an engine factor only the held-out group uses) goes back to
its prior, not to the point the whole set chose: nothing the held-out group wanted leaks through it.
"""

from __future__ import annotations

import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Callable, Sequence

import numpy as np

from kvplan.cpus import pool_size

METRICS = ("throughput", "e2e", "ttft", "itl")
TRUST = math.log(2.0)  # the most a log-constant moves from u0 in one linear step
STEP_LOG = math.log(1.15)  # the difference step of a log-constant
STEP_LINEAR = 0.05  # the difference step of a linear constant, as a share of its range
BACKTRACKS = 2  # halvings of a move the engine finds worse than the linear model said


@dataclass(frozen=True, slots=True)
class Param:
    """One fitted constant: its name, its physical range and its prior (the value it takes when
    no run informs it)."""

    name: str
    low: float
    high: float
    prior: float

    @property
    def log(self) -> bool:
        return self.low > 0

    def to_u(self, value: float) -> float:
        value = min(max(value, self.low), self.high)
        return math.log(value) if self.log else value

    def from_u(self, u: float) -> float:
        value = math.exp(u) if self.log else u
        return min(max(value, self.low), self.high)

    @property
    def u_bounds(self) -> tuple[float, float]:
        return (math.log(self.low), math.log(self.high)) if self.log else (self.low, self.high)

    @property
    def du(self) -> float:
        return STEP_LOG if self.log else STEP_LINEAR * (self.high - self.low)


@dataclass(slots=True)
class Case:
    """One measured run: its id, its group, its regime, and how to predict it (picklable: a
    module-level function and its argument)."""

    id: str
    group: str
    regime: str
    predict: Callable  # predict(arg, values: dict[str, float]) -> {metric: (predicted, measured)}
    arg: object
    fitted: bool = True  # False: reported, never fitted on (e.g. all-at-once bursts)


@dataclass(slots=True)
class Rows:
    """The (case, metric) rows a linear model is taken over."""

    case: list[int] = field(default_factory=list)
    metric: list[str] = field(default_factory=list)
    measured: np.ndarray = field(default_factory=lambda: np.zeros(0))
    y0: np.ndarray = field(default_factory=lambda: np.zeros(0))  # log predicted at u0
    jac: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # d log predicted / d u


def _run(job):
    predict, arg, values = job
    try:
        return predict(arg, values)
    except Exception:  # a case the engine cannot run at these constants counts as missing
        return None


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(workers: int) -> ProcessPoolExecutor:
    """One pool of `workers` processes for the whole fit: a process keeps what it resolved and
    compiled (models, step tables, the engine's kernel) from one evaluation to the next."""
    if workers not in _POOLS:
        _POOLS[workers] = ProcessPoolExecutor(workers, mp_context=get_context("fork"))
    return _POOLS[workers]


def run_cases(cases: Sequence[Case], values: dict, workers: int = 1) -> list[dict | None]:
    """Every case's predictions at `values` (in parallel over `workers` processes)."""
    jobs = [(c.predict, c.arg, values) for c in cases]
    workers = pool_size(workers, len(jobs))
    if workers <= 1 or len(jobs) < 4:
        return [_run(j) for j in jobs]
    return list(_pool(workers).map(_run, jobs, chunksize=max(1, len(jobs) // (8 * workers))))


def errors(results: Sequence[dict | None]) -> list[dict]:
    """{metric: predicted / measured - 1} of each case (empty where it could not be run)."""
    return [{m: p / q - 1 for m, (p, q) in (r or {}).items() if p > 0 and q > 0} for r in results]


def objective_of(errs: Sequence[dict]) -> float:
    """Mean over metrics of the median |log(predicted / measured)|."""
    meds = []
    for m in METRICS:
        v = [abs(math.log1p(e[m])) for e in errs if m in e]
        if v:
            meds.append(statistics.median(v))
    return sum(meds) / len(meds) if meds else float("inf")


def linearize(cases: Sequence[Case], params: Sequence[Param], values: dict, workers: int = 1,
              progress: Callable[[str], None] | None = None) -> Rows:
    """The linear model of every case's log predictions around `values`: one run of all the cases
    there, and one more per parameter moved by its difference step."""
    base = run_cases(cases, values, workers)
    rows = Rows()
    for i, r in enumerate(base):
        for m, (p, q) in (r or {}).items():
            if p > 0 and q > 0:
                rows.case.append(i)
                rows.metric.append(m)
    rows.measured = np.array([base[i][m][1] for i, m in zip(rows.case, rows.metric)], dtype=float)
    rows.y0 = np.log([base[i][m][0] for i, m in zip(rows.case, rows.metric)])
    rows.jac = np.zeros((len(rows.case), len(params)))
    for k, p in enumerate(params):
        u = p.to_u(values[p.name])
        lo, hi = p.u_bounds
        du = p.du if u + p.du <= hi else -p.du  # step inside the range
        moved = dict(values, **{p.name: p.from_u(u + du)})
        actual = p.to_u(moved[p.name]) - u
        if progress:
            progress(f"linearize {p.name} ({k + 1}/{len(params)})")
        if actual == 0:
            continue
        got = run_cases(cases, moved, workers)
        for row, (i, m) in enumerate(zip(rows.case, rows.metric)):
            r = got[i]
            if r and m in r and r[m][0] > 0:
                rows.jac[row, k] = (math.log(r[m][0]) - rows.y0[row]) / actual
    return rows


def surrogate_objective(rows: Rows, mask: np.ndarray, du: np.ndarray) -> float:
    """The objective of the linear model at u0 + du over the rows in `mask`."""
    resid = np.abs(rows.y0[mask] + rows.jac[mask] @ du - np.log(rows.measured[mask]))
    metric = np.asarray(rows.metric)[mask]
    meds = [float(np.median(resid[metric == m])) for m in METRICS if np.any(metric == m)]
    return sum(meds) / len(meds) if meds else float("inf")


def minimize(rows: Rows, mask: np.ndarray, params: Sequence[Param], values: dict,
             trust: float = TRUST) -> tuple[dict, float]:
    """The constants minimizing the linear model over the rows in `mask`: coordinate descent on
    shrinking steps, each constant inside its range and the trust region around `values`. A
    constant that moves none of these rows takes its prior."""
    u0 = np.array([p.to_u(values[p.name]) for p in params])
    width = np.array([trust if p.log else trust / TRUST * 0.25 * (p.high - p.low) for p in params])
    lo = np.maximum([p.u_bounds[0] for p in params], u0 - width) - u0
    hi = np.minimum([p.u_bounds[1] for p in params], u0 + width) - u0
    informed = np.abs(rows.jac[mask]).sum(axis=0) > 0 if mask.any() else np.zeros(len(params), bool)
    du = np.zeros(len(params))
    best = surrogate_objective(rows, mask, du)
    for step in (0.5, 0.25, 0.12, 0.06, 0.03, 0.015):
        improved = True
        while improved:
            improved = False
            for k in range(len(params)):
                if not informed[k]:
                    continue
                span = hi[k] - lo[k]
                for sign in (1, -1):
                    trial = du.copy()
                    trial[k] = min(max(du[k] + sign * step * span, lo[k]), hi[k])
                    if trial[k] == du[k]:
                        continue
                    s = surrogate_objective(rows, mask, trial)
                    if s < best - 1e-9:
                        du, best, improved = trial, s, True
    out = {p.name: (p.from_u(u0[k] + du[k]) if informed[k] else p.prior) for k, p in enumerate(params)}
    return out, best


def fit(cases: Sequence[Case], params: Sequence[Param], values: dict, iterations: int = 2, workers: int = 1,
        progress: Callable[[str], None] | None = None) -> tuple[dict, Rows, float]:
    """Fit `params` on the fitted cases, starting from `values`: linearize, minimize, move, a few
    times; each move is kept only when the engine itself (not the linear model) agrees it is
    better (else half of it is tried, BACKTRACKS times). Returns the constants, the last linear model and the objective the engine measured."""
    fitted = [c.fitted for c in cases]
    current = dict(values)
    score = objective_of([e for e, f in zip(errors(run_cases(cases, current, workers)), fitted) if f])
    rows = Rows()
    for it in range(iterations):
        rows = linearize(cases, params, current, workers, progress)
        mask = np.array([fitted[i] for i in rows.case], dtype=bool)
        proposal, _ = minimize(rows, mask, params, current)
        proposal = {**current, **{p.name: proposal[p.name] for p in params
                                  if np.abs(rows.jac[mask][:, params.index(p)]).sum() > 0}}
        for _ in range(BACKTRACKS + 1):  # the linear model overshot: try half the move, twice
            trial = objective_of([e for e, f in zip(errors(run_cases(cases, proposal, workers)), fitted) if f])
            if progress:
                progress(f"iteration {it + 1}: objective {score:.4f} -> {trial:.4f}")
            if trial < score - 1e-6:
                break
            proposal = _halfway(params, current, proposal)
        if trial >= score - 1e-6:
            break
        current, score = proposal, trial
    return current, rows, score


def _halfway(params: Sequence[Param], a: dict, b: dict) -> dict:
    """The point halfway from `a` to `b`, each parameter in its own coordinate."""
    return {**a, **{p.name: p.from_u((p.to_u(a[p.name]) + p.to_u(b[p.name])) / 2) for p in params}}


def leave_one_group_out(cases: Sequence[Case], params: Sequence[Param], values: dict, rows: Rows,
                        workers: int = 1) -> list[dict]:
    """Each group's errors predicted with constants fitted on every other group (the linear model
    `rows`, taken at `values`): {metric: error} per case, in the order of `cases`."""
    fitted = np.array([cases[i].fitted for i in rows.case], dtype=bool)
    groups = np.array([cases[i].group for i in rows.case])
    out: list[dict] = [{} for _ in cases]
    for group in sorted({c.group for c in cases}):
        members = [i for i, c in enumerate(cases) if c.group == group]
        held, _ = minimize(rows, fitted & (groups != group), params, values)
        held = {**values, **held}
        for i, e in zip(members, errors(run_cases([cases[i] for i in members], held, workers))):
            out[i] = e
    return out


def medians(errs: Sequence[dict], picks: Sequence[bool] | None = None) -> dict[str, tuple[float, int]]:
    """{metric: (median |error|, cases)} over the picked cases."""
    out = {}
    for m in METRICS:
        v = [abs(e[m]) for j, e in enumerate(errs) if m in e and (picks is None or picks[j])]
        if v:
            out[m] = (statistics.median(v), len(v))
    return out
