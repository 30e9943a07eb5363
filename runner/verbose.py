"""`runner -v` (or RUNNER_DEBUG=1): what runner does on a host, said on stderr as it happens — each ssh command
line as run, each supervisor call with its round trip's time and exit code, each upload with its size.

The switch is the environment variable, so a child runner (an args check, a fleet's host thread) says it too.
"""
from __future__ import annotations

import os
import sys
import time
from types import TracebackType

ENV = "RUNNER_DEBUG"


def on() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def say(message: str) -> None:
    """One line on stderr, stamped, when on (never raises: stderr may be closed)."""
    if on():
        try:
            sys.stderr.write(f"[runner -v {time.strftime('%H:%M:%S')}] {message}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


class timed:
    """`with timed("what"):` says what ran and how long it took, and how it ended."""

    def __init__(self, what: str) -> None:
        self.what, self.started, self.outcome = what, 0.0, ""

    def __enter__(self) -> timed:
        self.started = time.monotonic()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: TracebackType | None) -> None:
        ended = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}" if exc else self.outcome
        say(f"{self.what}: {ended or 'done'} in {time.monotonic() - self.started:.3f} s")
