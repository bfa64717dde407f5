"""Speed target (issue 15): a fleet of 64 replicas serving 1,000,000 requests in <= 60 s locally.

Llama-3.1-8B-Instruct on 64 H100-80GBs (vLLM V1 defaults), 1,000,000 requests, lognormal
prompts (mean 1,000) and outputs (mean 200), Poisson at 900 requests/s (each replica near 14/s,
about 70% of what it serves within seconds of TTFT), for each router. The routers that look at
the replicas refresh their view every 0.1 s of arrival time (11,000 refreshes of 64 replicas).

With --prefix, the prompts open with one of 64 shared 512-token system prompts (hash ids per 16
tokens), so the prefix-aware routers index and match every prompt's blocks.

With --engine sglang every replica is an SGLang server (its start-up pool, mem_fraction_static
default; SGLang's scheduler steps one iteration at a time, with no closed-form jumps).

Run: python bench/fleet.py [--quick] [--prefix] [--router NAME] [--engine sglang]   (--quick: 100,000 requests)
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0
FLEET = """name: fleet-bench
experiment: fleet
seed: 1
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
pool: {{gpu_memory_utilization: 0.92}}
requests:
  count: {count}
  prompt: {{dist: lognormal, mean: 1000, sigma: 1.0}}
  output: {{dist: lognormal, mean: 200, sigma: 1.0}}
  arrival: {{process: poisson, rate: 900}}
replicas:
  - {{count: 64}}
router: {router}
"""


def main() -> None:
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet
    from kvplan.workload.routing import ROUTER_NAMES as ROUTERS

    count = 100_000 if "--quick" in sys.argv else 1_000_000
    routers = [sys.argv[sys.argv.index("--router") + 1]] if "--router" in sys.argv else list(ROUTERS)
    with tempfile.TemporaryDirectory() as tmp:
        for router in routers:
            path = Path(tmp) / f"{router}.yaml"
            text = FLEET.format(count=count, router=router)
            if "--engine" in sys.argv and sys.argv[sys.argv.index("--engine") + 1] == "sglang":
                text = text.replace("pool: {gpu_memory_utilization: 0.92}", "engine: sglang\npool: {mem_fraction_static: default}")
            if "--prefix" in sys.argv:
                text += "prefix: {system_prompts: 64, system_prompt_len: 512, hash_block_size: 16}\n"
            path.write_text(text)
            wl = load(path)
            t0 = time.perf_counter()
            r = simulate_fleet(wl)
            wall = time.perf_counter() - t0
            ok = count >= 1_000_000 and wall <= TARGET_S
            print(f"{router:18s} 64 replicas x {count:,} requests in {wall:5.1f} s = {count / wall:9,.0f} requests/s; "
                  f"fleet {r.throughput_rps:,.0f} req/s, TTFT p99 {r.ttft.p99:.2f} s, imbalance {r.imbalance:.3f}  "
                  f"[{'ok' if ok else 'MISSED'}]", flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:,.0f} MiB")


if __name__ == "__main__":
    main()
