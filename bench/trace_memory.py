"""Memory target: trace readers stream, so memory does not grow with the trace; `limit:` stops reading.

Writes a synthetic Azure-format CSV of 3,000,000 rows (about 150 MB, in a temporary folder) and
reads it, each in its own process so that its peak RSS is its own:
- `limit`: `limit: 2000` (the issue's case: about 1 GB before streaming), which must read only
  the first rows;
- `all`: every row, chunk by chunk, as the serving engine consumes them;
- `small`: the same reading of a 30,000-row file, for comparison: `all` should sit near it.
Prints the wall time and peak RSS of each.

Run: python bench/trace_memory.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = 3_000_000
TARGET_RSS = 256 * 2**20


def write_trace(path: Path, rows: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for i in range(rows):
            s = i // 50
            f.write(f"2023-11-{16 + s // 86_400:02d} {s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}."
                    f"{i % 50 * 2:02d}00000,{100 + i % 997},{10 + i % 89}\n")


def read(path: str, limit: str) -> None:
    from kvplan.workload.traces import open_trace

    t0 = time.perf_counter()
    trace = open_trace("azure", path, limit=None if limit == "none" else int(limit), max_model_len=8192)
    count = sum(len(c) for c in trace.chunks())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{count:>9,} requests read in {time.perf_counter() - t0:6.2f} s, peak RSS {rss / 2**20:6.0f} MiB"
          f"  [{'ok' if rss <= TARGET_RSS else 'OVER'}]")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--read":
        read(sys.argv[2], sys.argv[3])
        return
    with tempfile.TemporaryDirectory() as folder:
        big, small = Path(folder) / "big.csv", Path(folder) / "small.csv"
        write_trace(big, ROWS)
        write_trace(small, ROWS // 100)
        print(f"trace of {ROWS:,} rows, {big.stat().st_size / 2**20:.0f} MiB; target peak RSS <= "
              f"{TARGET_RSS >> 20} MiB")
        for name, path, limit in (("limit", big, "2000"), ("all", big, "none"), ("small", small, "none")):
            print(f"{name:>6}: ", end="", flush=True)
            subprocess.run([sys.executable, __file__, "--read", str(path), limit], check=True)


if __name__ == "__main__":
    main()
