"""The controller's own files that a user names on the command line (a result.json, a baseline, a plot):
regular files only, read up to a cap.

A FIFO or a device blocks open() or read() forever, so each is opened non-blocking and checked before a
byte is read or written; a file over the cap is refused before it is read (rendering it would take the
terminal and the memory with it).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from remote_payload.contract import MAX_RESULT_BYTES

from .errors import NoResult, SpecError

__all__ = ["MAX_RESULT_BYTES", "read_regular", "write_regular", "megabytes"]


def megabytes(size: int) -> str:
    return f"{size / (1 << 20):.0f} MB"


def read_regular(path: str | Path, what: str, *, limit: int = MAX_RESULT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. OSError when it cannot be opened; SpecError
    (exit 2) when it is not a regular file; NoResult when it is over the cap."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        _require_regular(path, info, what)
        if info.st_size > limit:
            raise _too_large(path, info.st_size, limit, what)
        data = fh.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise _too_large(path, len(data), limit, what)
    return data


def write_regular(path: str | Path, data: bytes, what: str) -> None:
    """Write `data` to a new or existing regular file; SpecError (exit 2) naming the path otherwise."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise SpecError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None
    if info is not None:
        _require_regular(path, info, what)
    try:
        # O_NONBLOCK: a FIFO swapped in since the stat fails (ENXIO) instead of waiting for a reader.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        raise SpecError(f"{path}: cannot write {what}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as fh:
        _require_regular(path, os.fstat(fh.fileno()), what)
        fh.write(data)


def _require_regular(path: str | Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{path}: not a regular file ({_kind(info.st_mode)}); {what} must be a file")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _too_large(path: str | Path, size: int, limit: int, what: str) -> NoResult:
    return NoResult(f"{path}: {what} is {size / (1 << 20):.1f} MB, over runner's {megabytes(limit)} cap",
                    hint=f"read the raw file with another tool (jq, python -m json.tool): {path}")
