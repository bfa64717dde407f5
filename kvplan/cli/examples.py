"""`kvplan examples` and `kvplan schema`: what ships with kvplan to start from."""

from __future__ import annotations

from kvplan.cli.options import JsonOpt


def examples(json: JsonOpt = False) -> None:
    """List the example workloads that ship with kvplan (run one with `kvplan simulate NAME`)."""
    from kvplan.workload.examples import list_examples

    items = list_examples()
    if json:
        from kvplan.report.output import emit_json

        emit_json({"examples": [e.to_dict() for e in items]})
        return
    from rich.table import Table

    from kvplan.report.output import console, print_table
    from kvplan.text import terminal

    table = Table(title="Example workloads (kvplan simulate NAME)", title_justify="left")
    for name in ("name", "experiment", "what it shows"):
        table.add_column(name)
    for e in items:
        table.add_row(terminal(e.name), terminal(e.experiment),
                      terminal(e.about + (" (needs its trace file)" if e.needs_trace else "")))
    print_table(console(), table, wrap=("what it shows",))  # the prose wraps at its spaces, names whole


def schema(json: JsonOpt = False) -> None:
    """Print the JSON Schema of the workload file, for editors to complete and check it."""
    import json as json_module
    import sys

    from kvplan.workload.json_schema import workload_schema

    sys.stdout.write(json_module.dumps(workload_schema(), indent=2) + "\n")
