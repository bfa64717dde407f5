"""Speed target: the whole Mooncake (FAST'25) conversation trace served by the engine with prefix
caching on, in <= 5 s, peak RSS <= 1 GiB.

workloads/mooncake-serve.yaml (12,031 requests, one hash id per 512-token block, Llama-3.1-8B-
Instruct on one H100-80GB, vLLM V1 defaults, paged B = 16), run at its time_scale (10: a tenth of
the trace's cluster load on one GPU) and at the trace's own pace (1: the GPU overloaded, so the
cache evicts and requests are preempted all the time), each in its own process so that its peak
RSS is its own. Prints the wall time of the run with caching on (JIT compilation excluded: it is
cached on disk after the first run; reading the trace included), requests/s and the hit rate, and
the same run with caching off for comparison.

Run: python bench/prefix_serve.py [10|1]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "mooncake-serve.yaml"
TARGET_S = 5.0
TARGET_RSS = 2**30


def run_case(scale: str) -> None:
    import numpy as np

    from kvplan.experiments import load
    from kvplan.sim.engine import simulate
    from kvplan.workload.chunks import RequestChunk

    wl = load(WORKLOAD)
    spec = wl.allocators[0]
    if scale != "10":  # the workload's own time_scale is 10: rescale the arrivals it reads
        factor = float(scale) / 10
        make = wl.make_requests
        wl = replace(wl, make_requests=lambda: (replace(c, arrival=c.arrival * factor) for c in make()))
    one = RequestChunk(np.zeros(2), np.array([1100, 1200]), np.array([20, 30]), [(1, 2), (1, 3)], 512)
    t0 = time.perf_counter()
    simulate(replace(wl, make_requests=lambda: iter([one])), spec)  # compile or load the cache
    t1 = time.perf_counter()
    on = simulate(wl, spec)
    wall = time.perf_counter() - t1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t2 = time.perf_counter()
    off = simulate(wl, replace(spec, prefix_caching=False))
    wall_off = time.perf_counter() - t2
    ok = wall <= TARGET_S and rss <= TARGET_RSS
    p = on.prefix
    print(f"time_scale {scale:>2}: {on.completed:,} requests in {wall:.2f} s with prefix caching "
          f"({on.completed / wall:,.0f} requests/s, hit rate {100 * p.hit_rate:.1f}%, "
          f"{p.blocks_evicted:,} blocks evicted, {on.preemptions:,} preemptions, {on.steps:,} steps), "
          f"peak RSS {rss / 2**20:,.0f} MiB (jit/cache load {t1 - t0:.1f} s)  [{'ok' if ok else 'MISSED'}]")
    print(f"              caching off: {wall_off:.2f} s; TTFT p50 {on.ttft.p50:.3g} s on vs "
          f"{off.ttft.p50:.3g} s off, throughput {on.throughput_tps:,.0f} vs {off.throughput_tps:,.0f} tok/s")


def main() -> None:
    if len(sys.argv) > 1:
        run_case(sys.argv[1])
        return
    print(f"target: the whole trace in <= {TARGET_S:g} s with prefix caching, <= 1 GiB")
    for scale in ("10", "1"):
        subprocess.run([sys.executable, __file__, scale], check=True)


if __name__ == "__main__":
    main()
