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


def test_each_choice_literal_names_its_tuple_of_values():
    """contract.py makes its Literals on first use (a host call never imports typing): each must name the same
    values as the tuple the host checks against, in the same order, and the spec models must take them."""
    from typing import get_args

    from remote_payload import contract

    for literal, values in (("ServiceManager", "SERVICE_MANAGERS"), ("Launcher", "LAUNCHERS"),
                            ("ServiceScope", "SERVICE_SCOPES"), ("StopPolicy", "STOP_POLICIES")):
        assert get_args(getattr(contract, literal)) == getattr(contract, values)
        assert getattr(contract, literal) is getattr(contract, literal)  # made once
    assert ServiceSpec(manager="none").manager == "none"
    with pytest.raises(ValidationError):
        ServiceSpec(manager="upstart")
    with pytest.raises(AttributeError):
        contract.NoSuchChoice  # noqa: B018
