"""What the supervisor keeps on the host's disk under ROOT: the paths, atomic files and the locks.

Owns: `JobPaths` (the one place job paths are built; layout in docs/protocol.md), atomic JSON writes
(temp + fsync + rename + dir fsync) and appends, reading status.json (unreadable is `bad-status`, never
"running"), reading a result the payload wrote (a bounded regular file of the job dir), the job's disk
reserve, and the host-wide flock locks under ROOT/locks with their holder files. Host-level records that
must outlive every process belong here, beside the locks.
Imports only the stdlib, contract.py and host/ (answer.py, bundle.py, gpu.py, parsers.py, processes.py).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time

from ..contract import MAX_RESULT_BYTES, MAX_RESULT_DEPTH, PROTOCOL, services_of
from ..host.answer import Fail
from ..host.bundle import HERE
from ..host.gpu import GPU_QUERY, nvidia_smi, query_gpus
from ..host.parsers import parse_gpu_csv
from ..host.processes import pid_exists, real_uid

RESERVE_BYTES = 256 << 10   # given back when the disk fills, so the final status and restore log still fit
LOCK_RETRY_S = 5.0          # how long a busy lock with no live holder recorded is retried before "busy"
#                              (a starter writes its holder record just after its flock; under load that takes >1 s)


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


def locks_dir(root: str) -> str:
    return os.path.join(root, "locks")


# ── atomic io ─────────────────────────────────────────────────────────────────────────────────────────

def write_json_atomic(path: str, obj) -> None:
    """Temp file in the same dir, fsync, rename, fsync the dir: a reader sees the old or the new file."""
    data = (json.dumps(obj, sort_keys=True) + "\n").encode("utf-8")
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try_unlink(tmp)  # a leftover of a killed writer with our pid; never write through what sits there
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)  # never publish a half-written file
        raise
    os.close(fd)
    os.replace(tmp, path)
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
    """A job's file, open for reading in binary. A job's files are its payload's to replace, so the open never
    blocks (a FIFO would hold it until a writer came, for good: every `status`, `logs` and restorer with it) and
    what is not a regular file is refused (NotRegular, an OSError) before a byte is read (a device never ends)."""
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
    a symlink, never a FIFO (which would block the open) or a device (/dev/zero never ends).
    FileNotFoundError when there is none; UnsafeResult otherwise."""
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
    """The JSON value of a result file, read as open_result allows, at most `limit` bytes and nested at most
    MAX_RESULT_DEPTH levels (parse_bounded: no depth can exhaust the stack). FileNotFoundError
    when there is none; UnsafeResult or ValueError (not JSON) otherwise."""
    fd, _ = open_result(path, job_dir)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeResult("is over %.1f MB" % (limit / (1 << 20)))
    return parse_bounded(data)


def parse_bounded(data: bytes):
    """JSON nested at most MAX_RESULT_DEPTH levels: the C parser stops a deeper text with RecursionError (caught
    here), and the depth of what it parsed is measured without recursion."""
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
    with open(path, "ab") as fh:
        fh.write((json.dumps(obj, sort_keys=True) + "\n").encode("utf-8"))


def append_text(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), text))


# ── locks ─────────────────────────────────────────────────────────────────────────────────────────────

def lock_keys(spec: dict) -> list:
    """`gpu-<index>` per device and `service-<unit>` per service the job frees; none for CPU jobs. A job that
    frees a service without naming devices means every GPU: it takes every card's lock (as nvidia-smi lists
    them), so a job on any one card waits for it and it for them."""
    services = services_of(spec)
    devices = spec["gpu"]["devices"]
    keys = ["gpu-" + d for d in (gpu_lock_names(devices) if devices or not services else every_gpu())]
    keys += ["service-" + s["unit"] for s in services]
    return sorted(set(keys))


def restore_keys(spec: dict) -> list:
    """A restorer's keys: the job's devices and its services. Without devices, its services' alone: a job on
    another card neither runs on them nor adopts their stops, and must not hold their restore back."""
    return lock_keys(spec) if spec["gpu"]["devices"] else ["service-" + s["unit"] for s in services_of(spec)]


def every_gpu() -> list:
    """Every card's index; none when nvidia-smi cannot say (a host without GPUs)."""
    try:
        return [str(g["index"]) for g in parse_gpu_csv(nvidia_smi(GPU_QUERY))]
    except (Fail, ValueError):
        return []


def gpu_lock_names(devices: list) -> list:
    """One name per card however the spec names it (index or UUID): its index, as nvidia-smi reports it."""
    if not devices:
        return []
    try:
        return [str(g["index"]) for g in query_gpus(devices)]
    except (Fail, ValueError):
        return list(devices)  # the drain step reports the GPU problem with its own message


def read_holder(root: str, key: str):
    try:
        holder = read_json(os.path.join(locks_dir(root), key + ".json"))
    except (OSError, ValueError):
        return None
    return dict(holder, key=key) if isinstance(holder, dict) else None


def probe_lock(root: str, key: str) -> dict:
    """Whether a lock is held now, without keeping it. Held with no live holder recorded means a starter that
    has not written its record yet: look again for a moment, so the answer names the job (or finds it free)."""
    deadline = time.monotonic() + LOCK_RETRY_S
    while True:
        probe = _probe_once(root, key)
        holder = probe["holder"]
        if not probe["held"] or (holder and pid_exists(holder.get("pid"))) or time.monotonic() >= deadline:
            return probe
        time.sleep(0.05)


def lock_held(root: str, key: str) -> bool:
    """One probe, no waiting: whether some process holds the lock now (a job's supervisor or its guard)."""
    return _probe_once(root, key)["held"]


def held_by_another_user(root: str, key: str) -> bool:
    """The lock is held by a process of a user none of the job's processes runs as (root, ROOT's owner, the
    lock file's owner, us): payload.user's processes outside the job can open the lock file read-only and
    flock it, and must not pass for a live supervisor or guard. A holder /proc/locks cannot name (gone, or in
    another pid namespace) counts as the job's."""
    path = os.path.join(locks_dir(root), key + ".lock")
    try:
        ours = {0, os.geteuid(), os.stat(path).st_uid, os.stat(root).st_uid}
        inode = os.stat(path).st_ino
    except OSError:
        return False
    uids = {real_uid(pid) for pid in flock_holders(inode) if pid > 0} - {None}
    return bool(uids) and not uids & ours


def flock_holders(inode: int) -> set:
    """The pids /proc/locks shows holding (not waiting for) a flock on the file with this inode."""
    pids = set()
    try:
        with open("/proc/locks") as fh:
            for fields in (line.split() for line in fh):
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
                    pids.add(int(fields[4]))
    except (OSError, ValueError):
        pass
    return pids


def _probe_once(root: str, key: str) -> dict:
    path = os.path.join(locks_dir(root), key + ".lock")
    if not os.path.exists(path):
        return {"key": key, "held": False, "holder": None}
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: two probes never make each other "busy"
        return {"key": key, "held": False, "holder": None}
    except BlockingIOError:
        return {"key": key, "held": True, "holder": read_holder(root, key)}
    finally:
        os.close(fd)


class Locks:
    """flock files under ROOT/locks; all or nothing (so two queued jobs never hold one lock each)."""

    def __init__(self, root: str, keys: list, job_id: str) -> None:
        self.root, self.keys, self.job_id = root, keys, job_id
        self.fds: dict[str, int] = {}  # lock key -> its open descriptor
        self.held = False

    def open(self) -> None:
        os.makedirs(locks_dir(self.root), exist_ok=True)
        for key in self.keys:
            self.fds[key] = os.open(os.path.join(locks_dir(self.root), key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)

    def try_acquire(self):
        """Take every lock or none. Returns the holder of the first busy one, or None when all are ours.
        A lock that is busy with no live holder recorded is a probe or a starter that has not written its
        holder yet: try again for a moment rather than answer "busy" naming nobody."""
        deadline = time.monotonic() + LOCK_RETRY_S
        while True:
            holder = self._try_all()
            if holder is None or pid_exists(holder.get("pid")) or time.monotonic() >= deadline:
                return holder
            time.sleep(0.05)

    def _try_all(self):
        taken = []
        for key in self.keys:
            try:
                fcntl.flock(self.fds[key], fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                for done in taken:
                    fcntl.flock(self.fds[done], fcntl.LOCK_UN)
                return read_holder(self.root, key) or {"key": key}
            taken.append(key)
        self.held = True
        return None

    def write_holders(self) -> None:
        for key in self.keys:
            write_json_atomic(os.path.join(locks_dir(self.root), key + ".json"),
                              {"job_id": self.job_id, "pid": os.getpid(), "since": time.time()})

    def release(self) -> None:
        """LOCK_UN releases the lock for every fd sharing the open file (the guard's copies too)."""
        if not self.held:
            return
        for key in self.keys:
            holder = read_holder(self.root, key)
            if holder and holder.get("job_id") == self.job_id:
                try_unlink(os.path.join(locks_dir(self.root), key + ".json"))
            fcntl.flock(self.fds[key], fcntl.LOCK_UN)
        self.held = False


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
    """What every record this code writes carries: the wire protocol it speaks and the bundle it runs from
    (ROOT/payload/<digest>: the digest), so a later supervisor can tell which code wrote an old job's files."""
    return {"protocol": PROTOCOL, "bundle": os.path.basename(HERE)}


TORN_READ_WAITS = (0.02, 0.05, 0.1)  # s: a payload rewriting status.json in place leaves it empty for a moment


def read_status(paths: JobPaths) -> dict:
    """The job's status.json. Ours is replaced whole (rename), but a payload may rewrite it in place: what does
    not parse is read again after each of TORN_READ_WAITS (0.17 s in all) before it is `bad-status`."""
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


