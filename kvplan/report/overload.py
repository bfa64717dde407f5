"""The one warning line of an overloaded serve run or fleet (the verdict: kvplan/sim/overload.py).

It reads the documents' "overload" entries, so the table and the JSON say the same thing."""

from __future__ import annotations

from kvplan.text import printable

ADVICE = ("lower the arrival rate (--rate, or the workload's arrival), serve on more GPUs (--tp) or "
          "replicas (a fleet), or let `kvplan plan` find a configuration that keeps up")


def _rate(value: float) -> str:
    return f"{value:.3g}"


def _time(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"


def overload_line(entries: list[tuple[str, dict | None]], unit: str) -> str | None:
    """One line for the overloaded (label, overload dict) entries, or None when none was overloaded."""
    hit = [(label, o) for label, o in entries if o and o["overloaded"]]
    if not hit:
        return None
    offered = {_rate(o["offered_rate"]) for _, o in hit}
    if len(offered) == 1:  # one stream (the allocators of one workload): its rate once
        parts = (f"requests arrive at {offered.pop()}/{unit} and are admitted at about "
                 + ", ".join(f"{_rate(o['sustained_rate'])}/{unit} ({label})" for label, o in hit))
    else:
        parts = "; ".join(f"{label} admits about {_rate(o['sustained_rate'])}/{unit} of the "
                          f"{_rate(o['offered_rate'])}/{unit} that arrive" for label, o in hit)
    label, first = hit[0]
    return (f"warning: overloaded: {parts}, and the median queue delay{' of ' + label if len(hit) > 1 else ''} "
            f"grew from {_time(first['queue_delay_mid'], unit)} to {_time(first['queue_delay_end'], unit)} "
            f"over the run. To keep up, {ADVICE}.")


def print_overload(out, entries: list[tuple[str, dict | None]], unit: str) -> None:
    """Print the warning (when there is one) on the report's console, markup-free: one paragraph,
    folded at spaces to the terminal's width like the report's prose (a number is never split)."""
    line = overload_line(entries, unit)
    if line is not None:
        out.print(printable(line), markup=False, style="bold yellow")  # folded at spaces like prose


def print_fleet_overload(out, doc: dict) -> None:
    """A fleet document's line: the fleet as a whole, or else the replicas overloaded on their own
    (a router that sends one of them more than it keeps up with)."""
    unit = doc.get("time_unit") or "s"
    fleet = doc["fleet"].get("overload")
    if fleet and fleet["overloaded"]:
        print_overload(out, [("the fleet", fleet)], unit)
    else:
        print_overload(out, [(f"replica {r['replica']}", r.get("overload")) for r in doc["replicas"]], unit)
