"""The typer app: every command registered in the order `kvplan --help` lists them.

Each command lives in a module of its own (kvplan/cli/<command>.py) and is a thin function that
parses, calls a library function and hands its result to kvplan/report/. Heavy modules are
imported inside the commands, so that `kvplan size` on a catalog model never imports numpy,
torch, matplotlib or huggingface_hub.
"""

from __future__ import annotations

import typer

from kvplan.cli.calibrate import calibrate
from kvplan.cli.catalog import gpus, models
from kvplan.cli.check import check
from kvplan.cli.examples import examples, schema
from kvplan.cli.plan import plan
from kvplan.cli.simulate import simulate
from kvplan.cli.size import size
from kvplan.cli.step import step
from kvplan.cli.validate import validate

def plain_defaults() -> None:
    """Typer (0.12 to 0.19) escapes the "[default: ...]" of an option's help for rich markup even
    when the help is printed plain (rich_markup_mode=None, as here), so every default read
    "\\[default: ...]". Plain help needs no escaping: keep the text as it is. Called only when help
    is asked for (typer.rich_utils costs a cold start 0.2 s)."""
    try:
        from typer import rich_utils
    except ImportError:  # typer without rich prints plain help already
        return
    if hasattr(rich_utils, "escape_before_html_export"):
        rich_utils.escape_before_html_export = lambda text: text.strip()


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Capacity planning and simulation for the KV cache of LLM serving.",
)

def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from kvplan.model.vllm_memory import VLLM_RELEASE

        try:
            number = version("kvplan")
        except PackageNotFoundError:  # a source tree that was never installed
            number = "unknown (not installed)"
        typer.echo(f"kvplan {number} (vLLM rules and defaults of release {VLLM_RELEASE})")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print kvplan's version and exit.")) -> None:
    """Capacity planning and simulation for the KV cache of LLM serving."""


def _short_help(command) -> str:
    """The first line of a command's docstring, whole (click would cut it at 45 characters)."""
    return (command.__doc__ or "").strip().splitlines()[0]


for command in (size, step, simulate, plan, calibrate, examples, schema, validate, models, gpus, check):
    app.command(short_help=_short_help(command))(command)
