"""Human output and CSV of `kvplan plan`: the answer in one sentence, the ranked table, the frontier."""

from __future__ import annotations

import csv
from pathlib import Path

from kvplan.report.output import console, print_table

CSV_FIELDS = ("rank", "config", "gpu", "tp", "quantization", "kv_dtype", "max_num_seqs", "block_size", "prefix_caching",
              "feasible", "replicas", "gpus", "usd_per_gpu_hour", "cost_per_hour", "cost_per_million_tokens", "rate_per_replica",
              "ttft_p99", "tpot_p99", "e2e_p99", "reason")


def _money(x) -> str:
    return "-" if x is None else f"${x:,.2f}"


def _s(x, scale: float = 1.0, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def traffic_words(t: dict) -> str:
    """The traffic in a few words: "20 requests/s of 1,000 + 200 tokens" (or the workload file's)."""
    if t.get("workload"):
        return (f"{t['rate']:g} requests/s of {Path(t['workload']).name}'s requests (mean {t['prompt']:,.0f} + "
                f"{t['output']:,.0f} tokens)")
    return f"{t['rate']:g} requests/s of {t['prompt']:,} + {t['output']:,.0f} tokens"


def targets_words(g: dict) -> str:
    """"p99 TTFT <= 2 s, p99 TPOT <= 0.05 s", or "90% of requests within TTFT 2 s and TPOT 0.05 s"."""
    limits = [(k.removesuffix("_p99").upper(), v) for k, v in g.items() if k != "goodput" and v is not None]
    if g.get("goodput") is not None:
        return (f"{100 * g['goodput']:g}% of requests within " + " and ".join(f"{k} {v:g} s" for k, v in limits)
                + " at once")
    return ", ".join(f"p99 {k} <= {v:g} s" for k, v in limits) or "none"


def answer_sentence(doc: dict) -> str:
    best = doc["answer"]
    t = doc["traffic"]
    if best is None:
        return f"No configuration in the search space serves {traffic_words(t)} within the targets."
    c = best["config"]
    gpus = f"{best['gpus']} GPU" + ("s" if best["gpus"] != 1 else "")
    kv = f", KV {c['kv_dtype']}" if c["kv_dtype"] != "auto" else ""
    if c.get("quantization", "none") != "none":
        kv = f", weights {c['quantization']}" + kv
    if best.get("prefill_replicas"):
        gpus += f": {best['prefill_replicas']} prefill + {best['replicas'] - best['prefill_replicas']} decode replicas"
    return (f"Rent {best['replicas']} x {c['tp']} {c['gpu']} ({gpus}{kv}): "
            f"{_money(best['cost_per_hour'])}/hour, {_money(best['cost_per_million_tokens'])} per million output "
            f"tokens, for {traffic_words(t)} at p99 TTFT {best['ttft_p99']:.2f} s and p99 TPOT "
            f"{1e3 * best['tpot_p99']:.0f} ms ({best['rate_per_replica']:.2f} requests/s per replica"
            + (f"; {targets_words(doc['targets'])}" if doc.get("targets", {}).get("goodput") is not None else "")
            + (f"; checked on a fleet behind {best['router']}" if best.get("router") else "")
            + ").")


def render_plan(doc: dict, top: int = 15) -> None:
    from rich.table import Table

    out = console()
    out.print(answer_sentence(doc))
    table = Table(title=f"Ranked by cost ({len(doc['results'])} configurations, "
                        f"{sum(1 for r in doc['results'] if r['feasible'])} feasible)", title_justify="left")
    for name in ("#", "configuration", "replicas", "GPUs", "$/hour", "$/M tok", "req/s each",
                 "TTFT p99 s", "TPOT p99 ms"):
        table.add_column(name, justify="left" if name == "configuration" else "right")
    for i, r in enumerate(doc["results"][:top], 1):
        if r["feasible"]:
            table.add_row(str(i), r["config"]["label"], f"{r['replicas']:,}", f"{r['gpus']:,}",
                          _money(r["cost_per_hour"]), _money(r["cost_per_million_tokens"]),
                          f"{r['rate_per_replica']:.2f}", _s(r["ttft_p99"]), _s(r["tpot_p99"], 1e3, ".1f"))
        else:
            table.add_row(str(i), r["config"]["label"], "-", "-", "-", "-", "-", "-", "-")
    print_table(out, table)
    front = Table(title="Frontier: cost against p99 TTFT (no configuration is both cheaper and faster)",
                  title_justify="left")
    for name in ("configuration", "$/hour", "TTFT p99 s"):
        front.add_column(name, justify="left" if name == "configuration" else "right")
    by_label = {r["config"]["label"]: r for r in doc["results"]}
    for label in doc["frontier"]:
        r = by_label[label]
        front.add_row(label, _money(r["cost_per_hour"]), _s(r["ttft_p99"]))
    print_table(out, front)
    pruned = [r for r in doc["results"] if not r["feasible"]]
    if pruned:
        out.print(f"[dim]{len(pruned)} configurations left out (e.g. {pruned[0]['config']['label']}: "
                  f"{pruned[0]['reason']}).[/dim]")


def write_plan_csv(doc: dict, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_FIELDS)
        for i, r in enumerate(doc["results"], 1):
            c = r["config"]
            writer.writerow([i, c["label"], c["gpu"], c["tp"], c["quantization"], c["kv_dtype"], c["max_num_seqs"] or "",
                             c["block_size"], c["prefix_caching"], r["feasible"], r["replicas"], r["gpus"], r["usd_per_gpu_hour"], r["cost_per_hour"],
                             r["cost_per_million_tokens"], r["rate_per_replica"], r["ttft_p99"], r["tpot_p99"],
                             r["e2e_p99"], r["reason"] or ""])
