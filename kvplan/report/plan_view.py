"""Human output and CSV of `kvplan plan`: the answer in one sentence, the ranked table, the frontier."""

from __future__ import annotations

import csv
from pathlib import Path

from kvplan.report.output import console, print_table
from kvplan.text import count, csv_cell, printable, terminal

CSV_FIELDS = ("rank", "config", "gpu", "tp", "quantization", "kv_dtype", "max_num_seqs", "max_num_batched_tokens",
              "block_size", "prefix_caching", "feasible", "simulated", "replicas", "gpus", "tier", "instances",
              "instance_gpus", "usd_per_gpu_hour", "cost_per_hour", "usd_per_million_tokens",
              "usd_per_million_output_tokens", "served", "load_per_replica", "capacity", "saturated", "ttft_p99",
              "tpot_p99", "e2e_p99", "bound_cost", "bound_ttft", "reason")


def _money(x) -> str:
    """$1,234.56; under a dollar three significant digits ($0.0312)."""
    if x is None:
        return "-"
    return f"${x:,.2f}" if abs(x) >= 1 else f"${x:.3g}"


def _s(x, scale: float = 1.0, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def traffic_words(t: dict, rate: float | None = None) -> str:
    """The traffic in a few words: "20 requests/s of 1,000 + 200 tokens" (or the workload file's);
    `rate`: instead of the traffic's own (the most a limit serves)."""
    rate = t["rate"] if rate is None else rate
    what = "requests" if rate is None else f"{rate:.3g} requests/s"
    if t.get("workload"):
        return (f"{what} of {Path(t['workload']).name}'s requests (mean {t['prompt']:,.0f} + "
                f"{t['output']:,.0f} tokens)")
    return f"{what} of {t['prompt']:,} + {t['output']:,.0f} tokens"


def targets_words(g: dict) -> str:
    """"p99 TTFT <= 2 s, p99 TPOT <= 0.05 s", or "90% of requests within TTFT 2 s and TPOT 0.05 s"."""
    limits = [(k.removesuffix("_p99").upper(), v) for k, v in g.items()
              if k.endswith("_p99") and v is not None]
    if g.get("goodput") is not None:
        return (f"{100 * g['goodput']:g}% of requests within " + " and ".join(f"{k} {v:g} s" for k, v in limits)
                + " at once")
    return ", ".join(f"p99 {k} <= {v:g} s" for k, v in limits) or "none"


def answer_sentence(doc: dict) -> str:
    best = doc["answer"]
    t, rules = doc["traffic"], doc.get("rules", {})
    if best is None:
        return (f"No configuration in the search space serves {traffic_words(t)} within the targets"
                + (" and the limit" if rules.get("objective") in ("latency", "traffic") else "") + ".")
    c = best["config"]
    gpus = f"{best['gpus']} GPU" + ("s" if best["gpus"] != 1 else "")
    kv = f", KV {c['kv_dtype']}" if c["kv_dtype"] != "auto" else ""
    if c.get("quantization", "none") != "none":
        kv = f", weights {c['quantization']}" + kv
    if best.get("prefill_replicas"):
        gpus += f": {best['prefill_replicas']} prefill + {best['replicas'] - best['prefill_replicas']} decode replicas"
    rental = best.get("rental") or {}
    shape = ""
    if rental.get("instances") and rental.get("provider"):
        whole = ""
        if rental["gpus_rented"] != best["gpus"] or rental["instance_gpus"] != c["tp"] * c.get("dp", 1):
            whole = (f"{rental['instances']} x {rental['instance_gpus']}-GPU instance"
                     f"{'s' if rental['instances'] != 1 else ''}, {rental['gpus_rented']} GPUs paid for; ")
        shape = f"; {whole}{rental['tier']}: {rental['provider']}"
    per_m = _money(best["usd_per_million_tokens"]) + " per million tokens in + out"
    if best.get("usd_per_million_output_tokens") is not None:
        per_m += f" ({_money(best['usd_per_million_output_tokens'])} per million output tokens)"
    parts = [f"{name} {fmt(best[key])}" for name, key, fmt in (
        ("TTFT", "ttft_p99", lambda v: f"{v:.2f} s"), ("TPOT", "tpot_p99", lambda v: f"{1e3 * v:.0f} ms"),
        ("E2E", "e2e_p99", lambda v: f"{v:.2f} s")) if best.get(key) is not None]  # no TPOT of 1-token outputs
    latencies = "p99 " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts))
    plan = (f"{best['load_per_replica']:.3g} requests/s per replica planned, a capacity of {best['capacity']:.3g} "
            f"within the targets less {rules.get('headroom', 0):.0%} headroom")
    if best.get("router"):
        where = f"on the fleet behind {best['router']}, a fresh sample"
        how = "" if best.get("prefill_replicas") else f"; {plan}"
    elif best.get("seeds"):
        where, how = f"the worst of {count(len(best['seeds']), 'fresh sample')}", f" at {plan}"
    else:
        fixed = " (its trace fixes every request: no fresh sample)" if rules.get("seeds") else ""
        where, how = f"on the search's sample{fixed}", f" at {plan}"
    served_by = f", served by {ENGINE_NAMES.get(c['engine'], c['engine'])}" if "engine" in c else ""
    ranks = ""
    if c.get("dp", 1) > 1 or c.get("expert_parallel"):  # a replica of DP ranks (kvplan/sim/data_parallel.py)
        ranks = (f" as {c['dp']} DP rank{'s' if c['dp'] != 1 else ''} of {c['tp']}"
                 + (", experts split by EP" if c.get("expert_parallel") else ""))
    words = [f"Rent {best['replicas']} x {c['tp'] * c.get('dp', 1)} {c['gpu']}{ranks}{served_by} ({gpus}{kv}{shape}): "
             f"{_money(best['cost_per_hour'])}/hour, {per_m}, for {traffic_words(t, best['served'])} at {latencies} "
             f"({where}{how}"]
    if doc.get("targets", {}).get("goodput") is not None:
        words.append(f"; {targets_words(doc['targets'])}")
    words.append(").")
    free = doc.get("targets", {}).get("unconstrained") or []
    if free and doc.get("targets", {}).get("goodput") is None:
        words.append(f" No target was set for {' or '.join(free)}: the plan does not bound "
                     f"{'it' if len(free) == 1 else 'them'}.")
    return "".join(words)


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def engine_words(doc: dict) -> str | None:
    """Which engine wins and by how much, in one line (a plan that compared engines; else None)."""
    cmp = doc.get("engines")
    if not cmp or len(cmp["best"]) < 2:  # one engine searched: nothing to compare
        return None
    best, winner = cmp["best"], cmp["winner"]
    name = lambda e: ENGINE_NAMES.get(e, e)  # noqa: E731
    missing = [name(e) for e, b in best.items() if b is None]
    if winner is None:
        return "Neither engine meets the targets in the search space."
    w = best[winner]
    if cmp["margin"] == 0:  # the same objective: the ranking's tiebreak (fewer GPUs, then the p99 TTFT) decides
        other = next(e for e, b in best.items() if e != winner and b is not None)
        o = best[other]
        return (f"{name(winner)} and {name(other)} tie on the {cmp['by']}: {w['label']} and {o['label']} at "
                f"{_money(w['cost_per_hour'])} and {_money(o['cost_per_hour'])}/hour; {name(winner)} ranks first "
                f"({'its ' + count(w['gpus'], 'GPU') + ' against ' + str(o['gpus']) + ', ' if w['gpus'] != o['gpus'] else ''}"
                f"a replica's capacity {w['capacity']:.3g} requests/s against {o['capacity']:.3g}, "
                f"p99 TTFT {_s(w['ttft_p99'])} s against "
                f"{_s(o['ttft_p99'])} s, p99 TPOT {_s(w['tpot_p99'], 1e3, '.1f')} ms against "
                f"{_s(o['tpot_p99'], 1e3, '.1f')} ms).")
    words = f"{name(winner)} wins: {w['label']} at {_money(w['cost_per_hour'])}/hour"
    for engine, b in best.items():
        if engine == winner or b is None:
            continue
        if cmp["by"] == "cost":
            how = f"{100 * cmp['margin']:.0f}% more" if cmp["margin"] is not None else "as much"
        elif cmp["by"] == "latency":
            how = f"a p99 E2E {100 * cmp['margin']:.0f}% longer" if cmp["margin"] is not None else "no faster"
        else:
            how = f"{100 * cmp['margin']:.0f}% less traffic" if cmp["margin"] is not None else "as much traffic"
        words += (f"; {name(engine)}'s best, {b['label']}, costs {_money(b['cost_per_hour'])}/hour "
                  f"({how}, at the same targets; a replica's capacity {b['capacity']:.3g} requests/s against "
                  f"{w['capacity']:.3g})")
    if missing:
        words += f"; {' and '.join(missing)} meet{'s' if len(missing) == 1 else ''} them in no configuration"
    return words + "."


def search_words(doc: dict) -> str | None:
    """What each step of the search settled, in one line."""
    s = doc.get("search")
    if not s or not s.get("configurations"):
        return None
    return (f"{count(s['configurations'], 'configuration')}: {s['not_started']:,} would not start, "
            f"{s['ruled_out']:,} ruled out by their bounds without a run, {s['bounded']:,} beaten by a simulated "
            f"answer before their run, {s['simulated']:,} simulated in {count(s['waves'], 'wave')}, {s['verified']:,} "
            "re-simulated on fresh samples "
            f"({count(s['runs'], 'run')}, {s['reused']:,} of them shared within a group).")


LEFT_OUT = {  # why a configuration has no plan, by the step of kvplan/plan/search.py that settled it
    "memory": "would not start (vLLM's start-up memory)",
    "floor": "cannot meet a target at any load (one request alone misses it)",
    "limit": "do not fit the limit (--gpus, --budget)",
    "price": "have no offer that rents them in the tiers searched",
    "bounded": "cannot beat a simulated answer (their bounds), or cost over the frontier's span",
    "missed": "miss the targets when simulated",
}


def _runs(numbers: list[int]) -> str:
    """1, 3-5, 8"""
    parts, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            parts.append(f"{start}" if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def left_out_lines(doc: dict) -> list[str]:
    """One line per step that left configurations out: how many, and one of them with its reason."""
    lines = []
    for kind, words in LEFT_OUT.items():
        if kind == "memory" and doc.get("engines"):
            words = "would not start (their engine's start-up memory)"
        rows = [r for r in doc["results"] if not r["feasible"] and r.get("left_out") == kind]
        if rows:
            lines.append(f"{len(rows):,} {words}, e.g. {rows[0]['config']['label']}: {rows[0]['reason']}")
    return lines


def render_plan(doc: dict, top: int = 15) -> None:
    from rich.table import Table

    out = console()
    out.print(printable(answer_sentence(doc)), markup=False)
    if engine_words(doc):
        out.print(printable(engine_words(doc)), markup=False)
    objective = doc.get("rules", {}).get("objective", "cost")
    order = {"cost": "cost", "latency": "p99 E2E within the limit", "traffic": "requests/s within the limit"}[objective]
    feasible = [r for r in doc["results"] if r["feasible"]]
    planned = f"{len(feasible):,} of {count(len(doc['results']), 'configuration')} planned"
    table = Table(title=f"Ranked by {order} ({planned}; p99s at the planned load)", title_justify="left")
    for name in ("#", "configuration", "replicas", "GPUs", "$/hour", "$/M tok", "req/s each", "capacity",
                 "TTFT p99 s", "TPOT p99 ms", "E2E p99 s"):
        table.add_column(name, justify="left" if name == "configuration" else "right")
    for i, r in enumerate(feasible[:top], 1):
        table.add_row(str(i), terminal(r["config"]["label"]), f"{r['replicas']:,}", f"{r['gpus']:,}",
                      _money(r["cost_per_hour"]), _money(r["usd_per_million_tokens"]),
                      f"{r['load_per_replica']:.3g}", f"{r['capacity']:.3g}", _s(r["ttft_p99"]),
                      _s(r["tpot_p99"], 1e3, ".1f"), _s(r["e2e_p99"], 1.0, ".2f"))
    if feasible:
        print_table(out, table)
        unchecked = [i for i, r in enumerate(feasible[:top], 1) if not r.get("seeds")]
        if unchecked and any(r.get("seeds") for r in feasible):
            rows = f"Row{'s' if len(unchecked) > 1 else ''} {_runs(unchecked)}"
            out.print(f"{rows}: p99s of the search's own sample at the planned load; the others the worst of "
                      f"{count(len(feasible[0]['seeds'] or []), 'fresh sample')}.", markup=False, style="dim")
    front = Table(title="Frontier: cost against p99 TTFT at the planned load (no configuration is both cheaper "
                        "and faster)", title_justify="left")
    for name in ("configuration", "$/hour", "TTFT p99 s"):
        front.add_column(name, justify="left" if name == "configuration" else "right")
    by_label = {r["config"]["label"]: r for r in doc["results"]}
    for label in doc["frontier"]:
        r = by_label[label]
        front.add_row(terminal(label), _money(r["cost_per_hour"]), _s(r["ttft_p99"]))
    if doc["frontier"]:
        print_table(out, front)
    for line in [search_words(doc), *left_out_lines(doc)]:
        if line:
            out.print(printable(line), markup=False, style="dim")


def write_plan_csv(doc: dict, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        engines = bool(doc.get("engines"))  # a plan that compared engines: their column last
        writer.writerow(CSV_FIELDS + (("engine",) if engines else ()))
        for i, r in enumerate(doc["results"], 1):
            c = r["config"]
            rent = r.get("rental") or {}
            writer.writerow([csv_cell(v) for v in [i, c["label"], c["gpu"], c["tp"], c["quantization"], c["kv_dtype"], c["max_num_seqs"] or "",
                             c.get("max_num_batched_tokens") or "", c["block_size"], c["prefix_caching"], r["feasible"],
                             r["simulated"], r["replicas"], r["gpus"], rent.get("tier", ""), rent.get("instances", ""),
                             rent.get("instance_gpus", ""), r["usd_per_gpu_hour"], r["cost_per_hour"],
                             r["usd_per_million_tokens"], r["usd_per_million_output_tokens"], r["served"],
                             r["load_per_replica"], r["capacity"], r["saturated"], r["ttft_p99"], r["tpot_p99"],
                             r["e2e_p99"], r["bound_cost"], r["bound_ttft"], r["reason"] or ""]
                             + ([c["engine"]] if engines else [])])
