"""vLLM or SGLang for this workload? kvplan's two engines against runs of both on the same setup.

Reads tests/data/engine_pairs.yaml: pairs of runs, one vLLM and one SGLang, of the same model on the
same GPU at the same TP, prompt and output lengths and concurrency, measured by one harness (the
file's header: every such pair of aiconfigurator's silicon_sample.csv, 34 of Qwen3-32B on H100). No
constant of kvplan was fitted to them. Each run is restated as bench/timing_fidelity.py restates the
other rows of that file (predictions(): a closed loop of `concurrency` clients, fixed lengths, the
mean): the vLLM run by vLLM's rules (its pool, scheduler and the step model), the SGLang run as
`kvplan simulate --engine sglang` serves it (timing_fidelity's values["_sglang"]: SGLang's start-up
pool at the run's release, its scheduler, its overlap scheduler's lag).

Prints, per pair, each engine's measured and predicted TPOT and TTFT (ms) and closed-loop output
throughput (tokens/s: concurrency x output / (TTFT + (output - 1) x TPOT), both sides alike), then:
- each engine's median |error| of TPOT, TTFT and throughput, over all pairs and per TP;
- the SGLang / vLLM ratio of each metric, measured against predicted (median |error| of the ratio);
- how often kvplan names the same engine as the measurement, metric by metric: the decision
  `plan --engine vllm,sglang` makes (a near tie, where the measured engines are within 5% of each
  other, is counted apart: either answer is fair there).

Run: python bench/engine_pairs.py [--workers N] [--json FILE]
"""

from __future__ import annotations

import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
PAIRS = ROOT / "tests" / "data" / "engine_pairs.yaml"
ENGINES = ("vllm", "sglang")
METRICS = ("tpot", "ttft", "throughput")
TIE = 0.05  # measured engines closer than this on a metric: a near tie


def load() -> list[dict]:
    return yaml.safe_load(PAIRS.read_text(encoding="utf-8"))["pairs"]


def entry(pair: dict, engine: str) -> dict:
    """One run of a pair as a bench/timing_fidelity.py measurement (its schema)."""
    from timing_fidelity import closed_loop_entry

    run = pair[engine]
    return closed_loop_entry(f"{pair['id']}-{engine}", run["source"], run["quote"], engine, run["version"],
                             pair["model"], pair["gpu"], pair["tp"], pair["input_len"], pair["output_len"],
                             pair["concurrency"], run["ttft_ms"], run["tpot_ms"])


def throughput(pair: dict, ttft_ms: float, tpot_ms: float) -> float:
    """Output tokens/s of the closed loop: each client's request takes TTFT + (output - 1) x TPOT."""
    out = pair["output_len"]
    return pair["concurrency"] * out / ((ttft_ms + (out - 1) * tpot_ms) / 1e3)


def predict(pair: dict) -> dict:
    """{engine: {metric: (measured, predicted)}} of one pair."""
    import timing_fidelity as T

    got = {}
    for engine in ENGINES:
        p = T.served_predictions(entry(pair, engine))
        if p is None:
            raise ValueError(f"{pair['id']}: kvplan cannot restate the {engine} run")
        (ttft, ttft_m), (tpot, tpot_m) = p["ttft"], p["itl"]
        got[engine] = {"ttft": (ttft_m, ttft), "tpot": (tpot_m, tpot),
                       "throughput": (throughput(pair, ttft_m, tpot_m), throughput(pair, ttft, tpot))}
    return got


def better(metric: str, vllm: float, sglang: float) -> str:
    """The engine a metric favours (throughput higher, latencies lower)."""
    return ("sglang" if sglang > vllm else "vllm") if metric == "throughput" else ("sglang" if sglang < vllm else "vllm")


def _errors(results: list[dict], engine: str, metric: str) -> list[float]:
    return [abs(r[engine][metric][1] / r[engine][metric][0] - 1) for r in results]


def _ratio_errors(results: list[dict], metric: str) -> list[float]:
    """|error| of the predicted SGLang / vLLM ratio against the measured one, per pair."""
    return [abs((r["sglang"][metric][1] / r["vllm"][metric][1]) / (r["sglang"][metric][0] / r["vllm"][metric][0]) - 1)
            for r in results]


def _named(results: list[dict], metric: str) -> tuple[int, int, int, int]:
    """(pairs where kvplan names the measured engine, clear pairs, near ties, near ties named alike)."""
    same = ties = tie_same = 0
    for r in results:
        alike = better(metric, r["vllm"][metric][0], r["sglang"][metric][0]) == \
            better(metric, r["vllm"][metric][1], r["sglang"][metric][1])
        if abs(r["sglang"][metric][0] / r["vllm"][metric][0] - 1) < TIE:
            ties, tie_same = ties + 1, tie_same + alike
        else:
            same += alike
    return same, len(results) - ties, ties, tie_same


def scores(results: list[dict]) -> dict:
    """The figures a change must not make worse (tests/data/engine_pairs_baseline.json): each
    engine's median |error| per metric, the ratio's, and the clear pairs kvplan names right."""
    out = {f"{e} {m}": round(statistics.median(_errors(results, e, m)), 4) for e in ENGINES for m in METRICS}
    out.update({f"ratio {m}": round(statistics.median(_ratio_errors(results, m)), 4) for m in METRICS})
    out.update({f"named {m}": _named(results, m)[0] for m in METRICS})
    return out


def summarize(pairs: list[dict], results: list[dict]) -> list[str]:
    def med(values) -> str:
        return f"{statistics.median(values):6.1%}" if values else "     -"

    lines = ["\nmedian |error| per engine (pairs)      " + "".join(f"{m:>12}" for m in METRICS)]
    groups = [("all", lambda p: True)] + [(f"tp {t}", lambda p, t=t: p["tp"] == t)
                                          for t in sorted({p["tp"] for p in pairs})]
    for engine in ENGINES:
        for label, sel in groups:
            chosen = [r for p, r in zip(pairs, results) if sel(p)]
            cells = [med(_errors(chosen, engine, m)) for m in METRICS]
            lines.append(f"  {engine:7} {label:8} ({len(chosen):2})" + " " * 15 + "".join(f"{c:>12}" for c in cells))
    lines.append("\nSGLang / vLLM, measured and predicted (median over pairs; median |error| of the ratio)")
    for m in METRICS:
        meas = [r["sglang"][m][0] / r["vllm"][m][0] for r in results]
        pred = [r["sglang"][m][1] / r["vllm"][m][1] for r in results]
        lines.append(f"  {m:10} measured {statistics.median(meas):5.2f}  kvplan {statistics.median(pred):5.2f}  "
                     f"|error| {med(_ratio_errors(results, m))}")
    lines.append("\nthe engine kvplan names against the measured one (a near tie: measured within 5%)")
    for m in METRICS:
        same, clear, ties, tie_same = _named(results, m)
        lines.append(f"  {m:10} same engine in {same} of {clear} clear pairs; {ties} near ties "
                     f"({tie_same} named alike)")
    return lines


def run(workers: int = 2) -> tuple[list[dict], list[dict]]:
    """The pairs and kvplan's predictions of them."""
    pairs = load()
    if workers <= 1:
        return pairs, [predict(p) for p in pairs]
    with ProcessPoolExecutor(workers) as pool:
        return pairs, list(pool.map(predict, pairs))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the scores (the test's baseline) here")
    args = ap.parse_args()
    pairs, results = run(args.workers)
    print(f"{'pair':34} {'engine':7} {'TPOT ms':>16} {'TTFT ms':>18} {'output tok/s':>20}")
    print(f"{'':34} {'':7} {'meas':>7} {'kvplan':>8} {'meas':>8} {'kvplan':>9} {'meas':>9} {'kvplan':>10}")
    for p, r in zip(pairs, results):
        for engine in ENGINES:
            cells = "".join(f" {r[engine][m][0]:>{w}.{d}f} {r[engine][m][1]:>{w + 1}.{d}f}"
                            for m, w, d in (("tpot", 7, 1), ("ttft", 8, 0), ("throughput", 9, 0)))
            print(f"{p['id'] if engine == 'vllm' else '':34} {engine:7}{cells}")
    for line in summarize(pairs, results):
        print(line)
    print(f"\n{len(pairs)} pairs from {PAIRS.relative_to(ROOT)}; no kvplan constant was fitted to them.")
    if args.json:
        args.json.write_text(json.dumps(scores(results), indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
