"""The self-contained HTML report of `kvplan plan --html FILE`, and its chart (`--plot FILE`).

One file, no scripts, no external resources: the answer, the frontier chart (an inline SVG drawn by
matplotlib: cost per hour against p99 TTFT, every feasible configuration, the frontier joined),
the ranked table, and the assumptions (traffic, targets, prices with their sources, the vLLM
release the rules follow).
"""

from __future__ import annotations

import io
from pathlib import Path

from kvplan.report.plan_view import answer_sentence, engine_words, targets_words, traffic_words
from kvplan.text import count, html_link, html_text, plot_label


def plot_frontier(doc: dict, path: Path | io.StringIO, fmt: str | None = None) -> None:
    """Cost per hour against p99 TTFT of every feasible configuration, the frontier joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if r["feasible"]]
    by_label = {r["config"]["label"]: r for r in rows}
    front = [by_label[label] for label in doc["frontier"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=100)
    gpus = sorted({r["config"]["gpu"] for r in rows})
    for i, gpu in enumerate(gpus):
        mine = [r for r in rows if r["config"]["gpu"] == gpu]
        ax.scatter([r["ttft_p99"] for r in mine], [r["cost_per_hour"] for r in mine], s=18,
                   color=plt.cm.tab20(i % 20), label=plot_label(gpu))
    if front:
        ax.plot([r["ttft_p99"] for r in front], [r["cost_per_hour"] for r in front], color="black",
                linewidth=1.2, marker="o", markersize=9, markerfacecolor="none", label="frontier")
    ax.set_xlabel("p99 TTFT at the rate per replica (s)")
    ax.set_ylabel("cost ($/hour)")
    t = doc["traffic"]
    ax.set_title(plot_label(f"{doc['model']}: {traffic_words(t)}"), fontsize=10)
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, format=fmt)
    plt.close(fig)


def _cell(value, fmt: str, prefix: str = "") -> str:
    return "-" if value is None else prefix + format(value, fmt)


def render_html(doc: dict) -> str:
    """The whole report as one HTML document."""
    svg = io.StringIO()
    plot_frontier(doc, svg, fmt="svg")
    chart = svg.getvalue()
    chart = chart[chart.index("<svg"):]  # drop the XML prolog: inline SVG
    esc = html_text  # every value from a file or a flag: escaped, controls shown as escapes
    t, g = doc["traffic"], doc["targets"]
    arrivals = ("the file's arrivals, their times scaled to each rate tried" if t.get("workload")
                else "Poisson arrivals, fixed lengths")
    rows = []
    for i, r in enumerate(doc["results"], 1):
        c = r["config"]
        if r["feasible"]:
            tier = (r.get("rental") or {}).get("tier", "")
            cells = [str(i), esc(c["label"]), f"{r['replicas']:,}", f"{r['gpus']:,}", esc(tier),
                     f"${r['cost_per_hour']:,.2f}", _cell(r["usd_per_million_tokens"], ",.3f", "$"),
                     _cell(r["usd_per_million_output_tokens"], ",.3f", "$"), f"{r['load_per_replica']:.2f}",
                     f"{r['capacity']:.2f}", _cell(r["ttft_p99"], ".3f"),
                     _cell(r["tpot_p99"] and 1e3 * r["tpot_p99"], ".1f"), _cell(r["e2e_p99"], ".2f"), ""]
        else:
            cells = [str(i), esc(c["label"]), *["-"] * 11, esc(r["reason"] or "")]
        rows.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    prices = "".join(
        f"<li>{esc(gpu)}: " + "; ".join(
            f"${esc(str(row.get('usd_per_gpu_hour')))}/GPU-hour {esc(str(row.get('tier', '')))}, "
            f"{esc(str(row.get('provider', '')))}"
            + (f" (instances of {esc(', '.join(map(str, row['instance_gpus'])))} GPUs)"
               if isinstance(row.get("instance_gpus"), list) else "")
            + f" ({esc(str(row.get('date', '')))}) {html_link(row.get('source'))}" for row in offers) + "</li>"
        for gpu, offers in sorted(doc.get("prices", {}).items()))
    targets = targets_words(g)
    free = g.get("unconstrained") or []
    if free and g.get("goodput") is None:
        targets += f" (no target for {' or '.join(free)})"
    rules = doc.get("rules", {})
    engines_line = f'<p id="engines">{esc(engine_words(doc))}</p>\n' if doc.get("engines") else ""
    memory = ("<li>Memory: vLLM's start-up profile as <code>kvplan size</code> computes it; a configuration vLLM would not "
              "start is left out.\nServing: kvplan's serve engine with vLLM V1's scheduler defaults and its fitted "
              "step-time model.</li>")
    if doc.get("engines"):
        memory = ("<li>Memory: each engine's start-up as <code>kvplan size --engine vllm|sglang</code> computes it "
                  "(SGLang at its default mem_fraction_static for the GPU and TP); a configuration its engine would not "
                  "start is left out.\nServing: kvplan's serve engine with vLLM V1's scheduler or SGLang's "
                  "(RadixAttention, lpm), at each engine's defaults, and the fitted step-time model restated for each "
                  "engine.</li>")
    head = ("#", "configuration", "replicas", "GPUs", "tier", "$/hour", "$/M tokens in + out", "$/M output tokens",
            "req/s per replica", "capacity req/s", "p99 TTFT s", "p99 TPOT ms", "p99 E2E s", "why not")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>kvplan plan: {esc(doc['model'])}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }}
td:nth-child(2), th:nth-child(2) {{ text-align: left; }} .answer {{ font-size: 1.15em; background: #eef5ee; padding: 0.8em; }}
</style></head><body>
<h1>kvplan plan: {esc(doc['model'])}</h1>
<p class="answer" id="answer">{esc(answer_sentence(doc))}</p>
{engines_line}<h2>Cost against latency</h2>
<figure id="frontier-chart">{chart}</figure>
<h2>Configurations, best first</h2>
<table id="ranked"><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>
<tbody>{''.join(rows)}</tbody></table>
<h2>Assumptions</h2>
<ul id="assumptions">
<li>Traffic: {esc(traffic_words(t))}, {esc(arrivals)}; {count(t['count'], 'request')} simulated per run.</li>
<li>Targets: {esc(targets)}; each replica planned at most at {1 - rules.get('headroom', 0):.0%} of its capacity, and
every answer re-simulated at its planned load on {count(len(rules.get('seeds') or []), 'fresh sample')} of the traffic
(the worst of them is reported).</li>
{memory}
<li>Prices ({esc(', '.join(rules.get('price_tiers') or []))}; list prices, they go stale):<ul>{prices}</ul></li>
</ul>
</body></html>
"""
