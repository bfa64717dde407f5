"""Speed target: the Mooncake conversation trace through the prefix cache, B = 16, in under 5 s.

The trace (12,031 requests, ~12K-token prompts, 512-token hash blocks) is read once, then replayed
with automatic prefix caching on, one request at a time (a pure LRU replay of the prompt blocks),
into the KV pool of Llama-3-8B on one H100-80GB as `kvplan size` computes it (bf16, gpu memory
utilization 0.92), and into the issue's round figure of 35,600 blocks. Prints the wall time of the
replay (parsing excluded, shown apart), requests per second and the hit rate.

`--sweep` also prints the hit rate against cache size, in blocks of 512 tokens and of 16 tokens
(the same token capacities), and saves a chart to /tmp/mooncake_hit_rate.png.

Run: python bench/prefix.py [--sweep]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from kvplan.replay.prefix import hit_rate_sweep, replay_prefix_cache
from kvplan.workload.traces import open_trace

SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACE = SHARED / "traces/mooncake-fast25/conversation_trace.jsonl"
BLOCK = 16
ISSUE_BLOCKS = 35_600
TARGET_S = 5.0
SWEEP_512 = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 300_000)  # 300K: never evicts
PNG = Path("/tmp/mooncake_hit_rate.png")


def pool_blocks() -> int:
    from kvplan.model.size import size

    return size("meta-llama/Meta-Llama-3-8B", gpu="H100-80GB", block_size=BLOCK).report.num_blocks


def replay(chunks, num_blocks: int) -> None:
    start = time.perf_counter()
    r = replay_prefix_cache(chunks, num_blocks, BLOCK)
    wall = time.perf_counter() - start
    print(f"{num_blocks:>7,} blocks of {BLOCK} ({num_blocks * BLOCK:,} token slots): "
          f"{wall:.2f} s, {r.requests / wall:,.0f} requests/s, hit rate {r.hit_rate:.4f}, "
          f"{r.stats.blocks_evicted:,} blocks evicted; target < {TARGET_S:.0f} s: "
          f"{'ok' if wall < TARGET_S else 'MISSED'}")  # fmt: skip


def sweep(chunks) -> None:
    rows = []
    for block_size in (512, 16):
        sizes = [n * 512 // block_size for n in SWEEP_512]
        start = time.perf_counter()
        results = hit_rate_sweep(lambda: chunks, sizes, block_size)
        print(f"block size {block_size}: sweep of {len(sizes)} sizes in "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
        rows.append(results)
    print(f"{'cache tokens':>13} {'blocks of 512':>14} {'hit rate':>9} {'blocks of 16':>13} "
          f"{'hit rate':>9}")
    for a, b in zip(*rows):
        print(f"{a.cache_tokens:>13,} {a.num_blocks:>14,} {a.hit_rate:>9.4f} {b.num_blocks:>13,} "
              f"{b.hit_rate:>9.4f}")  # fmt: skip
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for results, label in zip(rows, ("blocks of 512 tokens", "blocks of 16 tokens")):
        ax.plot([r.cache_tokens / 512 for r in results], [100 * r.hit_rate for r in results],
                marker="o", label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("LRU cache size (in 512-token blocks)")
    ax.set_ylabel("prefix cache hit rate (% of prompt tokens)")
    ax.set_title("Mooncake conversation trace, one request at a time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PNG, dpi=120)
    print(f"chart: {PNG}")


def main() -> None:
    start = time.perf_counter()
    chunks = list(open_trace("mooncake", TRACE).chunks())
    n = sum(len(c) for c in chunks)
    print(f"{TRACE.name}: {n:,} requests parsed in {time.perf_counter() - start:.2f} s")
    for num_blocks in (pool_blocks(), ISSUE_BLOCKS):
        replay(chunks, num_blocks)
    if "--sweep" in sys.argv[1:]:
        sweep(chunks)


if __name__ == "__main__":
    main()
