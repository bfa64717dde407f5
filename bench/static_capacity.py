"""Speed target: the static capacity experiment on 1,000,000 requests, every allocator, well under 1 s.

Builds 1,000,000 final lengths drawn uniformly from 100..2,000 tokens (an invented workload, the
lesson's distribution at a larger scale), runs the closed form for contiguous max/pow2/oracle and
paged B = 1, 2, 4, 8, 16, 32, 64, and prints the median wall time of a few runs and the figure.
The pool holds 2**29 slots, about half of the stream's tokens, so every allocator stops partway
(a memory effect, not a throughput benchmark).

Run: python bench/static_capacity.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from kvplan.memory.capacity import BLOCK_SIZES, capacity_sweep

NUM_REQUESTS = 1_000_000
SLOTS = 2**29
LIMIT = 8192
RUNS = 7
TARGET_S = 1.0


def main() -> None:
    lengths = np.random.default_rng(0).integers(100, 2001, NUM_REQUESTS)
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        results = capacity_sweep(lengths, SLOTS, limit=LIMIT, block_sizes=BLOCK_SIZES)
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    print(f"{NUM_REQUESTS:,} requests, pool {SLOTS:,} slots, contiguous limit {LIMIT:,}; "
          f"{len(results)} allocators")
    print(f"wall time: median {median * 1000:.1f} ms of {RUNS} runs "
          f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}); target < {TARGET_S:.0f} s: "
          f"{'ok' if median < TARGET_S else 'MISSED'}")
    print(f"{'allocator':<18} {'admitted':>10} {'x max':>7} {'utilization':>12} {'wasted slots':>14}")
    base = results[0].admitted
    for r in results:
        print(f"{r.allocator:<18} {r.admitted:>10,} {r.admitted / base:>7.2f} "
              f"{r.utilization:>12.4f} {r.wasted_slots:>14,}")


if __name__ == "__main__":
    main()
