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

Every scheduler of the report is llm-d's endpoint picker behind the cluster's Envoy gateway (the
random one is its random-picker plugin): each runs with llm_d's default gateway_s, 25 ms, the
EPP's own timings of that path (kvplan/workload/routing.GATEWAY_DEFAULT_S, cited there).

The client, Inference-Perf as it was then (kubernetes-sigs/inference-perf before 3631096 of
2025-11-14, apis/completion.py and client/modelserver/openai_client.py): TTFT = the time of the
first streamed line - the time taken just before the POST (after its own ClientSession is made), so
nothing of the request's scheduling lag counts; its loop stamps every line of the stream, the blank
line closing each SSE message too, so half of the "inter-token" gaps are ~0: the report's ITL p50 of
0.0000 is that double stamp, not a lagging read loop (the loop has no timer; it reads as bytes come).
Nothing of the client is added here.

One stage's p90 is a random quantity: the trace's seed and the routers' move it (random at 3/s:
1.42-1.95 s over 4 seeds), as much as two runs of the benchmark differ (the repeat below: 1.50 and
2.00 s). Each figure here is the median over SEEDS seeds of the stage's p90, its range beside it.

Prints the TTFT p90 per stage and router, measured and simulated, and the ratio. Targets: the
prefix-aware routers within 2x of the measured TTFT p90, random within 25%.

Run: python bench/routing_fidelity.py [--router NAME] [--seeds N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvplan.workload.routing import GATEWAY_DEFAULT_S

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
# A second Inference-Perf report of the same X-37 workload and cluster (4 pods of the 70B at TP4; found
# in the search index by the same title line, its source path not given there; warm-up 10/s for 25 s,
# then the same stages), whose random-picker is the same scheduler: a repeat of the measurement,
# printed beside it, not a target. Its other schedulers differ (active-request-scorer for
# queue-scorer, a configured prefix-cache-scorer), so only random is repeated.
REPEAT = {"random": {3: 2.000, 4: 22.814, 5: 30.994, 6: 56.371, 8: 74.757, 10: 88.089, 12: 96.284, 15: 128.434,
                     20: 197.010}}
SEEDS = 4  # the trace's and the routers' seeds: one stage's p90 moves with them (random at 3/s: 1.42-1.95 s)
GATEWAY = GATEWAY_DEFAULT_S["llm_d"]  # every scheduler of the report is llm-d's EPP behind its gateway
ROUTERS = {
    "random": f"{{policy: random, gateway_s: {GATEWAY}}}",
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


def simulate(name: str, seed: int, tmp: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """One run of a router over the trace of `seed` (the workload's seed too): every request's TTFT,
    its stage, and the fleet's prefix hit rate."""
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    requests, stages = trace(seed)
    path = tmp / f"trace{seed}.json"
    path.write_text(json.dumps({"block_size": BLOCK, "requests": requests}))
    fleet = tmp / f"{name}{seed}.yaml"
    fleet.write_text(FLEET.format(block=BLOCK, trace=path, router=ROUTERS[name]).replace("seed: 0", f"seed: {seed}"))
    result = simulate_fleet(load(fleet), record=True)
    return result.requests["ttft_s"], np.asarray(stages), result.prefix_hit_rate


def main() -> None:
    names = [sys.argv[sys.argv.index("--router") + 1]] if "--router" in sys.argv else list(ROUTERS)
    seeds = range(int(sys.argv[sys.argv.index("--seeds") + 1]) if "--seeds" in sys.argv else SEEDS)
    rates = [r for r, _ in STAGES]
    print(f"{len(trace()[0]):,} requests in {len(STAGES)} stages, {len(seeds)} seeds; TTFT p90 in s per stage: "
          f"measured, kvplan's median over the seeds [its lowest-highest], ratio; the routers behind llm-d's "
          f"gateway see {GATEWAY * 1e3:g} ms of it")
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            t0 = time.perf_counter()
            runs = [simulate(name, seed, Path(tmp)) for seed in seeds]
            wall = time.perf_counter() - t0
            cells, worst = [], 1.0
            for k, rate in enumerate(rates):
                if rate not in MEASURED[name]:
                    continue
                p90 = sorted(float(np.percentile(ttft[stages == k], 90)) for ttft, stages, _ in runs)
                sim = float(np.median(p90))
                got = sim / MEASURED[name][rate]
                worst = max(worst, got, 1 / got)
                again = (f", repeat {REPEAT[name][rate]:.3g} ({sim / REPEAT[name][rate]:.2f})"
                         if name in REPEAT else "")
                cells.append(f"{rate:>2}/s {MEASURED[name][rate]:8.3g} {sim:8.3g} [{p90[0]:.3g}-{p90[-1]:.3g}] "
                             f"({got:.2f}){again}")
            ok = worst <= TARGET[name]
            misses += [] if ok else [name]
            hit = np.mean([h for _, _, h in runs])
            print(f"{name:8s} hit rate {100 * hit:5.1f}%, worst ratio {worst:5.2f} "
                  f"(target within {TARGET[name]:g}x) [{'ok' if ok else 'MISSED'}] in {wall:.0f} s", flush=True)
            for cell in cells:
                print("    " + cell, flush=True)
    print("all within their targets" if not misses else f"missed: {', '.join(misses)}")


if __name__ == "__main__":
    main()
