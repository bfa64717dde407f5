"""Routers as deployed, against a published benchmark of llm-d's scheduler (issue 28).

The benchmark: llm-d's precise prefix-cache-aware guide, its Inference-Perf report
(llm-d/llm-d, guides/precise-prefix-cache-aware/benchmark-results, charts at commit 209c37c4):
4 vLLM pods of meta-llama/Llama-3.1-70B-Instruct, each on 4 H100s (TP4); Inference-Perf's
shared_prefix data, 83 groups x 3 prompts of an 8,000-token system prompt + a 1,000-token question,
1,000 output tokens (ignore_eos); stages of Poisson arrivals (Inference-Perf's `constant` load:
exponential gaps, rate x duration requests, those past the stage's end dropped), each stage drained
before the next. Inference-Perf shuffles the 249 prompts once and request i of a stage takes
prompt i mod 249, the stage starting again from the first (kubernetes-sigs/inference-perf,
datagen/synthetic/shared_prefix_datagen.py and loadgen/load_generator.py, read at 7de5ef2e).

The schedulers, as the report configures them, and kvplan's router for each:
- random-scheduling: random;
- load-scheduling: queue-scorer 1 + kv-cache-scorer 1 = llm_d with prefix_weight 0;
- default-scheduling: + prefix-cache-scorer 2 (approximate) = llm_d;
- precise-scheduling: precise prefix-cache-scorer 2 + kv 1 + queue 1, its scores min-max
  normalised as llm-d's precise scorer did then = llm_d, index precise, prefix_score min_max.

The pods run vLLM's defaults (utilization 0.9: kvplan's start-up pool is 453,536 tokens per pod,
the report's 461,376) with blocks of 64 tokens, as the guide's indexer (blockSize 64) needs. The
trace is written here, in a temporary folder, one hash id per 64 tokens: a group's 125 system
blocks shared, a prompt's 15 question blocks its own.

Prints the TTFT p90 per stage and router, measured and simulated, and the ratio. Targets: the
prefix-aware routers within 2x of the measured TTFT p90, random within 25%.

Run: python bench/routing_fidelity.py [--router NAME]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STAGES = [(9, 30), (3, 210), (4, 180), (5, 120), (6, 120), (8, 90), (10, 70), (12, 60), (15, 50), (20, 50)]
GROUPS, PER_GROUP, SYSTEM, QUESTION, OUTPUT, BLOCK = 83, 3, 8000, 1000, 1000, 64
DRAIN_S = 2000.0  # idle time between stages: every request of a stage has finished by then
# TTFT p90 in seconds per stage rate, from the report's per-QPS tables (the warm-up stage has none)
MEASURED = {
    "precise": {3: 0.201, 4: 0.277, 5: 0.281, 6: 0.281, 8: 0.280, 10: 0.282, 12: 0.282, 15: 0.288, 20: 0.290},
    "default": {3: 0.399, 4: 0.700, 5: 0.900, 6: 0.794, 8: 1.110, 10: 1.309, 12: 1.199, 15: 1.900, 20: 43.568},
    "load": {3: 2.400, 4: 16.101, 5: 28.581, 6: 59.389, 8: 73.762, 10: 86.063, 12: 94.109, 15: 114.672,
             20: 173.540},
    "random": {3: 1.502, 4: 23.480, 5: 41.795, 6: 62.490, 8: 78.656, 10: 83.002, 12: 98.661, 15: 139.286,
               20: 176.975},
}
ROUTERS = {
    "random": "random",
    "load": "{policy: llm_d, prefix_weight: 0}",
    "default": "{policy: llm_d}",
    "precise": "{policy: llm_d, index: precise, prefix_score: min_max}",
}
TARGET = {"random": 1.25, "load": 1.25, "default": 2.0, "precise": 2.0}  # max ratio either way

FLEET = """name: llm-d-precise-guide
experiment: fleet
seed: 0
model: meta-llama/Llama-3.1-70B-Instruct
gpu: H100-80GB
tp: 4
pool: {{gpu_memory_utilization: 0.9}}
allocators: [{{kind: paged, block_size: {block}}}]
requests:
  trace: {{format: agentic, path: {trace}}}
replicas:
  - {{count: 4}}
router: {router}
"""


def trace(seed: int = 0) -> tuple[list[dict], list[int]]:
    """The benchmark's requests (agentic JSON entries) and each one's stage."""
    rng = np.random.default_rng(seed)
    system_blocks, question_blocks = SYSTEM // BLOCK, (SYSTEM + QUESTION) // BLOCK - SYSTEM // BLOCK
    prompts = [(g, p) for g in range(GROUPS) for p in range(PER_GROUP)]
    prompts = [prompts[i] for i in rng.permutation(len(prompts))]
    first_question = GROUPS * system_blocks
    requests, stages, start = [], [], 0.0
    for k, (rate, duration) in enumerate(STAGES):
        times = start + np.cumsum(rng.exponential(1 / rate, int(rate * duration)))
        times = times[times < start + duration]
        for i, t in enumerate(times.tolist()):
            g, p = prompts[i % len(prompts)]
            ids = list(range(g * system_blocks, (g + 1) * system_blocks))
            q = first_question + (g * PER_GROUP + p) * question_blocks
            ids += list(range(q, q + question_blocks))
            requests.append({"t": round(t, 6), "in": SYSTEM + QUESTION, "out": OUTPUT, "hash_ids": ids})
            stages.append(k)
        start += duration + DRAIN_S
    return requests, stages


def main() -> None:
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    names = [sys.argv[sys.argv.index("--router") + 1]] if "--router" in sys.argv else list(ROUTERS)
    requests, stages = trace()
    stages = np.asarray(stages)
    rates = [r for r, _ in STAGES]
    print(f"{len(requests):,} requests in {len(STAGES)} stages; TTFT p90 in s, measured / kvplan (ratio)")
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        path.write_text(json.dumps({"block_size": BLOCK, "requests": requests}))
        for name in names:
            fleet = Path(tmp) / f"{name}.yaml"
            fleet.write_text(FLEET.format(block=BLOCK, trace=path, router=ROUTERS[name]))
            t0 = time.perf_counter()
            result = simulate_fleet(load(fleet), record=True)
            wall = time.perf_counter() - t0
            ttft = result.requests["ttft_s"]
            cells, worst = [], 1.0
            for k, rate in enumerate(rates):
                if rate not in MEASURED[name]:
                    continue
                sim = float(np.percentile(ttft[stages == k], 90))
                got = sim / MEASURED[name][rate]
                worst = max(worst, got, 1 / got)
                cells.append(f"{rate}/s {MEASURED[name][rate]:.3g}/{sim:.3g} ({got:.2f})")
            ok = worst <= TARGET[name]
            misses += [] if ok else [name]
            print(f"{name:8s} hit rate {100 * result.prefix_hit_rate:5.1f}%, worst ratio {worst:5.2f} "
                  f"(target {TARGET[name]:g}) [{'ok' if ok else 'MISSED'}] in {wall:.0f} s", flush=True)
            print("         " + "; ".join(cells), flush=True)
    print("all within their targets" if not misses else f"missed: {', '.join(misses)}")


if __name__ == "__main__":
    main()
