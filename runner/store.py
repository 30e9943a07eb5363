"""Local controller state: a job index with each job's host and log cursor (a byte offset).

The host's job directory is the source of truth; this is only what the controller needs to find it again
and to print each log byte exactly once. One JSON file per job, replaced atomically.
Location: $RUNNER_STATE_DIR, else platformdirs' user state dir.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import LocalStateError, RunnerError, UnknownJob


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


class Store:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_state_dir()

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def check_writable(self) -> None:
        """Refuse before any host is contacted when a job record could not be kept (read-only or full disk)."""
        try:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            _write_atomic(self.jobs_dir / ".write-check", "ok")
            os.unlink(self.jobs_dir / ".write-check")
        except OSError as exc:
            raise LocalStateError(
                f"the state dir {self.root} cannot be written: {exc.strerror or exc}",
                hint="free space there, or point RUNNER_STATE_DIR at a writable directory.",
            ) from None

    def save(self, record: JobRecord) -> None:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.jobs_dir / f"{record.job_id}.json", json.dumps(asdict(record), indent=1))

    def load(self, job_id: str) -> JobRecord:
        path = self.jobs_dir / f"{job_id}.json"
        try:
            return JobRecord(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise UnknownJob(
                f"unknown job id {job_id!r} (not in {self.jobs_dir})",
                hint="`runner list` shows the jobs this controller knows.",
            ) from None
        except (ValueError, TypeError) as exc:
            raise RunnerError(f"local job record {path} is unreadable: {exc}") from exc

    def update_state(self, job_id: str, state: str) -> None:
        """Change only last_state, on a fresh read: a `tail` running meanwhile may have moved the cursor."""
        record = self.load(job_id)
        record.last_state = state
        self.save(record)

    def all(self) -> list[JobRecord]:
        if not self.jobs_dir.is_dir():
            return []
        records = [self.load(p.stem) for p in self.jobs_dir.glob("*.json")]
        return sorted(records, key=lambda r: r.submitted_at)


def default_state_dir() -> Path:
    override = os.environ.get("RUNNER_STATE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_state_dir("runner"))


def _write_atomic(path: Path, text: str) -> None:
    # What tempfile.mkstemp does (O_EXCL, 0600, a random name), without importing tempfile on every command
    tmp = str(path.parent / f".tmp-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
