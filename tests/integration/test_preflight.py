"""The submit-time decision, on preflight reports shaped like the supervisor's."""
import pytest

from runner.errors import HostBusy, PreflightError
from runner.remote.preflight import decide
from tests.harness.host_reports import report


def wire(stop="if-needed", manager="systemd", devices=("0",), need=9000):
    service = {"manager": manager, "unit": "sglang.service", "stop": stop} if manager != "none" else {"manager": "none"}
    return {"job_id": "this-job", "service": service, "gpu": {"devices": list(devices), "required_mib": need}}


def test_enough_memory_leaves_service_alone():
    assert decide(wire(), report()).stop_service is False


def test_always_stops_even_with_enough_memory():
    assert decide(wire(stop="always"), report()).stop_service is True


def test_short_memory_if_needed_stops():
    decision = decide(wire(), report(free=1000))
    assert decision.stop_service is True
    assert any("will stop sglang.service" in n for n in decision.notes)


def test_short_memory_never_refuses_naming_holders():
    with pytest.raises(PreflightError, match=r"pid 4242 \(120000 MiB\)"):
        decide(wire(stop="never"), report(free=1000, apps=[{"pid": 4242, "used_mib": 120000}]))


def test_need_above_total_refused_at_once():
    with pytest.raises(PreflightError, match="only 143771 MiB in total"):
        decide(wire(need=200000), report())


def test_inactive_service_cannot_free_memory():
    with pytest.raises(PreflightError, match="is inactive"):
        decide(wire(), report(free=10, active="inactive"))


def test_no_service_and_short_memory_refused():
    with pytest.raises(PreflightError, match="no service to stop"):
        decide(wire(manager="none"), report(free=10))


def test_unknown_gpu_named():
    with pytest.raises(PreflightError, match="GPU 3 not found"):
        decide(wire(devices=("3",)), report())


def test_gpu_by_uuid():
    assert decide(wire(devices=("GPU-aaaa",)), report()).stop_service is False


def test_busy_names_holder_unless_queued():
    locks = [{"key": "service-sglang.service", "held": True, "holder": {"job_id": "other-job", "pid": 77}}]
    with pytest.raises(HostBusy, match="other-job"):
        decide(wire(), report(locks=locks))
    assert decide(wire(), report(locks=locks), queue=True).stop_service is False


def test_no_gpus_no_memory_check():
    assert decide(wire(devices=()), {"locks": []}).stop_service is False


def test_lock_held_by_this_same_job_is_a_retry_not_busy():
    locks = [{"key": "service-sglang.service", "held": True, "holder": {"job_id": "this-job", "pid": 77}}]
    assert decide(wire(), report(locks=locks)).stop_service is False


def test_unknown_memory_counts_as_short_not_a_crash():
    unknown = report()
    unknown["gpus"][0].update(total_mib=None, free_mib=None)
    assert decide(wire(), unknown).stop_service is True  # if-needed: the service may hold it
    with pytest.raises(PreflightError):
        decide(wire(stop="never"), unknown)


def test_queued_job_waits_for_the_runner_job_holding_the_service_stopped():
    """The ledger (or the held service lock) says a runner job stopped it: --queue waits."""
    stopped = report(free=1000, active="inactive")
    stopped["service"]["ledger"] = {"unit": "sglang.service", "job_id": "other-job"}
    decision = decide(wire(), stopped, queue=True)
    assert decision.stop_service is False and any("other-job" in n for n in decision.notes)
    locked = report(free=1000, active="inactive", locks=[{"key": "service-sglang.service", "held": True,
                                                           "holder": {"job_id": "other-job", "pid": 7}}])
    assert any("other-job" in n for n in decide(wire(), locked, queue=True).notes)
    with pytest.raises(PreflightError, match="frees nothing"):  # without --queue, or with no runner job, still refused
        decide(wire(), report(free=1000, active="inactive"), queue=True)


# -- the same rule as the host applies it: remote_payload/admission.admit's plain-data verdict --------------

def test_the_verdict_is_plain_data_the_wire_can_carry():
    import json

    from remote_payload.admission import admit

    locks = [{"key": "gpu-0", "held": True, "holder": {"job_id": "other-job", "pid": 77}}]
    for verdict in (admit(wire(), report()), admit(wire(), report(free=1000)), admit(wire(), report(locks=locks)),
                    admit(wire(stop="never"), report(free=1000))):
        assert json.loads(json.dumps(verdict)) == verdict
    assert admit(wire(), report(free=1000)) == {
        "start": True, "stop_service": True,
        "notes": ["GPU 0: 1000 MiB free < 9000 MiB needed", "will stop sglang.service and restore it afterwards"]}


def test_a_busy_verdict_names_the_holder_and_its_lock():
    from remote_payload.admission import BUSY_HINT, admit

    locks = [{"key": "gpu-0", "held": True, "holder": {"job_id": "other-job", "pid": 77}}]
    assert admit(wire(), report(locks=locks)) == {"refuse": {
        "code": "busy", "message": "gpu-0 is held by job other-job (supervisor pid 77)", "hint": BUSY_HINT,
        "holder": {"job_id": "other-job", "pid": 77, "key": "gpu-0"}}}


def test_a_refusal_verdict_is_preflight_refused_with_the_hint():
    from remote_payload.admission import admit

    refusal = admit(wire(need=200000), report())["refuse"]
    assert refusal["code"] == "preflight-refused" and "only 143771 MiB in total" in refusal["message"]
    assert "larger GPU" in refusal["hint"] and "holder" not in refusal


@pytest.mark.parametrize("policy, short, stops", [("always", False, True), ("always", True, True),
                                                  ("if-needed", False, False), ("if-needed", True, True),
                                                  ("never", False, False), ("never", True, False)])
def test_the_stop_policy_the_supervisor_applies_again_at_start(policy, short, stops):
    from remote_payload.admission import needs_stop

    assert needs_stop(policy, short) is stops
