"""A command's plan of a job spec: everything decided from JOB.yaml (and its `--set` overrides) before any
host is contacted, made once per command (controller.local_plan) and passed
down as this one object — the CLI, the controller and a fleet's rollout never read or validate the file again.

The wire form is the validated spec in the host's terms (docs/protocol.md, its job id left to each submit);
a fleet's plan names every host and is retargeted to each (`for_address`) without another validation.

May import: remote/bundles.py (the bundles' type) only; pure data.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..remote.bundles import Bundle

PLANNED_JOB_ID = "planned"  # the wire form's job id in a plan; each submit sets its own


@dataclass(frozen=True)
class Plan:
    spec_path: str  # the spec file, resolved
    overrides: tuple[str, ...]
    host: dict  # the validated host section; host["address"] a list for a fleet
    bundle: Bundle  # the supervisor's: the host code, by its digest
    wire: dict  # job_id PLANNED_JOB_ID
    args_note: str  # the payload args check's one line
    rollout: dict | None = None  # a fleet's rollout section (defaults filled in); None for one host
    payload_bundle: Bundle | None = None  # the job's script and its local imports, uploaded apart; None for a command
    metrics: dict | None = None  # the spec's `metrics`: which result columns the gate compares (the host never needs it)

    @property
    def name(self) -> str:
        return self.wire["name"]

    @property
    def is_fleet(self) -> bool:
        return isinstance(self.host["address"], list)

    @property
    def addresses(self) -> list[str]:
        """The hosts this plan runs on, in order (one for a plain spec)."""
        address = self.host["address"]
        return list(address) if isinstance(address, list) else [address]

    def for_address(self, address: str) -> Plan:
        """This plan for one host of a fleet: the wire form names no host, so only host.address changes and
        nothing is validated again."""
        return replace(self, host=dict(self.host, address=address), rollout=None)

    def wire_for(self, job_id: str) -> dict:
        """The wire form one submit sends: this plan's, with that submit's job id."""
        return dict(self.wire, job_id=job_id)
