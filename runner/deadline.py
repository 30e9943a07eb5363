"""One deadline per controller command, passed down to every hop (call, upload, connect, channel).

A hop asks how long it may take (`cap`), never starts its own clock: the sum of the hops cannot outlive
the command (DESIGN.md invariant 2).
"""
from __future__ import annotations

import math
import time


class Deadline:
    """A point on the monotonic clock `seconds` from now; `Deadline(math.inf)` never passes."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds until the deadline, never below 0."""
        return max(0.0, self._end - time.monotonic())

    def cap(self, timeout: float) -> float:
        """timeout, or less when the deadline comes first."""
        return min(timeout, self.left())

    def within(self, seconds: float) -> Deadline:
        """A deadline `seconds` from now, or this one when it comes first (one hop of the command)."""
        return Deadline(self.cap(seconds))

    def __repr__(self) -> str:
        return f"Deadline(left={self.left():.2f}s)" if math.isfinite(self._end) else "Deadline(never)"
