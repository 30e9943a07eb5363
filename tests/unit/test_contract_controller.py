"""The controller side of the contract table: the rows of tests/harness/contract_table.py (the host side walks
them in tests/integration/test_contract_host.py), walked through runner/'s own checks (spec models, job ids, preflight),
must get the contract's verdict."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from runner.errors import PreflightError, SpecError
from runner.remote.preflight import decide
from runner.spec.spec import GpuSpec, HostSpec, PayloadSpec, ServiceSpec
from runner.state.job_id import check_job_id
from tests.harness import contract_table as table

CONTROLLER_CHECKS = {
    "job_id": check_job_id,
    "unit": lambda v: ServiceSpec(manager="systemd", unit=v),
    "script": lambda v: PayloadSpec(script=v),
    "env_key": lambda v: PayloadSpec(command=["/bin/true"], env={v: "x"}),
    "device": lambda v: GpuSpec(devices=[v]),
    "root": lambda v: HostSpec(address="local", root=v),
    "payload_user": lambda v: PayloadSpec(command=["/bin/true"], user=v),
}


def controller_accepts(kind: str, value) -> bool:
    try:
        CONTROLLER_CHECKS[kind](value)
    except (SpecError, ValidationError):
        return False
    return True


def controller_memory_verdict(gpu: dict, need: int) -> str:
    """preflight.decide on one card, with a running service it may stop: stopping it means memory is short."""
    wire = {"job_id": "j", "service": {"manager": "systemd", "unit": "s.service", "stop": "if-needed"},
            "gpu": {"devices": ["0"], "required_mib": need}}
    report = {"gpus": [dict(gpu, index=0, uuid="GPU-x")], "service": {"active_state": "active"}, "nvidia_smi": True}
    try:
        return "short" if decide(wire, report).stop_service else "ok"
    except PreflightError:
        return "too-small"


@pytest.mark.parametrize("kind, value, ok", table.ROWS)
def test_the_controller_agrees_with_the_contract(kind, value, ok):
    assert controller_accepts(kind, value) == ok


@pytest.mark.parametrize("gpu, need, verdict", table.MEMORY_ROWS)
def test_preflight_memory_agrees_with_the_contract(gpu, need, verdict):
    assert controller_memory_verdict(gpu, need) == verdict
