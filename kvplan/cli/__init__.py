"""The kvplan command line, and the one place where errors become exit codes.

Every KvplanError (and every command-line usage error) becomes one line on stderr and exit code 2;
KVPLAN_DEBUG=1 shows the traceback instead. The commands themselves are in kvplan/cli/app.py.
"""

from __future__ import annotations

import os
import sys

import typer

from kvplan.cli.app import app
from kvplan.errors import KvplanError


def _cli_error_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes of the installed typer (its own vendored click in 0.29+, else click)."""
    found = [t for t in (getattr(typer, "TyperException", None),) if t is not None]
    try:
        import click

        found.append(click.exceptions.ClickException)
    except ImportError:
        pass
    return tuple(found)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every input error into one line and exit code 2."""
    debug = os.environ.get("KVPLAN_DEBUG", "") not in ("", "0")
    try:
        code = app(args=argv, prog_name="kvplan", standalone_mode=False)
    except KvplanError as exc:
        if debug:
            raise
        _fail(str(exc))
    except (typer.Abort, KeyboardInterrupt):
        _fail("aborted")
    except BrokenPipeError:
        sys.stderr.close()
        raise SystemExit(1)
    except _cli_error_types() as exc:
        if debug:
            raise
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stderr.write(message + "\n")
            raise SystemExit(2)
        _fail(message)
    raise SystemExit(code if isinstance(code, int) else 0)


def _fail(message: str) -> None:
    sys.stderr.write(f"kvplan: error: {' '.join(message.split())}\n")
    raise SystemExit(2)


__all__ = ["app", "main"]
