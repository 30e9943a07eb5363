"""Several services on one host: the pure rules behind tests/integration/test_multi_gpu_services.py — which services a job
frees (the spec declares who holds which GPU), its locks, the admission verdict over its own GPUs, the ledger
rebuilt with one entry per service, the controller's spec model and the status text."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from remote_payload import admission
from remote_payload.supervision import ledger, locks as supervisor_locks
from remote_payload.supervision.restore import owed
from remote_payload.supervision.files import JobPaths
from remote_payload.host.answer import Fail
from remote_payload.supervision.record import initial_status
from remote_payload.supervision.spec import check_spec
from tests.typed_answers import status_text as _status_text

A, B = "infer-a.service", "infer-b.service"


def raw(devices: list, services=None, **extra) -> dict:
    services = services if services is not None else [
        {"manager": "systemd", "unit": A, "stop": "if-needed", "gpus": [0, 1]},
        {"manager": "systemd", "unit": B, "stop": "if-needed", "gpus": [2, 3]}]
    return dict({"services": services, "gpu": {"devices": devices, "required_mib": 9000},
                 "payload": {"command": ["/bin/true"]}}, **extra)


@pytest.mark.parametrize("devices, freed, kept", [
    ([4], [], [A, B]), ([0], [A], [B]), ([3], [B], [A]), ([1, 2], [A, B], []), ([], [A, B], [])])
def test_a_job_frees_only_the_services_its_gpus_meet(devices, freed, kept):
    spec = check_spec(raw(devices), "j")
    assert [s["unit"] for s in spec["services"]] == freed and spec["services_kept"] == kept
    assert spec["service"] == (spec["services"][0] if freed else {"manager": "none"})


def test_one_service_on_every_gpu_keeps_the_spec_as_it_was():
    spec = check_spec({"service": {"manager": "systemd", "unit": A}, "gpu": {"devices": [0]},
                       "payload": {"command": ["/bin/true"]}}, "j")
    assert "services" not in spec and "gpus" not in spec["service"]
    assert "services" not in initial_status(spec)


@pytest.mark.parametrize("change, words", [
    (lambda r: r.update(service={"manager": "systemd", "unit": A}), "not both"),
    (lambda r: r["services"][0].update(gpus=["gpu0"]), "a device is a GPU index"),
    (lambda r: r["services"][1].update(unit=A), "listed twice"),
    (lambda r: r["services"][0].update(gpus="0"), "service.gpus must be a list"),
])
def test_the_host_refuses_a_bad_services_list(change, words):
    spec = raw([0])
    change(spec)
    with pytest.raises(Fail, match=words) as info:
        check_spec(spec, "j")
    assert info.value.code == "bad-spec"


def test_locks_are_the_jobs_gpus_and_the_services_it_frees(monkeypatch):
    assert supervisor_locks.lock_keys(check_spec(raw([0]), "j")) == ["gpu-0", "service-" + A]
    assert supervisor_locks.lock_keys(check_spec(raw([4]), "j")) == ["gpu-4"]
    csv = "".join(f"{i}, GPU-00000000-0000-4000-8000-{i:012d}, H200, 143771, 0, 143156\n" for i in range(8))
    monkeypatch.setattr(supervisor_locks, "nvidia_smi", lambda args: csv)
    keys = supervisor_locks.lock_keys(check_spec(raw([]), "j"))  # no devices: every GPU
    assert keys == [f"gpu-{i}" for i in range(8)] + ["service-" + A, "service-" + B]


def report(free: dict, services: list, kept=()) -> dict:
    return {"gpus": [{"index": i, "uuid": f"GPU-{i}", "total_mib": 143771, "free_mib": f} for i, f in free.items()],
            "apps": [], "locks": [], "nvidia_smi": True, "service": services[0] if services else None,
            "services": services, "services_kept": list(kept)}


def active(unit: str) -> dict:
    return {"manager": "systemd", "unit": unit, "active_state": "active", "ledger": None}


def test_admission_stops_only_the_service_on_the_short_gpu():
    wire = {"job_id": "j", **raw([1, 2])}  # the controller's wire: every declared service
    verdict = admission.admit(wire, report({1: 1000, 2: 100000}, [active(A), active(B)]))
    assert verdict["stop_service"] is True
    assert any(f"will stop {A}" in n for n in verdict["notes"]) and not any(B in n for n in verdict["notes"])


def test_admission_over_a_gpu_no_service_holds_names_the_ones_kept_serving():
    wire = {"job_id": "j", **raw([4])}
    verdict = admission.admit(wire, report({4: 100000}, [], kept=[A, B]))
    assert verdict["stop_service"] is False
    assert f"{A}, {B} keep serving: not on the job's GPUs" in verdict["notes"]
    refused = admission.admit(wire, report({4: 10}, [], kept=[A, B]))
    assert "there is no service to stop" in refused["refuse"]["message"]


def test_a_forged_status_is_settled_from_every_ledger_entry(tmp_path):
    paths = JobPaths(str(tmp_path), "j")
    (tmp_path / "jobs" / "j").mkdir(parents=True)
    spec = check_spec(raw([1, 2]), "j")
    (tmp_path / "jobs" / "j" / "spec.json").write_text("garbage")
    (tmp_path / "jobs" / "j" / "status.json").write_text(json.dumps({"state": "SUCCEEDED", "restored": True}))
    for service in spec["services"]:
        ledger.record_stop(str(tmp_path), service["unit"], "j", dict(service, was="active"), ["1", "2"],
                           service_gpus=service["gpus"])
    job = owed.load_for_restore(paths)
    assert [s["unit"] for s in job.spec["services"]] == [A, B]
    assert [s["gpus"] for s in job.spec["services"]] == [["0", "1"], ["2", "3"]]
    assert job.status["state"] == "LOST" and all(r["stopped"] for r in job.status["services"])


def test_the_controller_sends_every_declared_service_with_its_gpus():
    from runner.spec.spec import JobSpec

    spec = JobSpec.model_validate({"name": "t", "host": {"address": "h"}, **raw([0]), "gpu": {"devices": [0]}})
    wire = spec.to_wire("t-1", 9000, None)
    assert "service" not in wire and [s["gpus"] for s in wire["services"]] == [["0", "1"], ["2", "3"]]
    one = JobSpec.model_validate({"name": "t", "host": {"address": "h"}, "service": {"manager": "systemd", "unit": A},
                                  "payload": {"command": ["/bin/true"]}})
    assert "gpus" not in one.to_wire("t-1", 0, None)["service"]  # the wire as it was
    with pytest.raises(ValidationError, match="needs `manager: systemd`"):
        JobSpec.model_validate({"name": "t", "host": {"address": "h"}, **raw([0], services=[{"manager": "none"}]),
                                "gpu": {"devices": [0]}})


def test_status_shows_which_services_were_freed_and_which_kept_serving():
    job = {"job_id": "j", "state": "SUCCEEDED", "created_at": 1.0, "now": 9.0,
           "service": {"manager": "systemd", "unit": A, "was": "active", "now": "active", "stopped": True},
           "services": [{"manager": "systemd", "unit": A, "was": "active", "now": "active", "stopped": True},
                        {"manager": "systemd", "unit": B, "was": "active", "now": "active", "stopped": False}],
           "services_kept": ["infer-c.service"]}
    text = _status_text(job)
    assert f"{A} was active now active (freed)" in text and f"{B} was active now active (not freed)" in text
    assert "kept        infer-c.service serving" in text
