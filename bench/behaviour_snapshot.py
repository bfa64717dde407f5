"""Behaviour snapshot: record every shipped command's output, then show it is byte-identical later.

A refactoring (a move of modules, a rename of the engine's state) must not change a single byte of
what kvplan prints. This script runs, each in its own process:
- `kvplan size MODEL --json` for every catalog model, alone and on an H100-80GB at 8,192 tokens
  (and at tp=2 with fp8 KV, so the TP and dtype paths are covered);
- `kvplan simulate WORKLOAD --json` for every shipped workload, plus the options that change what
  runs: the block-size sweep, the rate sweep, the prefix-cache sweep, and the serve CSV;
- `kvplan check workloads/checks.yaml --json` with the shipped baseline, and `kvplan models/gpus`;
- the README's `size`, `step`, flag-only `simulate`, fleet and `calibrate` commands, three small
  `plan` searches (flags, text view, a workload file), `schema` and `examples`.

Record before the change, compare after:
    python bench/behaviour_snapshot.py record /tmp/before
    python bench/behaviour_snapshot.py compare /tmp/before
`compare` prints one line per difference and exits 1 on any; it prints the count of identical
outputs otherwise. Workloads whose trace is not in ../shared are skipped in both modes alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"


def _kvplan() -> list[str]:
    return [sys.executable, "-m", "kvplan"]


def cases(tmp: Path) -> dict[str, list[str]]:
    """Name -> argument list. Names are file names in the snapshot folder."""
    models = json.loads(subprocess.run(_kvplan() + ["models", "--json"], capture_output=True,
                                       check=True, cwd=ROOT, text=True).stdout)["models"]
    out: dict[str, list[str]] = {"models": ["models", "--json"], "gpus": ["gpus", "--json"]}
    for m in models:
        name = m["model"].replace("/", "--")
        out[f"size--{name}"] = ["size", m["model"], "--json"]
        out[f"size-h100--{name}"] = ["size", m["model"], "--gpu", "H100-80GB", "--tokens", "8192",
                                     "--json"]
        out[f"size-tp2-fp8--{name}"] = ["size", m["model"], "--kv-memory", "20GiB", "--tp", "2",
                                        "--kv-dtype", "fp8", "--json"]
    for path in sorted(WORKLOADS.glob("*.yaml")):
        if path.name.startswith("checks"):
            continue
        out[f"simulate--{path.stem}"] = ["simulate", str(path), "--json"]
    extra = {
        "simulate-sweep--lesson": ["simulate", "workloads/lesson.yaml", "--block-sizes", "1-64", "--json"],
        "simulate-rates--kwon": ["simulate", "workloads/kwon-sharegpt.yaml", "--rates", "0.5,1,2",
                                 "--latency-bound", "0.1", "--json"],
        "simulate-blocks--kwon": ["simulate", "workloads/kwon-sharegpt.yaml", "--block-sizes", "8,16,32", "--json"],
        "simulate-cache--mooncake": ["simulate", "workloads/mooncake-prefix.yaml", "--cache-blocks",
                                     "1000,5000", "--json"],
        "simulate-csv--kwon": ["simulate", "workloads/kwon-sharegpt.yaml", "--csv", str(tmp / "kwon.csv"),
                               "--json"],
        "check": ["check", "workloads/checks.yaml", "--baseline", "workloads/checks-baseline.json", "--json"],
        "simulate-text--lesson": ["simulate", "workloads/lesson.yaml"],
        "size-text--llama3": ["size", "meta-llama/Meta-Llama-3-8B", "--kv-memory", "11.12GiB"],
        "size-text--deepseek": ["size", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--gpu", "H200", "--tokens", "32768"],
        "size-text--grid": ["size", "meta-llama/Llama-3.1-70B", "--gpu", "H100-80GB,H200,L40S", "--tp", "1,2,4",
                            "--tokens", "32K"],
        "size-json--qwen3next": ["size", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--gpu", "H200", "--tp", "2",
                                 "--no-enable-prefix-caching", "--json"],
        "step-text--llama8b": ["step", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--tp", "2",
                               "--batch", "64", "--context", "4096"],
        "step-json--llama8b": ["step", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--json"],
        "simulate-flags--l40s": ["simulate", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S",
                                 "--rate", "10", "--prompt", "1000", "--output", "200", "--count", "2000", "--json"],
        "simulate-text--agentic": ["simulate", "workloads/agentic-prefix.yaml"],
        "simulate-text--fleet": ["simulate", "workloads/agentic-fleet.yaml"],
        "plan-json--llama8b": ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--rate", "20", "--prompt", "1000",
                               "--output", "200", "--ttft-p99", "2", "--tpot-p99", "0.05", "--gpu",
                               "H100-80GB,L40S", "--tp", "1,2", "--count", "2000", "--workers", "1", "--json"],
        "plan-text--llama8b": ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--rate", "8", "--prompt", "1000",
                               "--output", "200", "--ttft-p99", "2", "--tpot-p99", "0.05", "--gpu", "L40S",
                               "--tp", "1", "--count", "2000", "--workers", "1"],
        "plan-workload--agentic": ["plan", "meta-llama/Llama-3.1-8B-Instruct", "--workload",
                                   "workloads/agentic-prefix.yaml", "--ttft-p99", "3", "--gpu", "H100-80GB",
                                   "--tp", "1", "--workers", "1", "--json"],
        "calibrate-json--gpustack": ["calibrate", *sorted(str(p) for p in (ROOT / "tests/data/bench_results").glob(
            "gpustack-qwen3-8b-h100-c*.json")), "--model", "Qwen/Qwen3-8B", "--gpu", "H100-80GB", "--vllm-version", "0.11.0", "--out", str(tmp / "h100-qwen3-8b.yaml"),
                                     "--json"],
        "schema": ["schema"],
        "examples": ["examples", "--json"],
    }
    out.update(extra)
    return out


def run_one(args: list[str], tmp: Path) -> bytes:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="120", NO_COLOR="1")
    proc = subprocess.run(_kvplan() + args, capture_output=True, cwd=ROOT, env=env)
    blob = b"rc=%d\n" % proc.returncode + proc.stdout + b"\n--stderr--\n" + proc.stderr
    blob = blob.replace(str(tmp).encode(), b"$TMP")  # the temporary directory differs per run
    for flag in ("--csv", "--out"):  # a file the command writes, each case under a name of its own
        written = Path(args[args.index(flag) + 1]) if flag in args else None
        if written is not None and written.exists():
            blob += f"\n--{flag[2:]} sha256--\n".encode() + hashlib.sha256(written.read_bytes()).hexdigest().encode()
            written.unlink()
    return blob


def snapshot() -> dict[str, bytes]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        todo = cases(tmp)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = dict(zip(todo, pool.map(lambda a: run_one(a, tmp), todo.values())))
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "compare"):
        print(__doc__.strip().splitlines()[0])
        print("usage: python bench/behaviour_snapshot.py record|compare DIR")
        return 2
    mode, folder = argv[0], Path(argv[1])
    results = snapshot()
    if mode == "record":
        folder.mkdir(parents=True, exist_ok=True)
        for name, blob in results.items():
            (folder / f"{name}.out").write_bytes(blob)
        print(f"recorded {len(results)} outputs in {folder}")
        return 0
    recorded = {p.stem: p.read_bytes() for p in folder.glob("*.out")}
    diffs = [n for n in sorted(set(recorded) | set(results)) if recorded.get(n) != results.get(n)]
    for name in diffs:
        where = "missing now" if name not in results else "new" if name not in recorded else "differs"
        print(f"{name}: {where}")
    same = len(results) - len([d for d in diffs if d in results])
    print(f"{same} of {len(recorded)} recorded outputs byte-identical, {len(diffs)} differ")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
