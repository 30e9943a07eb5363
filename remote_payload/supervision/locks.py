"""The host lock place: one owner per unit and per GPU on the host, whatever the login and its host.root.

    H = /run/lock (root's, 1777 + sticky; RUNNER_LOCK_DIR in the host's environment names another)
    H/runner-<key>.lock       the flock of `service-<unit>` or `gpu-<index>`: made 0600 by its taker, removed
                              by its holder as it lets go; nobody else can open it, so nobody else can flock it
    H/runner-<key>.json       who holds it: {job_id, pid, since, user, root}, believed when its owner is the
                              lock file's; otherwise the holder is named from /proc/locks
    H/runner-ledger-…json     the host ledger (ledger.py)

A taker opens the name (O_NOFOLLOW, never through a link), flocks it, and keeps it only when the name still
leads to the file it locked (a holder that let go removed it meanwhile): then takes again. A lock file of
another user is that user's: held, it is busy and its holder named; held by nobody, root replaces it, anyone
else is busy ("left by USER"). docs/protocol.md, "Shared hosts".
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import stat
import time

from ..contract import services_of
from ..host.answer import Fail
from ..host.gpu import GPU_QUERY, nvidia_smi, query_gpus
from ..host.parsers import parse_gpu_csv
from ..host.processes import pid_exists, real_uid
from .files import try_unlink, write_json_atomic

LOCK_DIR = "/run/lock"
PREFIX = "runner-"
LOCK_RETRY_S = 5.0          # how long a busy lock with no live holder recorded is looked at again (until_named)
MAX_HOLDER_BYTES = 64 << 10


def lock_dir() -> str:
    """H, checked on each use: a real dir, root's or this login's, sticky where others may write it; made 1777
    when missing (as systemd-tmpfiles makes /run/lock)."""
    path = os.environ.get("RUNNER_LOCK_DIR") or LOCK_DIR
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
        except OSError as exc:
            raise Fail("unsafe-root", "the host lock place %s is missing and cannot be made: %s (as root: "
                       "install -d -m 1777 %s)" % (path, exc.strerror, path)) from exc
        info = os.lstat(path)
    others_write = info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.geteuid()) or others_write:
        raise Fail("unsafe-root", "the host lock place %s must be a dir of root's (or this login's), sticky where "
                   "others may write it" % path)
    return path


def lock_path(key: str) -> str:
    return os.path.join(lock_dir(), "%s%s.lock" % (PREFIX, key))


def holder_path(key: str) -> str:
    return os.path.join(lock_dir(), "%s%s.json" % (PREFIX, key))


def held_keys() -> list:
    """The keys whose lock file is in H now (held or left)."""
    names = os.listdir(lock_dir())
    return [n[len(PREFIX):-len(".lock")] for n in names if n.startswith(PREFIX) and n.endswith(".lock")]


# ── which keys ────────────────────────────────────────────────────────────────────────────────────────

def lock_keys(spec: dict) -> list:
    """`gpu-<index>` per device and `service-<unit>` per service the job frees. A job that frees a service
    without naming devices takes every card's lock: it means every GPU."""
    services = services_of(spec)
    devices = spec["gpu"]["devices"]
    keys = ["gpu-" + d for d in (gpu_lock_names(devices) if devices or not services else every_gpu())]
    keys += ["service-" + s["unit"] for s in services]
    return sorted(set(keys))


def restore_keys(spec: dict) -> list:
    """A restorer's keys: without devices, its services' alone (not the restore of other cards' jobs)."""
    return lock_keys(spec) if spec["gpu"]["devices"] else ["service-" + s["unit"] for s in services_of(spec)]


def every_gpu() -> list:
    """Every card's index; none when nvidia-smi cannot say (a host without GPUs)."""
    try:
        return [str(g["index"]) for g in parse_gpu_csv(nvidia_smi(GPU_QUERY))]
    except (Fail, ValueError):
        return []


def gpu_lock_names(devices: list) -> list:
    """Each card's index, however the spec names it (index or UUID)."""
    if not devices:
        return []
    try:
        return [str(g["index"]) for g in query_gpus(devices)]
    except (Fail, ValueError):
        return list(devices)  # the drain step reports the GPU problem with its own message


# ── who holds a key ───────────────────────────────────────────────────────────────────────────────────

def flock_holders(info) -> set:
    """The pids /proc/locks shows holding (not waiting for) a flock on the file `info` (an os.stat result)."""
    where = "%02x:%02x:%d" % (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)
    pids = set()
    try:
        with open("/proc/locks") as fh:
            for fields in (line.split() for line in fh):
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where:
                    pids.add(int(fields[4]))
    except (OSError, ValueError):
        pass
    return pids


def user_name(uid) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return "uid %s" % uid


def command_of(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read(200).replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def read_holder(key: str):
    """The holder of key as its record says, when the record is the lock file's owner's; else None."""
    try:
        fd = os.open(holder_path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.lstat(lock_path(key)).st_uid:
            return None
        holder = json.loads(os.read(fd, MAX_HOLDER_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return dict(holder, key=key) if isinstance(holder, dict) else None


def holder_of(key: str) -> dict:
    """Who holds key, for a busy answer: its record, else the process /proc/locks shows, else the user whose
    lock file nobody holds."""
    try:
        info = os.lstat(lock_path(key))
    except FileNotFoundError:
        return {"key": key}
    pids = flock_holders(info)
    holder = read_holder(key)
    if holder and (not pids or holder.get("pid") in pids or any(real_uid(p) == info.st_uid for p in pids)):
        return holder
    if pids:
        pid = min(pids)
        return {"key": key, "pid": pid, "user": user_name(real_uid(pid)), "command": command_of(pid)}
    return {"key": key, "user": user_name(info.st_uid), "left": True}


def probe_lock(key: str) -> dict:
    """Whether a lock is held now, without keeping it (another user's lock file counts as held but for root)."""
    holder = until_named(lambda: holder_of(key) if lock_held(key) or left_for_us(key) else None)
    return {"key": key, "held": holder is not None, "holder": holder}


def until_named(look):
    """look(): a holder or None, looked at again for LOCK_RETRY_S while the holder has no live pid recorded (a
    starter about to write its record), rather than answer "busy" naming nobody."""
    deadline = time.monotonic() + LOCK_RETRY_S
    while True:
        holder = look()
        if holder is None or pid_exists(holder.get("pid")) or time.monotonic() >= deadline:
            return holder
        time.sleep(0.05)


def lock_held(key: str) -> bool:
    """Whether a process holds key's lock now (one look)."""
    return file_locked(lock_path(key))


def file_locked(path: str) -> bool:
    """Whether a process holds a flock on the file `path` names (never through a link) now."""
    try:
        return bool(flock_holders(os.lstat(path)))
    except OSError:
        return False


def left_for_us(key: str) -> bool:
    """key's lock file is another user's, and this login is not root: not ours to take or replace."""
    try:
        return os.geteuid() != 0 and os.lstat(lock_path(key)).st_uid != os.geteuid()
    except FileNotFoundError:
        return False


# ── taking and letting go ─────────────────────────────────────────────────────────────────────────────

def take(key: str):
    """key's lock file, flocked: its fd; None when busy or another user's (replace_foreign)."""
    path = lock_path(key)
    for _ in range(5):  # the name changed between the open and the flock: a holder let go meanwhile
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        except OSError:  # another user's (EACCES), a link (ELOOP)
            if replace_foreign(path):
                continue
            return None
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode):
            os.close(fd)
            if replace_foreign(path):
                continue
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if names(path, info):
            return fd
        os.close(fd)
    return None


def names(path: str, info) -> bool:
    """The name still leads to the file `info` describes."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def replace_foreign(path: str) -> bool:
    """Root removes another user's lock file nobody holds (or a link); True when the name is free again."""
    if os.geteuid() != 0:
        return False
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    if stat.S_ISREG(info.st_mode) and flock_holders(info):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


class Locks:
    """A job's keys in H, all or nothing (so two queued jobs never hold one lock each)."""

    def __init__(self, root: str, keys: list, job_id: str) -> None:
        self.root, self.keys, self.job_id = root, keys, job_id
        self.fds: dict[str, int] = {}  # lock key -> its open descriptor, while held
        self.held = False

    def try_acquire(self):
        """Take every lock or none: the holder of the first busy one, or None when all are ours."""
        return until_named(self._try_all)

    def _try_all(self):
        for key in self.keys:
            fd = take(key)
            if fd is None:
                self._let_go()
                return holder_of(key)
            self.fds[key] = fd
        self.held = True
        return None

    def write_holders(self) -> None:
        """Who holds each key, for every login's busy answer (a name another user made first is left)."""
        me = {"job_id": self.job_id, "pid": os.getpid(), "since": time.time(), "user": user_name(os.geteuid()),
              "root": self.root}
        for key in self.keys:
            try:
                write_json_atomic(holder_path(key), me, 0o644)
            except OSError:
                pass

    def release(self) -> None:
        """LOCK_UN releases the lock for every fd sharing the open file (the guard's copies too); the names go
        first, so a waiter that had opened one takes the next file, not this one."""
        if self.held:
            for key in self.keys:
                holder = read_holder(key) or {}
                if (holder.get("job_id"), holder.get("root")) == (self.job_id, self.root):
                    try_unlink(holder_path(key))
        self._let_go()
        self.held = False

    @classmethod
    def inherited(cls, root: str, job_id: str) -> Locks:
        """The locks this process holds through inherited fds (the guard: its supervisor's)."""
        locks = cls(root, [], job_id)
        mine = {}
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                mine[(os.fstat(fd).st_dev, os.fstat(fd).st_ino)] = fd
            except OSError:
                continue
        for key in held_keys():
            try:
                info = os.lstat(lock_path(key))
            except FileNotFoundError:
                continue
            if (info.st_dev, info.st_ino) in mine:
                locks.keys.append(key)
                locks.fds[key] = mine[(info.st_dev, info.st_ino)]
        locks.held = bool(locks.keys)
        return locks

    def _let_go(self) -> None:
        for key, fd in self.fds.items():
            if names(lock_path(key), os.fstat(fd)):
                try_unlink(lock_path(key))
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self.fds = {}
