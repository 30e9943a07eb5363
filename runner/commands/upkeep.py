"""The commands that name a host rather than a job: `restore-service` (a unit started and waited on until
healthy, with no job involved) and `gc` (the host's retention rule by hand). Each takes its host from JOB.yaml or
from the command line, validated as the spec's own sections are.

May import: what controller.py may; it reaches the host through controller.connect.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from remote_payload.contract import normalize_unit

from ..deadline import Deadline
from ..errors import SpecError
from ..spec.spec import HostSpec, JobSpec, ServiceSpec
from ..spec.spec_load import load_spec, section_from_options
from ..state.store import Store
from . import controller


def restore_service(host: dict, service: dict, *, max_wait: float) -> dict:
    """Start the unit if inactive and wait until healthy, at most max_wait on the host plus one round trip."""
    if service.get("manager", "systemd") != "systemd" or not service.get("unit"):
        raise SpecError("restore-service needs a systemd unit (service.manager: systemd and service.unit)")
    with controller.connect(host, deadline=Deadline.for_command(max_wait)) as client:
        return client.restore_service(service, max_wait=max_wait)


def gc(target: str, *, keep_jobs: int, keep_days: float, dry_run: bool, deadline: Deadline, store: Store,
       every: bool = False) -> dict:
    """The host's retention rule by hand (`gc`): target is JOB.yaml (its host section) or a host address. Only
    the jobs this controller submitted there may go (a login may serve several controllers), unless `every`."""
    host = gc_host(target)
    here = controller.host_key(host)
    mine = None if every else [r.job_id for r in store.all() if controller.host_key(r.host) == here]
    with controller.connect(host, deadline=deadline) as client:
        return dict(client.gc(keep_jobs=keep_jobs, keep_days=keep_days, dry_run=dry_run, only=mine),
                    host=host["address"])


def gc_host(target: str) -> dict:
    """The host section of JOB.yaml when target is a file, else a host given by its address."""
    if os.path.isfile(target):
        return load_spec(target, ()).host.model_dump()
    return section_from_options(HostSpec, "HOST", address=target).model_dump()


def _service_of(spec: JobSpec, unit: str | None) -> ServiceSpec:
    """The one service of JOB.yaml to restore: its `service`, or with `services` the one --unit names (a job
    file's restore touches only that unit)."""
    services = spec.all_services()
    if unit is None:
        if spec.services is None or len(services) == 1:
            return spec.service if spec.services is None else services[0]
        names = ", ".join(normalize_unit(s.unit) for s in services if s.unit)  # systemd: all have one
        raise SpecError(f"the job file lists several services ({names}): name the one to restore with --unit")
    for service in services:
        if service.unit and normalize_unit(service.unit) == normalize_unit(unit):
            return service
    raise SpecError(f"--unit {unit} is not a service of the job file")


def restore_target(spec_path: str | None, *, address: str | None = None, unit: str | None = None,
                   overrides: Sequence[str] = (), **options: Any) -> tuple[dict, dict]:
    """The (host, service) sections to restore: from JOB.yaml with its overrides (--set; with --unit, the one
    of its services it names; with --host, on that host instead of the file's), or from --host/--unit and
    their options (user, port, host_key_policy for the host; scope, sudo, health_url for the service),
    validated alike."""
    host_keys = ("user", "port", "host_key_policy")
    if spec_path:
        spec = load_spec(spec_path, overrides)
        host = spec.host.model_dump()
        if address:  # the job file's service on another host: its login is --user/--port's, else ssh_config's
            given = {k: v for k, v in options.items() if k in host_keys and v is not None}
            host = section_from_options(HostSpec, "--host", **{**host, "user": None, "port": None,
                                                               "address": address, **given}).model_dump()
        return host, _service_of(spec, unit).model_dump()
    if overrides:
        raise SpecError("--set changes a job file: give JOB.yaml (or set the service with --unit and its options)")
    if not (address and unit):
        raise SpecError("restore-service needs JOB.yaml, or both --host and --unit")
    given_host = section_from_options(HostSpec, "--host", address=address,
                                      **{k: v for k, v in options.items() if k in host_keys and v is not None})
    service = section_from_options(ServiceSpec, "--unit", manager="systemd", unit=unit,
                                   **{k: v for k, v in options.items() if k not in host_keys and v is not None})
    return given_host.model_dump(), service.model_dump()
