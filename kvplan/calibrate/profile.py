"""`kvplan calibrate` as one library call: the runs of the result files as cases, the fit, the
leave-one-run-out error, and the timing profile's text."""

from __future__ import annotations

from kvplan.calibrate.bench_files import Server, predict_run, read_runs, run_spec
from kvplan.calibrate.fit import (Case, Param, errors, fit, leave_one_group_out, linearize, medians, objective_of,
                                  run_cases)
from kvplan.errors import UsageError


def calibrate_runs(server: Server, paths: list[str], names: list[str], workers: int = 1) -> tuple[dict, str]:
    """(the report, the profile's YAML text) of a fit of `names` on the runs of `paths`."""
    import yaml

    from kvplan.model.step_time import CONSTANTS, PHYSICAL_RANGES
    from kvplan.model.timing_profile import profile_document

    unknown = [n for n in names if n not in PHYSICAL_RANGES]
    if unknown or not names:
        raise UsageError(f"expected constants among {', '.join(PHYSICAL_RANGES)}, got {', '.join(unknown) or 'none'}",
                         field="--fit")
    runs = [run for path in paths for run in read_runs(path)]
    cases = [Case(run.name, f"{run.path}:{run.line}", "", predict_run,
                  (run_spec(server, run), run, server.async_scheduling)) for run in runs]
    params = [Param(n, *PHYSICAL_RANGES[n], getattr(CONSTANTS, n)) for n in names]
    shipped = CONSTANTS.to_dict()
    before = errors(run_cases(cases, shipped, workers))
    for case, got in zip(cases, before):
        if not got:
            raise UsageError(f"{case.id}: kvplan cannot restate this run with the shipped constants (the model on "
                             f"{server.gpu} x{server.tp}, or the file's lengths and counts)", field="results")
    values, _, score = fit(cases, params, shipped, iterations=3, workers=workers)
    after = errors(run_cases(cases, values, workers))
    held = None
    if len(cases) > 1:  # the linear model at the point the fit ended, where each run is left out
        held = leave_one_group_out(cases, params, values, linearize(cases, params, values, workers), workers)
    summary = lambda errs: {m: round(v, 4) for m, (v, _) in medians(errs).items()}  # noqa: E731
    doc = {
        "model": server.model, "gpu": server.gpu, "tp": server.tp, "runs": [c.id for c in cases],
        "fitted": {n: values[n] for n in names},
        "shipped": {n: shipped[n] for n in names},
        "ranges": {n: list(PHYSICAL_RANGES[n]) for n in names},
        "error_shipped": summary(before), "error_fitted": summary(after),
        "error_leave_one_run_out": summary(held) if held else None,
        "objective": {"shipped": objective_of(before), "fitted": score},
        "per_run": [{"run": c.id, "shipped": b, "fitted": a, **({"left_out": h} if held else {})}
                    for c, b, a, h in zip(cases, before, after, held or [None] * len(cases))],
    }
    description = (f"kvplan calibrate: {server.model} on {server.gpu} x{server.tp}, {len(cases)} run(s) of "
                   f"vllm bench serve")
    text = yaml.safe_dump(profile_document(values, description, doc["error_leave_one_run_out"],
                                           [c.id for c in cases], tuple(names), server.async_scheduling),
                          sort_keys=False)
    return doc, text
