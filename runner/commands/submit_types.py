"""A submit's own data: what it returns (Submitted, or DryRun for `--dry-run`) and the host call it may open
before its spec is validated (Early). Apart from controller.py so that the commands that make none of them
(tail, status, cancel: every agent's poll) do not define them.

May import: remote/host.py (the client's types) and plan.py, as controller.py does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..remote.host import HostClient, OpenCall
    from .plan import Plan


@dataclass
class Submitted:
    job_id: str
    state: str
    host: str
    stop_service: bool
    notes: list[str] = field(default_factory=list)
    round_trips: int = 0
    already: bool = False
    slurm_job_id: str | None = None


@dataclass
class DryRun:
    """What submit would do, decided from a real preflight; nothing was started or changed."""
    job_id: str
    host: str
    stop_service: bool
    required_mib: int
    argv: list[str]
    notes: list[str] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)
    service: dict | None = None
    variants: list[dict] = field(default_factory=list)  # a sweep's, as the host will run them
    array_parallel: int | None = None  # on Slurm a sweep is one job array, at most this many tasks at once
    slots: list[list[str]] | None = None  # sweep.gpus_per_variant: the devices of each side-by-side slot
    steps: dict = field(default_factory=dict)  # before_stop, window, freed: dry_run_steps


@dataclass
class Early:
    """A submit's host call opened before its spec is validated, on the last plan made from the same file and
    overrides (an edited spec): the connection and the host's interpreter start while the spec is checked.
    The call names no job (the host takes the id from the wire form), so an edited name still fits. Nothing is
    sent until the validated plan is found to go to the same host with the same bundle (`fits`); else, and on
    any error before, it is closed unsent — the host reads no input and refuses it."""
    client: HostClient
    call: OpenCall
    host: dict
    job_id: str | None = None  # the id of the job sent on it, once sent

    def fits(self, plan: Plan) -> bool:
        return plan.host == self.host and plan.bundle.digest == self.client.bundle.digest

    def close(self) -> None:
        self.call.close()
        self.client.close()
