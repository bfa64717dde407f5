"""Regenerate the README's example outputs, tables and quoted figures from the tool itself.

Every number the README shows must be what the tool prints now: regenerated, never edited by hand.
Each region of README.md that shows what a command prints lies between two HTML comments, which
do not render:

    <!-- kvplan-readme: NAME -->
    ...
    <!-- /kvplan-readme -->

NAME is a block of BLOCKS below: the commands it runs (RUNS) and the formatter that turns what
they print into the region's text, either a console block (`$ kvplan ...` and its output,
verbatim, or the lines of it a block names) or a table or sentence made of the cells and lines
the tool prints (its tables are read back cell by cell at a width where none folds). Figures that
running prose quotes are FACTS (a pattern around the figure, and the output it comes from), and
statements of the prose that a number could make false are CLAIMS (the words they anchor on, and a
test on the outputs): a fact is rewritten with the rest, a claim that fails needs new words.

    python bench/readme.py               rewrite README.md in place (atomically)
    python bench/readme.py --check       exit 1 listing every block, fact and claim that differs
    python bench/readme.py --only A,B    just these blocks (and the facts and claims of their runs)
    python bench/readme.py --list        the blocks, their commands, and which are slow

Commands run as `python -m kvplan` of this checkout (PYTHONPATH), each in its own process, two at a
time, with COLUMNS as the block says, NO_COLOR=1 and HF_HUB_OFFLINE=1. A block whose trace is not
in ../shared, or that needs torch where it is not installed, is left as it is and listed as
skipped. A whole run takes about 10 minutes on 2 cores, most of it bench/timing_fidelity.py and bench/parallel_fidelity.py;
tests/test_readme.py checks every block, fact and claim that needs no slow run (KVPLAN_README_ALL=1:
all of them).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = ROOT.parent / "shared"  # where the shipped workloads' trace paths point (../../shared from workloads/)
AGENTIC = "traces/kv-cache-tester-agentic"
MOONCAKE = "traces/mooncake-fast25/conversation_trace.jsonl"
WIDE = 1000  # COLUMNS for the runs whose tables and sentences are read back: nothing folds or wraps
BEGIN = re.compile(r"^<!-- kvplan-readme: (\S+) -->$", re.M)  # markers are lines of their own
END = re.compile(r"^<!-- /kvplan-readme -->$", re.M)
REGION = re.compile(r"^<!-- kvplan-readme: (\S+) -->\n(.*?)\n?^<!-- /kvplan-readme -->$", re.S | re.M)


class ProseError(Exception):
    """A sentence of the README that the outputs no longer bear out: its words must change."""


def require(ok: bool, why: str) -> None:
    if not ok:
        raise ProseError(why)


# ---------------------------------------------------------------------------------------------
# Runs: one command each, as the README would show it


@dataclass(frozen=True)
class Run:
    command: str  # "kvplan ..." or "python bench/...", as shown: `\` continuations, a trailing # comment
    columns: int = WIDE
    slow: bool = False  # too long for the default test (KVPLAN_README_ALL=1 runs it)
    traces: tuple[str, ...] = ()  # files under ../shared it reads
    torch: bool = False
    workload: Callable[[], str] | None = None  # YAML written to {workload} in a temporary folder
    in_tmp: bool = False  # run in the temporary folder (a command that writes a file by a relative name)

    def missing(self) -> str | None:
        """Why this run cannot happen here, or None."""
        for rel in self.traces:
            if not (SHARED / rel).exists():
                return f"{SHARED / rel} is not there"
        if self.torch and importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        return None

    def argv(self, tmp: Path) -> list[str]:
        words = shlex.split(self.command.replace("\\\n", " "), comments=True)
        head = [sys.executable, "-m", "kvplan"] if words[0] == "kvplan" else [sys.executable]
        out = []
        for w in words[1:]:
            if w == "{workload}":
                out.append(str(tmp / "workload.yaml"))
            elif "*" in w:  # a glob, as a shell expands it, from the checkout
                found = sorted(ROOT.glob(w))
                if not found:
                    raise SystemExit(f"readme: {w} matches no file")
                out += [str(p) if self.in_tmp else str(p.relative_to(ROOT)) for p in found]
            else:
                out.append(w)
        return head + out


def derived(base: str, *edits: tuple[str, str]) -> Callable[[], str]:
    """A shipped workload with some of its text replaced (each must occur exactly once), its trace
    paths made absolute so that it runs from a temporary folder."""

    def text() -> str:
        yaml = (ROOT / base).read_text(encoding="utf-8")
        for old, new in edits:
            if yaml.count(old) != 1:
                raise SystemExit(f"readme: {base} holds {old!r} {yaml.count(old)} times, not once")
            yaml = yaml.replace(old, new)
        return yaml.replace("../../shared/", f"{SHARED}/")

    text.describe = f"{base} with " + ", ".join(f"{old.strip()!r} -> {new.strip()!r}" for old, new in edits)
    return text


def inline(yaml: str) -> Callable[[], str]:
    def text() -> str:
        return yaml

    text.describe = "this YAML:\n" + textwrap.indent(yaml.rstrip(), "        ")
    return text


PD = """name: pd
experiment: fleet
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
pool: {{gpu_memory_utilization: 0.92}}
scheduler: {{prefix_caching: false}}
requests:
  count: 2000
  prompt: {{dist: fixed, value: 2000}}
  output: {{dist: fixed, value: 200}}
  arrival: {{process: poisson, rate: 30}}
replicas:
{replicas}"""
PD_SPLIT = PD.format(replicas="  - {name: prefill, role: prefill, count: 1}\n"
                              "  - {name: decode, role: decode, count: 2}\n"
                              "transfer: {gb_per_s: 25, latency_s: 0.001}\n")
PD_COLOCATED = PD.format(replicas="  - {count: 3}\nrouter: round_robin\n")
GEMMA_RATE = 20  # requests/s: the Gemma 3 workload saturated
MOONCAKE_SIZES = (1000, 2000, 5000, 10000, 20000, 50000, 300000)  # blocks of 512 tokens; 300K never evicts
KWON_RATES = "0.5,0.75,1,1.25,1.5,1.75,2,2.5,3"
PLAN_DISAGGREGATE = ("kvplan plan meta-llama/Llama-3.1-8B-Instruct --rate 30 --prompt 2000 --output 200 --ttft-p99 3 \\\n"
                     "    --tpot-p99 0.013 --gpu H100-80GB --tp 1 --router round_robin,least_outstanding --disaggregate 25")

RUNS: dict[str, Run] = {
    "version": Run("kvplan --version"),
    "models": Run("kvplan models --json"),
    "gpus": Run("kvplan gpus --json"),
    "size-llama3": Run("kvplan size meta-llama/Meta-Llama-3-8B --kv-memory 11.12GiB", columns=100),
    "size-deepseek": Run("kvplan size deepseek-ai/DeepSeek-V3 --tp 8 --gpu H200 --tokens 32768", columns=100),
    "size-qwen3-next": Run("kvplan size Qwen/Qwen3-Next-80B-A3B-Instruct --gpu H200 --tp 2 --no-enable-prefix-caching"),
    "lesson": Run("kvplan simulate workloads/lesson.yaml", columns=110),
    "lesson-sweep": Run("kvplan simulate workloads/lesson.yaml --block-sizes 1-64"),
    "agentic-prefix": Run("kvplan simulate workloads/agentic-prefix.yaml     # 12 Claude Code sessions, Llama-3.1-8B, H100",
                          traces=(AGENTIC,)),
    "offload": Run("kvplan simulate workloads/multiturn-offload.yaml     # 40 chats x 10 turns, 3 GiB pool, 8 GiB tier"),
    "gemma3": Run("kvplan simulate workloads/gemma3-hybrid.yaml     # Gemma 3 12B, H100, 2.5 requests/s of 4,000 + 500"),
    "gemma3-json": Run("kvplan simulate workloads/gemma3-hybrid.yaml --json"),
    "gemma3-saturated": Run("kvplan simulate {workload}",
                            workload=derived("workloads/gemma3-hybrid.yaml", ("rate: 2.5", f"rate: {GEMMA_RATE}"))),
    "gemma3-capacity": Run("kvplan simulate {workload}", workload=derived(
        "workloads/gemma3-hybrid.yaml", ("name: gemma3-hybrid\n", "name: gemma3-hybrid\nexperiment: capacity\n"))),
    **{f"fleet-agentic-{r}": Run("kvplan simulate {workload}", traces=(AGENTIC,), workload=derived(
        "workloads/agentic-fleet.yaml", ("policy: prefix_aware", f"policy: {policy}")))
       for r, policy in (("round_robin", "round_robin"), ("least_outstanding", "least_outstanding"),
                         ("llm_d", "llm_d, index: precise"), ("sglang", "sglang"))},
    "fleet-agentic-prefix_aware": Run("kvplan simulate workloads/agentic-fleet.yaml", traces=(AGENTIC,)),
    **{f"fleet-mooncake-{r}": Run("kvplan simulate {workload}", traces=(MOONCAKE,), workload=derived(
        "workloads/agentic-fleet.yaml", *([("policy: prefix_aware", f"policy: {r}")] if r != "prefix_aware" else []),
        ("{format: agentic, path: ../../shared/traces/kv-cache-tester-agentic, too_long: clip}",
         f"{{format: mooncake, path: ../../shared/{MOONCAKE}, too_long: clip, time_scale: 2.5}}")))
       for r in ("round_robin", "prefix_aware")},
    "fleet-pd": Run("kvplan simulate {workload}", workload=inline(PD_SPLIT)),
    "fleet-pd-colocated": Run("kvplan simulate {workload}", workload=inline(PD_COLOCATED)),
    "plan-rate": Run("kvplan plan meta-llama/Llama-3.1-8B-Instruct --rate 20 --prompt 1000 --output 200 --ttft-p99 2 "
                     "--tpot-p99 0.05", columns=100, slow=True),
    "plan-disaggregate": Run(PLAN_DISAGGREGATE, columns=100, slow=True),
    "plan-colocated": Run("kvplan plan meta-llama/Llama-3.1-8B-Instruct --rate 30 --prompt 2000 --output 200 "
                          "--ttft-p99 3 --tpot-p99 0.013 --gpu H100-80GB --tp 1 --router round_robin", slow=True),
    "plan-workload": Run("kvplan plan meta-llama/Llama-3.1-8B-Instruct --workload workloads/agentic-prefix.yaml \\\n"
                         "    --gpu H100-80GB,H200,L40S --tp 1,2 --ttft-p99 60 --tpot-p99 0.1 --prefix-caching on,off",
                         columns=100, slow=True, traces=(AGENTIC,)),
    "calibrate": Run("kvplan calibrate tests/data/bench_results/gpustack-qwen3-8b-h100-c*.json --model Qwen/Qwen3-8B \\\n"
                     "    --gpu H100-80GB --vllm-version 0.11.0 --out h100-qwen3-8b.yaml", columns=100, in_tmp=True),
    # its errors are floating-point results of this CPU's torch kernels (9.2e-07 on one machine,
    # 9.6e-07 on another): regenerated by the script, checked by the test with KVPLAN_README_ALL=1
    "validate": Run("kvplan validate meta-llama/Meta-Llama-3-8B", columns=100, torch=True, slow=True),
    "kwon": Run(f"kvplan simulate workloads/kwon-sharegpt.yaml --rates {KWON_RATES} --latency-bound 0.1"),
    "mooncake-cache": Run("kvplan simulate workloads/mooncake-prefix.yaml --cache-blocks "
                          + ",".join(map(str, MOONCAKE_SIZES)), traces=(MOONCAKE,)),
    "mooncake-cache-b16": Run("kvplan simulate {workload} --cache-blocks " + ",".join(str(n * 32) for n in MOONCAKE_SIZES),
                              slow=True, traces=(MOONCAKE,),
                              workload=derived("workloads/mooncake-prefix.yaml", ("block_size: 512", "block_size: 16"))),
    "alpaca": Run("kvplan simulate workloads/alpaca-sharing.yaml", slow=True),
    "size-sglang": Run("kvplan size meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB --engine sglang", columns=100),
    "size-ep": Run("kvplan size deepseek-ai/DeepSeek-V3 --gpu H200 --dp 8 --enable-expert-parallel --tokens 32768",
                   columns=100),
    "step-speculative": Run("kvplan step meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB --batch 8 "
                            "--speculative eagle3 --num-speculative-tokens 3", columns=100),
    "sglang-prefix-vllm": Run("kvplan simulate sglang-prefix"),
    "sglang-prefix-sglang": Run("kvplan simulate sglang-prefix --engine sglang"),
    "plan-engines": Run("kvplan plan meta-llama/Llama-3.1-8B-Instruct --rate 20 --prompt 1000 --output 200 --ttft-p99 1 "
                        "--tpot-p99 0.04 --gpu L40S,H100-80GB --engine vllm,sglang", columns=100),
    "sglang-memory": Run("python bench/sglang_memory_fidelity.py"),
    "speculative-fidelity": Run("python bench/speculative_fidelity.py"),
    "parallel-fidelity": Run("python bench/parallel_fidelity.py", slow=True),
    "engine-pairs": Run("python bench/engine_pairs.py"),
    "silicon-rows": Run("python bench/silicon_rows.py", slow=True),
    "vllm-memory": Run("python bench/vllm_memory_fidelity.py"),
    "timing-fidelity": Run("python bench/timing_fidelity.py", slow=True),
    "sglang-fidelity": Run("python bench/sglang_fidelity.py", slow=True),
}


def _env(columns: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORCE_COLOR", "KVPLAN_DEBUG", "RAY_ADDRESS", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    path = os.environ.get("PYTHONPATH")
    env.update(COLUMNS=str(columns), NO_COLOR="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))
    return env


def run_one(name: str) -> str:
    """What the command prints, trailing spaces of each line and trailing blank lines dropped."""
    run = RUNS[name]
    with tempfile.TemporaryDirectory(prefix="kvplan-readme-") as d:
        tmp = Path(d)
        if run.workload is not None:
            (tmp / "workload.yaml").write_text(run.workload(), encoding="utf-8")
        proc = subprocess.run(run.argv(tmp), capture_output=True, text=True, cwd=tmp if run.in_tmp else ROOT,
                              env=_env(run.columns), encoding="utf-8")
    if proc.returncode != 0:
        raise SystemExit(f"readme: `{run.command}` exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return "\n".join(line.rstrip() for line in proc.stdout.replace(d, "$TMP").splitlines()).strip("\n")


def run_all(names, workers: int = 2) -> dict[str, str]:
    names = sorted(set(names), key=lambda n: (not RUNS[n].slow, n))  # the long ones first
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(names, pool.map(run_one, names)))


# ---------------------------------------------------------------------------------------------
# Reading back what the tool prints


def tables(text: str) -> list[list[list[str]]]:
    """Every rich table of an output: its header cells, then each row's cells."""
    out: list[list[list[str]]] = []
    header: list[str] = []
    rows = False
    for line in text.splitlines():
        if line.startswith(("┏", "┌", "└")):
            header, rows = [], False
        elif line.startswith("┃"):  # a header, perhaps folded over several lines
            cells = [c.strip() for c in line.strip("┃").split("┃")]
            header = cells if not header else [f"{a} {b}".strip() for a, b in zip(header, cells)]
        elif line.startswith("┡"):
            out.append([header])
            rows = True
        elif line.startswith("│") and rows:
            out[-1].append([c.strip() for c in line.strip("│").split("│")])
    return out


def table(text: str, *columns: str) -> list[dict[str, str]]:
    """The rows of the first table of `text` that has all these columns, as {header: cell}."""
    for t in tables(text):
        if all(c in t[0] for c in columns):
            return [dict(zip(t[0], row)) for row in t[1:]]
    raise SystemExit(f"readme: no table with the columns {columns} in:\n{text[:2000]}")


def by_label(rows: list[dict[str, str]], key: str = "allocator") -> dict[str, dict[str, str]]:
    return {r[key]: r for r in rows}


def search(pattern: str, text: str, group: int = 1) -> str:
    m = re.search(pattern, text, re.S)
    if m is None:
        raise SystemExit(f"readme: {pattern!r} not found in:\n{text[:2000]}")
    return m.group(group)


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%x").lstrip("$"))


def ratio(a: str, b: str) -> str:
    return f"{round(number(a) / number(b), 1):g}"


WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def md_table(header: list[str], rows: list[list[str]]) -> str:
    line = lambda cells: "|" + "".join(f" {c} |" if c else " |" for c in cells)  # noqa: E731
    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def prose(text: str) -> str:
    """A paragraph of the README, wrapped as its prose is (100 columns)."""
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns picked from the tool's tables, as plain text: the label left, the numbers right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    widths[0] = max(widths[0], 19)
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join(fmt(r).rstrip() for r in [header, *rows])


# ---------------------------------------------------------------------------------------------
# Blocks: a region's runs and its formatter

Out = dict[str, str]


@dataclass(frozen=True)
class Block:
    runs: tuple[str, ...]
    render: Callable[[Out], str]


def console(name: str, keep: Callable[[list[str]], list[str]] | None = None, fence: str = "console") -> Block:
    """`$ COMMAND` and what it prints (or the lines `keep` picks), in a fenced block."""

    def render(out: Out) -> str:
        lines = out[name].splitlines()
        body = "\n".join(keep(lines) if keep else lines)
        return f"```{fence}\n$ {RUNS[name].command}\n{body}\n```"

    return Block((name,), render)


def answer(lines: list[str]) -> list[str]:
    """A plan's answer: its lines before the ranked table."""
    end = next((i for i, line in enumerate(lines) if line.startswith("Ranked by")), len(lines))
    return lines[:end]


DEEPSEEK_LINES = ("│   mla layers", "│ bytes per token", "│ weights", "│ GPU (as CUDA", "│   vLLM may use",
                  "│   - ", "│ KV pool", "│ requests of", "vLLM would log: Maximum concurrency", "note:")


def deepseek(lines: list[str]) -> list[str]:
    """The memory breakdown of a start-up on an H200 (the lines that differ from a bare pool's)."""
    return ["...", *(line for line in lines if line.startswith(DEEPSEEK_LINES))]


def lesson_sweep(out: Out) -> str:
    rows = table(out["lesson-sweep"], "allocator", "admitted", "wasted slots")
    paged = [r for r in rows if r["allocator"].startswith("paged-B")]
    contiguous = by_label(rows)["contiguous-max"]
    return md_table(["block size", *(r["allocator"].removeprefix("paged-B") for r in paged), "contiguous max"],
                    [["admitted", *(r["admitted"] for r in paged), contiguous["admitted"]],
                     ["wasted slots", *(r["wasted slots"] for r in paged), contiguous["wasted slots"]]])


def agentic_prefix(out: Out) -> str:
    text = out["agentic-prefix"]
    serve = by_label(table(text, "allocator", "done", "TTFT p99 s", "TPOT ms"))
    hits = by_label(table(text, "allocator", "hit rate %"))
    cols = ["done", "preempted", "TTFT p50 s", "TTFT p99 s", "TPOT ms"]
    rows = [[label, *(r[c] for c in cols), hits.get(label, {}).get("hit rate %", "-")] for label, r in serve.items()]
    return f"```\n$ {RUNS['agentic-prefix'].command}\n{text_table(['allocator', *cols, 'hit rate %'], rows)}\n```"


def offload(out: Out) -> str:
    """The CPU tier beside the same run without it and without prefix caching."""
    text = out["offload"]
    serve = by_label(table(text, "allocator", "TTFT p50 s", "TTFT p99 s"))
    gpu = by_label(table(text, "allocator", "hit rate %"))
    tier = by_label(table(text, "allocator", "CPU hit %", "GPU+CPU hit %", "loaded GiB"))
    cols = ["TTFT p50 s", "TTFT p99 s"]
    rows = [[label, *(r[c] for c in cols), gpu.get(label, {}).get("hit rate %", "-"),
             *(tier.get(label, {}).get(c, "-") for c in ("CPU hit %", "GPU+CPU hit %", "loaded GiB"))]
            for label, r in serve.items()]
    header = ["allocator", *cols, "GPU hit %", "CPU hit %", "GPU+CPU hit %", "loaded GiB"]
    return f"```\n$ {RUNS['offload'].command}\n{text_table(header, rows)}\n```"


def gemma3(out: Out) -> str:
    import json

    serve = by_label(table(out["gemma3"], "allocator", "tok/s", "preempted", "TTFT p50 s", "TTFT p99 s"))
    peak = {r["label"]: f"{r['peak_running']:,}" for r in json.loads(out["gemma3-json"])["results"]}
    rows = [[label, r["tok/s"], r["preempted"], peak[label], r["TTFT p50 s"], r["TTFT p99 s"]]
            for label, r in serve.items()]
    header = ["allocator", "tok/s", "preempted", "peak batch", "TTFT p50 s", "TTFT p99 s"]
    return f"```\n$ {RUNS['gemma3'].command}\n{text_table(header, rows)}\n```"


def gemma3_saturated(out: Out) -> str:
    batch = by_label(table(out["gemma3-saturated"], "allocator", "batch"))
    admitted = by_label(table(out["gemma3-capacity"], "allocator", "admitted"))
    grouped, full = "paged-B16", "paged-B16 all-full"
    a, b = batch[grouped]["batch"], batch[full]["batch"]
    c, d = admitted[grouped]["admitted"], admitted[full]["admitted"]
    require(number(a) > number(b) and number(c) > number(d), "the grouped pool no longer runs the larger batch")
    return prose(f"Saturated ({GEMMA_RATE} requests/s) the running batch averages {a} against {b}: {ratio(a, b)}x, where "
            f"the capacity experiment on the same pool admits {c} against {d} requests at their full 4,500 tokens "
            f"({ratio(c, d)}x).")


FLEET = r"(\d+) replicas behind (\S+) served ([\d,]+) requests.*?TTFT p50/p99 ([\d,]+)/([\d,]+) ms, TPOT p99 ([\d,]+) ms"


def fleet_line(text: str) -> dict[str, str]:
    m = re.search(FLEET, text)
    if m is None:
        raise SystemExit(f"readme: no fleet sentence in:\n{text[:2000]}")
    hit = re.search(r"prefix hit rate ([\d.]+%)", text)
    keys = ("replicas", "router", "served", "ttft_p50", "ttft_p99", "tpot_p99")
    return dict(zip(keys, m.groups()), hit=hit.group(1) if hit else "-")


def fleet_table(out: Out) -> str:
    rows = []
    for trace, routers, what in (
            ("agentic", ("round_robin", "least_outstanding", "prefix_aware", "llm_d", "sglang"),
             "agentic (12 Claude Code sessions, {} requests)"),
            ("mooncake", ("round_robin", "prefix_aware"), "Mooncake conversation ({} requests, arrivals 2.5x apart)")):
        for i, router in enumerate(routers):
            f = fleet_line(out[f"fleet-{trace}-{router}"])
            require(f["router"] == router and f["replicas"] == "4", f"the fleet of {trace} is not 4 x {router}")
            rows.append([what.format(f["served"]) if i == 0 else "", router, f["hit"], f["ttft_p50"], f["ttft_p99"]])
    pa, rr = fleet_line(out["fleet-agentic-prefix_aware"]), fleet_line(out["fleet-agentic-round_robin"])
    require(number(pa["hit"]) > number(rr["hit"]) and number(pa["ttft_p99"]) < number(rr["ttft_p99"]),
            "prefix_aware no longer keeps more hits and a lower p99 TTFT than round robin")
    return md_table(["trace, Llama-3.1-8B-Instruct, 4 x H100-80GB", "router", "prefix hit rate", "TTFT p50 ms",
                     "TTFT p99 ms"], rows)


def disaggregated(out: Out) -> str:
    pd, co = fleet_line(out["fleet-pd"]), fleet_line(out["fleet-pd-colocated"])
    require(number(pd["tpot_p99"]) < number(co["tpot_p99"]), "the decode pool no longer has the lower TPOT")
    require(number(pd["ttft_p50"]) > 10 * number(co["ttft_p50"]), "the lone prefill replica now keeps up")
    return prose("With 2,000-token prompts (200 out) at 30/s on three H100s (25 GB/s, 1 ms), one prefill and two decode "
            f"replicas give a TPOT p99 of {pd['tpot_p99']} ms against {co['tpot_p99']} ms colocated behind round "
            f"robin, but the lone prefill replica cannot keep up (TTFT p50 {pd['ttft_p50']} ms against "
            f"{co['ttft_p50']} ms): the ratio matters.")


RENT = r"Rent (\d+) x (\d+) (\S+) \((\d+) GPUs?[;:].*?\): (\$[\d,.]+)/hour"


def plan_colocated(out: Out) -> str:
    replicas, tp, gpu, gpus, cost = re.search(RENT, out["plan-colocated"]).groups()
    split = re.search(RENT, " ".join(out["plan-disaggregate"].splitlines())).group(4)
    require("on the fleet behind round_robin" in out["plan-colocated"], "the colocated plan is not behind round robin")
    require(int(gpus) > int(split), "colocated now takes no more GPUs than prefill and decode apart")
    require((tp, gpu) == ("1", "H100-80GB"), "the colocated plan is not H100s of tp 1")
    return prose(f"(colocated, behind round robin alone, the same TPOT takes {gpus} H100s at {cost}/hour: every prefill "
            "chunk slows the decode steps it shares.)")


def plan_no_cache(out: Out) -> str:
    rows = table(out["plan-workload"], "configuration", "replicas", "capacity")
    best = rows[0]
    require(best["configuration"] == "H100-80GB x2", "the answer is no longer a pair of H100s")
    off = by_label(rows, "configuration")[best["configuration"] + " no-cache"]
    n = int(number(off["replicas"]))
    return prose(f"(with caching off a pair of H100s serves {off['capacity']} requests/s, not {best['capacity']}: "
            f"{WORDS.get(n, str(n))} replica{'s' if n != 1 else ''}.)")


KWON_PAPER = {"contiguous-max": "20.4%", "contiguous-pow2": "26.8%", "contiguous-oracle": "38.2%", "paged-B16": "96.3%"}
KWON_LABELS = {"contiguous-max": "contiguous max", "contiguous-pow2": "contiguous pow2",
               "contiguous-oracle": "contiguous oracle", "paged-B16": "paged B = 16"}


def kwon_figure2(out: Out) -> str:
    states = by_label(table(out["kwon"], "allocator", "token states"))
    return md_table(["token states (% of KV memory)", *KWON_LABELS.values()],
                    [["Kwon et al. (measured, Orca variants vs vLLM)", *KWON_PAPER.values()],
                     ["kvplan (simulated, time-averaged)", *(states[k]["token states"] + "%" for k in KWON_LABELS)]])


def kwon_rates(out: Out) -> str:
    sweep = by_label(table(out["kwon"], "allocator", "max rate under bound"))
    rates = KWON_RATES.split(",")
    rows = [[KWON_LABELS[k], *(sweep[k][f"{r}/s"] for r in rates), sweep[k]["max rate under bound"]] for k in KWON_LABELS]
    best = sweep["paged-B16"]["max rate under bound"]
    return (md_table(["mean normalized latency (s/token) at rate", *rates, "max rate under 0.1"], rows) + "\n\n"
            + prose(f"Paged sustains {ratio(best, sweep['contiguous-oracle']['max rate under bound'])}x the rate of "
            f"contiguous-oracle and {ratio(best, sweep['contiguous-max']['max rate under bound'])}x contiguous-max "
            "here (the physical step-time model, chunked prefill and vLLM V1's admission)."))


def mooncake_cache(out: Out) -> str:
    rows = table(out["mooncake-cache"], "cache blocks", "hit rate")
    head = [f"{n // 1000}K" if n < 300000 else "never evicts" for n in MOONCAKE_SIZES]
    require([number(r["cache blocks"]) for r in rows] == list(MOONCAKE_SIZES), "the sweep's sizes changed")
    return md_table(["cache blocks (512 tokens)", *head],
                    [["kvplan hit rate", *(r["hit rate"] for r in rows)],
                     ["Mooncake paper (FAST'25)", "~30%", "", "", "", "", "~50%", ""]])


SHARING_PAPER = {"parallel": "6.1-9.8%", "beam (random parent)": "37.6-55.2%"}


def sharing(out: Out) -> str:
    rows = table(out["alpaca"], "mode", "width", "saved (time-avg)")
    widths = sorted({r["width"] for r in rows}, key=int)
    saved = {(r["mode"], r["width"]): r["saved (time-avg)"] for r in rows}
    names = {"parallel": "parallel sampling", "beam (random parent)": "beam search (random surviving parent)"}
    return md_table(["", f"width {widths[0]}", *widths[1:], "Kwon et al. (Alpaca)"],
                    [[names[m], *(saved[m, w] for w in widths), paper] for m, paper in SHARING_PAPER.items()])


def lines_from(first: str, before: str | None = None) -> Callable[[list[str]], list[str]]:
    """The lines from the first that starts with `first` up to (not with) the first after it that
    starts with `before`."""

    def keep(lines: list[str]) -> list[str]:
        start = next((i for i, line in enumerate(lines) if line.startswith(first)), None)
        require(start is not None, f"no line starts with {first!r}")
        end = next((i for i in range(start + 1, len(lines)) if before and lines[i].startswith(before)), len(lines))
        return lines[start:end]

    return keep


def sglang_prefix(out: Out) -> str:
    """The same workload under vLLM's scheduler and SGLang's, each with and without its prefix cache."""
    cols = ["req/s", "TTFT p50 s", "TTFT p99 s", "TPOT ms"]
    rows = []
    for name in ("sglang-prefix-vllm", "sglang-prefix-sglang"):
        text = out[name]
        serve = by_label(table(text, "allocator", *cols))
        hits = by_label(table(text, "allocator", "hit rate %"))
        rows += [[label, *(r[c] for c in cols), hits.get(label, {}).get("hit rate %", "-")] for label, r in serve.items()]
    commands = "\n".join(f"$ {RUNS[n].command}" for n in ("sglang-prefix-vllm", "sglang-prefix-sglang"))
    return f"```\n{commands}\n{text_table(['run', *cols, 'hit rate %'], rows)}\n```"


def _bench_module(name: str):
    """Another script of bench/ as a module (for the data files it reads: one reader of each)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def engine_fidelity(out: Out) -> str:
    """SGLang's start-up memory, speculative decoding, EP/DP/PP and the vLLM-or-SGLang pairs against their cited corpora."""
    import yaml

    sg = out["sglang-memory"]
    logs = yaml.safe_load((ROOT / "tests/data/sglang_startup_logs.yaml").read_text(encoding="utf-8"))["logs"]
    sg_all = re.search(r"^  all +(\d+) of +(\d+) \((\d+%)\)", sg, re.M)
    sg_held = re.search(r"^  part held out +(\d+) of +(\d+) \((\d+%)\)", sg, re.M)
    head = re.search(r"^(\d+) logs, (\d+) with a model kvplan resolves and a setting it models, (\d+) sources", sg, re.M)
    require(sg_all is not None and sg_held is not None and head is not None,
            "bench/sglang_memory_fidelity.py no longer prints its shares")
    require(int(head.group(1)) == len(logs), "bench/sglang_memory_fidelity.py no longer reads every log")
    sp = out["speculative-fidelity"]
    rows, sp_sources = re.search(r"^(\d+) rows, (\d+) sources", sp, re.M).groups()
    med = {k: re.search(rf"^  {re.escape(k)} +(\S+) \( *(\d+)\)", sp, re.M) for k in
           ("overall", "held_out", "engine vllm", "engine sglang", "batch 1", "batch 17-64")}
    require(all(med.values()), "bench/speculative_fidelity.py no longer prints its medians")
    pa = out["parallel-fidelity"]
    step = re.search(r"^step-time rows: held out +(\S+) over +(\d+); rest +(\S+) over +(\d+); all +(\S+) over +(\d+)",
                     pa, re.M)
    memory = re.search(r"^  memory +(\S+) over +(\d+)", pa, re.M)
    prefill = re.search(r"^  prefill +(\S+) over +(\d+)", pa, re.M)
    pa_sources = len(re.findall(r"^  \S+ +(?:held out|rest) ", pa, re.M))
    mtp = re.search(r"^  measured 2026-01-14: median \|error\| plain (\S+), with one MTP token (\S+) over (\d+)$", pa, re.M)
    require(step is not None and memory is not None and prefill is not None and mtp is not None,
            "bench/parallel_fidelity.py changed")
    ep = out["engine-pairs"]
    named = {k: re.search(rf"^  {k} +same engine in (\d+) of (\d+) clear pairs; (\d+) near ties", ep, re.M)
             for k in ("tpot", "ttft", "throughput")}
    per_engine = {k: re.search(rf"^  {k} +all +\( *(\d+)\) +(\S+) +(\S+) +(\S+)", ep, re.M) for k in ("vllm", "sglang")}
    require(all(named.values()) and all(per_engine.values()), "bench/engine_pairs.py no longer prints its scores")
    si = out["silicon-rows"]
    unseen = {k: re.search(rf"^  {k} +(\d+) +(\S+) +(\S+) +(\S+) +(\S+)$", si, re.M) for k in ("vllm", "sglang")}
    restated = re.search(r"^(\d+) of (\d+) rows restated", si, re.M)
    si_mtp = re.search(r"^  sglang all +(\d+) +(\S+) +\S+ +\S+ +\S+ +(\S+) +\S+$", si, re.M)
    require(all(unseen.values()) and restated is not None and si_mtp is not None,
            "bench/silicon_rows.py no longer prints its medians")
    u = {k: v.groups() for k, v in unseen.items()}
    n = {k: v.groups() for k, v in named.items()}
    pair_docs = _bench_module("engine_pairs").load()
    setups = {(p["model"].split("/")[-1], p["gpu"].split("-")[0]) for p in pair_docs}
    tps = sorted({p["tp"] for p in pair_docs})
    versions = {e: sorted({p[e]["version"] for p in pair_docs}) for e in ("vllm", "sglang")}
    require(len(setups) == 1, "tests/data/engine_pairs.yaml now holds more than one model and GPU: reword")
    (pair_model, pair_gpu), = setups
    cells = _bench_module("silicon_rows").load()
    gpus = sorted({c["system"].split("_")[0].upper() for c in cells})
    e = {k: v.groups() for k, v in per_engine.items()}
    m = {k: v.groups() for k, v in med.items()}
    return "\n\n".join([
        prose(f"**SGLang's start-up memory** (`python bench/sglang_memory_fidelity.py`, {len(logs)} cited logs, "
              f"{head.group(2)} of them of a model in the catalog and a setting kvplan models, from {head.group(3)} "
              f"sources): {sg_all.group(1)} of {sg_all.group(2)} checks within tolerance (weights 5%, KV tokens "
              f"10%, `max_running_requests`, `chunked_prefill_size` and `mem_fraction_static` exact), "
              f"{sg_held.group(1)} of {sg_held.group(2)} on the sources no constant was read off."),
        prose(f"**Speculative decoding** (`python bench/speculative_fidelity.py`, {rows} cited speedups from "
              f"{sp_sources} sources, a third of the sources held out): median |error| {m['overall'][0]} overall, "
              f"{m['held_out'][0]} held out ({m['held_out'][1]} rows), {m['engine vllm'][0]} on vLLM's "
              f"{m['engine vllm'][1]} rows, {m['batch 1'][0]} at batch 1 ({m['batch 1'][1]}) and "
              f"{m['batch 17-64'][0]} at batch 17-64 ({m['batch 17-64'][1]}); SGLang's tree drafting is taken as "
              f"a chain of the same depth, {m['engine sglang'][0]} off on its {m['engine sglang'][1]} rows."),
        prose(f"**Expert, data and pipeline parallelism** (`python bench/parallel_fidelity.py`, "
              f"{pa_sources} sources, a third held out): start-up pools within a median {memory.group(1)} "
              f"({memory.group(2)} pools), wide-EP prefill throughput {prefill.group(1)} ({prefill.group(2)}); "
              f"step times {step.group(3)} on the sources not held out ({step.group(4)}) but {step.group(1)} on the "
              f"held-out ones ({step.group(2)}: TensorRT-LLM's DeepSeek-R1 decode and vLLM V0 pipelines over "
              "PCIe), short of the 15% the model is meant to reach. Those DeepSeek-R1 rows state no speculative "
              "decoding, and aiconfigurator, which published them, configured DeepSeek deployments with one MTP "
              "draft token by default then: had the "
              f"{mtp.group(3)} rows of 2026-01-14 run one (kvplan's serve engine drafting it at kvplan's "
              f"published acceptance, nothing fitted), they would be {mtp.group(2)} off instead of "
              f"{mtp.group(1)}, a what-if the bench prints and does not score."),
        prose(f"**vLLM or SGLang** (`python bench/engine_pairs.py`: {e['vllm'][0]} pairs of runs, vLLM "
              f"{', '.join(versions['vllm'])} and SGLang {', '.join(versions['sglang'])} on the same setup, {pair_model} "
              f"on {pair_gpu} at TP {tps[0]}-{tps[-1]}, from one file of measurements; no constant was fitted to them, "
              "though other vLLM rows of that file are in the fitted corpus): kvplan names "
              f"the engine with the lower TPOT in {n['tpot'][0]} of {n['tpot'][1]} pairs, the lower TTFT in "
              f"{n['ttft'][0]} of {n['ttft'][1]}, and the higher throughput (derived from the measured TTFT and TPOT) "
              f"in {n['throughput'][0]} of {n['throughput'][1]} pairs where the engines differ by 5% or more "
              f"({n['throughput'][2]} are closer). "
              f"Median |error| of TPOT, TTFT and throughput: vLLM {e['vllm'][1]}, {e['vllm'][2]}, {e['vllm'][3]}; "
              f"SGLang {e['sglang'][1]}, {e['sglang'][2]}, {e['sglang'][3]}."),
        prose(f"**Runs no constant was fitted to** (`python bench/silicon_rows.py`: {restated.group(1)} of "
              f"{restated.group(2)} runs of vLLM and SGLang, {len({c['model_path'] for c in cells})} catalog models "
              f"on {', '.join(gpus)}, from the file of the pairs above, which states no client: restated as closed "
              "loops, as the step-time corpus restates that file's rows): "
              f"median |error| of TPOT {u['vllm'][1]} on vLLM's {u['vllm'][0]} runs and {u['sglang'][1]} on "
              f"SGLang's {u['sglang'][0]} (signed medians {u['vllm'][2]} and {u['sglang'][2]}, positive where kvplan "
              f"predicts longer); of TTFT {u['vllm'][3]} and {u['sglang'][3]}. The bench prints them per GPU, model "
              "and concurrency. SGLang's DeepSeek-R1 and V3 runs there state no speculation either; served again by "
              "SGLang's engine in kvplan drafting one MTP token a step (its speculative rules, kvplan's published "
              f"acceptance, nothing fitted), their {si_mtp.group(1)} runs' TPOT would be {si_mtp.group(3)} off "
              f"instead of {si_mtp.group(2)}, a what-if the bench prints and does not score."),
    ])


def vllm_memory(out: Out) -> str:
    import yaml

    text = out["vllm-memory"]
    logs = yaml.safe_load((ROOT / "tests/data/vllm_startup_logs.yaml").read_text(encoding="utf-8"))["logs"]
    sources = len({e.get("source_group") or e["source"] for e in logs})
    medians = {part: re.search(rf"{part}: median \|error\| weights (\S+) over (\d+), KV (\S+) over (\d+)", text)
               for part in ("fit", "held out")}
    require(all(medians.values()), "bench/vllm_memory_fidelity.py no longer prints its medians per part")
    holds = dict(re.findall(r"^  (fit|held out) +(\d+ of +\d+) \(", text, re.M))
    require(set(holds) == {"fit", "held out"}, "bench/vllm_memory_fidelity.py no longer prints the cases that hold")
    causes = re.findall(r"^  cause (\w+) \((fit|held out)\) +(\d+) of +(\d+)", text, re.M)
    verdict = [(int(a), int(b)) for cause, _, a, b in causes if cause == "verdict"]
    tokens, tn = re.search(r"median \|error\| of the token line (\S+) over (\d+)", text).groups()
    token_logs = text.split("log (from its logged pool)")[-1].split("median |error| of the token line")[0]
    require("gemma-3" in token_logs, "no hybrid Gemma 3 among the logs of the token line")
    w, wn, k, kn = medians["held out"].groups()
    fw, fwn, fk, fkn = medians["fit"].groups()
    return prose(f"**vLLM's start-up memory** (`python bench/vllm_memory_fidelity.py`, {len(logs)} cited logs from "
                 f"{sources} sources, held out by source: a third of the sources no constant was checked on): on the "
                 f"held-out logs the weights are within a median {w} (of {wn}) and \"Available KV cache memory\" "
                 f"within {k} (of {kn}); on the rest {fw} (of {fwn}) and {fk} (of {fkn}). Cases that hold every target "
                 f"they state (weights within 5%, the pool within max(10%, 0.5 GiB), tokens and concurrency within "
                 f"10%, the verdict exact): {' '.join(holds['held out'].split())} held out, "
                 f"{' '.join(holds['fit'].split())} of the rest; the start/fail verdict right in "
                 f"{sum(a for a, _ in verdict)} of {sum(b for _, b in verdict)}. vLLM's token and concurrency lines, "
                 f"from the pool a log states, are within a median {tokens} of {tn} logs (a hybrid Gemma 3 among "
                 "them).")


FIDELITY_ROWS = (  # README row, the bench's section and row, its column
    ("every regime but bursts ({n}), leave-one-source-out", "median |error| overall", "all but bursts", 2),
    ("the same, fitted on all", "median |error| overall", "all but bursts", 3),
    ("the same, the previous default (partly fitted on these runs)", "median |error| overall", "all but bursts", 0),
    ("the same, `timing: {{model: roofline}}`", "median |error| overall", "all but bursts", 1),
    ("single requests ({n}), leave-one-source-out", "per regime", "single requests", 2),
    ("light load, under half of capacity ({n})", "per regime", "light load", 2),
    ("near saturation ({n})", "per regime", "near saturation", 2),
    ("closed loops of 2-128 clients ({n})", "per regime", "closed loops", 2),
    ("offline tables ({n})", "per regime", "offline tables", 2),
    ("bursts of every request at once ({n}), not fitted", "per regime", "bursts", 2),
    ("vLLM V1's own runs ({n}), bursts left out, leave-one-source-out", "per engine (bursts left out)", "vllm", 2),
)
FIDELITY_COLUMNS = ("old default (as shipped)", "roofline", "new default, leave-one-source-out",
                    "new default (fitted on all)")


def fidelity_sections(text: str) -> dict[tuple[str, str], tuple[int, list[list[str]]]]:
    """(section, row) -> (runs, per column the four medians: thr, E2E, TTFT, ITL) of timing_fidelity's tables."""
    out, section = {}, None
    for line in text.splitlines():
        if line in ("median |error| overall", "per regime", "per engine (bursts left out)", "per source"):
            section = line
        elif section and "|" in line and line[:34].strip():
            cells = line.split("|")
            head = re.match(r"(.{28}) +(\d+)", cells[0])
            if head:
                out[section, head.group(1).strip()] = (int(head.group(2)), [c.split() for c in cells[1:]])
        elif section and "|" in line and "thr" not in line:
            names = [c.strip() for c in line.split("|")[1:]]
            require(tuple(names) == FIDELITY_COLUMNS, f"bench/timing_fidelity.py's columns are now {names}")
    return out


def sglang_own(text: str) -> tuple[int, list[str]]:
    """(runs, thr / E2E / TTFT / ITL medians) of bench/sglang_fidelity.py's SGLang runs as its own engine
    serves them (SGLang's pool and scheduler), leave-one-source-out, bursts left out."""
    head = re.search(r"^ +\| SGLang's own, leave-one-source-out\|", text, re.M)
    require(head is not None, "bench/sglang_fidelity.py no longer prints SGLang's own rules held out by source")
    row = re.search(r"^all but bursts +(\d+) +\| +(\S+) +(\S+) +(\S+) +(\S+) +\|", text[head.end():], re.M)
    require(row is not None, "bench/sglang_fidelity.py no longer prints its all-but-bursts medians")
    return int(row.group(1)), list(row.groups()[1:])


def timing_fidelity(out: Out) -> str:
    cells = fidelity_sections(out["timing-fidelity"])
    rows = []
    for words, section, row, col in FIDELITY_ROWS:
        n, columns = cells[section, row]
        rows.append([words.format(n=n), *columns[col]])
    n, medians = sglang_own(out["sglang-fidelity"])
    rows.append([f"SGLang's runs ({n}) as `--engine sglang` serves them, bursts left out, leave-one-source-out",
                 *medians])
    return md_table(["regime (runs), leave-one-source-out unless said", "throughput", "E2E", "TTFT", "TPOT/ITL"], rows)


BLOCKS: dict[str, Block] = {
    "size-llama3": console("size-llama3"),
    "size-deepseek": console("size-deepseek", deepseek),
    "lesson": console("lesson"),
    "lesson-sweep": Block(("lesson-sweep",), lesson_sweep),
    "agentic-prefix": Block(("agentic-prefix",), agentic_prefix),
    "offload": Block(("offload",), offload),
    "gemma3-hybrid": Block(("gemma3", "gemma3-json"), gemma3),
    "gemma3-saturated": Block(("gemma3-saturated", "gemma3-capacity"), gemma3_saturated),
    "fleet-table": Block(tuple(n for n in RUNS if n.startswith(("fleet-agentic-", "fleet-mooncake-"))), fleet_table),
    "fleet-disaggregated": Block(("fleet-pd", "fleet-pd-colocated"), disaggregated),
    "plan-rate": console("plan-rate", answer, fence=""),
    "plan-disaggregate": console("plan-disaggregate", answer, fence=""),
    "plan-colocated": Block(("plan-colocated", "plan-disaggregate"), plan_colocated),
    "plan-workload": console("plan-workload", answer, fence=""),
    "plan-workload-no-cache": Block(("plan-workload",), plan_no_cache),
    "calibrate": console("calibrate"),
    "validate": console("validate"),
    "size-sglang": console("size-sglang"),
    "sglang-prefix": Block(("sglang-prefix-vllm", "sglang-prefix-sglang"), sglang_prefix),
    "plan-engines": console("plan-engines", answer, fence=""),
    "size-ep": console("size-ep", lines_from("Parallelism:")),
    "step-speculative": console("step-speculative", lines_from("Speculative decoding:", "async scheduling")),
    "engine-fidelity": Block(("sglang-memory", "speculative-fidelity", "parallel-fidelity", "engine-pairs",
                              "silicon-rows"), engine_fidelity),
    "vllm-memory": Block(("vllm-memory",), vllm_memory),
    "timing-fidelity": Block(("timing-fidelity", "sglang-fidelity"), timing_fidelity),
    "kwon-figure2": Block(("kwon",), kwon_figure2),
    "kwon-rates": Block(("kwon",), kwon_rates),
    "mooncake-cache": Block(("mooncake-cache",), mooncake_cache),
    "alpaca-sharing": Block(("alpaca",), sharing),
}


# ---------------------------------------------------------------------------------------------
# Facts (figures in running prose) and claims (statements the figures could make false)


@dataclass(frozen=True)
class Fact:
    pattern: str  # a regex over the README outside the blocks; group 1 is the figure (whitespace-insensitive)
    runs: tuple[str, ...]
    value: Callable[[Out], str]


def _table_cell(run: str, columns: tuple[str, ...], label_col: str, label: str, col: str) -> Callable[[Out], str]:
    return lambda out: by_label(table(out[run], *columns), label_col)[label][col]


def _gpus(out: Out) -> str:
    import json

    names = [g["name"] for g in json.loads(out["gpus"])["gpus"]]
    return f"{len(names)} parts: {', '.join(names)}"


def _models(out: Out) -> str:
    import json

    return str(len(json.loads(out["models"])["models"]))


def _b16_gap(out: Out) -> str:
    a = [number(r["hit rate"]) for r in table(out["mooncake-cache"], "cache blocks", "hit rate")]
    b = [number(r["hit rate"]) for r in table(out["mooncake-cache-b16"], "cache blocks", "hit rate")]
    require(len(a) == len(b), "the two sweeps differ in length")
    return f"{max(abs(x - y) for x, y in zip(a, b)):.1f}"


def _calibrated(col: str) -> Callable[[Out], str]:
    cell = _table_cell("calibrate", ("constant", "fitted"), "constant", "frontend_latency_s", col)
    return lambda out: f"{1e3 * number(cell(out)):.0f}"


_RELEASE = lambda out: search(r"release (\d+\.\d+)", out["version"])  # noqa: E731
_FIDELITY_COUNTS = r"(\d+) runs of (\d+) restated, (\d+) sources"
_ALL = "median |error| overall", "all but bursts"

FACTS: dict[str, Fact] = {
    "release": Fact(r"whose rules and defaults kvplan follows\s+\((\d+\.\d+), the current one", ("version",), _RELEASE),
    "release-size": Fact(r"the release whose rules apply, default (\d+\.\d+)\)", ("version",), _RELEASE),
    "release-pool": Fact(r"The defaults follow vLLM's current release, (\d+\.\d+) ", ("version",), _RELEASE),
    "models": Fact(r"from the bundled catalog \((\d+) models;", ("models",), _models),
    "models-catalog": Fact(r"the bundled catalog \(`models/`, (\d+) models,", ("models",), _models),
    "gpus": Fact(r"`kvplan gpus` the GPU catalog \((\d+ parts: [^:]+):", ("gpus",), _gpus),
    "qwen3-next-block": Fact(r"a layer's Mamba state, ([\d,]+) tokens for Qwen3-Next", ("size-qwen3-next",),
                             lambda out: search(r"attention block size ([\d,]+) tokens", out["size-qwen3-next"])),
    "kwon-slots": Fact(r"with 12 GiB of KV\s+\(([\d,]+) slots\)", ("kwon",),
                       lambda out: search(r"pool of ([\d,]+) token slots", out["kwon"])),
    "mooncake-requests": Fact(r"--cache-blocks [\d,]+`; ([\d,]+) requests, 512-token blocks", ("mooncake-cache",),
                              lambda out: search(r"mooncake-prefix \(([\d,]+) requests", out["mooncake-cache"])),
    "mooncake-never-evicts": Fact(r"serves\s+only ([\d.]+%) of its prompt tokens from cache", ("mooncake-cache",),
                                  _table_cell("mooncake-cache", ("cache blocks", "hit rate"), "cache blocks", "300,000",
                                              "hit rate")),
    "mooncake-b16": Fact(r"Blocks of 16 tokens give the same curve\s+within about ([\d.]+) points",
                         ("mooncake-cache", "mooncake-cache-b16"), _b16_gap),
    "calibrate-frontend": Fact(r"Their API server adds (\d+) ms to every TTFT", ("calibrate",), _calibrated("fitted")),
    "calibrate-shipped": Fact(r"where the shipped constants take vLLM's measured (\d+)\s+ms", ("calibrate",),
                              _calibrated("shipped")),
    "plan-floor": Fact(r"rules the configuration out in words \(\"one request alone already takes ([\d.]+ ms) per output",
                       ("plan-rate",), lambda out: search(r"one request alone already takes ([\d.]+ ms) per output",
                                                          squash(out["plan-rate"]))),
    "step-time-runs": Fact(r"`tests/data/step_time_measurements.yaml` \((\d+): vLLM", ("timing-fidelity",),
                           lambda out: search(_FIDELITY_COUNTS, out["timing-fidelity"], 2)),
    "fidelity-results": Fact(r"`python bench/timing_fidelity.py`: (\d+) cited benchmark results", ("timing-fidelity",),
                             lambda out: search(_FIDELITY_COUNTS, out["timing-fidelity"], 2)),
    "fidelity-sources": Fact(r"TensorRT-LLM and NIM from (\d+) sources, \d+ of them restated", ("timing-fidelity",),
                             lambda out: search(_FIDELITY_COUNTS, out["timing-fidelity"], 3)),
    "fidelity-restated": Fact(r"TensorRT-LLM and NIM from \d+ sources, (\d+) of them restated", ("timing-fidelity",),
                              lambda out: search(_FIDELITY_COUNTS, out["timing-fidelity"], 1)),
}


@dataclass(frozen=True)
class Claim:
    words: str  # the README's words it stands for (whitespace-insensitive): reworded prose needs a new claim
    runs: tuple[str, ...]
    holds: Callable[[Out], bool]


def _kwon_states(out: Out) -> dict[str, float]:
    return {k: number(r["token states"]) for k, r in by_label(table(out["kwon"], "allocator", "token states")).items()}


def _kwon_max_ratio(out: Out) -> float:
    sweep = by_label(table(out["kwon"], "allocator", "max rate under bound"))
    return number(sweep["paged-B16"]["max rate under bound"]) / number(sweep["contiguous-max"]["max rate under bound"])


def _saved(out: Out, mode: str, width: str) -> float:
    rows = table(out["alpaca"], "mode", "width", "saved (time-avg)")
    return next(number(r["saved (time-avg)"]) for r in rows if r["mode"] == mode and r["width"] == width)


def _fidelity_missed(out: Out) -> bool:
    cells = fidelity_sections(out["timing-fidelity"])
    loso = [number(x) for x in cells[_ALL][1][2]]
    targets = (10, 8, 15, 10)
    regimes = [number(x) for (s, _), (_, cols) in cells.items() if s == "per regime" for x in cols[2] if x != "-"]
    return any(v > t for v, t in zip(loso, targets)) or any(v > 20 for v in regimes)


CLAIMS: dict[str, Claim] = {
    "kwon-token-states": Claim("token states within about 1.5 points", ("kwon",), lambda out: all(
        abs(_kwon_states(out)[k] - number(KWON_PAPER[k])) <= 1.5 for k in ("contiguous-max", "paged-B16"))),
    "kwon-max-ratio": Claim("the max ratio inside the paper's range", ("kwon",),
                            lambda out: 2.7 <= _kwon_max_ratio(out) <= 8),
    "kwon-pow2-oracle": Claim("finds the pow2 and oracle baselines doing better than the paper measured", ("kwon",),
                              lambda out: all(_kwon_states(out)[k] > number(KWON_PAPER[k])
                                              for k in ("contiguous-pow2", "contiguous-oracle"))),
    "mooncake-below-paper": Claim("The shipped conversation trace cannot reach the paper's curve", ("mooncake-cache",),
                                  lambda out: all(number(r["hit rate"]) < 50 for r in
                                                  table(out["mooncake-cache"], "cache blocks", "hit rate"))),
    "sharing-parallel": Claim("Parallel sampling lands inside the paper's range at widths 4 and 6", ("alpaca",),
                              lambda out: all(6.1 <= _saved(out, "parallel", w) <= 9.8 for w in ("4", "6"))),
    "sharing-beam": Claim("saves more than the paper measured at widths 4 and 6", ("alpaca",),
                          lambda out: all(_saved(out, "beam (random parent)", w) > 55.2 for w in ("4", "6"))),
    "fidelity-targets": Claim("no regime above 20%) are not met", ("timing-fidelity",), _fidelity_missed),
}


# ---------------------------------------------------------------------------------------------
# Comparing and rewriting


@dataclass
class Report:
    text: str  # the README as it should be
    differs: list[tuple[str, str, str]]  # (what, README's, the tool's)
    skipped: list[tuple[str, str]]  # (what, why)
    problems: list[str]  # what no rewrite can fix: unknown or missing markers, patterns not found, failed claims


def regions(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2).strip("\n")) for m in REGION.finditer(text)]


def outside(text: str) -> str:
    """The README without its generated regions (where facts and claims are looked for)."""
    return REGION.sub("", text)


def squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def runs_of(blocks=None, facts=None, claims=None) -> set[str]:
    need = set()
    for name in BLOCKS if blocks is None else blocks:
        need.update(BLOCKS[name].runs)
    for name in FACTS if facts is None else facts:
        need.update(FACTS[name].runs)
    for name in CLAIMS if claims is None else claims:
        need.update(CLAIMS[name].runs)
    return need


def why_not(runs) -> str | None:
    for r in runs:
        reason = RUNS[r].missing()
        if reason:
            return reason
    return None


def compare(text: str, out: Out, blocks=None, facts=None, claims=None) -> Report:
    """The README regenerated from `out` (the runs' outputs), for the blocks, facts and claims named
    (all by default); those whose runs are not all in `out` are left as they are and listed as skipped."""
    blocks = list(BLOCKS) if blocks is None else blocks
    facts = list(FACTS) if facts is None else facts
    claims = list(CLAIMS) if claims is None else claims
    report = Report(text, [], [], [])
    found = regions(text)
    names = [n for n, _ in found]
    report.problems += [f"block {n}: unknown (README.md names a block that bench/readme.py does not define)"
                        for n in names if n not in BLOCKS]
    report.problems += [f"block {n}: {names.count(n)} regions in README.md" for n in set(names) if names.count(n) > 1]
    report.problems += [f"block {n}: no region in README.md" for n in BLOCKS if n not in names]
    if not len(BEGIN.findall(text)) == len(END.findall(text)) == len(found):
        report.problems.append("README.md has a kvplan-readme marker without its pair")

    def available(what: str, runs) -> bool:
        if all(r in out for r in runs):
            return True
        report.skipped.append((what, why_not(runs) or "not run"))
        return False

    new = {}
    for name in blocks:
        if name not in names or not available(f"block {name}", BLOCKS[name].runs):
            continue
        try:
            new[name] = BLOCKS[name].render(out)
        except ProseError as e:
            report.problems.append(f"block {name}: the words around the numbers are no longer true: {e}")

    def replace(m: re.Match) -> str:
        name, body = m.group(1), m.group(2).strip("\n")
        if name not in new:
            return m.group(0)
        if new[name] != body:
            report.differs.append((f"block {name}", body, new[name]))
        return f"<!-- kvplan-readme: {name} -->\n\n{new[name]}\n\n<!-- /kvplan-readme -->"

    text = REGION.sub(replace, text)
    for name in facts:
        fact = FACTS[name]
        if not available(f"fact {name}", fact.runs):
            continue
        matches = list(re.finditer(fact.pattern, outside(text)))
        if not matches:
            report.problems.append(f"fact {name}: README.md no longer says {fact.pattern!r}; update FACTS")
            continue
        value = fact.value(out)
        for m in matches:
            if squash(m.group(1)) != squash(value):
                report.differs.append((f"fact {name}", m.group(1), value))
                whole = m.group(0)
                text = text.replace(whole, whole.replace(m.group(1), value, 1), 1)
    for name in claims:
        claim = CLAIMS[name]
        if not available(f"claim {name}", claim.runs):
            continue
        if squash(claim.words) not in squash(outside(text)):
            report.problems.append(f"claim {name}: README.md no longer says {claim.words!r}; update CLAIMS")
        elif not claim.holds(out):
            report.problems.append(f"claim {name}: {claim.words!r} is no longer true of what the tool prints; "
                                   "reword the README (and the claim)")
    report.text = text
    return report


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when anything differs")
    ap.add_argument("--only", help="comma-separated block names (with the facts and claims of their runs)")
    ap.add_argument("--list", action="store_true", help="list the blocks and their commands")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.list:
        for name, block in BLOCKS.items():
            slow = " (slow)" if any(RUNS[r].slow for r in block.runs) else ""
            print(f"{name}{slow}:")
            for r in block.runs:
                run = RUNS[r]
                print("    " + re.sub(r"\\\n\s*", "", run.command))
                if run.workload is not None:
                    print(f"      {{workload}}: {run.workload.describe}")
        return 0
    blocks = facts = claims = None
    if args.only:
        blocks = args.only.split(",")
        unknown = [b for b in blocks if b not in BLOCKS]
        if unknown:
            print(f"readme: no block named {', '.join(unknown)}", file=sys.stderr)
            return 2
        mine = runs_of(blocks, [], [])
        facts = [n for n, f in FACTS.items() if set(f.runs) <= mine]
        claims = [n for n, c in CLAIMS.items() if set(c.runs) <= mine]
    todo = [r for r in runs_of(blocks, facts, claims) if RUNS[r].missing() is None]
    out = run_all(todo, args.workers)
    text = README.read_text(encoding="utf-8")
    report = compare(text, out, blocks, facts, claims)
    for what, old, new in report.differs:
        print(f"{what} differs from what the tool prints:")
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), "README.md", "the tool", lineterm="", n=1):
            print("    " + line)
    for what, why in report.skipped:
        print(f"{what}: skipped ({why})")
    for problem in report.problems:
        print(problem)
    if args.check:
        print(f"{len(report.differs)} difference(s), {len(report.problems)} problem(s), {len(report.skipped)} skipped")
        return 1 if report.differs or report.problems else 0
    if report.text != text:
        write_atomically(README, report.text)
        print(f"README.md rewritten: {len(report.differs)} block(s) and figure(s) regenerated")
    else:
        print("README.md already shows what the tool prints")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
