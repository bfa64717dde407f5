"""Write output files atomically: a failed run never leaves a half-written file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from kvplan.errors import UsageError


def check_writable(path: str | Path, field: str) -> Path:
    """Fail early, before any work, when an output path cannot be written."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; expected a file name", field=field)
    if not path.parent.is_dir():
        raise UsageError(f"directory {path.parent} does not exist", field=field)
    return path


def atomic_write(path: str | Path, write: Callable[[Path], None], field: str = "output") -> None:
    """Call write(tmp) on a temporary file beside `path`, then rename it into place."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", field=field) from None
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", field=field) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
