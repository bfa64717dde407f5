"""Human output and plot of a fleet: one line for the fleet, a table per replica."""

from __future__ import annotations

from pathlib import Path

from kvplan.report.output import console, print_table
from kvplan.report.overload import print_fleet_overload
from kvplan.report.serve_view import goodput_words, offload_table
from kvplan.text import count, csv_cell, plot_label, printable, terminal


def _ms(stats: dict, key: str) -> str:
    v = stats.get(key)
    return "-" if v is None else f"{1e3 * v:,.0f}"


def fleet_sentence(doc: dict) -> str:
    f, router = doc["fleet"], doc["router"]
    hit = "" if f["prefix_hit_rate"] is None else f", prefix hit rate {100 * f['prefix_hit_rate']:.1f}%"
    if f.get("transfer_s"):
        hit += f", KV transfer p50/p99 {_ms(f['transfer_s'], 'p50')}/{_ms(f['transfer_s'], 'p99')} ms"
        if (f.get("transfer_wait_s") or {}).get("p99"):
            hit += f" (waiting for the links p99 {_ms(f['transfer_wait_s'], 'p99')} ms)"
    tier = f.get("offload")
    if tier is not None:
        hit += (f", CPU tier hit rate {100 * tier['hit_rate']:.1f}% (GPU+CPU {100 * tier['combined_hit_rate']:.1f}%), "
                f"{tier['bytes_loaded'] / 2**30:,.2f} GiB loaded")
    good = f.get("goodput")
    if good is not None:
        hit += f"; {goodput_words(good)}"
    return (f"{doc['workload']}: {count(f['replicas'], 'replica')} behind {router['policy']} served {f['completed']:,} "
            f"requests, {f['throughput_rps']:,.2f} requests/s and {f['throughput_tps']:,.0f} output tokens/s; "
            f"TTFT p50/p99 {_ms(f['ttft_s'], 'p50')}/{_ms(f['ttft_s'], 'p99')} ms, TPOT p99 "
            f"{_ms(f['tpot_s'], 'p99')} ms, E2E p99 {f['e2e_s']['p99'] or 0:,.2f} s{hit}; "
            f"load imbalance (max/mean busy time) {f['imbalance']:.2f}.")


def render_fleet(doc: dict, top: int = 64) -> None:
    from rich.table import Table

    out = console()
    out.print(printable(fleet_sentence(doc)), markup=False)
    table = Table(title="Replicas", title_justify="left")
    for col in ("#", "group", "role", "routed", "busy s", "req/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p99 ms",
                "hit rate", "preempted"):
        table.add_column(col, justify="left" if col in ("group", "role") else "right")
    for r in doc["replicas"][:top]:
        hit = (r.get("prefix_cache") or {}).get("prefix_hit_rate")
        table.add_row(str(r["replica"]), terminal(r["group"]), terminal(r.get("role", "both")), f"{r['routed']:,}",
                      f"{r['busy_s']:,.1f}",
                      f"{r['throughput_rps']:,.2f}", _ms(r["ttft_s"], "p50"), _ms(r["ttft_s"], "p99"),
                      _ms(r["tpot_s"], "p99"), "-" if hit is None else f"{100 * hit:.1f}%", f"{r['preemptions']:,}")
    print_table(out, table)
    if len(doc["replicas"]) > top:
        out.print(f"[dim]({len(doc['replicas']) - top} more replicas in --json)[/dim]")
    tiers = [r for r in doc["replicas"][:top] if r.get("offload")]
    if tiers:
        print_table(out, offload_table(tiers, [f"#{r['replica']}" for r in tiers]))
    print_fleet_overload(out, doc)


def write_fleet_csv(result, path: Path) -> None:
    """One row per request of the fleet (request = its number in arrival order): the replica that
    streamed its answer and its group (and, disaggregated, the prefill replica and group, the KV
    transfer and its wait for the link), its lengths, queueing and client latencies in seconds,
    and with an `slo:` whether it met it (1/0). Streamed by chunks."""
    import csv

    rows, groups = result.requests, result.replica_groups
    names = list(rows)
    header = ["request"]
    for name in names:
        header.append(name)
        if name in ("replica", "prefill_replica"):
            header.append(name.replace("replica", "group"))
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        n = len(rows["replica"])
        for begin in range(0, n, 65_536):
            cols = [rows[k][begin:begin + 65_536].tolist() for k in names]
            for i, values in enumerate(zip(*cols)):
                row = [begin + i]
                for name, v in zip(names, values):
                    if isinstance(v, float) and v != v:  # NaN: a TPOT of one output token
                        v = ""
                    row.append(v)
                    if name in ("replica", "prefill_replica"):
                        row.append(csv_cell(groups[v]))
                writer.writerow(row)


def plot_fleet(doc: dict, path: str | Path) -> None:
    """Per replica: requests routed, busy time and p99 TTFT, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reps = doc["replicas"]
    x = [r["replica"] for r in reps]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharex=True)
    for ax, values, label in ((axes[0], [r["routed"] for r in reps], "requests routed"),
                              (axes[1], [r["busy_s"] for r in reps], "busy time, s"),
                              (axes[2], [r["ttft_s"]["p99"] or 0 for r in reps], "TTFT p99, s")):
        ax.bar(x, values, color="#4c72b0")
        ax.set_title(label)
        ax.set_xlabel("replica")
    fig.suptitle(plot_label(f"{doc['workload']}: {count(len(reps), 'replica')}, router {doc['router']['policy']}"))
    fig.tight_layout()
    fig.savefig(path, format=Path(path).suffix.lstrip(".").lower() or "png")
    plt.close(fig)
