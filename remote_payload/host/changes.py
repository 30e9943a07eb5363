"""Waiting for a job's dir to change: inotify on the dir, through ctypes (the stdlib has no binding). What a reader
waits for all shows there: its log appended, status.json replaced, and the end of its supervisor and guard (the
last of them to die closes supervisor.log: IN_CLOSE_WRITE), so a job both left without a word is reaped by the
reader it wakes. Where inotify is missing or fails (not Linux, a watch limit, a Slurm job's files written on
other nodes), a plain poll every POLL_S.

The first wait arms the watch and returns at once: a call that never waits never loads ctypes, and a change
made before the watch existed is read by the pass after it. A wake waits for the rest of its burst and comes at
most once every GAP_S: a log written in many small writes costs a reader a few dozen passes a second, not one
per write.
"""
from __future__ import annotations

import os
import select
import time

from .processes import POLL_S

GAP_S = 0.05
SETTLE_S = 0.002
# inotify(7): a file in the dir written, or closed after writing; a name moved or created in it (status.json
# replaced by rename, the log created); the dir itself removed or moved
EVENTS = 0x2 | 0x8 | 0x80 | 0x100 | 0x400 | 0x800
IN_Q_OVERFLOW = 0x4000


class Changes:
    """A dir's changes, waited for; a context manager that gives its fd back."""

    def __init__(self, path) -> None:
        self.path = path  # None: polled
        self.fd: int | None = None
        self.armed = False
        self.last = time.monotonic()
        self.names: set = set()

    def __enter__(self) -> Changes:
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def wait(self, seconds: float) -> None:
        """Until something in the dir changed, at most `seconds`."""
        if not self.armed:
            self.armed, self.fd, self.names = True, self.inotify(), {None}  # what changed before it: unknown
            return
        if self.fd is None:
            time.sleep(max(0.0, min(POLL_S, seconds)))
            return
        if select.select([self.fd], [], [], max(0.0, seconds))[0]:
            early = self.last + GAP_S - time.monotonic()
            if early > 0:
                time.sleep(early)
            self.drain()
            settled = time.monotonic() + GAP_S
            while time.monotonic() < settled and select.select([self.fd], [], [], SETTLE_S)[0]:
                self.drain()  # the rest of a burst: a print's text and newline are two writes when unbuffered
        self.last = time.monotonic()

    def inotify(self):
        """An inotify fd watching the dir, or None where there can be none."""
        if self.path is None:
            return None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(self.path), EVENTS) < 0:
            os.close(fd)
            return None
        return fd

    def changed(self):
        """The names in the dir changed since the last call, or None where that is not known (polled, just
        armed, the kernel's queue overflowed)."""
        names, self.names = self.names, set()
        return None if self.fd is None or None in names else names

    def drain(self) -> None:
        """Read every event queued, keeping the names they are about."""
        assert self.fd is not None
        import struct

        try:
            while True:
                events = os.read(self.fd, 1 << 16)
                at = 0
                while at < len(events):
                    _wd, mask, _cookie, size = struct.unpack_from("iIII", events, at)
                    name = events[at + 16:at + 16 + size].rstrip(b"\0").decode("utf-8", "replace")
                    self.names.add(None if mask & IN_Q_OVERFLOW else name)
                    at += 16 + size
        except BlockingIOError:
            pass
