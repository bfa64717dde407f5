"""SGLang's measured runs (tests/data/step_time_measurements.yaml, engine: sglang) simulated with
vLLM's scheduler (what bench/timing_fidelity.py does) and with SGLang's (kvplan/sim/sglang.py):
median |error| of throughput, E2E, TTFT and ITL per regime and per source, at the shipped
constants (nothing refitted), on the runs both can take (the SGLang engine refuses models with
sliding-window or state layers; those are listed).

Run: python bench/sglang_fidelity.py [--workers N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import timing_fidelity as T  # noqa: E402


def main() -> None:
    import argparse

    from kvplan.calibrate.fit import errors, run_cases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    entries = [e for e in T.load_entries() if T.runtime(e) == "sglang"]
    cases = T.cases(entries)
    values = T.shipped_values()
    columns = {"vLLM's scheduler": errors(run_cases(cases, values, args.workers)),
               "SGLang's scheduler": errors(run_cases(cases, {**values, "_sglang_scheduler": True}, args.workers))}
    both = [bool(a) and bool(b) for a, b in zip(*columns.values())]  # compared on the runs both engines ran
    skipped = [c.id for c, ok in zip(cases, both) if not ok]
    columns = {name: [e if ok else {} for e, ok in zip(errs, both)] for name, errs in columns.items()}
    for c, a, b in zip(cases, *columns.values()):
        cells = "  ".join(f"{k} {a.get(k, float('nan')):+.0%} -> {b.get(k, float('nan')):+.0%}" for k in a)
        print(f"{c.id[:46]:46} {c.regime[:15]:15} {cells}")
    picks = {"all but bursts": [c.fitted for c in cases], "all": [True] * len(cases)}
    by_regime = {r: [c.regime == r for c in cases] for r in T.REGIMES}
    by_source = {g: [c.group == g for c in cases] for g in sorted({c.group for c in cases})}
    for line in (T.table("\nmedian |error| overall", columns, picks) + T.table("\nper regime", columns, by_regime)
                 + T.table("\nper source", columns, by_source)):
        print(line)
    print(f"\n{len(cases)} SGLang runs of {len(entries)} measurements, {sum(both)} compared; left out (the SGLang "
          f"engine does not take models with windowed or state layers): {', '.join(skipped) or 'none'}")


if __name__ == "__main__":
    main()
