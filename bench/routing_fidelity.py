"""Routers as deployed, against published benchmarks of llm-d's scheduler (issue 28).

Four Inference-Perf reports of llm-d's schedulers, each a source (SOURCES below; the targets are
checked on each of TARGETED, per source): X-37 (described here), X-37-repeat (a second run of X-37's
workload and cluster, whose report states every scheduler's configuration), X-70R-6kSys (8 pods of a
32B, a 6,000-token system prompt) and L1 (short prompts; printed, not a target, see TARGETED).

The first benchmark, X-37: llm-d's Inference-Perf report "This benchmark report compares the
performance of the different llm-d well-lit scheduling strategies (default + precise), along with
load-based and random scheduling" (found in the search index by that title and first line, which
give no repository or path; the precise guide's charts, llm-d/llm-d guides/precise-prefix-cache-aware/
benchmark-results at 209c37c4, once cited here, are of a later 8-pod Qwen3-32B run):
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
1.42-1.95 s over 4 seeds), as much as two runs of the benchmark differ (X-37 and X-37-repeat: 1.50
and 2.00 s). Each figure here is the median over SEEDS seeds of the stage's p90, its range beside it.

Prints, per source, the TTFT p90 per stage and router, measured and simulated, and the ratio; where a
report's TTFT mean is transcribed (precise, default), the measured and simulated means and their gap.
Targets: the prefix-aware routers within 2x of the measured TTFT p90, random within 25%.

What the precise scheduler's gap looks like, source by source (mean TTFT, measured - kvplan's, at
every rate of a report; kvplan's routing there is near perfect, 95-98% hits, so the gap is latency
outside the routing decision): X-37 +0.06 to +0.10 s, flat from 3 to 20/s; the repeat of X-37 (the
same workload, cluster and weights) +0.11 to +0.22 s; X-70R-6kSys +0.13 to +0.21 s, flat from 3 to
60/s, and its estimated scheduler +0.10 to +0.15 s at 3-15/s, where neither queues. It is not the
router's: X-70R's random scheduler, whose requests mostly miss and prefill 7,200 tokens (6x the 1,200
a precise hit prefills), shows the same gap where it does not queue (+0.15 s at 3/s, +0.17 s at
10/s; printed), so it is a per-request latency of that deployment, not a cost of the prefill, the
prompt's length (9,000 tokens in X-37, 7,200 in X-70R), the load or the pods' number (4 or 8), and it
differs between two runs of one stack. The engine is not what is fast: its decode pace agrees at low
load (2 x the ITL mean against kvplan's TPOT mean: X-37 0.026 vs 0.029 s at 3/s, X-70R 0.022 vs
0.021 s at 3/s; kvplan's is 1.5x the measured at the top rates, 0.086 vs 0.058 s in X-37 at 20/s and
0.09 vs 0.058 s in X-70R at 40-60/s, a separate miss). Delivery differs by run: in X-37 the ITL p90
(0.078-0.100 s) is 1.7-3.3x the time per token (printed): tokens reach the client in bursts ~0.1 s
apart, as they do in the repeat (ITL p90 0.100, TTFT p90 0.400 at seven of nine rates); in X-70R at
3-35/s it is 1.0-1.2x the time per token (0.022 and 0.022 s at 3/s): no bursts, yet the same gap.
Not modelled.

The reports' TTFT samples look quantized to 0.1 s: the measured p90s under 3 s lie within 2 ms of a
multiple of 0.1 s at 11 of X-70R-6kSys's 16 precise rates (0.400, 0.500, 0.600 again and again), at
5 of X-37's 8 default ones and at 10 of X-37-repeat's 11 under 3 s, where a quantity spread
continuously lands there 5% of the time; X-70R's
means, which average a grid away, do so at 1 of 16 and 1 of 8 (quantized_share; the bench prints the
counts per source; X-37's precise means sit near 0.2 s at every rate, so 4 of its 9 do). A p90 is an
order statistic and inherits the grid of its samples. Whatever puts the first streamed line on a 0.1 s
grid (the client's reads, a gateway's or a proxy's flushes) lies outside the engine and the router,
and nothing read says what it is: Inference-Perf's client stamps each line with perf_counter as it
reads it, and the EPP passes each response chunk through as it comes (its StreamingServer, in
Envoy's full-duplex streamed mode). The grid alone does not close the gap either (kvplan's 0.15-0.2
s p90s in X-70R rounded up to it are 0.2-0.3 s, against 0.4-0.6): with the per-request gap above it
is latency of the reports' delivery path, which neither describes, so it is not modelled.

The approximate index remembers what its configuration lets it. X-37-repeat's estimate-prefix-cache
scheduler keeps lruCapacityPerServer 2,200 blocks of 64 tokens a pod (140,800 tokens, a third of a
pod's 453,536-token pool, a number its team sized for the 141K-token pods of the L1 report), so it
forgets the system prompts of most of the 83 groups and sends their requests by load: run with that
capacity (`lru_capacity_blocks: 2200`) kvplan's hits fall from 98% to 67% and its TTFT p90s from
0.09-0.21 s, 25-800x below the report's 2.2-165 s, to 0.95-127 s, 0.31-0.77 of it; the scheduler
collapses at 6/s in both. X-37's own report states no capacity, so its approximate index is the pod's
pool (the default).

Read in the deployed code and ruled out as its cause (each on the path of every request, or of the
precise scheduler's):
- the index's lag: vLLM publishes a step's KV events as it schedules the step (vllm/v1/core/sched/
  scheduler.py, Scheduler.schedule, in the releases of the reports' time; after the step from
  v0.14), over ZMQ to the EPP, which indexes them: a request is scored on what was stored up to about
  a step before, as kvplan's router sees each replica's cache at its last refresh (every 50 ms);
  repeats of a prompt come seconds apart at these rates, so no hit is lost to it;
- the precise scorer's weights and normalisation: prefix 2 / KV 1 / queue 1 (X-37), 3 / 2 / 2
  (X-70R), its scores min-max scaled over the pods that hold the prompt's first block, the others 0
  (kvplan/fleet/routers._min_max_of_holders, now as deployed; before, over every pod: 3.74 -> 3.75,
  2.79 -> 2.79, no decision of these traces depends on it);
- the precise scorer's tokenizer: skipped once 80% of a prompt is found in its store of earlier
  tokenizations (llm-d-kv-cache-manager, pkg/tokenization/pool.go, minPrefixOverlapRatio 0.8);
- the gateway: 25 ms (GATEWAY_DEFAULT_S, cited there);
- vLLM's API server tokenizes each prompt on one thread (vllm-project/vllm#25301: serving_engine.py's
  ThreadPoolExecutor(max_workers=1)) at 1.3-1.9 MB/s for the Llama 3.1 tokenizer
  (huggingface/tokenizers#1582): 19-42 ms for X-37's 9,000 tokens and 15-33 ms for X-70R's 7,200 at
  4-6 bytes a token, the same for every router, where X-70R's p90s want +0.10-0.14 s to come within 2x;
  kvplan's API server (kvplan/model/step_time.py, frontend_latency_s and the fitted
  frontend_request_s) does not scale with the prompt, and that is left to that model's own fit;
- the client's read loop (the ITL p50 of 0 is the blank SSE line being stamped).
The client of that time opened a new aiohttp session (its connection and DNS resolver) for every
request, inside its TTFT (kubernetes-sigs/inference-perf, client/modelserver/openai_client.py before
#282, merged 2025-11-26): a client cost, unmeasured there, which no server default carries. Its load
generator also holds at most num_workers x worker_max_concurrency requests in flight (os.cpu_count()
of the client's machine x 100, config.py at 16c972f): a request waiting for a slot is stamped only
when sent, so a saturated stage's TTFT leaves that wait out; the reports do not state the client's
machine, so nothing of it is restated here (it bears on random's and load's saturated stages, not on
the precise gap). X-70R's random misses fit both: at 3/s the same per-request gap (0.535 s against
0.82), and saturated, its measured p90 grows 1.3x (70-91 s to 101-107 s) as its stages double from
~750 to ~1,500 requests (20-35/s, then 40-60/s) where kvplan's, which counts every wait, grows 3x
(49-56 s to 155-190 s), as a cap on the requests in flight would make it; its size is unknown.

Run: python bench/routing_fidelity.py [--source NAME] [--router NAME] [--seeds N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvplan.workload.routing import GATEWAY_DEFAULT_S

# One benchmark report each: its cluster, its workload (Inference-Perf's shared_prefix data, random
# token ids decoded), its load stages (rate/s, duration s; the first a warm-up, which no table
# covers: a ladder stage of the same rate is compared alone), its per-QPS TTFT p90 tables (s), the TTFT
# means of its precise, default and random schedulers (s; printed beside their gap, not a target), its
# precise scheduler's ITL means (s; the client stamps the blank line closing each SSE message too, so a
# token's gap is split in two and 2 x the ITL mean is the mean time per output token, printed beside
# kvplan's TPOT mean: the engine's decode pace, not a target) and ITL p90s (s; printed: with half the
# gaps ~0, a p90 far above the time per token means tokens reach the client in bursts), and each
# scheduler as the report configures it, in kvplan's words.
# X-37's cluster and workload (the module docstring), which X-37-repeat ran again: its load stages after
# the warm-up, and the rest
X37_STAGES = [(3, 210), (4, 180), (5, 120), (6, 120), (8, 90), (10, 70), (12, 60), (15, 50), (20, 50)]
X37_SETUP = {"model": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "H100-80GB", "tp": 4, "pods": 4,
             "pool": "{gpu_memory_utilization: 0.9}", "groups": 83, "per_group": 3, "system": 8000, "question": 1000,
             "output": 1000}
SOURCES = {
    # See the module docstring.
    "X-37": {
        **X37_SETUP,
        "stages": [(9, 30), *X37_STAGES],
        "measured": {
            "precise": {3: 0.201, 4: 0.277, 5: 0.281, 6: 0.281, 8: 0.280, 10: 0.282, 12: 0.282, 15: 0.288,
                        20: 0.290},
            "default": {3: 0.399, 4: 0.700, 5: 0.900, 6: 0.794, 8: 1.110, 10: 1.309, 12: 1.199, 15: 1.900,
                        20: 43.568},
            "load": {3: 2.400, 4: 16.101, 5: 28.581, 6: 59.389, 8: 73.762, 10: 86.063, 12: 94.109, 15: 114.672,
                     20: 173.540},
            "random": {3: 1.502, 4: 23.480, 5: 41.795, 6: 62.490, 8: 78.656, 10: 83.002, 12: 98.661,
                       15: 139.286, 20: 176.975},
        },
        "mean": {"precise": {3: 0.144, 4: 0.182, 5: 0.188, 6: 0.195, 8: 0.199, 10: 0.202, 12: 0.202,
                             15: 0.210, 20: 0.201},
                 "default": {3: 0.207, 4: 0.236, 5: 0.307, 6: 0.254, 8: 0.399, 10: 0.466, 12: 0.420, 15: 1.294,
                             20: 7.609},
                 "random": {3: 0.852, 4: 9.475, 5: 15.998, 6: 30.389, 8: 39.117, 10: 41.480, 12: 53.513, 15: 61.425,
                            20: 94.952}},
        "itl_mean": {"precise": {3: 0.013, 4: 0.014, 5: 0.015, 6: 0.016, 8: 0.018, 10: 0.020, 12: 0.021, 15: 0.024,
                                 20: 0.029}},
        "itl_p90": {"precise": {3: 0.087, 4: 0.078, 5: 0.079, 6: 0.081, 8: 0.084, 10: 0.088, 12: 0.085, 15: 0.079,
                                20: 0.100}},
        "routers": {
            "random": "{policy: random, gateway_s: GATEWAY}",
            "load": "{policy: llm_d, prefix_weight: 0}",
            "default": "{policy: llm_d}",
            "precise": "{policy: llm_d, index: precise, prefix_score: min_max}",
        },
    },
    # llm-d's "X-70R-6kSys" Inference-Perf report (found in the search index by its title line; its
    # source path is not given there): 8 vLLM pods of Qwen/Qwen3-32B, 307,328 KV tokens a pod as the
    # report states (the GPU and TP are not stated: H100-80GB at TP2 and utilization 0.9 is the
    # layout whose start-up pool kvplan computes nearest it, 304,762 tokens; H200 at TP1 gives 253k,
    # A100-80GB at TP2 318k; and the precise scheduler's decode pace at 3/s, 2 x its ITL mean 0.022 s,
    # is kvplan's 0.021 s on H100 at TP2, 0.034 s on A100 at TP2); shared_prefix 150 groups x 5
    # prompts of a 6,000-token system prompt + a 1,200-token question, 1,000 output tokens
    # (ignore_eos), Poisson stages (Inference-Perf's PoissonLoadTimer: a Poisson count each second,
    # spread over it). The pool is the report's.
    # Its schedulers: estimated-scheduling = prefix-cache-scorer 1 (hashBlockSize 64 characters, 256
    # blocks: 4,096 tokens at kvplan's 4 characters a token) + kv-cache-scorer 1 + queue-scorer 1;
    # load = queue 1 + kv 1; precise = precise prefix-cache-scorer 3 + kv 2 + queue 2 (its scores taken
    # min-max normalised as in X-37; kvplan routes 96% of the blocks to a hit either way); random.
    "X-70R-6kSys": {
        "model": "Qwen/Qwen3-32B", "gpu": "H100-80GB", "tp": 2, "pods": 8, "pool": "{slots: 307328}",
        "groups": 150, "per_group": 5, "system": 6000, "question": 1200, "output": 1000,
        "stages": [(15, 50), (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21),
                   (40, 38), (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25)],
        "measured": {
            "precise": {3: 0.498, 10: 0.600, 15: 0.400, 20: 0.600, 22: 0.500, 25: 0.583, 30: 0.509, 35: 0.500,
                        40: 0.488, 43: 0.500, 46: 0.589, 49: 0.600, 52: 0.507, 55: 0.600, 57: 0.600, 60: 0.500},
            "default": {3: 0.497, 10: 0.499, 15: 0.400, 20: 0.600, 22: 0.700, 25: 0.609, 30: 0.708, 35: 2.459,
                        40: 43.018, 43: 43.515, 46: 44.930, 49: 46.335, 52: 47.284, 55: 50.108, 57: 49.930,
                        60: 50.226},
            "load": {3: 1.609, 10: 4.124, 15: 7.002, 20: 77.707, 22: 72.972, 25: 85.979, 30: 83.806, 35: 88.086,
                     40: 100.911, 43: 101.524, 46: 105.884, 49: 105.015, 52: 108.572, 55: 110.681, 57: 113.278,
                     60: 110.184},
            "random": {3: 0.820, 10: 1.398, 15: 2.299, 20: 70.273, 22: 78.420, 25: 82.943, 30: 86.182,
                       35: 91.519, 40: 101.272, 43: 101.142, 46: 101.265, 49: 103.514, 52: 105.004, 55: 104.321,
                       57: 106.816, 60: 105.988},
        },
        "mean": {"precise": {3: 0.291, 10: 0.335, 15: 0.249, 20: 0.363, 22: 0.300, 25: 0.303, 30: 0.296,
                             35: 0.275, 40: 0.269, 43: 0.281, 46: 0.293, 49: 0.311, 52: 0.288, 55: 0.308,
                             57: 0.319, 60: 0.283},
                 "default": {3: 0.300, 10: 0.271, 15: 0.232, 20: 0.329, 22: 0.407, 25: 0.370, 30: 0.373,
                             35: 2.780},
                 "random": {3: 0.622, 10: 0.826, 15: 1.278, 20: 25.073, 22: 28.185, 25: 30.689, 30: 32.212,
                            35: 34.043, 40: 54.196, 43: 53.247, 46: 53.572, 49: 56.130, 52: 56.035, 55: 54.844,
                            57: 56.803, 60: 57.426}},
        "itl_mean": {"precise": {3: 0.011, 10: 0.013, 15: 0.015, 20: 0.021, 22: 0.020, 25: 0.021, 30: 0.021,
                                 35: 0.021, 40: 0.027, 43: 0.028, 46: 0.028, 49: 0.029, 52: 0.029, 55: 0.029,
                                 57: 0.029, 60: 0.029}},
        "itl_p90": {"precise": {3: 0.022, 10: 0.028, 15: 0.032, 20: 0.048, 22: 0.049, 25: 0.050, 30: 0.049,
                                35: 0.048, 40: 0.095, 43: 0.091, 46: 0.086, 49: 0.062, 52: 0.062, 55: 0.061,
                                57: 0.061, 60: 0.061}},
        "routers": {
            "random": "{policy: random, gateway_s: GATEWAY}",
            "load": "{policy: llm_d, prefix_weight: 0}",
            "default": "{policy: llm_d, prefix_weight: 1, max_prefix_tokens: 4096}",
            "precise": "{policy: llm_d, index: precise, prefix_weight: 3, kv_cache_weight: 2, queue_weight: 2, "
                       "prefix_score: min_max}",
        },
    },
    # A second Inference-Perf report of X-37's workload and cluster (llm-d/llm-d-kv-cache-manager,
    # benchmarking/37-capacity/README.md at edb766fd: "X-37 - Long prefix (~8k)", 4 vLLM pods of the
    # 70B, 461,376 KV tokens a pod; warm-up 10/s for 25 s, then X-37's stages), which states every
    # scheduler's EndpointPickerConfig: random-picker; load = active-request-scorer 1 + kv-cache-scorer
    # 1; estimate-prefix-cache_load = active-request 1 + kv 1 + prefix-cache-scorer 2 with hashBlockSize
    # 256 (characters, 64 tokens), maxPrefixBlocksToMatch 256 and lruCapacityPerServer 2200 (the
    # index remembers 2,200 blocks of 64 tokens a pod, 140,800 tokens, a third of the pod's KV; the L1
    # report's comment sizes that number for its 141K-token pods); precise-prefix-cache_load = precise
    # prefix 2 (blockSize 64) + kv 1 + active-request 1, its scores taken min-max normalised as X-37's.
    "X-37-repeat": {
        **X37_SETUP,
        "stages": [(10, 25), *X37_STAGES],
        "measured": {
            "precise": {3: 0.400, 4: 0.486, 5: 0.400, 6: 0.400, 8: 0.400, 10: 0.400, 12: 0.400, 15: 0.400,
                        20: 0.400},
            "default": {3: 2.200, 4: 3.402, 5: 4.322, 6: 30.211, 8: 64.280, 10: 66.291, 12: 81.511, 15: 103.779,
                        20: 165.276},
            "load": {3: 3.299, 4: 15.818, 5: 31.501, 6: 88.121, 8: 101.514, 10: 129.421, 12: 115.098, 15: 148.000,
                     20: 208.052},
            "random": {3: 2.000, 4: 22.814, 5: 30.994, 6: 56.371, 8: 74.757, 10: 88.089, 12: 96.284, 15: 128.434,
                       20: 197.010},
        },
        "mean": {"precise": {3: 0.246, 4: 0.304, 5: 0.270, 6: 0.271, 8: 0.248, 10: 0.242, 12: 0.255, 15: 0.247,
                             20: 0.250},
                 "default": {3: 1.007, 4: 1.497, 5: 1.919, 6: 9.700, 8: 20.389, 10: 26.567, 12: 31.615, 15: 38.253,
                             20: 71.632},
                 "random": {3: 1.102, 4: 7.257, 5: 11.988, 6: 23.742, 8: 40.124, 10: 46.359, 12: 49.556, 15: 58.760,
                            20: 93.345}},
        "itl_mean": {"precise": {3: 0.013, 4: 0.015, 5: 0.016, 6: 0.017, 8: 0.019, 10: 0.020, 12: 0.022, 15: 0.024,
                                 20: 0.031}},
        "itl_p90": {"precise": {3: 0.088, 4: 0.095, 5: 0.100, 6: 0.100, 8: 0.100, 10: 0.100, 12: 0.100, 15: 0.089,
                                20: 0.100}},
        "routers": {
            "random": "{policy: random, gateway_s: GATEWAY}",
            "load": "{policy: llm_d, prefix_weight: 0, queue_weight: 0, active_request_weight: 1}",
            "default": "{policy: llm_d, queue_weight: 0, active_request_weight: 1, lru_capacity_blocks: 2200}",
            "precise": "{policy: llm_d, index: precise, prefix_score: min_max, queue_weight: 0, "
                       "active_request_weight: 1}",
        },
    },
    # llm-d's "L1" Inference-Perf report (short prompts; found in the search index by its title line):
    # 4 vLLM pods of meta-llama/Llama-3.1-70B-Instruct at TP4 (GPU not stated; H100-80GB taken, as
    # X-37's cluster), 141,056 KV tokens a pod as the report states; 100 groups x 2 prompts of a
    # 3,500-token system prompt + 512-token question, 192 output tokens; constant stages (exponential
    # gaps scaled to the stage). Schedulers: estimate-prefix-cache = queue 1 + kv 1 + prefix 1
    # (hashBlockSize 256 = 4 x 64: kvplan's default cap; lruCapacityPerServer 2200, "per-Pod KVCache
    # size (~141K) / block size (64)"); load = queue 1 + kv 1; precise = prefix 1 +
    # kv 1 + queue 1; random.
    "L1": {
        "model": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "H100-80GB", "tp": 4, "pods": 4,
        "pool": "{slots: 141056}", "groups": 100, "per_group": 2, "system": 3500, "question": 512, "output": 192,
        "stages": [(10, 20), (3, 120), (4, 100), (5, 90), (6, 60), (8, 60), (10, 50), (12, 50), (14, 35),
                   (16, 30), (18, 30), (20, 30)],
        "measured": {
            "precise": {3: 5.711, 4: 5.223, 5: 3.078, 6: 5.492, 8: 13.585, 10: 9.563, 12: 2.353, 14: 9.660,
                        16: 5.267, 18: 9.844, 20: 0.780},
            "default": {3: 10.807, 4: 17.734, 5: 14.250, 6: 32.576, 8: 15.299, 10: 13.764, 12: 10.769,
                        14: 12.450, 16: 11.791, 18: 15.229, 20: 14.594},
            "load": {3: 71.080, 4: 39.528, 5: 49.317, 6: 25.308, 8: 43.550, 10: 44.439, 12: 33.256, 14: 31.318,
                     16: 26.396, 18: 29.354, 20: 52.725},
            "random": {3: 25.977, 4: 27.291, 5: 29.446, 6: 25.441, 8: 30.898, 10: 30.396, 12: 28.584,
                       14: 30.219, 16: 27.666, 18: 20.470, 20: 19.254},
        },
        "mean": {"precise": {3: 3.101, 4: 1.351, 5: 2.069, 6: 1.407, 8: 4.582, 10: 3.909, 12: 1.415, 14: 2.510,
                             16: 1.526, 18: 2.803, 20: 0.556}},
        "routers": {
            "random": "{policy: random, gateway_s: GATEWAY}",
            "load": "{policy: llm_d, prefix_weight: 0}",
            "default": "{policy: llm_d, prefix_weight: 1, lru_capacity_blocks: 2200}",
            "precise": "{policy: llm_d, index: precise, prefix_weight: 1, prefix_score: min_max}",
        },
    },
}
# The sources whose targets count (issue 28): the L1 report's every scheduler, random included, sees
# TTFTs of 20-70 s at 3-6/s with 4k-token prompts and 192-token outputs on four 70B pods (and its
# precise scheduler's p90 swings 0.8-13.6 s between neighbouring rates): no engine model of that
# cluster queues so long at that load, so its figures are printed, not held to a target.
TARGETED = ("X-37", "X-37-repeat", "X-70R-6kSys")
GRID_MS, NEAR_MS = 100, 2  # the reports' TTFT p90s sit on multiples of 0.1 s (quantized_share)
SEEDS = 4  # the trace's and the routers' seeds: one stage's p90 moves with them (random at 3/s: 1.42-1.95 s)
GATEWAY = GATEWAY_DEFAULT_S["llm_d"]  # every scheduler of the reports is llm-d's EPP behind its gateway
TARGET = {"random": 1.25, "load": 1.25, "default": 2.0, "precise": 2.0}  # max ratio either way
DRAIN_S = 2000.0  # idle time between stages: every request of a stage has finished by then
BLOCK = 64  # every report's vLLM block size (the precise indexer's blockSize 64)

FLEET = """name: llm-d-report
experiment: fleet
seed: 0
model: {model}
gpu: {gpu}
tp: {tp}
pool: {pool}
allocators: [{{kind: paged, block_size: {block}}}]
requests:
  trace: {{format: agentic, path: {trace}}}
replicas:
  - {{count: {pods}}}
router: {router}
"""


def trace(src: dict, seed: int = 0) -> tuple[list[dict], list[int]]:
    """The benchmark's requests (agentic JSON entries) and each one's stage (its index in the
    source's stages; the first, the warm-up, has no table of its own)."""
    rng = np.random.default_rng(seed)
    system, question, per_group = src["system"], src["question"], src["per_group"]
    system_blocks, question_blocks = system // BLOCK, (system + question) // BLOCK - system // BLOCK
    prompts = [(g, p) for g in range(src["groups"]) for p in range(per_group)]
    prompts = [prompts[i] for i in rng.permutation(len(prompts))]
    first_question = src["groups"] * system_blocks
    requests, stages, start = [], [], 0.0
    for k, (rate, duration) in enumerate(src["stages"]):
        times = start + np.cumsum(rng.exponential(1 / rate, int(rate * duration)))
        times = times[times < start + duration]
        for i, t in enumerate(times.tolist()):
            g, p = prompts[i % len(prompts)]
            ids = list(range(g * system_blocks, (g + 1) * system_blocks))
            q = first_question + (g * per_group + p) * question_blocks
            ids += list(range(q, q + question_blocks))
            requests.append({"t": round(t, 6), "in": system + question, "out": src["output"], "hash_ids": ids})
            stages.append(k)
        start += duration + DRAIN_S
    return requests, stages


def simulate(source: str, name: str, seed: int, tmp: Path) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """One run of a router over the trace of `seed` (the workload's seed too): every request's TTFT,
    its stage, the fleet's prefix hit rate and every request's TPOT."""
    from kvplan.experiments import load
    from kvplan.fleet.run import simulate_fleet

    src = SOURCES[source]
    requests, stages = trace(src, seed)
    path = tmp / f"{source}-trace{seed}.json"
    path.write_text(json.dumps({"block_size": BLOCK, "requests": requests}))
    fleet = tmp / f"{source}-{name}{seed}.yaml"
    router = src["routers"][name].replace("GATEWAY", f"{GATEWAY}")
    fleet.write_text(FLEET.format(model=src["model"], gpu=src["gpu"], tp=src["tp"], pool=src["pool"], block=BLOCK,
                                  trace=path, pods=src["pods"], router=router).replace("seed: 0", f"seed: {seed}"))
    result = simulate_fleet(load(fleet), record=True)
    return result.requests["ttft_s"], np.asarray(stages), result.prefix_hit_rate, result.requests["tpot_s"]


def quantized_share(values) -> tuple[int, int]:
    """How many of `values` (s, printed to the ms; those under 3 s) lie within NEAR_MS of a multiple of
    GRID_MS, and how many there are. A quantity spread continuously lands there (2 x NEAR_MS + 1) /
    GRID_MS = 5% of the time."""
    ms = [round(v * 1000) for v in values if v < 3.0]
    return sum(min(m % GRID_MS, GRID_MS - m % GRID_MS) <= NEAR_MS for m in ms), len(ms)


def _arg(flag: str):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else None


def main() -> None:
    sources = [_arg("--source")] if _arg("--source") else list(SOURCES)
    seeds = range(int(_arg("--seeds") or SEEDS))
    print(f"{len(seeds)} seeds; TTFT p90 in s per stage rate: measured, kvplan's median over the seeds "
          f"[its lowest-highest], ratio; every router behind llm-d's gateway sees {GATEWAY * 1e3:g} ms of it")
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        for source in sources:
            src = SOURCES[source]
            names = [_arg("--router")] if _arg("--router") else list(src["routers"])
            print(f"== {source}: {src['pods']} x {src['model']} (tp {src['tp']}), prompts {src['system']:,} + "
                  f"{src['question']:,}, output {src['output']:,}; {len(trace(src)[0]):,} requests"
                  f"{'' if source in TARGETED else ' (printed, no target)'}", flush=True)
            for name in names:
                t0 = time.perf_counter()
                runs = [simulate(source, name, seed, Path(tmp)) for seed in seeds]
                wall = time.perf_counter() - t0
                cells, worst = [], 1.0
                measured = src["measured"][name]
                for k, (rate, _) in enumerate(src["stages"]):
                    if k == 0 or rate not in measured:  # the warm-up has no table of its own
                        continue
                    p90 = sorted(float(np.percentile(ttft[stages == k], 90)) for ttft, stages, _, _ in runs)
                    mean = float(np.median([np.mean(ttft[stages == k]) for ttft, stages, _, _ in runs]))
                    tpot = float(np.median([np.mean(t[stages == k]) for _, stages, _, t in runs]))
                    sim = float(np.median(p90))
                    got = sim / measured[rate]
                    worst = max(worst, got, 1 / got)
                    means = src.get("mean", {}).get(name, {})
                    means = (f"; mean {means[rate]:.3g} vs {mean:.3g} (gap {means[rate] - mean:+.3f})"
                             if rate in means else "")
                    itl = src.get("itl_mean", {}).get(name, {})
                    means += f"; TPOT {2 * itl[rate]:.3f} vs {tpot:.3f}" if rate in itl else ""
                    itl90 = src.get("itl_p90", {}).get(name, {})
                    means += f", ITL p90 {itl90[rate]:.3f}" if rate in itl90 else ""
                    cells.append(f"{rate:>2}/s {measured[rate]:8.3g} {sim:8.3g} [{p90[0]:.3g}-{p90[-1]:.3g}] "
                                 f"({got:.2f}){means}")
                ok = worst <= TARGET[name]
                if source in TARGETED and not ok:
                    misses.append(f"{source} {name}")
                hit = np.mean([h for _, _, h, _ in runs])
                verdict = ("ok" if ok else "MISSED") if source in TARGETED else "no target"
                print(f"{name:8s} hit rate {100 * hit:5.1f}%, worst ratio {worst:5.2f} "
                      f"(target within {TARGET[name]:g}x) [{verdict}] in {wall:.0f} s", flush=True)
                for cell in cells:
                    print("    " + cell, flush=True)
            on_grid, count = quantized_share(v for name in names for v in src["measured"][name].values())
            on_mean, means = quantized_share(v for name in names for v in src.get("mean", {}).get(name, {}).values())
            print(f"measured TTFT p90s under 3 s within {NEAR_MS} ms of a multiple of {GRID_MS} ms: "
                  f"{on_grid} of {count}; of the means: {on_mean} of {means} (by chance: "
                  f"{100 * (2 * NEAR_MS + 1) / GRID_MS:.0f}%)", flush=True)
    print("all within their targets" if not misses else f"missed: {', '.join(misses)}")


if __name__ == "__main__":
    main()
