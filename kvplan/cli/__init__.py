"""The kvplan command line, and the one place where errors become exit codes.

Every KvplanError (and every command-line usage error) becomes one line on stderr and exit code 2;
KVPLAN_DEBUG=1 shows the traceback instead. The commands themselves are in kvplan/cli/app.py.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
import threading
import warnings

import typer

from kvplan.cli.app import app
from kvplan.errors import KvplanError
from kvplan.text import cut


def _cli_error_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes of the installed typer (its own vendored click in 0.29+, else click)."""
    found = [t for t in (getattr(typer, "TyperException", None),) if t is not None]
    try:
        import click

        found.append(click.exceptions.ClickException)
    except ImportError:
        pass
    return tuple(found)


class Terminated(BaseException):
    """A termination signal, raised where the program is so that every `finally` runs (output
    files half written are removed on the way out)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_as_exceptions():
    """SIGTERM and SIGHUP raise Terminated while a command runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum, frame):
        raise Terminated(signum)

    saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, previous)


class _ClosedStdout(io.TextIOBase):
    """Standard output when it was closed before kvplan started (`kvplan ... >&-`; Python then sets
    sys.stdout to None): the first write fails as a write to a closed descriptor does, so a command
    that prints ends in one error line (exit 2) and one that prints nothing exits 0."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


class _Discard(io.TextIOBase):
    """Standard error when it was closed: there is nowhere to say anything; the exit code remains."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)


def _closed_streams() -> None:
    """Stand-ins for a closed stdout or stderr, and /dev/null on their descriptors, so that a
    file the command opens cannot be given descriptor 1 or 2 (and receive what a library or a
    worker process writes to it)."""
    for fd, name, stand_in in ((1, "stdout", _ClosedStdout), (2, "stderr", _Discard)):
        if getattr(sys, name) is not None:
            continue
        setattr(sys, name, stand_in())
        try:
            os.fstat(fd)
        except OSError:  # closed: hold it with /dev/null
            with contextlib.suppress(OSError):
                held = os.open(os.devnull, os.O_RDWR)
                if held != fd:
                    os.dup2(held, fd)
                    os.close(held)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app and turn every input error into one line and exit code 2."""
    debug = os.environ.get("KVPLAN_DEBUG", "") not in ("", "0")
    _closed_streams()
    words = sys.argv[1:] if argv is None else argv
    if not words or "--help" in words or "-h" in words:
        from kvplan.cli.app import plain_defaults

        plain_defaults()
    try:
        with _signals_as_exceptions(), warnings.catch_warnings():
            if not debug:  # numeric warnings (overflow in an extreme input) are not output
                warnings.simplefilter("ignore", RuntimeWarning)
            code = app(args=argv, prog_name="kvplan", standalone_mode=False)
            sys.stdout.flush()
    except SystemExit as exc:
        code = exc.code
        _flush_stdout(debug)
    except KvplanError as exc:
        if debug:
            raise
        _fail(str(exc))
    except (typer.Abort, KeyboardInterrupt):
        _fail("aborted")
    except Terminated as exc:
        sys.stderr.write(f"kvplan: error: stopped by {signal.Signals(exc.signum).name}\n")
        raise SystemExit(128 + exc.signum) from None
    except BrokenPipeError:
        _quiet_stdout()
        sys.stderr.close()
        raise SystemExit(1)
    except OSError as exc:
        if debug:
            raise
        _quiet_stdout()
        _fail(_os_message(exc))
    except _cli_error_types() as exc:
        if debug:
            raise
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stderr.write(message + "\n")
            raise SystemExit(2)
        _fail(message)
    raise SystemExit(code if isinstance(code, int) else 0)


def _os_message(exc: OSError) -> str:
    if exc.filename is None:  # standard output: a full disk, a closed terminal
        return f"cannot write the output: {exc.strerror or exc}"
    return f"{exc.filename}: {exc.strerror or exc}"


def _flush_stdout(debug: bool) -> None:
    """Flush what a command printed before it exited; a failed write is one error line."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        if debug:
            raise
        _quiet_stdout()
        _fail(_os_message(exc))


def _quiet_stdout() -> None:
    """Point standard output at /dev/null, so Python's own flush at exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (captured in tests)


def _fail(message: str) -> None:
    sys.stderr.write(f"kvplan: error: {cut(' '.join(message.split()))}\n")
    raise SystemExit(2)


__all__ = ["app", "main"]
