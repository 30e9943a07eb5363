"""The spec's `launcher: slurm` part: the `slurm` section's model (the rules between it and the other sections,
and its wire form, are the whole spec's: spec.py). The field rules are remote_payload/slurm/batch.py's, which
the host applies again, so the controller never accepts what the supervisor on the login node would refuse.

    launcher: slurm            host = the login node (or `local`); sbatch places the job
    slurm: {partition, gres | gpus, time, account, qos, constraint, extra_args}
    sweep: {…, max_parallel}   one job array, at most max_parallel variants at once (remote_payload/slurm/array.py)
"""
from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from remote_payload.slurm.batch import slurm_problem

from .spec_fields import Duration, kind


def _gpus(value: Any) -> str:
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


def minutes(seconds: float) -> int:
    """Slurm's --time is whole minutes: round a duration up."""
    return max(1, math.ceil(seconds / 60.0))
