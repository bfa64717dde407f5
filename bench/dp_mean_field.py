"""The mean-field fast path of data-parallel serving against the lockstep reference.

The lockstep reference (kvplan/sim/data_parallel.py) runs D ranks, each its own scheduler and
pool, stepping together: a step is the slowest rank's own step plus the routed experts over every
rank's tokens and the all-to-all. The mean-field path (kvplan/sim/parallel_clock.py, used by
`kvplan plan`) runs one rank's fast engine on 1 / D of the traffic with a clock that charges the
MoE time of D ranks of that rank's own batch. This prints, per workload, the p50 and p99 of TTFT
and TPOT of both and the relative error of the mean-field figure.

The workloads: MoE models of kvplan's bundled configs, at a light and a heavy load of Poisson
arrivals with lognormal lengths (seed 0), D and EP as named. Each runs `count` requests through
the lockstep reference (Python: about a second per 100 requests per rank at these loads).

    python bench/dp_mean_field.py [--count N] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

CASES = (  # name, model, gpu, dp, EP, backend, rate (requests/s over all ranks)
    ("qwen3-30b dp4 ep, light", "Qwen/Qwen3-30B-A3B", "H100-80GB", 4, True, "allgather_reducescatter", 8.0),
    ("qwen3-30b dp4 ep, heavy", "Qwen/Qwen3-30B-A3B", "H100-80GB", 4, True, "allgather_reducescatter", 40.0),
    ("qwen3-30b dp2 no ep", "Qwen/Qwen3-30B-A3B", "H100-80GB", 2, False, "allgather_reducescatter", 20.0),
    ("dsv2-lite dp8 ep deepep-ll", "deepseek-ai/DeepSeek-V2-Lite", "H100-80GB", 8, True, "deepep_low_latency", 40.0),
    ("qwen3-235b dp8 ep deepep-ht", "Qwen/Qwen3-235B-A22B", "H200", 8, True, "deepep_high_throughput", 16.0),
)


def workload_text(model, gpu, dp, ep, backend, rate, count) -> str:
    return (f"model: {model}\ngpu: {gpu}\npool: {{gpu_memory_utilization: 0.9}}\n"
            f"requests: {{count: {count}, prompt: {{dist: lognormal, mean: 1000, sigma: 0.8, min: 16, max: 6000}},"
            f" output: {{dist: lognormal, mean: 200, sigma: 0.8, min: 2, max: 1500}},"
            f" arrival: {{process: poisson, rate: {rate}}}}}\nscheduler: {{max_model_len: 8192}}\n"
            f"parallel: {{dp: {dp}, enable_expert_parallel: {str(ep).lower()}, all2all_backend: {backend}}}\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=800)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from kvplan.experiments import load
    from kvplan.sim.data_parallel import mean_field
    from kvplan.sim.engine import simulate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, gpu, dp, ep, backend, rate in CASES:
            path = Path(tmp) / "w.yaml"
            path.write_text(workload_text(model, gpu, dp, ep, backend, rate, args.count))
            wl = load(path)
            t0 = time.perf_counter()
            lock = simulate(wl, wl.allocators[0])
            t1 = time.perf_counter()
            one, setup = mean_field(wl, wl.allocators[0])
            fast = simulate(one, wl.allocators[0], setup=setup)
            t2 = time.perf_counter()
            row = {"case": name, "requests": args.count, "lockstep_s": t1 - t0, "mean_field_s": t2 - t1}
            for metric in ("ttft", "tpot"):
                for q in ("p50", "p99"):
                    a, b = getattr(getattr(lock, metric), q), getattr(getattr(fast, metric), q)
                    row[f"{metric}_{q}"] = {"lockstep": a, "mean_field": b, "error": (b - a) / a if a else None}
            rows.append(row)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'case':32} {'metric':9} {'lockstep':>10} {'mean-field':>10} {'error':>8}")
    for row in rows:
        for key in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"):
            v = row[key]
            print(f"{row['case']:32} {key:9} {v['lockstep'] * 1e3:9.1f}ms {v['mean_field'] * 1e3:9.1f}ms "
                  f"{v['error']:+8.1%}")
        print(f"{'':32} runs: lockstep {row['lockstep_s']:.1f} s, mean-field {row['mean_field_s']:.2f} s")
    errors = sorted(abs(r[k]["error"]) for r in rows for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99"))
    print(f"median |error| {errors[len(errors) // 2]:.1%}, worst {errors[-1]:.1%} over {len(errors)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
