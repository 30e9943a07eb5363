"""A job's services: the ones its GPUs meet, each freed, recorded and restored on its own.

The spec lists them in `services` when there are several or some were left serving (`services_kept`), else
only `service`. status.json keeps `service` (the first one's record, so every reader of one service still
reads it) and, with several, `services`: one record per service, in the spec's order. The single-service
steps read `spec["service"]` and `status["service"]` and save `service=…`; `ServiceView` is the job as one
of its services sees it, so those steps run unchanged once per service.
"""
from __future__ import annotations

from ..contract import services_of
from ..host.systemd import Systemd


def records(status: dict) -> list:
    """The status records of the job's services, in the spec's order."""
    if "services" in status:
        return list(status["services"])
    return [status["service"]] if status["service"].get("manager") == "systemd" else []


def units(spec: dict) -> list:
    return [s["unit"] for s in services_of(spec)]


def views(job) -> list:
    """One view per service record of the job's status; a job of one service is its own view."""
    if "services" not in job.status:
        return [job] if records(job.status) else []
    return [ServiceView(job, index) for index in range(len(job.status["services"]))]


class ServiceView:
    """The job, with `spec["service"]` and `status["service"]` those of its service number `index`."""

    def __init__(self, job, index: int) -> None:
        self.job, self.index, self.paths, self.payload_pids = job, index, job.paths, job.payload_pids
        specs = services_of(job.spec)
        service = specs[index] if index < len(specs) else records(job.status)[index]  # a record holds its section
        self.spec = dict(job.spec, service=service)
        self.ctl = job.ctl if index == 0 else Systemd(service["scope"], service["sudo"])

    @property
    def status(self) -> dict:
        return dict(self.job.status, service=records(self.job.status)[self.index])

    def save(self, **changes) -> None:
        self.job.save(**self._mapped(changes))

    def set_state(self, state: str, phase: str, **changes) -> None:
        self.job.set_state(state, phase, **self._mapped(changes))

    def event(self, kind: str, **fields) -> None:
        self.job.event(kind, **fields)

    def note_restore(self, text: str) -> None:
        self.job.note_restore(text)

    def _mapped(self, changes: dict) -> dict:
        """`service=` of this view written to its record; the first service's is `service` as well."""
        if "service" not in changes or "services" not in self.job.status:
            return changes
        mapped = dict(changes)
        listed = list(self.job.status["services"])
        listed[self.index] = mapped["service"]
        mapped["services"] = listed
        if self.index != 0:
            del mapped["service"]
        return mapped
