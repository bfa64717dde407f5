"""Speed target (issue 25): `kvplan plan` searching >= 500 configurations over a 10,000-request
workload on 2 cores in <= 15 s; prints configurations per second and what each step settled.

Llama-3.1-8B-Instruct, 1,000 + 200 tokens, 20 requests/s wanted, p99 TTFT <= 2 s and TPOT <=
50 ms, the shipped prices of every tier: every priced GPU x TP 1, 2, 4, 8 x KV auto/fp8 x
max_num_seqs 64, 128, 256, 512, 1024 (14 x 4 x 2 x 5 = 560 configurations), 2 workers, the
default headroom and fresh seeds (the fleet check of the CLI is not part of this figure).
`--quick` runs the same space with 1,000 requests per run to see the scaling.

Run: python bench/plan.py [--quick]
"""

from __future__ import annotations

import sys
import time

TARGET_S = 15.0


def main() -> None:
    from kvplan.plan.prices import TIERS, load_prices
    from kvplan.plan.search import Config, Rules, SearchStats, Targets, Traffic, search

    count = 1_000 if "--quick" in sys.argv else 10_000
    book = load_prices(tiers=TIERS)
    configs = [Config(g, tp, kv, seqs) for g in book.gpus() for tp in (1, 2, 4, 8)
               for kv in ("auto", "fp8") for seqs in (64, 128, 256, 512, 1024)]
    stats = SearchStats()
    t0 = time.perf_counter()
    rows = search("meta-llama/Llama-3.1-8B-Instruct", Traffic(20.0, 1000, 200, count), Targets(2.0, 0.05),
                  configs, book, Rules(), workers=2, stats=stats)
    wall = time.perf_counter() - t0
    ok = len(configs) >= 500 and count >= 10_000 and wall <= TARGET_S  # --quick never meets it
    best = rows[0]
    print(f"{len(configs)} configurations x {count:,} requests in {wall:.1f} s on 2 workers = "
          f"{len(configs) / wall:.1f} configurations/s; {stats.not_started} would not start, {stats.ruled_out} "
          f"ruled out by their bounds, {stats.bounded} beaten before a run, {stats.simulated} simulated, "
          f"{stats.verified} checked on fresh seeds "
          f"({stats.runs:,} runs, {stats.reused:,} shared) in {stats.waves} waves; best {best.config.label} "
          f"x{best.replicas} ${best.cost_per_hour:.2f}/h  [{'ok' if ok else 'MISSED'}]")


if __name__ == "__main__":
    main()
