"""JSON event lines on stdout, one per event and flushed, with heartbeats during long phases.

The runner shows the payload's stdout live; a phase such as the cold JIT compile runs for minutes with no
output of its own, so `phase()` prints a heartbeat from a background thread until the phase ends.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, Iterator


class Events:
    def __init__(self, start: float, stream: IO[str] | None = None, heartbeat_s: float = 5.0):
        self.start = start                      # time.time() at process start
        self.stream = stream or sys.stdout
        self.heartbeat_s = heartbeat_s
        self.phase_seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    def since_start(self) -> float:
        return time.time() - self.start

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, **fields, "t": round(self.since_start(), 3)})
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def wait_for_go(self, stdin: IO[str] | None = None) -> None:
        """Staged (RUNNER_STAGED=1): the line {"event": "staged"}, then one line from stdin. `go` hands this
        process the GPU; EOF (the supervisor is gone) or anything else exits, nothing touched."""
        self.emit("staged")
        line = (stdin or sys.stdin).readline()
        if line.strip() != "go":
            raise SystemExit(f"bench_marlin_moe: stdin said {line!r}, not go: exiting without touching the GPU")

    @contextmanager
    def phase(self, name: str, **fields) -> Iterator[None]:
        """start/end lines around a block, heartbeats while it runs; the end line says whether it failed."""
        began = time.monotonic()
        self.emit("phase", phase=name, status="start", **fields)
        stop = threading.Event()
        beater = threading.Thread(target=self._beat, args=(name, began, stop), daemon=True)
        beater.start()
        status = "error"
        try:
            yield
            status = "end"
        finally:
            stop.set()
            beater.join()
            seconds = round(time.monotonic() - began, 3)
            self.phase_seconds[name] = seconds
            self.emit("phase", phase=name, status=status, seconds=seconds, **fields)

    def _beat(self, name: str, began: float, stop: threading.Event) -> None:
        while not stop.wait(self.heartbeat_s):
            self.emit("heartbeat", phase=name, elapsed_s=round(time.monotonic() - began, 1))
