"""A submit's own data: what it returns (Submitted, or DryRun for `--dry-run`), apart from controller.py.

May import nothing of runner's: plain data.
"""
from __future__ import annotations

from dataclasses import dataclass, field


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
    bundle: dict | None = None  # a script's payload bundle: files, bytes, digest (what an upload would send)
