"""SGLang's measured runs (tests/data/step_time_measurements.yaml, engine: sglang) restated three
ways, median |error| of throughput, E2E, TTFT and ITL per regime and per source:
- vLLM's restatement (bench/timing_fidelity.py with values["_sglang"] off): vLLM's pool, limits
  and scheduler, the SGLang engine and server factors as shipped;
- SGLang's scheduler on vLLM's pool and max_num_seqs (values["_sglang_scheduler"]);
- SGLang as SGLang runs it (values["_sglang"]: timing_fidelity.sglang_setup): its own start-up
  pool (kvplan/model/sglang_memory.startup_memory at the run's release, GPU, TP and stated
  --mem-fraction-static), max_running_requests and chunked_prefill_size, --disable-radix-cache
  where stated, SGLang's scheduler (kvplan/sim/sglang.py); at the shipped factors, and with the
  SGLang engine and server factors (ENGINE_OVERHEAD_FACTOR / SERVER_FRONTEND_FACTOR['sglang'])
  refitted on the SGLang runs, every other constant as shipped: on all sources, and leave-one-
  source-out (each source's runs simulated with the two factors fitted on the other SGLang sources).
Runs SGLang's engine does not take (models with recurrent state layers) keep vLLM's restatement
in the SGLang columns; they are listed. Bursts are reported and never fitted.

--moe: is the SGLang MoE runs' bias SGLang's? Every engine's MoE runs of the corpus (bursts left
out), by engine and GPU vendor, the signed and absolute median error of throughput and ITL: as
shipped (SGLang's runs by vLLM's and by SGLang's own restatement) and with the step model's
narrow-expert penalty off (expert_half_width 0, kvplan/model/step_time.py), and with the fused-MoE
tile model instead of it (timing_fidelity.TILE_MODEL: the kernel's tiles against the GPU's compute
units). A bias that vLLM's MoE runs on the same vendor's GPUs share is the step model's, not SGLang's.
--moe --measured-hbm: the same, with the step model reading at the GPUs' measured achievable
bandwidth (timing_fidelity.MEASURED_HBM) instead of the two expert_half_width 0 columns, alone and
with the fused-MoE tile model on top of it (timing_fidelity.MEASURED_HBM_TILES).

Run: python bench/sglang_fidelity.py [--workers N] [--quick] [--moe [--measured-hbm]]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing_fidelity as T  # noqa: E402

FACTORS = ("engine:sglang", "server:sglang")


def moe_model(entry: dict) -> bool:
    """Whether the run's model routes tokens to experts."""
    from kvplan.model.weights import moe_shape

    spec, _ = T._spec_and_quant(entry["model"], entry.get("quantization"))
    return spec is not None and bool(moe_shape(spec)[0])


def gpu_vendor(entry: dict) -> str | None:
    """The vendor of the run's GPU in kvplan's catalog (NVIDIA, AMD), None where it is not there."""
    from kvplan.model.gpus import get_gpu

    name = T._gpu(entry["gpu"])
    return get_gpu(name).vendor if name else None


def bias(rows: list[tuple[str, str, dict]], metrics=("throughput", "itl")) -> dict:
    """{(engine, vendor): {metric: (runs, signed median error, median |error|)}} of rows
    (engine, vendor, {metric: predicted / measured - 1}); a metric no row of a group has is left out."""
    from statistics import median

    groups: dict = {}
    for engine, vendor, errs in rows:
        groups.setdefault((engine, vendor), []).append(errs)
    out = {}
    for key in sorted(groups):
        cells = {}
        for m in metrics:
            v = [e[m] for e in groups[key] if m in e]
            if v:
                cells[m] = (len(v), median(v), median(abs(x) for x in v))
        out[key] = cells
    return out


def moe_report(workers: int, measured_hbm: bool = False) -> None:
    """--moe: the MoE runs' bias by engine and GPU vendor, shipped, with expert_half_width 0 and with
    the fused-MoE tile model (--measured-hbm: at the measured bandwidth instead of expert_half_width 0,
    alone and with the tile model)."""
    from kvplan.calibrate.fit import errors, run_cases

    cases = [c for c in T.cases([e for e in T.load_entries() if moe_model(e)]) if c.fitted]
    values = T.shipped_values()
    columns = {"shipped": {**values, "_sglang": False}, "shipped, SGLang's own": {**values, "_sglang": True},
               "expert_half_width 0": {**values, "_sglang": False, "expert_half_width": 0.0},
               "expert_half_width 0, SGLang's own": {**values, "_sglang": True, "expert_half_width": 0.0},
               "fused-MoE tiles": {**values, "_sglang": False, **T.TILE_MODEL},
               "fused-MoE tiles, SGLang's own": {**values, "_sglang": True, **T.TILE_MODEL}}
    if measured_hbm:
        for name in ("expert_half_width 0", "expert_half_width 0, SGLang's own",
                     "fused-MoE tiles", "fused-MoE tiles, SGLang's own"):
            del columns[name]
        columns.update({"measured HBM": {**values, "_sglang": False, **T.MEASURED_HBM},
                        "measured HBM, SGLang's own": {**values, "_sglang": True, **T.MEASURED_HBM},
                        "measured HBM + tiles": {**values, "_sglang": False, **T.MEASURED_HBM_TILES},
                        "measured HBM + tiles, SGLang's own": {**values, "_sglang": True, **T.MEASURED_HBM_TILES}})
    tables = {name: bias([(T.runtime(c.arg), gpu_vendor(c.arg), e)
                          for c, e in zip(cases, errors(run_cases(cases, v, workers)))])
              for name, v in columns.items()}
    print(f"MoE runs (bursts left out), signed median error / median |error| (runs): {len(cases)} runs")
    keys = sorted({k for t in tables.values() for k in t})
    print(f"{'engine, vendor':32} " + " | ".join(f"{n[:33]:33}" for n in tables))
    for key in keys:
        for m in ("throughput", "itl"):
            if not any(m in t.get(key, {}) for t in tables.values()):
                continue
            cells = []
            for t in tables.values():
                n, signed, absolute = t.get(key, {}).get(m, (0, float("nan"), float("nan")))
                cells.append(f"{m[:4]} {signed:+7.1%} / {absolute:6.1%} ({n:2})" if n else f"{m[:4]} -")
            print(f"{key[0] + ', ' + str(key[1]):32} " + " | ".join(f"{c:33}" for c in cells))


def main() -> None:
    import argparse
    import json

    from kvplan.calibrate.fit import Param, errors, fit, leave_one_group_out, linearize, run_cases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="no refit: the shipped factors only")
    ap.add_argument("--moe", action="store_true", help="only the MoE runs' bias by engine and GPU vendor")
    ap.add_argument("--measured-hbm", action="store_true",
                    help="with --moe: at the GPUs' measured achievable bandwidth (timing_fidelity.MEASURED_HBM)")
    args = ap.parse_args()
    if args.moe:
        moe_report(args.workers, args.measured_hbm)
        return
    entries = [e for e in T.load_entries() if T.runtime(e) == "sglang"]
    cases = T.cases(entries)
    values = T.shipped_values()
    own = {**values, "_sglang": True}
    columns = {"vLLM's restatement": errors(run_cases(cases, {**values, "_sglang": False}, args.workers)),
               "SGLang sched, vLLM pool": errors(run_cases(cases, {**values, "_sglang": False,
                                                                   "_sglang_scheduler": True}, args.workers)),
               "SGLang's own, shipped": errors(run_cases(cases, own, args.workers))}
    if not args.quick:
        prm = [Param(name, low, high, values[name]) for name, low, high in T.FACTOR_PARAMS if name in FACTORS]
        progress = lambda msg: print("  ..", msg, flush=True)  # noqa: E731
        fitted, _, _ = fit(cases, prm, own, iterations=3, workers=args.workers, progress=progress)
        print("refitted on the SGLang runs:", json.dumps({k: round(fitted[k], 4) for k in FACTORS}))
        rows = linearize(cases, prm, fitted, args.workers, progress)
        columns["SGLang's own, leave-one-source-out"] = leave_one_group_out(cases, prm, fitted, rows, args.workers)
        columns["SGLang's own, refit on all"] = errors(run_cases(cases, fitted, args.workers))
    own_runs = {c.id for c in cases if T.sglang_restated(c.arg)}
    for c, *errs in zip(cases, *columns.values()):
        cells = "  ".join(f"{k} {errs[0].get(k, float('nan')):+.0%} -> {errs[-1].get(k, float('nan')):+.0%}"
                          for k in errs[0])
        print(f"{c.id[:46]:46} {c.regime[:15]:15} {'own ' if c.id in own_runs else 'vllm'} {cells}")
    picks = {"all but bursts": [c.fitted for c in cases], "all": [True] * len(cases),
             "restated by SGLang's rules": [c.fitted and c.id in own_runs for c in cases]}
    by_regime = {r: [c.regime == r for c in cases] for r in T.REGIMES}
    by_source = {g: [c.group == g for c in cases] for g in sorted({c.group for c in cases})}
    moe = {c.id: moe_model(c.arg) for c in cases}
    by_kind = {f"{r} {kind}": [c.regime == r and c.id in own_runs and moe[c.id] == (kind == "MoE") for c in cases]
               for r in T.REGIMES for kind in ("dense", "MoE")}
    by_kind = {k: v for k, v in by_kind.items() if any(v)}
    for title, pick in (("\nmedian |error| overall", picks), ("\nper regime", by_regime), ("\nper source", by_source),
                        ("\nper regime, dense and MoE models, the runs restated by SGLang's rules", by_kind)):
        for line in T.table(title, dict(list(columns.items())[:3]), pick):
            print(line)
        if len(columns) > 3:
            for line in T.table("", dict(list(columns.items())[3:]), pick)[1:]:
                print(line)
    left = [c.id for c in cases if c.id not in own_runs]
    print(f"\n{len(cases)} SGLang runs of {len(entries)} measurements; {len(own_runs)} restated by SGLang's rules, "
          f"the rest by vLLM's (SGLang's engine does not take models with recurrent state layers): "
          f"{', '.join(left) or 'none'}")


if __name__ == "__main__":
    main()
