"""`logs`: output.log bytes from an offset, waiting (bounded) for new ones."""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from ..contract import TERMINAL
from ..host.answer import Fail
from ..host.changes import Changes
from ..supervision.files import JobPaths, NotRegular, is_slurm_job, open_regular
from ..supervision.spec import job_paths
from .launcher import slurm_launch
from .reap import reap_if_dead

LOG_MAX_BYTES = 4 << 20


def read_log_chunk(path: str, offset: int, limit: int) -> tuple:
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(offset)
            return fh.read(min(limit, max(0, size - offset))), size
    except (FileNotFoundError, NotRegular):  # a log the payload replaced with a FIFO or a device reads as none
        return b"", 0


def cmd_logs(args) -> dict:
    paths = job_paths(args)
    if args.offset < 0 or args.max <= 0:
        raise Fail("bad-args", "--offset must be >= 0 and --max > 0")
    if args.stream:
        return stream_log(paths, args)
    import base64  # the one-answer form's: a stream (every tail) sends the bytes raw, after each frame's line

    deadline = time.monotonic() + max(0.0, args.wait)
    with JobLog(paths) as log:
        while True:
            status, data, size = log.read(args.offset, min(args.max, LOG_MAX_BYTES))
            terminal = status["state"] in TERMINAL
            if data or terminal or time.monotonic() >= deadline:
                return {"ok": True, "offset": args.offset, "next_offset": args.offset + len(data), "size": size,
                        "data_b64": base64.b64encode(data).decode("ascii"), "state": status["state"],
                        "terminal": terminal, "exit_code": status.get("exit_code"),
                        "message": status.get("message") if terminal else None}
            log.changes.wait(deadline - time.monotonic())


class JobLog:
    """A `logs` call's reads of the job: its state, then its log's bytes from an offset. A waiting call sleeps
    on the job dir's changes and reads the state again only when something other than the log changed; a
    Slurm job's files are written on other nodes: polled, the state read at each pass."""

    def __init__(self, paths: JobPaths) -> None:
        self.paths, self.slurm = paths, is_slurm_job(paths)
        self.changes = Changes(None if self.slurm else paths.dir)
        self.status: dict | None = None

    def __enter__(self) -> JobLog:
        return self

    def __exit__(self, *exc) -> None:
        self.changes.__exit__(*exc)

    def read(self, offset: int, limit: int) -> tuple:
        """(the state, up to `limit` bytes of the log from `offset`, the log's size); an offset past the end is
        bad-offset. The state first: a terminal state then covers every byte read after it."""
        changed = self.changes.changed()
        if self.status is None or changed is None or changed - {os.path.basename(self.paths.output)}:
            self.status = reap_if_dead(self.paths)
        data, size = (self.slurm and slurm_launch().log_chunk(self.paths, offset, limit)) or \
            read_log_chunk(self.paths.output, offset, limit)  # a job array's: its variants' logs in turn
        if offset > size:
            raise Fail("bad-offset", "offset %d is past the end of the log (%d bytes)" % (offset, size), size=size)
        return self.status, data, size


def widen_pipe(fd: int) -> None:
    """Our stdout a pipe of a megabyte where it is a pipe and Linux allows it: fewer, larger writes to sshd."""
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass


def stream_log(paths: JobPaths, args) -> dict:
    """`logs --stream`: the log from --offset as it grows, for up to --wait seconds (--follow: until the job
    ended and every byte went). Each chunk is a frame: a JSON header line, then its raw bytes; the answer line
    is the last frame, with no bytes."""
    deadline, offset = time.monotonic() + max(0.0, args.wait), args.offset
    out = sys.stdout.buffer
    widen_pipe(out.fileno())
    with JobLog(paths) as log:
        while True:
            status, data, size = log.read(offset, min(args.max, LOG_MAX_BYTES))
            frame = {"ok": True, "offset": offset, "next_offset": offset + len(data), "size": size,
                     "state": status["state"], "terminal": status["state"] in TERMINAL,
                     "exit_code": status.get("exit_code"), "data_len": len(data), "last": False}
            if data:
                out.write(json.dumps(frame).encode() + b"\n")
                out.write(data)
                out.flush()
                offset += len(data)
            caught_up = offset >= size
            if (caught_up and (frame["terminal"] or not args.follow)) or time.monotonic() >= deadline:
                return dict(frame, offset=offset, next_offset=offset, data_len=0, last=True,
                            message=status.get("message") if frame["terminal"] else None)
            if caught_up:
                log.changes.wait(deadline - time.monotonic())
