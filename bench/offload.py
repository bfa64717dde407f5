"""The CPU offload tier's cost and gain: a serve run with vLLM's CPU tier against the same run
without it (kvplan/sim/offload.py).

workloads/multiturn-offload.yaml (chats of 10 turns after a shared system prompt, Llama-3.1-8B-
Instruct on one H100-80GB with a 3 GiB KV pool, an 8 GiB tier at 25 GB/s) with its request count
raised to N (40 conversations open at once, as there). Prints the wall time
of each run (JIT compilation excluded: it is cached on disk after the first run), requests/s,
the GPU prefix cache's hit rate, the tier's, both together, and TTFT p50.

Run: python bench/offload.py [N]   (default 20,000)
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "multiturn-offload.yaml"


def workload(n: int):
    from kvplan.experiments import load

    text = WORKLOAD.read_text(encoding="utf-8")
    assert text.count("count: 600") == 1
    text = text.replace("count: 600", f"count: {n}")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "offload.yaml"
        path.write_text(text, encoding="utf-8")
        return load(path)


def main(n: int) -> None:
    from kvplan.sim.engine import simulate

    wl = workload(n)
    spec = wl.allocators[0]
    small = workload(60)
    simulate(small, spec), simulate(small, replace(spec, offload=False))  # compile or load the cache
    runs = {}
    for label, s in (("tier", spec), ("no tier", replace(spec, offload=False))):
        t0 = time.perf_counter()
        runs[label] = (simulate(wl, s), time.perf_counter() - t0)
    for label, (r, wall) in runs.items():
        tier = r.offload
        both = f", tier {100 * tier['hit_rate']:.1f}%, GPU+CPU {100 * tier['combined_hit_rate']:.1f}%, " \
               f"{tier['bytes_loaded'] / 2**30:,.1f} GiB loaded in {tier['load_time_s']:.2f} s" if tier else ""
        print(f"{label:>8}: {r.completed:,} requests in {wall:.2f} s ({r.completed / wall:,.0f} requests/s, "
              f"{r.steps:,} steps); GPU hit rate {100 * r.prefix.hit_rate:.1f}%{both}; TTFT p50 {r.ttft.p50:.3f} s")
    (on, t_on), (off, t_off) = runs["tier"], runs["no tier"]
    print(f"the tier costs {t_on / t_off:.2f}x the wall time of the run without it")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
