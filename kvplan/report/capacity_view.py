"""Human output and plot of the capacity experiment (`kvplan simulate` on experiment: capacity)."""

from __future__ import annotations

from pathlib import Path

from kvplan.report.output import console, print_table
from kvplan.text import count, plot_label, printable, terminal


def render_capacity(doc: dict) -> None:
    from rich.table import Table

    out = console()
    results = doc["results"]
    table = Table(title=f"Capacity experiment: {terminal(doc['workload'])} ({count(doc['num_requests'], 'request')}, "
                        f"pool of {doc['pool_slots']:,} token slots)", title_justify="left")
    for col in ("allocator", "admitted", "vs contiguous", "allocated slots", "tokens stored", "wasted slots", "utilization"):
        table.add_column(col, justify="left" if col == "allocator" else "right", no_wrap=col == "allocator")
    for r in results:
        ratio = r.get("admitted_vs_first_contiguous")
        table.add_row(terminal(r["label"]), f"{r['admitted']:,}", f"{ratio:.2f}x" if ratio else "-",
                      f"{r['allocated_slots']:,}", f"{r['tokens_stored']:,}", f"{r['wasted_slots']:,}",
                      f"{100 * r['utilization']:.1f}%")
    print_table(out, table)
    print_table(out, _breakdown_table(results))
    for line in summary_lines(results):
        out.print(printable(line), markup=False)
    out.print("[dim]Every request counted at its final length and admitted in arrival order until the first "
              "that does not fit: a memory effect, not a throughput benchmark.[/dim]")


def _breakdown_table(results: list[dict]):
    from rich.table import Table

    table = Table(title="Where the pool went (Kwon et al. Figure 2 vocabulary, % of the pool)", title_justify="left")
    cols = ("token_states", "reserved", "internal", "external", "free")
    table.add_column("allocator")
    for col in cols:
        table.add_column(col.replace("_", " "), justify="right")
    for r in results:
        table.add_row(terminal(r["label"]), *(f"{100 * r['memory_breakdown'][c]:.1f}" for c in cols))
    return table


def summary_lines(results: list[dict]) -> list[str]:
    """The lesson's sentences, for each allocator."""
    lines, base = [], None
    for r in results:
        if r["allocator"] == "contiguous":
            base = base or r
            lines.append(f"{r['label']} admits {count(r['admitted'], 'request')} that use "
                         f"{100 * r['utilization']:.1f}% of the slots they reserved.")
        else:
            ratio = f" ({r['admitted'] / base['admitted']:.1f} times as many)" if base and base["admitted"] else ""
            share = 100 * r["wasted_slots"] / r["allocated_slots"] if r["allocated_slots"] else 0.0
            lines.append(f"{r['label']} admits {r['admitted']:,}{ratio} and wastes {r['wasted_slots']:,} of "
                         f"{r['allocated_slots']:,} allocated slots ({share:.1f}%).")
    return lines


def plot_capacity(doc: dict, path: Path) -> None:
    """Admitted requests and wasted slots per block size, beside the contiguous baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paged = [r for r in doc["results"] if r["allocator"] == "paged"]
    contiguous = [r for r in doc["results"] if r["allocator"] == "contiguous"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    sizes = [r["block_size"] for r in paged]
    ax.plot(sizes, [r["admitted"] for r in paged], "o-", color="tab:blue", label="paged: admitted")
    for r, style in zip(contiguous, ("--", ":", "-.")):
        ax.axhline(r["admitted"], linestyle=style, color="tab:red", label=plot_label(f"{r['label']}: admitted"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("block size B (token slots)")
    ax.set_ylabel("requests admitted")
    ax.set_ylim(bottom=0)
    waste = ax.twinx()
    waste.bar(sizes, [100 * r["wasted_slots"] / max(r["allocated_slots"], 1) for r in paged],
              width=[s * 0.35 for s in sizes], alpha=0.25, color="tab:gray", label="paged: wasted %")
    waste.set_ylabel("wasted slots (% of allocated)")
    lines = ax.get_legend_handles_labels()[0] + waste.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + waste.get_legend_handles_labels()[1]
    ax.legend(lines, labels, loc="center right", fontsize=8)
    ax.set_title(f"{plot_label(doc['workload'])}: {count(doc['num_requests'], 'request')}, "
                 f"{doc['pool_slots']:,} slots\n"
                 "memory effect, not a throughput benchmark", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
