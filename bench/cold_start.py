"""Cold start of `kvplan size meta-llama/Meta-Llama-3-8B --json`: median wall time over 10 runs.

Target (issue 2): <= 0.25 s on the project's 2-core machine. Run: python bench/cold_start.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = 10


def main() -> None:
    exe = Path(sys.executable).with_name("kvplan")  # the console script of this interpreter's kvplan
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "kvplan"]
    cmd += ["size", "meta-llama/Meta-Llama-3-8B", "--json"]
    subprocess.run(cmd, check=True, capture_output=True)  # warm the file cache once
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print(f"kvplan size cold start: median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}, max {max(times):.3f}) over {RUNS} runs; target <= 0.25 s")


if __name__ == "__main__":
    main()
