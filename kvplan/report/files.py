"""The one way kvplan writes a file: all of a run's outputs or none, and never over what is not ours.

- An output path must be new or a regular file: a FIFO, a device (`/dev/null` included) or a
  folder is refused, so nothing that is not a plain file is ever replaced.
- It must not be an input of the run: kvplan/fileio.py records every file read (the workload,
  its traces, the check file, the workloads it names, the baseline compared with), and a path
  that is one of them is refused, before any work when it is named on the command line and
  again just before writing.
- Each file is written to a temporary file beside it and renamed into place only when every
  output of the run is written: a run that fails late leaves nothing behind, and the temporary
  files are removed on every way out (errors, Ctrl-C, SIGTERM; kvplan/cli/ turns a signal into
  an exception).
- A new file gets the mode the umask gives (0666 less the umask); a replaced file keeps its mode.
- A symlink is written through: its target is replaced and the link stays a link. A read-only
  file (no write bit, or one this user may not write) is refused, never replaced.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from kvplan.errors import UsageError
from kvplan.fileio import expand, is_input

Writer = Callable[[Path], None]
NAME_MAX = 255  # bytes in one file name on common file systems


def check_writable(path: str | Path, field: str) -> Path:
    """The output path, checked: fail before any work when it cannot or must not be written."""
    path = expand(path, UsageError, field)
    # the temporary file beside it is named ".NAME.XXXXXXXXSUFFIX"
    if len(os.fsencode(path.name)) + 10 + len(os.fsencode(path.suffix)) > NAME_MAX:
        raise UsageError(f"the file name is too long ({len(os.fsencode(path.name))} bytes)",
                         file=path, field=field)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        reason = ("a symlink loop" if exc.errno == errno.ELOOP else
                  "the file name is too long" if exc.errno == errno.ENAMETOOLONG else
                  f"cannot write: {exc.strerror}")
        raise UsageError(reason, file=path, field=field) from None
    if os.path.islink(path):  # write through the link: the target is replaced, the link kept
        path = Path(os.path.realpath(path))
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise UsageError("is a folder; expected a file name", file=path, field=field)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError("is not a regular file (a FIFO or device); kvplan writes only regular "
                             "files", file=path, field=field)
        if is_input(path):
            raise UsageError("is an input of this run; kvplan never writes over its inputs",
                             file=path, field=field)
        if not info.st_mode & 0o222 or not os.access(path, os.W_OK):
            raise UsageError("is read-only; kvplan does not replace a file it may not write",
                             file=path, field=field)
    if not path.parent.is_dir():
        raise UsageError(f"folder {path.parent} does not exist", file=path, field=field)
    return path


def distinct_outputs(outputs: dict[str, str | Path | None]) -> None:
    """Two options of one run may not name the same output file."""
    seen: dict[str, str] = {}
    for field, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(expand(path, UsageError, field))
        if key in seen:
            raise UsageError(f"names the same file as {seen[key]}", file=path, field=field)
        seen[key] = field


def write_outputs(outputs: Iterable[tuple[str | Path, Writer, str]]) -> None:
    """Write every (path, writer, field) or none: writer(tmp) fills a temporary file beside
    each path; once all are written they are renamed into place."""
    ready: list[tuple[Path, Path, str]] = []
    try:
        for path, write, field in outputs:
            path = check_writable(path, field)  # again: the run has read more inputs since
            tmp = _temporary(path, field)
            ready.append((tmp, path, field))
            try:
                write(tmp)
                os.chmod(tmp, _mode(path))
            except OSError as exc:
                raise UsageError(f"cannot write: {exc.strerror or exc}", file=path, field=field) from None
        for i, (tmp, path, field) in enumerate(ready):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise UsageError(f"cannot write: {exc.strerror or exc}", file=path, field=field) from None
            ready[i] = (path, path, field)  # in place: nothing left to remove
    finally:
        for tmp, path, _ in ready:
            if tmp != path:
                tmp.unlink(missing_ok=True)


def atomic_write(path: str | Path, write: Writer, field: str = "output") -> None:
    """One output file, written as `write_outputs` writes them."""
    write_outputs([(path, write, field)])


def _temporary(path: Path, field: str) -> Path:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    except OSError as exc:
        raise UsageError(f"cannot write: {exc.strerror or exc}", file=path, field=field) from None
    os.close(fd)
    return Path(tmp)


def _mode(path: Path) -> int:
    """The mode a written file gets: the replaced file's, or what the umask leaves of 0666."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
