"""kvplan's serve engine against 720 measured runs of vLLM and SGLang that no constant was fitted to.

Reads tests/data/aiconfigurator_silicon_rows.yaml: every row of aiconfigurator's silicon_sample.csv
that kvplan can restate as one serve engine, less the 21 the step-time corpus holds (the file's
header states the selection rule). Each row is restated as bench/timing_fidelity.py restates that
corpus's rows of the same file (predictions(): a closed loop of the row's concurrency, fixed
lengths, 500 prompts, the mean; vLLM's runs by vLLM's rules, SGLang's as `--engine sglang` serves
them), with two rules of the file's own:
- precision fp8: the checkpoint is FP8 (a bf16 catalog model takes vLLM's online fp8) and so is the
  KV cache, as aiconfigurator deploys an FP8 checkpoint (tests/data/parallel_measurements.yaml's
  header cites the SDK and the generator);
- precision fp4 (gpt-oss-120b only): the model's own MXFP4 weights.

Prints the median |error| and the signed median of TPOT and TTFT per engine, per engine and GPU,
per engine and model, and per band of concurrency. The CSV states neither the client nor the
server's flags; TTFT there is the whole deployment's (its frontend included), TPOT the engine's.

`--set NAME=VALUE` predicts with a candidate's step-time constants or engine and server factors
(bench/timing_fidelity.py's names) instead of the shipped ones, e.g. the fused-MoE tile model
(`--set expert_half_width=0 --set expert_tiles_per_unit=1.94`).

Run: python bench/silicon_rows.py [--workers N] [--set NAME=VALUE ...]
"""

from __future__ import annotations

import csv
import io
import re
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
ROWS = ROOT / "tests" / "data" / "aiconfigurator_silicon_rows.yaml"
SOURCE = ("https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/"
          "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv")
GPUS = {"h100_sxm": "H100 SXM", "h200_sxm": "H200", "b200_sxm": "B200"}  # as timing_fidelity reads a GPU
BANDS = ((1, 8), (9, 64), (65, 100000))
# --set NAME=VALUE: constants and factors to predict with instead of the shipped ones (a candidate)
SETS: dict[str, float] = {}


def _use_sets(values: dict[str, float]) -> None:
    """A worker's initializer: this module's SETS become the parent's (a bound SETS.update would
    update a pickled copy in a spawned worker)."""
    SETS.update(values)


def load() -> list[dict]:
    """The rows as {column: value}, with `line` (the CSV's line) and `concurrency`."""
    doc = yaml.safe_load(ROWS.read_text(encoding="utf-8"))
    out = []
    for item in doc["rows"]:
        row = dict(zip(doc["columns"], next(csv.reader(io.StringIO(item["row"])))))
        stated = re.search(r"silicon_concurrency=(\d+)", row["silicon_data_source"])
        row.update(line=item["line"], raw=item["row"],
                   concurrency=int(stated[1]) if stated else int(row["batch_size"]))
        out.append(row)
    return out


def entry(row: dict) -> dict:
    """One row as a bench/timing_fidelity.py measurement (its schema)."""
    from timing_fidelity import closed_loop_entry

    return closed_loop_entry(f"silicon-L{row['line']}", f"{SOURCE}#L{row['line']}", row["raw"], row["backend"],
                             row["backend_version"] or None, row["model_path"], GPUS[row["system"]],
                             int(row["tp_size"]), int(row["isl"]), int(row["osl"]), row["concurrency"],
                             float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"]),
                             fp8=row["precision"] == "fp8")


def predict(row: dict) -> dict | None:
    """{"tpot": predicted / measured - 1, "ttft": ...} of one row, None where kvplan cannot restate it."""
    import timing_fidelity as T

    got = T.served_predictions(entry(row), SETS)
    if got is None:
        return None
    return {"tpot": got["itl"][0] / got["itl"][1] - 1, "ttft": got["ttft"][0] / got["ttft"][1] - 1}


def predict_mtp(row: dict) -> float | None:
    """The row's TPOT error had it drafted one MTP token a step, served by its own engine's rules
    (timing_fidelity.build_case's "_mtp"); None where kvplan cannot restate it."""
    import timing_fidelity as T

    got = T.served_predictions(entry(row), {**SETS, "_mtp": True})
    return None if got is None else got["itl"][0] / got["itl"][1] - 1


def table(title: str, groups: dict[str, list[dict]]) -> list[str]:
    lines = [f"\n{title}", f"  {'':44} {'runs':>5}   {'TPOT |err|':>10} {'signed':>8}   {'TTFT |err|':>10} {'signed':>8}"]
    for name, errs in groups.items():
        if not errs:
            continue
        cells = []
        for m in ("tpot", "ttft"):
            v = [e[m] for e in errs]
            cells.append(f"{statistics.median(abs(x) for x in v):>10.1%} {statistics.median(v):>+8.1%}")
        lines.append(f"  {name[:44]:44} {len(errs):>5}   {'   '.join(cells)}")
    return lines


def mtp_rows(done: list[tuple[dict, dict]]) -> list[tuple[dict, dict, float]]:
    """The rows of models with MTP layers, with the step model's speedup of one MTP draft token at
    the row's concurrency and a context of isl + osl / 2 (bench/parallel_fidelity.mtp_speedup_at)."""
    from parallel_fidelity import mtp_speedup_at

    out = []
    for r, e in done:
        sp = mtp_speedup_at(r["model_path"], GPUS[r["system"]], int(r["tp_size"]), r["concurrency"],
                            int(r["isl"]) + int(r["osl"]) // 2, "fp8" if r["precision"] == "fp8" else "auto")
        if sp:
            out.append((r, e, sp))
    return out


def mtp_table(rows: list[tuple[dict, dict, float]], served: list[float | None]) -> list[str]:
    """Per engine, model and GPU, the TPOT error of the rows of MTP models as predicted (a plain
    decode) and had each run one MTP draft token: the step model's ratio (mtp_rows), and the run
    served again by its engine drafting one token (predict_mtp: SGLang's speculative rules for
    SGLang's runs, kvplan/sim/sglang.py). The rows state no speculative decoding; aiconfigurator's
    task defaults of the time give DeepSeek models nextn 1 (tests/data/aiconfigurator_silicon_rows.yaml's
    header). A what-if: the tables above do not use it."""
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for (r, e, sp), run in zip(rows, served):
        if run is not None:
            groups.setdefault(f"{r['backend']} {r['model_path']} {r['system']}", []).append(
                (e["tpot"], (1 + e["tpot"]) / sp - 1, run))
    if not groups:
        return []
    lines = ["\nwhat if the rows of MTP models ran one MTP draft token (not stated; TPOT |err| and signed median)",
             f"  {'':40} {'runs':>4}   {'as predicted':>12} {'signed':>7}   {'step ratio':>10} {'signed':>7}"
             f"   {'served':>7} {'signed':>7}"]
    engines: dict[str, list[tuple[float, float, float]]] = {}
    for name, errs in groups.items():
        engines.setdefault(name.split()[0] + " all", []).extend(errs)
    for name, errs in [*sorted(groups.items()), *sorted(engines.items())]:
        cells = [f"{statistics.median(abs(x[i]) for x in errs):>{w}.1%} {statistics.median(x[i] for x in errs):>+7.1%}"
                 for i, w in ((0, 12), (1, 10), (2, 7))]
        lines.append(f"  {name[:40]:40} {len(errs):>4}   {'   '.join(cells)}")
    return lines


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a step-time constant or engine/server factor to predict with (timing_fidelity's names)")
    args = ap.parse_args()
    from timing_fidelity import parse_sets

    sets = parse_sets(args.set)
    if sets:
        print(f"with {', '.join(f'{k}={v:g}' for k, v in sets.items())} instead of the shipped values")
    rows = load()
    with ProcessPoolExecutor(max(args.workers, 1), initializer=_use_sets, initargs=(sets,)) as pool:
        results = list(pool.map(predict, rows, chunksize=8))
        done = [(r, e) for r, e in zip(rows, results) if e is not None]
        mtp = mtp_rows(done)
        served = list(pool.map(predict_mtp, [r for r, _, _ in mtp], chunksize=4))

    def by(key, order=None) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for r, e in sorted(done, key=lambda x: (order or key)(x[0])):
            out.setdefault(key(r), []).append(e)
        return out

    def band(r) -> int:
        return next(i for i, (lo, hi) in enumerate(BANDS) if lo <= r["concurrency"] <= hi)

    lines = table("per engine", by(lambda r: r["backend"]))
    lines += table("per engine and GPU", by(lambda r: f"{r['backend']} {r['system']}"))
    lines += table("per engine and model", by(lambda r: f"{r['backend']} {r['model_path']}"
                                               + (f" {r['precision']}" if r["precision"] else "")))
    lines += table("per engine and concurrency",
                   by(lambda r: f"{r['backend']} {BANDS[band(r)][0]}-{BANDS[band(r)][1]} clients".replace("-100000", "+"),
                      order=lambda r: (r["backend"], band(r))))
    lines += mtp_table(mtp, served)
    for line in lines:
        print(line)
    print(f"\n{len(done)} of {len(rows)} rows restated ({ROWS.relative_to(ROOT)}); no kvplan constant was fitted to them.")


if __name__ == "__main__":
    main()
