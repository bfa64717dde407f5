"""The one way kvplan opens a file it reads, and remembers it so that no output can overwrite it.

Every reader (workload and check files, model configs, traces, baselines, length columns) goes
through `input_path`, which turns every way a name can be wrong into one located error:

- a NUL byte, a name the OS refuses as too long, `~user/` of no such user;
- a symlink loop, a missing file, no permission;
- something that is not a regular file: a FIFO or a device would block or never end, a folder
  is not a file (readers that take a folder say so);

and then `read_limited`, `text_lines` and `load_json` read it with bounds: a whole-file read
stops at a size limit before anything is parsed, lines are at most MAX_LINE_BYTES, text must be
UTF-8 (a gzip file is read through transparently), JSON nested too deeply or holding a number of
thousands of digits is refused. Every path read is recorded, and `is_input` tells the writers in
kvplan/report/files.py that a path is an input of this run.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any, Iterator

from kvplan.errors import KvplanError

MAX_LINE_BYTES = 1 << 20  # one line of a text trace or column file
# A gzip file that unpacks to more than GZIP_MAX_RATIO times its size, once past GZIP_FREE_BYTES, is a
# decompression bomb, not a trace: real traces compress 3-4x (CSV, JSONL) and up to 35x (indented
# JSON). Blank lines cost a Python step each and carry nothing: a run of more than MAX_BLANK_RUN in
# a row is refused, so that 20 MiB of newlines fails in a blink instead of being read for minutes.
GZIP_MAX_RATIO = 200
GZIP_FREE_BYTES = 16 << 20
MAX_BLANK_RUN = 100_000
GZIP_MAGIC = b"\x1f\x8b"

_inputs: set[tuple[int, int]] = set()  # (device, inode) of every file read in this process


def expand(path: str | Path, error_cls: type[KvplanError], field: str | None = None) -> Path:
    """`~` and `~user` expanded; a NUL byte or an unknown user is an error naming the path."""
    text = os.fspath(path)
    if "\x00" in text:
        raise error_cls("the file name contains a NUL byte", file=text.replace("\x00", "\\0"), field=field)
    if text.startswith("~"):
        try:
            expanded = os.path.expanduser(text)
        except (KeyError, RuntimeError):
            expanded = text
        if expanded.startswith("~"):
            user = text[1:].split(os.sep, 1)[0]
            raise error_cls(f"cannot expand ~{user}: no such user or no home directory", file=text,
                            field=field)
        text = expanded
    return Path(text)


def _stat(path: Path, error_cls, field) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise error_cls(_why(exc), file=path, field=field) from None
    except ValueError as exc:  # e.g. "embedded null byte" from an odd path type
        raise error_cls(f"cannot read: {exc}", file=path, field=field) from None


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop (the link points back at itself)"
    if exc.errno == errno.ENAMETOOLONG:
        return "the file name is too long for the file system"
    if exc.errno == errno.ENOENT:
        return "no such file or folder"
    return f"cannot read: {exc.strerror or exc}"


def input_path(path: str | Path, error_cls: type[KvplanError], field: str | None = None, *,
               folder_ok: bool = False) -> Path:
    """A path that names a regular file (or, with folder_ok, a folder) that exists; recorded."""
    path = expand(path, error_cls, field)
    info = _stat(path, error_cls, field)
    if stat.S_ISDIR(info.st_mode):
        if not folder_ok:
            raise error_cls("expected a file, not a folder", file=path, field=field)
    elif not stat.S_ISREG(info.st_mode):
        raise error_cls("expected a regular file, not a FIFO or device (it could block or never end)", file=path,
                        field=field)
    _inputs.add((info.st_dev, info.st_ino))
    return path


def is_input(path: str | Path) -> bool:
    """Whether `path` (following links) is a file this run has read."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) in _inputs


def note_input(path: str | Path) -> None:
    """Record a path named on the command line as an input before anything is read."""
    try:
        info = os.stat(expand(path, KvplanError))
    except (OSError, ValueError, KvplanError):
        return
    if stat.S_ISREG(info.st_mode):
        _inputs.add((info.st_dev, info.st_ino))


def _open_binary(path: Path, error_cls, field):
    """The file for reading bytes; a gzip file (by its magic bytes) decompressed on the way."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == GZIP_MAGIC
        if gzipped:
            import gzip

            return gzip.open(path, "rb")
        return open(path, "rb")
    except OSError as exc:
        raise error_cls(_why(exc), file=path, field=field) from None


def read_limited(path: str | Path, limit: int, error_cls: type[KvplanError], field: str | None = None,
                 *, what: str = "file") -> bytes:
    """A whole (small) file, refused unparsed when it is larger than `limit` bytes."""
    path = input_path(path, error_cls, field)
    too_big = error_cls(f"{what} is larger than the {limit // 2**20} MiB limit", file=path, field=field)
    if os.stat(path).st_size > limit:
        raise too_big  # refused by its size, before a byte is read
    try:
        with _open_binary(path, error_cls, field) as f:
            data = f.read(limit + 1)  # a gzip file may unpack to more than its size
    except (OSError, EOFError, zlib.error) as exc:
        raise error_cls(f"cannot read: {getattr(exc, 'strerror', None) or exc}", file=path, field=field) from None
    if len(data) > limit:
        raise too_big
    return data


def decode(data: bytes, path: Path, error_cls, field=None, line: int | None = None) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error_cls(f"not UTF-8 text (byte {exc.start}{' of the line' if line else ''}); "
                        "save it as UTF-8 (gzip is read as is)", file=path, field=field, line=line) from None
    return text.removeprefix("\ufeff") if line in (None, 1) else text


def text_lines(path: str | Path, error_cls: type[KvplanError], field: str | None = None,
               *, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a UTF-8 (or gzipped UTF-8) text file, each at most `max_line` bytes, streamed.

    A byte-order mark before the first line is dropped. Errors name the file and line. A gzip
    file may unpack to at most GZIP_MAX_RATIO times its size (past GZIP_FREE_BYTES), and no file
    may hold more than MAX_BLANK_RUN blank lines in a row.
    """
    path = input_path(path, error_cls, field)
    number = blank_run = unpacked = 0
    packed = os.stat(path).st_size
    with _open_binary(path, error_cls, field) as f:
        gzipped = type(f).__name__ == "GzipFile"  # _open_binary's choice by the magic bytes
        while True:
            try:
                raw = f.readline(max_line + 1)
            except (OSError, EOFError, zlib.error) as exc:
                raise error_cls(f"cannot read: {getattr(exc, 'strerror', None) or exc}", file=path,
                                field=field, line=number + 1) from None
            if not raw:
                return
            number += 1
            if len(raw) > max_line:
                raise error_cls(f"line longer than {max_line >> 20} MiB", file=path, field=field,
                                line=number)
            unpacked += len(raw)
            if gzipped and unpacked > GZIP_FREE_BYTES and unpacked > GZIP_MAX_RATIO * packed:
                raise error_cls(f"the gzip file unpacks to more than {GZIP_MAX_RATIO} times its size "
                                f"({packed:,} bytes); a trace compresses far less (a decompression bomb?)",
                                file=path, field=field, line=number)
            blank_run = blank_run + 1 if raw.isspace() else 0
            if blank_run > MAX_BLANK_RUN:
                raise error_cls(f"more than {MAX_BLANK_RUN:,} blank lines in a row; expected one record "
                                "per line", file=path, field=field, line=number)
            yield decode(raw, path, error_cls, field, line=number)


def load_json(data: bytes | str, path: Path, error_cls: type[KvplanError], field: str | None = None,
              *, line: int | None = None, **options: Any) -> Any:
    """json.loads with every failure as one located error: syntax, depth, huge numbers."""
    text = decode(data, path, error_cls, field, line) if isinstance(data, bytes) else data
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        raise error_cls(f"not valid JSON: {exc.msg}", file=path, field=field,
                        line=line if line is not None else exc.lineno) from None
    except RecursionError:
        raise error_cls("not valid JSON: nested too deeply", file=path, field=field, line=line) from None
    except ValueError as exc:  # Python's int digit limit, or an options hook's refusal
        raise error_cls(f"not valid JSON: {_short(str(exc))}", file=path, field=field, line=line) from None


def _short(text: str) -> str:
    if "digits" in text and "integer" in text:
        return "a number with more than 4,300 digits"
    return text


__all__ = ["MAX_LINE_BYTES", "decode", "expand", "input_path", "is_input", "load_json", "note_input",
           "read_limited", "text_lines"]
