"""Speed target (issue 14): `kvplan plan` searching >= 500 configurations over a 10,000-request
workload on 2 cores in <= 60 s; prints configurations per second.

Llama-3.1-8B-Instruct, 1,000 + 200 tokens, 20 requests/s wanted, p99 TTFT <= 2 s and TPOT <=
50 ms, the shipped prices: every priced GPU x TP 1, 2, 4, 8 x KV auto/fp8 x max_num_seqs 64,
128, 256, 512, 1024 (14 x 4 x 2 x 5 = 560 configurations), 2 workers. `--quick` runs the same
space with 1,000 requests per evaluation to see the scaling.

Run: python bench/plan.py [--quick]
"""

from __future__ import annotations

import sys
import time

TARGET_S = 60.0


def main() -> None:
    from kvplan.plan.prices import load_prices
    from kvplan.plan.search import Config, Targets, Traffic, search

    count = 1_000 if "--quick" in sys.argv else 10_000
    prices, _ = load_prices()
    configs = [Config(g, tp, kv, seqs) for g in sorted(prices) for tp in (1, 2, 4, 8)
               for kv in ("auto", "fp8") for seqs in (64, 128, 256, 512, 1024)]
    t0 = time.perf_counter()
    rows = search("meta-llama/Llama-3.1-8B-Instruct", Traffic(20.0, 1000, 200, count), Targets(2.0, 0.05),
                  configs, prices, workers=2)
    wall = time.perf_counter() - t0
    sims = sum(r.evaluations for r in rows)
    ok = len(configs) >= 500 and count >= 10_000 and wall <= TARGET_S  # --quick never meets it
    print(f"{len(configs)} configurations x {count:,} requests in {wall:.1f} s on 2 workers = "
          f"{len(configs) / wall:.1f} configurations/s ({sims:,} serve simulations, "
          f"{sum(1 for r in rows if r.feasible)} feasible; best {rows[0].config.label} "
          f"${rows[0].cost_per_hour:.2f}/h)  [{'ok' if ok else 'MISSED'}]")


if __name__ == "__main__":
    main()
