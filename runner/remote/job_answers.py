"""The typed answers of `status`, `submit` and `result`: each built by its `from_json` from the dict answers.py
checked (as Ray's `JobInfo.from_json`; a job its host was not asked about from the controller's record,
JobStatus.last_known), and read field by field by every layer above. status.json is the payload's to
overwrite: the parts the checks leave open (a window, a sweep's tally, slots) are kept as the host sent them,
and the renderer checks each value.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _opt_dict(value: Any) -> dict | None:
    return value if isinstance(value, dict) else None


def _copied(cls: Any, record: dict, **made: Any) -> Any:
    """cls with each field copied from `record` as it is (None where absent), but those `made` gives."""
    return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls) if f.name not in made}, **made)


@dataclass(frozen=True)
class Started:
    """`submit`'s answer: the job started (or queued) under the id asked for, with the host's verdict: whether
    it stops the service, and its notes; on Slurm the scheduler's job id."""

    job_id: str
    state: str
    stop_service: bool = False
    notes: tuple[str, ...] = ()
    slurm_job_id: str | None = None

    @classmethod
    def from_json(cls, answer: dict) -> Started:
        return cls(job_id=answer["job_id"], state=answer["state"], stop_service=bool(answer.get("stop_service")),
                   notes=tuple(answer.get("notes") or ()), slurm_job_id=answer.get("slurm_job_id"))

    @classmethod
    def found(cls, job: JobStatus) -> Started:
        """A job this id started before (a retried submit, found by `status`): its state, no verdict."""
        return cls(job_id=job.job_id, state=job.state)


@dataclass(frozen=True)
class ServiceRecord:
    """One service as a job's status holds it (status.json `service`, or one of `services`)."""

    unit: str | None = None
    was: str | None = None
    now: str | None = None
    stopped: bool | None = None
    stopped_at: float | None = None
    restored_at: float | None = None
    downtime_s: float | None = None
    healthy: bool | None = None      # back and healthy once restored (None: not known yet)
    window: dict | None = None       # `downtime`: not serving and its parts, once the service is back
    stop_result: dict | None = None  # the unit our stop left failed: systemd's Result

    @classmethod
    def from_json(cls, record: dict) -> ServiceRecord:
        return _copied(cls, record, window=_opt_dict(record.get("downtime")),
                       stop_result=_opt_dict(record.get("stop_result")))


@dataclass(frozen=True)
class Progress:
    """The payload's progress as the host tallied it from its events (remote_payload/progress.py)."""

    rows_done: int
    rows_expected: int | None = None
    silent_s: float | None = None
    phase: Any = None                # the payload's own word for it
    phase_status: Any = None
    variant: dict | None = None      # a sweep's variant running now: index, of, args, status
    sweep: dict = dataclasses.field(default_factory=dict)  # a sweep's tally: done, of, running, rows, side_by_side

    @classmethod
    def from_json(cls, progress: dict) -> Progress:
        return _copied(cls, progress, rows_done=progress["rows_done"], variant=_opt_dict(progress.get("variant")),
                       sweep=_dict(progress.get("sweep")))


@dataclass(frozen=True)
class Slurm:
    """A job on Slurm as its status holds it (`slurm`): the scheduler's job id, its state, why it waits, its node."""

    job_id: str | None = None
    state: str | None = None
    reason: str | None = None
    node: str | None = None

    @classmethod
    def from_json(cls, slurm: dict) -> Slurm:
        return _copied(cls, slurm)


@dataclass(frozen=True)
class JobStatus:
    """One job's status: status.json as the host read it plus what `status` adds; `error` when its host was not
    asked (the controller's record: the last known state). `raw` is the answer as it came, what `--json` prints."""

    job_id: str
    state: str
    raw: dict = dataclasses.field(repr=False, compare=False)
    phase: str | None = None
    message: str | None = None
    error: str | None = None
    now: float | None = None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    service: ServiceRecord = dataclasses.field(default_factory=ServiceRecord)
    services: tuple[ServiceRecord, ...] = ()      # several freed services, each its own record
    services_kept: tuple[str, ...] = ()           # services left serving (not on the job's GPUs)
    progress: Progress | None = None
    slurm: Slurm = dataclasses.field(default_factory=Slurm)   # a job on Slurm: its scheduler's view
    array: dict | None = None                     # a sweep on Slurm: its job array's tally
    slots: list | None = None                     # a sweep's side-by-side slots: devices, variant

    @classmethod
    def from_json(cls, job: dict) -> JobStatus:
        listed = job.get("services")
        progress = job.get("progress")
        return _copied(cls, job, job_id=job.get("job_id", ""), state=job.get("state", ""), raw=job,
                       service=ServiceRecord.from_json(_dict(job.get("service"))),
                       services=tuple(ServiceRecord.from_json(s) for s in listed if isinstance(s, dict))
                       if isinstance(listed, list) else (),
                       services_kept=tuple(u for u in job.get("services_kept") or [] if isinstance(u, str)),
                       progress=Progress.from_json(progress) if isinstance(progress, dict) else None,
                       slurm=Slurm.from_json(_dict(job.get("slurm"))), array=_opt_dict(job.get("array")),
                       slots=job.get("slots") if isinstance(job.get("slots"), list) else None)

    @classmethod
    def last_known(cls, job_id: str, state: str, message: str, *, error: str | None = None) -> JobStatus:
        """A job its host was not asked about, from the controller's record: never started there (no error), or
        its host not reached (`error`, its code): the state last recorded, and why there is no newer one."""
        return cls.from_json({"job_id": job_id, "state": state, **({"error": error} if error is not None else {}),
                              "message": message})


@dataclass(frozen=True)
class Result:
    """`result`'s answer: the job's result.json (`value`, any JSON value: its readers check its shape) and
    `windows`, (unit, window) of each service the job freed, in the spec's order (results/window.py)."""

    value: Any
    windows: tuple[tuple[str | None, dict], ...] = ()

    @classmethod
    def from_json(cls, answer: dict) -> Result:
        return cls(answer["result"], tuple((w.get("unit"), w["window"]) for w in answer.get("windows") or []))
