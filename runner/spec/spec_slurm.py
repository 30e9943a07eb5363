"""The spec's `launcher: slurm` part: the `slurm` section's model, the rules between it and the other
sections, and its wire form. The field rules are remote_payload/slurm/batch.py's, which the host applies
again, so the controller never accepts what the supervisor on the login node would refuse.

    launcher: slurm            host = the login node (or `local`); sbatch places the job
    slurm: {partition, gres | gpus, time, account, qos, constraint, extra_args}
    sweep: {…, max_parallel}   one job array, at most max_parallel variants at once (remote_payload/slurm/array.py)
"""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from remote_payload.slurm.batch import (
    MAX_DOWNTIME_ON_SLURM,
    setup_seconds,
    slurm_problem,
    time_limit_minutes,
    time_problem,
)

from .spec_fields import Duration, kind


def _gpus(value):
    """`gpus: 2` or `gpus: a100:2`; on the wire it is text either way."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"gpus must be a count or TYPE:COUNT; got {kind(value)}")
    return str(value)


class SlurmSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    partition: str | None = None
    gres: str | None = None
    gpus: Annotated[str | None, BeforeValidator(_gpus)] = None
    time: Duration | None = None  # default: prepare step + staging + limits.max_runtime + grace + slack, whole minutes
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra_args: list[str] = []

    @model_validator(mode="after")
    def _slurm_rules(self) -> SlurmSpec:
        problem = slurm_problem(self.model_dump())
        if problem:
            raise ValueError(problem)
        return self


def launcher_problem(spec) -> str | None:
    """The rules between `launcher`, `slurm` and the other sections (spec is a JobSpec); None when they hold."""
    if spec.launcher == "ssh":
        return "a `slurm` section needs `launcher: slurm`" if spec.slurm is not None else None
    if spec.service.manager != "none":
        return ("launcher slurm needs service.manager: none: the scheduler owns the GPUs, so there is no "
                "service of ours to stop and restore on the node it picks")
    if spec.gpu.devices:
        return ("launcher slurm picks no gpu.devices: Slurm hands out the GPUs (ask with slurm.gres or "
                "slurm.gpus; the job sees them in CUDA_VISIBLE_DEVICES)")
    if spec.limits.max_downtime is not None:
        return MAX_DOWNTIME_ON_SLURM
    if spec.slurm is not None and spec.slurm.time is not None:
        return time_problem(minutes(spec.slurm.time), spec.limits.max_runtime, spec.limits.grace, setup_s(spec))
    return None


def setup_s(spec) -> float:
    """What the allocation runs before the payload, at its bounds (the prepare step, the staging)."""
    return setup_seconds(spec.limits.model_dump(), {"prepare": spec.prepare_argv(), "staged": spec.payload.staged})


def minutes(seconds: float) -> int:
    """Slurm's --time is whole minutes: round a duration up."""
    return max(1, math.ceil(seconds / 60.0))


def wire_slurm(spec) -> dict:
    """The wire form's `slurm` section: the user's choices, `time` replaced by `time_min` (whole minutes)."""
    slurm = (spec.slurm or SlurmSpec()).model_dump()
    seconds = slurm.pop("time")
    slurm["time_min"] = (minutes(seconds) if seconds is not None
                         else time_limit_minutes(spec.limits.max_runtime, spec.limits.grace, setup_s(spec)))
    return slurm
