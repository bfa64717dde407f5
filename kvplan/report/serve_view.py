"""Human output, CSV and plots of a discrete-event run (`kvplan simulate` on experiment: serve)."""

from __future__ import annotations

import csv
from pathlib import Path

from kvplan.report.output import console, print_table
from kvplan.report.overload import print_overload
from kvplan.text import count, csv_cell, plot_label, terminal

BREAKDOWN = ("token_states", "reserved", "internal", "external", "free")


def _num(value, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def _fixed(value, scale: float = 1.0) -> str:
    """One format per column: three decimals below 100, whole numbers with separators above."""
    if value is None:
        return "-"
    v = value * scale
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3f}"


def render_serve(doc: dict) -> None:
    from rich.table import Table

    out = console()
    unit = doc.get("time_unit") or "s"
    ms = unit == "s"  # per-token times in milliseconds when time is in seconds
    par = doc.get("parallel")
    pool = (f"pool of {doc['pool_slots']:,} token slots" if not par else
            f"{par['dp']} DP ranks of {par['tp']} GPU{'s' if par['tp'] != 1 else ''}, each a pool of "
            f"{par['pool_slots_per_rank']:,} token slots")
    title = (f"Serving simulation: {terminal(doc['workload'])} ({count(doc['num_requests'], 'request')}, "
             f"{pool}, times in {unit})")
    rate_cols = (("done", lambda r: f"{r['completed']:,}"), (f"req/{unit}", lambda r: f"{r['throughput_rps']:.2f}"),
                 (f"tok/{unit}", lambda r: f"{r['throughput_tps']:,.0f}"),
                 ("batch", lambda r: f"{r['mean_running']:.1f}"), ("preempted", lambda r: f"{r['preemptions']:,}"))
    scale, per = (1e3, "ms") if ms else (1.0, unit)
    latency_cols = ((f"TTFT p50 {unit}", lambda r: _fixed(r["ttft_s"]["p50"])),
                    (f"TTFT p99 {unit}", lambda r: _fixed(r["ttft_s"]["p99"])),
                    (f"TPOT {per}", lambda r: _fixed(r["tpot_s"]["mean"], scale)),
                    (f"{unit}/token", lambda r: _fixed(r["normalized_latency_s"]["mean"])))
    table = Table(title=title, title_justify="left")
    table.add_column("allocator")
    for name, _ in rate_cols + latency_cols:
        table.add_column(name, justify="right")
    for r in doc["results"]:
        table.add_row(terminal(r["label"]), *(cell(r) for _, cell in rate_cols + latency_cols))
    print_table(out, table)  # folded into two or more tables on a narrow terminal
    mem = Table(title="Time-averaged memory (Kwon et al. Figure 2 vocabulary, % of the pool)", title_justify="left")
    mem.add_column("allocator", no_wrap=True)
    for col in BREAKDOWN:
        mem.add_column(col.replace("_", " "), justify="right")
    for r in doc["results"]:
        mem.add_row(terminal(r["label"]), *(f"{100 * r['memory_breakdown'][c]:.1f}" for c in BREAKDOWN))
    print_table(out, mem)
    cached = [r for r in doc["results"] if r.get("prefix_cache")]
    if any(r["prefix_cache"]["prefill_tokens_saved"] for r in cached):  # prompts that share something
        print_table(out, _prefix_table(cached))
    tiers = [r for r in doc["results"] if r.get("offload")]
    if tiers:
        print_table(out, offload_table(tiers))
    if doc.get("rate_sweep"):
        print_table(out, _sweep_table(doc["rate_sweep"], unit))
    for r in doc["results"]:
        if r.get("goodput") is not None:
            out.print(f"{terminal(r['label'])}: {goodput_words(r['goodput'])}.", markup=False)
    print_overload(out, [(r["label"], r.get("overload")) for r in doc["results"]], unit)
    if par:
        for r in doc["results"]:
            dp = r.get("data_parallel") or {}
            moe = dp.get("moe_shared_time")
            out.print(f"{terminal(r['label'])}: {'EP ' + str(par['ep']) if par['enable_expert_parallel'] else 'no EP'}, "
                      f"ranks in lockstep (an idle rank runs a dummy batch: {dp.get('dummy_rank_steps', 0):,} rank "
                      f"steps); requests per rank {', '.join(f'{n:,}' for n in dp.get('requests_per_rank', []))}"
                      + (f"; the MoE layers shared by the ranks took {moe:.3g} {unit} of the run" if moe else "")
                      + ".", markup=False)
    sp = doc.get("speculative")
    if sp:
        rates = ", ".join(f"{x:.2f}" for x in sp["acceptance"])
        out.print(f"Speculative decoding: {terminal(sp['method'])}, {sp['num_speculative_tokens']} draft tokens a step, "
                  f"acceptance per position {rates} ({sp['mean_accepted'] + 1:.2f} tokens a step on average; "
                  "each request's accepted drafts drawn from its seed).", markup=False)
    clipped = doc["results"][0].get("clipped", 0) if doc["results"] else 0
    if clipped:
        noun = "request was" if clipped == 1 else "requests were"
        out.print(f"[dim]note: {clipped:,} {noun} clipped to max_model_len.[/dim]")


def goodput_words(good: dict) -> str:
    """'goodput 12.3 requests/s (93.1% within TTFT 2 s, TPOT 25 ms)'."""
    limits = [f"{name} {v:g} s" if v >= 1 else f"{name} {1e3 * v:g} ms"
              for name, v in (("TTFT", good["ttft_s"]), ("TPOT", good["tpot_s"]), ("E2E", good["e2e_s"]))
              if v is not None]
    return f"goodput {good['rps']:,.2f} requests/s ({100 * good['share']:.1f}% within {', '.join(limits)})"


def _prefix_table(results: list[dict]):
    """Automatic prefix caching, per run that had it on (vLLM's definitions)."""
    from rich.table import Table

    table = Table(title="Prefix caching (hit rate: prompt tokens found cached at first admission)",
                  title_justify="left")
    for name in ("allocator", "hit rate %", "prefill tokens saved", "blocks evicted"):
        table.add_column(name, justify="left" if name == "allocator" else "right")
    for r in results:
        c = r["prefix_cache"]
        table.add_row(terminal(r["label"]), f"{100 * c['prefix_hit_rate']:.1f}", f"{c['prefill_tokens_saved']:,}",
                      f"{c['blocks_evicted']:,}")
    return table


def offload_table(results: list[dict], labels: list[str] | None = None):
    """The CPU tier of each run that had one (kvplan/sim/offload.py): its hit rate over the prompt
    tokens the GPU cache did not hold, both tiers' over all prompt tokens, what it loaded and how long
    the loads took (per GPU link), and its evictions. `labels`: row names (default: each run's label)."""
    from rich.table import Table

    table = Table(title="CPU offload tier (CPU hit: of the prompt tokens the GPU cache missed)",
                  title_justify="left")
    for i, name in enumerate(("replica" if labels else "allocator", "CPU hit %", "GPU+CPU hit %", "loaded GiB",
                              "load s", "tier evictions")):
        table.add_column(name, justify="right" if i else "left")
    for i, r in enumerate(results):
        o = r["offload"]
        table.add_row(terminal(labels[i] if labels else r["label"]), f"{100 * o['hit_rate']:.1f}",
                      f"{100 * o['combined_hit_rate']:.1f}", f"{o['bytes_loaded'] / 2**30:,.2f}",
                      f"{o['load_time_s']:.3f}", f"{o['blocks_evicted']:,}")
    return table


def _sweep_table(sweeps: list[dict], unit: str):
    from rich.table import Table

    rates = sorted({p["rate"] for s in sweeps for p in s["points"]})
    table = Table(title=f"Request-rate sweep: mean normalized latency ({unit}/token); bound "
                        f"{sweeps[0]['latency_bound']:g}", title_justify="left")
    table.add_column("allocator", no_wrap=True)
    for rate in rates:
        table.add_column(f"{rate:g}/{unit}", justify="right")
    table.add_column("max rate under bound", justify="right")
    for s in sweeps:
        by_rate = {p["rate"]: p["normalized_latency_s"] for p in s["points"]}
        table.add_row(terminal(s["label"]), *(_num(by_rate.get(r)) for r in rates), _num(s["max_rate"], "g"))
    return table


def write_requests_csv(results, path: Path) -> None:
    """One row per request per allocator (request = index in arrival order), streamed by chunks."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        fields = list(results[0].requests.FIELDS)
        fields += sorted({f for r in results for f in r.requests.fields} - set(fields))
        writer.writerow(["allocator", "request", *fields])
        for result in results:
            row, label = 0, csv_cell(result.label)
            for chunk in result.requests.iter_chunks():
                n = len(chunk["prompt"])  # a column this run lacks (caching off) stays empty
                columns = [chunk[name].tolist() if name in chunk else [""] * n for name in fields]
                for values in zip(*columns):
                    writer.writerow([label, row, *values])
                    row += 1


def plot_serve(results, path: Path, workload: str = "") -> None:
    """Memory breakdown over time (stacked, % of pool) and the running batch, one column per
    allocator, on one shared time axis; the title names the workload and the allocators, and the
    legends sit outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(2, n, figsize=(4.2 * n + 1.6, 6.4), dpi=110, squeeze=False, sharex=True)
    fig.suptitle(plot_label(f"{workload or 'serve'}: " + ", ".join(r.label for r in results)), fontsize=11)
    colors = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "0.85")
    for j, result in enumerate(results):
        cols = result.timeline.columns
        pool = max(result.pool_slots, 1)
        stack = [100 * cols[k] / pool for k in BREAKDOWN]
        axes[0][j].stackplot(cols["time"], *stack, labels=[k.replace("_", " ") for k in BREAKDOWN], colors=colors)
        axes[0][j].set_title(plot_label(result.label), fontsize=10)
        axes[0][j].set_ylim(0, 100)
        axes[1][j].plot(cols["time"], cols["running"], color="tab:blue", label="running")
        axes[1][j].plot(cols["time"], cols["waiting"], color="tab:gray", label="waiting", alpha=0.7)
        axes[1][j].set_xlabel(f"time ({result.time_unit})")
    axes[0][0].set_ylabel("% of KV pool")
    axes[1][0].set_ylabel("requests")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    axes[1][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
