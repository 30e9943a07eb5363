"""A command's plan of a job spec, and what a submit of it returns (Submitted, or DryRun for `--dry-run`).

The plan is everything decided from JOB.yaml (and its `--set` overrides) before any host is contacted, made
once per command (controller.local_plan) and passed down as this one object: the CLI, the controller and a
fleet's rollout never read or validate the file again. Its wire form is the validated spec in the host's terms
(docs/protocol.md, its job id left to each submit); a fleet's plan names every host and is retargeted to each
(`for_address`) without another validation.

May import: remote/bundles.py (the bundles' type) only; pure data.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

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


@dataclass
class Submitted:
    """What submit did: the job started (or queued, or adopted: `already`) on its host."""
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
    bundle: dict | None = None  # a script's payload bundle: files, bytes, digest (what an upload would send)
