"""Memory target: a serve run with prefix caching holds memory bounded by what is live, not by the
length of the stream (kvplan/sim/prefix_ids.py: the engines compact the trie and the identities).

A synthetic stream on Llama-3.1-8B-Instruct and one H100-80GB: prompts lognormal (mean 1,000
tokens), each opening with one of 64 shared 512-token system prompts and going on with blocks of
its own (hash ids per 16 tokens, so about 60 new trie nodes a request), Poisson at 14 requests/s
(the GPU busy, not overloaded). Each engine runs it at 25,000, 100,000 and 400,000 requests, each
run in its own process so that its peak RSS is its own. What must still grow with the stream is
the per-request table and the result's columns (a few hundred bytes a request); before compaction
the trie and the identities added about 16 KiB a request (1.3 GB at 80,000 requests).

Target: peak RSS grows by at most 1 KiB a request from 100,000 to 400,000 requests.

Run: python bench/prefix_memory.py [--engine sglang]
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNTS = (25_000, 100_000, 400_000)
TARGET_PER_REQUEST = 1024
WORKLOAD = """name: prefix-memory
experiment: serve
seed: 1
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
{pool}
requests:
  count: {count}
  prompt: {{dist: lognormal, mean: 1000, sigma: 1.0}}
  output: {{dist: lognormal, mean: 200, sigma: 1.0}}
  arrival: {{process: poisson, rate: 14}}
prefix: {{system_prompts: 64, system_prompt_len: 512, hash_block_size: 16}}
"""
POOLS = {"vllm": "pool: {gpu_memory_utilization: 0.92}",
         "sglang": "engine: sglang\npool: {mem_fraction_static: default}"}


def run_case(engine: str, count: int) -> None:
    from kvplan.experiments import load
    from kvplan.sim.engine import simulate

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.yaml"
        path.write_text(WORKLOAD.format(pool=POOLS[engine], count=count))
        wl = load(path)
        t0 = time.perf_counter()
        r = simulate(wl, wl.allocators[0])
        wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{engine} {count} {wall:.1f} {rss} {100 * r.prefix.hit_rate:.1f}", flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        run_case(sys.argv[2], int(sys.argv[3]))
        return
    engine = sys.argv[sys.argv.index("--engine") + 1] if "--engine" in sys.argv else "vllm"
    print(f"target: peak RSS grows by <= {TARGET_PER_REQUEST} bytes a request from {COUNTS[1]:,} to "
          f"{COUNTS[2]:,} requests ({engine})")
    rss = {}
    for count in COUNTS:
        out = subprocess.run([sys.executable, __file__, "--case", engine, str(count)], check=True,
                             capture_output=True, text=True).stdout.split()
        wall, rss[count], hit = float(out[2]), int(out[3]), out[4]
        print(f"{count:>9,} requests: {wall:6.1f} s ({count / wall:,.0f} requests/s), peak RSS "
              f"{rss[count] / 2**20:,.0f} MiB, prefix hit rate {hit}%", flush=True)
    slope = (rss[COUNTS[2]] - rss[COUNTS[1]]) / (COUNTS[2] - COUNTS[1])
    print(f"growth {slope:,.0f} bytes a request  [{'ok' if slope <= TARGET_PER_REQUEST else 'MISSED'}]")


if __name__ == "__main__":
    main()
