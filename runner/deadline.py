"""One deadline per controller command, passed down to every hop (call, upload, retry, connect, channel).

A command makes its deadline once (`Deadline.for_command(max_wait)`); a hop asks how long it may take
(`left`, `cap`) and never starts a clock of its own, and a retry runs inside what is left: the sum of the
hops cannot outlive the command, so no command blocks longer than its --max-wait plus one round trip.
"""
from __future__ import annotations

import time

DEFAULT_MAX_WAIT_S = 50.0  # every command's --max-wait unless given: fits an agent's 120 s tool limit
MAX_WAIT_LIMIT_S = 3600  # the most --max-wait a command takes (the CLI's range)
# How far past --max-wait one SSH round trip may run before the command gives up (exit 3): the bound on a
# link that went silent, where nothing but the clock ends the wait.
ROUND_TRIP_ALLOWANCE_S = 5.0


class Deadline:
    """A point on the monotonic clock `seconds` from now."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    @classmethod
    def for_command(cls, max_wait: float) -> Deadline:
        """A command's one deadline: its --max-wait plus one round trip's allowance."""
        return cls(max_wait + ROUND_TRIP_ALLOWANCE_S)

    def left(self) -> float:
        """Seconds until the deadline, never below 0."""
        return max(0.0, self._end - time.monotonic())

    def passed(self) -> bool:
        return self.left() <= 0.0

    def cap(self, timeout: float) -> float:
        """timeout, or less when the deadline comes first."""
        return min(timeout, self.left())

    def within(self, seconds: float) -> Deadline:
        """A deadline `seconds` from now, or this one when it comes first (a part of the command, e.g. its
        connect, that has a shorter bound of its own)."""
        return Deadline(self.cap(seconds))

    def __repr__(self) -> str:
        return f"Deadline(left={self.left():.2f}s)"
