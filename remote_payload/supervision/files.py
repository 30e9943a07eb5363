"""What the supervisor keeps on the host's disk under ROOT: the paths and atomic files.

`JobPaths` (layout in docs/protocol.md), atomic JSON writes and appends, reading status.json (unreadable is
`bad-status`, never "running") and a result the payload wrote (a bounded regular file of the job dir), the
job's disk reserve. The host-wide locks and the ledger are not under ROOT (locks.py, ledger.py).
"""
from __future__ import annotations

import errno
import json
import os
import stat
import time

from ..contract import MAX_RESULT_BYTES, MAX_RESULT_DEPTH, PROTOCOL
from ..host.answer import Fail
from ..host.bundle import HERE

RESERVE_BYTES = 256 << 10   # given back when the disk fills, so the final status and restore log still fit


# ── paths ─────────────────────────────────────────────────────────────────────────────────────────────

class JobPaths:
    """The one place job paths are built (layout: docs/protocol.md)."""

    def __init__(self, root: str, job_id: str) -> None:
        self.root = root
        self.job_id = job_id
        self.dir = os.path.join(root, "jobs", job_id)
        self.spec = os.path.join(self.dir, "spec.json")
        self.status = os.path.join(self.dir, "status.json")
        self.events = os.path.join(self.dir, "events.jsonl")
        self.output = os.path.join(self.dir, "output.log")
        self.result = os.path.join(self.dir, "result.json")
        self.prepare_result = os.path.join(self.dir, "prepare-result.json")  # the prepare step's, never the job's
        self.restore_log = os.path.join(self.dir, "restore.log")
        self.cancel = os.path.join(self.dir, "cancel")
        self.supervisor_log = os.path.join(self.dir, "supervisor.log")
        self.reserve = os.path.join(self.dir, "reserve")
        self.restore_lock = os.path.join(self.dir, "restore.lock")
        self.ready_lock = os.path.join(self.dir, "ready.lock")   # `start` and `_run` decide the handshake under it
        self.abandoned = os.path.join(self.dir, "abandoned")     # `start` gave up: the supervisor must not go on


# ── atomic io ─────────────────────────────────────────────────────────────────────────────────────────

def write_json_atomic(path: str, obj, mode: int = 0o600, durable: bool = True) -> None:
    """Temp file in the same dir, fsync, rename, fsync the dir: a reader sees the old or the new file.
    durable=False leaves out both fsyncs: still whole for every reader, not sure to outlive a host crash."""
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    tmp = "%s.tmp.%d.%s" % (path, os.getpid(), os.urandom(4).hex())  # a name nobody made first (H is shared)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)  # never publish a half-written file
        raise
    os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


MAX_RECORD_BYTES = 16 << 20  # status.json, spec.json, a ledger entry: ours are kilobytes


class NotRegular(OSError):
    """A job file that is not a regular file (a FIFO, a device, a folder): the payload replaced it."""


def open_regular(path: str):
    """A job's file, open for reading in binary. The payload may replace it: the open never blocks (a FIFO
    would, for good) and what is not a regular file is refused (NotRegular) before a byte is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise NotRegular(errno.EINVAL, "not a regular file (a FIFO, a device or a folder)", path)
    return fh


def read_json(path: str):
    """A record as JSON, read as the payload may have left it (open_regular), at most MAX_RECORD_BYTES of it."""
    with open_regular(path) as fh:
        data = fh.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError("larger than %d bytes" % MAX_RECORD_BYTES)
    return json.loads(data.decode("utf-8"))


# ── result files: written by the payload, so read as hostile ───────────────────────────────────────────

class UnsafeResult(ValueError):
    """A result file refused before or while it was read; the message says why ("is a symlink", ...)."""


def open_result(path: str, job_dir: str) -> tuple:
    """(an fd open for reading, its fstat) of a result file: a regular file inside the job dir, never through
    a symlink, a FIFO or a device. FileNotFoundError when there is none; UnsafeResult otherwise."""
    inside = os.path.realpath(job_dir)
    if os.path.commonpath([os.path.realpath(os.path.dirname(path)), inside]) != inside:
        raise UnsafeResult("is not inside the job dir (a folder on its way is a symlink)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeResult("is a symlink, not a regular file of the job dir") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeResult("is not a regular file (a FIFO, a device or a folder)")
    return fd, info


def read_result(path: str, job_dir: str, limit: int = MAX_RESULT_BYTES):
    """A result file's JSON value (open_result, parse_bounded), at most `limit` bytes."""
    fd, _ = open_result(path, job_dir)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeResult("is over %.1f MB" % (limit / (1 << 20)))
    return parse_bounded(data)


def parse_bounded(data: bytes):
    """JSON nested at most MAX_RESULT_DEPTH levels, measured without recursion (no depth exhausts the stack)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise UnsafeResult("is nested deeper than %d levels" % MAX_RESULT_DEPTH) from None
    if depth_over(value, MAX_RESULT_DEPTH):
        raise UnsafeResult("is nested deeper than %d levels" % MAX_RESULT_DEPTH)
    return value


def depth_over(value, limit: int) -> bool:
    """Whether a parsed JSON value nests deeper than `limit` levels (the value itself is level 1)."""
    todo = [(value, 1)] if isinstance(value, (dict, list)) else []
    while todo:
        node, depth = todo.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def file_digest(fd: int, size: int, most: int) -> str | None:
    """sha256 of an open file read from its start, or None when it is over `most` bytes (not worth the time)."""
    if size > most:
        return None
    import hashlib  # a result's digest only: the read-only verbs never load it

    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def is_slurm_job(paths: JobPaths) -> bool:
    """A `launcher: slurm` job (its supervisor runs in an allocation: slurm/launch.py follows it)."""
    try:
        return read_json(paths.spec).get("launcher") == "slurm"
    except (OSError, ValueError, AttributeError):
        return False


def append_line(path: str, obj) -> None:
    append_bytes(path, (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8"))


def append_text(path: str, text: str) -> None:
    append_bytes(path, ("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), text)).encode("utf-8"))


def append_bytes(path: str, data: bytes) -> None:
    """One append to a job's log or event lines, made 0600 like its records."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def try_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def release_reserve(paths: JobPaths) -> bool:
    try:
        os.unlink(paths.reserve)
        return True
    except OSError:
        return False


def stamp() -> dict:
    """What every record carries: the protocol and the bundle (its digest) of the code that wrote it."""
    return {"protocol": PROTOCOL, "bundle": os.path.basename(HERE)}


TORN_READ_WAITS = (0.02, 0.05, 0.1)  # s: a payload rewriting status.json in place leaves it empty for a moment


def read_status(paths: JobPaths) -> dict:
    """status.json; one that does not parse (a payload may rewrite it in place) is read again, then `bad-status`."""
    for wait in TORN_READ_WAITS + (None,):
        try:
            status = read_json(paths.status)
            if not isinstance(status, dict) or "state" not in status:
                raise ValueError("not a status object")
            break
        except (OSError, ValueError) as exc:  # absent or not a regular file: no second read
            if wait is None or isinstance(exc, OSError):
                raise Fail("bad-status", "cannot read %s: %s" % (paths.status, exc), job_id=paths.job_id) from exc
            time.sleep(wait)
    check_protocol(status, paths.status)
    return status


def check_protocol(record: dict, path: str) -> None:
    """A record written by a newer supervisor (a later protocol) is refused, never half understood."""
    written = record.get("protocol", 1)
    if not isinstance(written, int) or isinstance(written, bool) or written > PROTOCOL:
        raise Fail("newer-protocol", "%s was written by a newer runner (protocol %r, bundle %r); this supervisor "
                   "speaks protocol %d: use that runner's controller for this job" % (
                       path, written, record.get("bundle"), PROTOCOL))


