"""One table of values (tests/harness/contract_table.py, which the controller side walks too), the contract's
verdict, and the host side's own checks: they must agree.
"""
from __future__ import annotations

import time

import pytest

from remote_payload import contract
from remote_payload.verbs import reap as supervisor
from remote_payload.supervision import files as supervisor_files, job as supervisor_job, record as supervisor_record, \
    spec as supervisor_spec
from remote_payload.supervision.restore import guard as supervisor_guard, owed as supervisor_owed
from remote_payload.host import (answer as supervisor_answer, bundle as supervisor_bundle, gpu as supervisor_gpu,
                                 parsers as supervisor_parsers, processes as supervisor_processes,
                                 systemd as supervisor_systemd)
from remote_payload.host.answer import Fail
from remote_payload.host.gpu import refuse_too_small, short_gpus
from remote_payload.supervision import spec as checks
from tests.harness.contract_table import CONTRACT_RULES, MEMORY_ROWS, ROWS
from tests.harness.pace import Scale

ROOMS = (supervisor, supervisor_files, supervisor_answer, supervisor_bundle, supervisor_gpu, supervisor_parsers,
         supervisor_processes, supervisor_systemd, supervisor_job, supervisor_record, supervisor_guard,
         supervisor_owed, supervisor_spec)


def host_accepts(kind: str, value) -> bool:
    """The supervisor's own check for one kind of value: True when it accepts it."""
    rules = {
        "job_id": lambda v: checks.check_job_id(v),
        "unit": lambda v: checks.check_unit(v),
        "script": lambda v: checks.check_spec({"payload": {"script": v, "bundle": "0" * 16}}, "j"),
        "env_key": lambda v: checks.check_spec({"payload": {"command": ["/bin/true"], "env": {v: "x"}}}, "j"),
        "device": lambda v: checks.check_spec({"payload": {"command": ["/bin/true"]}, "gpu": {"devices": [v]}}, "j"),
        "root": lambda v: checks.check_root(v),
        "payload_user": lambda v: checks.check_spec({"payload": {"command": ["/bin/true"], "user": v}}, "j"),
    }
    try:
        rules[kind](value)
    except Fail:
        return False
    return True


def host_memory_verdict(gpu: dict, need: int) -> str:
    card = dict(gpu, index="0", uuid="GPU-x", name="t", used_mib=None)
    try:
        refuse_too_small([card], need)
    except Fail:
        return "too-small"
    return "short" if short_gpus([card], need) else "ok"


@pytest.mark.parametrize("kind, value, ok", ROWS)
def test_the_contract_says_what_the_table_says(kind, value, ok):
    assert (CONTRACT_RULES[kind](value) is None) == ok


@pytest.mark.parametrize("kind, value, ok", ROWS)
def test_the_supervisor_agrees_with_the_contract(kind, value, ok):
    assert host_accepts(kind, value) == ok


@pytest.mark.parametrize("gpu, need, verdict", MEMORY_ROWS)
def test_memory_rows(gpu, need, verdict):
    assert contract.memory_verdict(gpu, need) == verdict
    assert host_memory_verdict(gpu, need) == verdict


# ── where the two sides' checks drifted apart, one test each ────────────────────────────────────────────────

def test_drift_job_id_starting_with_dash_is_refused():
    with pytest.raises(Fail) as err:
        checks.check_job_id("-rf")
    assert err.value.code == "bad-args"


def test_drift_unit_names_follow_the_contract():
    for unit in ("a..b.service", ".hidden", "@x", "a@b@c", "x" * 245):
        with pytest.raises(Fail):
            checks.check_unit(unit)
    assert checks.check_unit("sglang") == contract.normalize_unit("sglang") == "sglang.service"


def test_drift_default_max_runtime_is_the_contract_default():
    checked = checks.check_spec({"payload": {"command": ["/bin/true"]}}, "j")
    assert checked["limits"]["max_runtime"] == contract.DEFAULTS["limits.max_runtime"] == 3600.0
    assert checked["limits"]["grace"] == contract.DEFAULTS["limits.grace"]
    assert checked["gpu"]["drain_timeout"] == contract.DEFAULTS["gpu.drain_timeout"]


def test_drift_states_come_from_the_contract():
    for room in ROOMS:
        for name in ("STATES", "TERMINAL", "RUNNING_SERVICE_STATES", "DEFAULTS"):
            assert getattr(room, name, getattr(contract, name)) is getattr(contract, name), (room.__name__, name)
    assert all("TERMINAL" in vars(room) for room in (supervisor_record, supervisor_guard, supervisor_owed, supervisor))


def test_drift_a_card_smaller_than_the_need_is_refused_at_once(tmp_path):
    """Not 'drain until drain_timeout': no stop can make a card larger than it is."""
    from tests.harness.supervisor_calls import Host, gpu_spec

    host, scale = Host(tmp_path), Scale()  # "at once": well under the drain timeout, both at this machine's pace
    try:
        began = time.monotonic()
        host.start("big", gpu_spec(host, "sleep", "0", "0", required=200000, drain=scale(30)))
        final = host.wait("big", "FAILED", timeout=scale(20))
        assert time.monotonic() - began < scale(15)
        assert "143771 MiB in total" in final["message"] and "200000 MiB" in final["message"]
        assert final["payload"] is None and final["restored"] is True
    finally:
        host.cleanup()


def test_every_error_code_the_supervisor_answers_is_a_contract_code():
    import inspect
    import re

    codes = set()
    for room in ROOMS:
        codes |= set(re.findall(r'Fail\(\s*"([a-z-]+)"', inspect.getsource(room)))
        codes |= set(re.findall(r'"error": "([a-z-]+)"', inspect.getsource(room)))
    assert codes and codes <= set(contract.ERRORS), codes - set(contract.ERRORS)


@pytest.mark.systemd
def test_drift_a_too_small_card_never_stops_the_service(service_host):
    """stop: always, a need above the card's total: refused before the stop, the service never goes down."""
    from tests.harness.supervisor_calls import RemoteHost

    remote = RemoteHost(service_host)
    try:
        assert remote.call("start", "--job-id", "small", spec=remote.spec("always", "sleep", "0", "0",
                                                                          required=200000))["ok"]
        final = remote.wait("small", "FAILED", "SUCCEEDED")
        assert final["state"] == "FAILED" and "143771 MiB in total" in final["message"], final
        assert final["service"]["stopped"] is False and final["payload"] is None
        assert remote.sh.service_state() == "active"
    finally:
        remote.cleanup()
