"""Local controller state: a job index with each job's host and log cursor (a byte offset).

The host's job directory is the source of truth; this is only what the controller needs to find it again and
to print each log byte exactly once: one JSON file per job, replaced atomically, in $RUNNER_STATE_DIR (else
platformdirs' user state dir). The records hold each job's payload.env (tokens): whatever the umask, every dir
runner makes there is 0700 (`private_dir`) and every file 0600 (`_write_atomic`, `private_file`).

The cursor: every read-modify-write of a record holds the job's record lock (a short flock on
locks/<id>.record), and a write never moves the cursor back (`save` keeps the larger of the two); the one
move back is `rewind_cursor`, after the host's log was found shorter than the cursor. A `tail` call holds
the job's cursor turn (a flock on locks/<id>.cursor, released by the kernel if the call is killed) from
reading the cursor to saving it, so two tails of one job take turns and each byte goes to one of them.

The index: `list` and `status` read the recent jobs and the ones not yet ended, never every record. `index`
holds one line per record made (`JOB_ID SUBMITTED_AT`, appended in creation order), `active/` an empty file
per record whose last state is not terminal; both follow every write of a record, and a state dir written
before them is indexed once, from a scan, by the first reader. A record put there by anything else is found by
a listing of jobs/, made again only once the dir or the index changed (`index.listed`).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from remote_payload.contract import is_terminal

from ..errors import LocalStateError, RunnerError, UnknownJob

TURN_POLL_S = 0.05
RECENT_JOBS = 50  # `list`/`status` without --all: this many of the newest jobs, and every job not yet ended
# A jobs dir changed more recently than this is listed again at the next read: a file system's timestamps are
# coarse (a few ms), so an entry added in the same tick as the stamp was taken would leave it unchanged.
LISTED_SETTLE_S = 1.0
INDEX_LINE_BYTES = 64  # an index line's usual length: `recent` reads about this much per job it shows


@dataclass
class JobRecord:
    job_id: str
    name: str
    host: dict  # the spec's host section, enough to reconnect
    spec_path: str
    submitted_at: float
    service: dict = field(default_factory=dict)
    cursor: int = 0
    last_state: str = "QUEUED"
    wire: dict = field(default_factory=dict)  # the spec as submitted (its wire form): what the history reads
    note: str = ""  # why a job that was never started (last_state NOT_STARTED) was not
    metrics: dict = field(default_factory=dict)  # the spec's `metrics` declaration: what the gate compares
    submit_until: float = 0.0  # time.time() past which no host call of its submit can still start it


_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "job_id": str, "name": str, "host": dict, "spec_path": str, "submitted_at": (int, float), "service": dict,
    "cursor": int, "last_state": str, "wire": dict, "note": str, "metrics": dict, "submit_until": (int, float)}
NOT_STARTED = "NOT_STARTED"  # a controller-side end: the host was never reached, so it has no such job


def is_over(state: str) -> bool:
    """A job that runs no more as far as this controller knows: ended, never started, or unknown to its host."""
    return is_terminal(state) or state in (NOT_STARTED, "UNKNOWN")


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_state_dir()
        self._writable = False  # check_writable passed once: a command asks it before each host it contacts

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def runs_dir(self) -> Path:
        """The fleet runs' records (state/fleet_store.py's RunStore)."""
        return self.root / "runs"

    def is_run(self, ref: str) -> bool:
        """Is this id a fleet run of this controller (rather than one job)? Asked here, not by the run store's
        module: every job's tail asks, and needs no run store."""
        from .job_id import check_job_id

        try:
            return (self.runs_dir / f"{check_job_id(ref)}.json").is_file()
        except RunnerError:
            return False

    def check_writable(self) -> None:
        """Refuse before any host is contacted when a job record could not be kept (read-only or full disk);
        once per Store (a command's), whose records are then written as they come."""
        if self._writable:
            return
        with _local_state(self.root):
            private_dir(self.jobs_dir)
            probe = self.jobs_dir / f".write-check-{os.urandom(6).hex()}"  # its own name: tails run side by side
            _write_atomic(probe, "ok", durable=False)  # read-only or full fails at open or write; no fsync
            os.unlink(probe)
        self._writable = True

    def save(self, record: JobRecord) -> None:
        """Write the record; its cursor never goes below the one already stored (a reader holding an old
        record cannot move it back)."""
        with self._record_lock(record.job_id):
            stored = self._stored_cursor(record.job_id)
            self._write(JobRecord(**{**asdict(record), "cursor": max(record.cursor, stored)}))

    def forget(self, job_id: str) -> None:
        """Remove a job's record (one the host refused, so never started): best effort, never raises."""
        with suppress(OSError):
            (self.jobs_dir / f"{job_id}.json").unlink(missing_ok=True)
            (self.root / "active" / job_id).unlink(missing_ok=True)

    def keep(self, job_id: str, kind: str, answer: dict) -> None:
        """A finished job's final `status` or `result` answer, kept once fetched (kept/<id>.<kind>.json): the
        host's retention (another controller's gc, a submit's) may delete the job dir later. Best effort."""
        path = self.root / "kept" / f"{job_id}.{kind}.json"
        if not path.exists():
            with suppress(OSError):
                _write_atomic(private_dir(path.parent) / path.name, json.dumps(answer), durable=False)

    def kept(self, job_id: str, kind: str) -> dict | None:
        """What `keep` kept of the job, or None."""
        return read_cache(self.root / "kept" / f"{job_id}.{kind}.json")

    def load(self, job_id: str) -> JobRecord:
        path = self.jobs_dir / f"{job_id}.json"
        try:
            return _record_from(json.loads(path.read_bytes()))
        except FileNotFoundError:
            raise UnknownJob(
                f"unknown job id {job_id!r} (not in {self.jobs_dir})",
                hint="`runner list` shows the jobs this controller knows.",
            ) from None
        except (OSError, ValueError, TypeError) as exc:
            raise RunnerError(f"local job record {path} is unreadable: {exc}",
                              hint="move it away; `runner list` skips it.") from None

    def advance_cursor(self, job_id: str, offset: int, state: str) -> None:
        """After a tail call delivered the log up to `offset`: move the cursor there (never back), on a
        fresh read of the record, and note the state it saw."""
        with self._record_lock(job_id):
            record = self.load(job_id)
            record.cursor, record.last_state = max(record.cursor, offset), state
            self._write(record)

    def rewind_cursor(self, job_id: str) -> None:
        """The host's log is shorter than the cursor: start it again from byte 0 (repeats, never a gap)."""
        self._change(job_id, cursor=0)

    def update_state(self, job_id: str, state: str) -> None:
        """Change only last_state: a `tail` running meanwhile may have moved the cursor."""
        self._change(job_id, last_state=state, note="")

    def end_not_started(self, job_id: str, why: str) -> None:
        """A job whose submit never reached its host: it cannot have started; the record says so and why."""
        self._change(job_id, last_state=NOT_STARTED, note=why)

    def _change(self, job_id: str, **fields: Any) -> None:
        """These fields of the record changed, on a fresh read under its lock."""
        with self._record_lock(job_id):
            self._write(replace(self.load(job_id), **fields))

    @contextmanager
    def cursor_turn(self, job_id: str, wait_s: float,
                    waiting: Callable[[], None] = lambda: None) -> Iterator[tuple[JobRecord, bool]]:
        """Hold the job's cursor for one tail call: yields (its record as of the turn, True), or (the record, False)
        when another call held it for all of wait_s (`waiting()` is called once, when it must wait). An unknown
        record, or a state dir where the cursor could not be saved (the same bytes would print again and again),
        is said before anything is written. A killed holder's lock is dropped by the kernel."""
        self.load(job_id)
        self.check_writable()
        with self._lock_file(job_id, "cursor") as fd:
            end, told = time.monotonic() + wait_s, False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        waiting()
                        told = True
                    if time.monotonic() >= end:
                        yield self.load(job_id), False
                        return
                    time.sleep(min(TURN_POLL_S, max(0.0, end - time.monotonic())))
            yield self.load(job_id), True

    def scan(self) -> tuple[list[JobRecord], list[str]]:
        """Every readable record, oldest first, and a line for each one skipped as unreadable."""
        if not self.jobs_dir.is_dir():
            return [], []
        records, skipped = [], []
        for path in sorted(self.jobs_dir.glob("*.json")):
            try:
                records.append(self.load(path.stem))
            except RunnerError as exc:
                skipped.append(str(exc))
        return sorted(records, key=lambda r: r.submitted_at), skipped

    def recent(self, count: int = RECENT_JOBS) -> tuple[list[JobRecord], list[str], int]:
        """The newest `count` records and every one not yet ended (as last seen), oldest first; a line for
        each one skipped as unreadable; how many older ended ones were left out. Reads the index's last lines
        only (and counts the rest): a long history costs a `status` or `list` next to nothing."""
        newest, total = self._newest_indexed(count)
        wanted = dict.fromkeys(newest)
        with suppress(FileNotFoundError):  # an active mark is indexed: both are written under the record lock
            wanted.update(dict.fromkeys(sorted(os.listdir(self.root / "active"))))
        records, skipped = self._strays()
        strays = {record.job_id for record in records}
        for job_id in wanted:
            if job_id in strays:
                continue
            try:
                records.append(self.load(job_id))
            except UnknownJob:
                pass  # forgotten (a refused submit) after its index line was written
            except RunnerError as exc:
                skipped.append(str(exc))
        return sorted(records, key=lambda r: r.submitted_at), skipped, max(0, total - len(wanted))

    def _newest_indexed(self, count: int) -> tuple[list[str], int]:
        """The newest `count` job ids of the index (each once, in creation order), read from its end, and how
        many lines it has (counted, not parsed: a job's line is written once, but two readers indexing the same
        stray at one moment may both write it, and it then counts twice)."""
        with _local_state(self.root), self._index_lock():
            self._build_index_if_missing()
            with open(self.root / "index", "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                span = INDEX_LINE_BYTES * (count + 8)
                while True:
                    start = max(0, size - span)
                    fh.seek(start)
                    lines = fh.read(size - start).split(b"\n")
                    if start > 0:
                        lines = lines[1:]  # the first may be the end of a longer line
                    ids = list(dict.fromkeys(line.decode("utf-8", "replace").split(" ", 1)[0]
                                             for line in lines if line))
                    if len(ids) >= count or start == 0:
                        break
                    span *= 4
                fh.seek(0)
                total = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
        return (ids[-count:] if count > 0 else []), total

    def _strays(self) -> tuple[list[JobRecord], list[str]]:
        """Records the index does not hold (put there by something other than this store): the readable ones,
        indexed now, and a line for each unreadable one. A listing of the jobs dir, skipped while the dir and the
        index are as they were when one last found every record indexed (`index.listed`): a long history is
        not listed at each `status` and `list`."""
        stamp = self._listing_stamp()
        if stamp is not None and stamp == self._read_listed():
            return [], []
        try:
            names = {name[:-5] for name in os.listdir(self.jobs_dir) if name.endswith(".json")}
        except FileNotFoundError:
            names = set()
        records, skipped = [], []
        for job_id in sorted(names - set(self._indexed())):
            try:
                records.append(self.load(job_id))
            except RunnerError as exc:
                skipped.append(str(exc))
        if records:
            with _local_state(self.root), self._index_lock(), open(self.root / "index", "a") as fh:
                fh.write("".join(f"{r.job_id} {r.submitted_at!r}\n" for r in records))
        if stamp is not None and not skipped and time.time() - stamp[1] / 1e9 > LISTED_SETTLE_S:
            # the stamp from before the listing: a change made while it ran is listed next time (strays just
            # indexed changed the index's size: one listing more, which finds none)
            with suppress(OSError):  # a read-only state dir lists again next time: nothing else changes
                _write_atomic(self.root / "index.listed", " ".join(map(str, stamp)), durable=False)
        return records, sorted(skipped)

    def _listing_stamp(self) -> tuple[int, ...] | None:
        """The jobs dir's inode and mtime (an entry added, renamed or removed changes it) and the index's
        inode and size as they are now; None when either is missing."""
        try:
            jobs, index = os.stat(self.jobs_dir), os.stat(self.root / "index")
        except OSError:
            return None
        return (jobs.st_ino, jobs.st_mtime_ns, index.st_ino, index.st_size)

    def _read_listed(self) -> tuple[int, ...] | None:
        try:
            return tuple(int(word) for word in (self.root / "index.listed").read_text().split())
        except (OSError, ValueError):
            return None

    def all(self) -> list[JobRecord]:
        """Every readable record, oldest first (an unreadable one is skipped: `scan` says which)."""
        return self.scan()[0]

    def _stored_cursor(self, job_id: str) -> int:
        try:
            return self.load(job_id).cursor
        except RunnerError:
            return 0

    def _write(self, record: JobRecord) -> None:
        """Under the job's record lock: the record, its index line when it is new, its `active/` mark."""
        with _local_state(self.root):
            private_dir(self.jobs_dir)
            path = self.jobs_dir / f"{record.job_id}.json"
            new = not path.exists()
            _write_atomic(path, json.dumps(asdict(record), indent=1))
            self._mark_active(record)
            if new:
                with self._index_lock():
                    if self._build_index_if_missing():
                        return  # built from a scan that found this record (written above)
                    with open(private_file(self.root / "index"), "a") as fh:
                        fh.write(f"{record.job_id} {record.submitted_at!r}\n")

    def _mark_active(self, record: JobRecord) -> None:
        mark = self.root / "active" / record.job_id
        if is_over(record.last_state):
            mark.unlink(missing_ok=True)
        elif not mark.exists():
            private_dir(mark.parent)
            private_file(mark)

    def _indexed(self) -> list[str]:
        """Every job id the index holds, in creation order, each once."""
        with _local_state(self.root), self._index_lock():
            self._build_index_if_missing()
            with open(self.root / "index", "rb") as fh:
                lines = fh.read().decode("utf-8", "replace").splitlines()
        return list(dict.fromkeys(line.split(" ", 1)[0] for line in lines if line))

    def _build_index_if_missing(self) -> bool:
        """A state dir from before the index (or none yet): index its records once, from a full scan (True:
        built now). The caller holds the index lock."""
        if (self.root / "index").exists():
            return False
        records, _skipped = self.scan()
        for record in records:
            self._mark_active(record)
        private_dir(self.root)
        _write_atomic(self.root / "index", "".join(f"{r.job_id} {r.submitted_at!r}\n" for r in records))
        return True

    @contextmanager
    def _index_lock(self) -> Iterator[None]:
        with self._lock_file("index", "lock") as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield

    @contextmanager
    def _record_lock(self, job_id: str) -> Iterator[None]:
        with self._lock_file(job_id, "record") as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield

    @contextmanager
    def _lock_file(self, job_id: str, kind: str) -> Iterator[int]:
        with _local_state(self.root):
            private_dir(self.root / "locks")
            fd = os.open(self.root / "locks" / f"{job_id}.{kind}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            yield fd
        finally:
            os.close(fd)  # closing the one descriptor releases its flock


def _record_from(data: object) -> JobRecord:
    """A JobRecord from parsed JSON, or TypeError naming what is of the wrong shape."""
    if not isinstance(data, dict):
        raise TypeError(f"a job record is a JSON object, got {type(data).__name__}")
    known = {f.name for f in fields(JobRecord)}
    if set(data) - known:
        raise TypeError(f"unknown fields {sorted(set(data) - known)}")
    for name, kind in _FIELD_TYPES.items():
        if name in data and (not isinstance(data[name], kind) or isinstance(data[name], bool)):
            raise TypeError(f"{name} is {type(data[name]).__name__}, not {getattr(kind, '__name__', 'a number')}")
    if data.get("cursor", 0) < 0:
        raise TypeError("cursor is negative")
    return JobRecord(**data)


@contextmanager
def _local_state(root: Path) -> Iterator[None]:
    """An OSError on the state dir is a LocalStateError (exit 2), never a traceback."""
    try:
        yield
    except OSError as exc:
        raise LocalStateError(f"the state dir {root} cannot be written: {exc.strerror or exc}",
                              hint=_state_dir_hint(exc.errno)) from None


def _state_dir_hint(number: int | None) -> str:
    """What to do about a state dir that refused a write: full, read-only, or something else."""
    elsewhere = "point RUNNER_STATE_DIR at a writable directory."
    if number in (errno.ENOSPC, errno.EDQUOT):
        return "free space there, or " + elsewhere
    if number in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "make it writable, or " + elsewhere
    return "P" + elsewhere[1:]


def default_state_dir() -> Path:
    override = os.environ.get("RUNNER_STATE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_state_dir("runner"))


def private_dir(path: Path) -> Path:
    """`mkdir -p path`, each dir it makes 0700 whatever the umask, and `path` itself 0700 (a dir of runner's own
    inside the state dir; a dir the user made above it is left as it is)."""
    missing = []
    at = Path(path)
    while not at.is_dir():
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            if not directory.is_dir():  # a file in the way: the caller's error, not a chmod of it
                raise
        os.chmod(directory, 0o700)
    if not missing:
        with suppress(OSError):  # best effort on a dir made before (a read-only state dir is still read)
            os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create `path` (empty) as 0600 if it is not there, and make it 0600 if it is: for files another library
    writes (sqlite), whose umask-given mode would let others read them."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                     0o600))
    os.chmod(path, 0o600)
    return path


def read_cache(path: Path) -> dict | None:
    """A cache file of the state dir as a JSON object; None (a miss) when it is absent, unreadable, torn or not
    an object."""
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_cache(path: Path, text: str) -> None:
    """A cache file of the state dir replaced whole: 0600 in a private dir, not fsync'd (torn after a crash, it
    reads as a miss). Best effort: a state dir that cannot be written only costs the next command the work."""
    with suppress(OSError):
        _write_atomic(private_dir(path.parent) / path.name, text, durable=False)


def _write_atomic(path: Path, text: str, *, durable: bool = True) -> None:
    """`path` replaced whole by `text`, 0600, through a temp file of a random name (O_EXCL). durable=False (a
    cache, whose torn or empty file after a crash reads as a miss): no fsync."""
    tmp = str(path.parent / f".tmp-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
