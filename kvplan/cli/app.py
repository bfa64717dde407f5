"""The typer app: every command registered in the order `kvplan --help` lists them.

Each command lives in a module of its own (kvplan/cli/<command>.py) and is a thin function that
parses, calls a library function and hands its result to kvplan/report/. Heavy modules are
imported inside the commands, so that `kvplan size` on a catalog model never imports numpy,
torch, matplotlib or huggingface_hub.
"""

from __future__ import annotations

import typer

from kvplan.cli.catalog import gpus, models
from kvplan.cli.check import check
from kvplan.cli.simulate import simulate
from kvplan.cli.size import size
from kvplan.cli.step import step
from kvplan.cli.validate import validate

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Capacity planning and simulation for the KV cache of LLM serving.",
)

for command in (size, step, simulate, validate, models, gpus, check):
    app.command()(command)
