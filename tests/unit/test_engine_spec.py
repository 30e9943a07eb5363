"""service.free / api_url / pause_mode: the controller's model and the host's check agree, and a job with
`free: stop` (the default) keeps the wire form it had."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from remote_payload.admission import admit
from remote_payload.host.answer import Fail
from remote_payload.supervision.spec import check_service
from runner.spec.spec import ServiceSpec

BASE = {"manager": "systemd", "unit": "sglang.service", "health_url": "http://127.0.0.1:30000/health"}


def test_free_stop_is_the_default_and_the_wire_is_unchanged():
    wire = ServiceSpec(**BASE).wire()
    assert "free" not in wire and "api_url" not in wire and "pause_mode" not in wire
    assert check_service(wire) == dict(wire, unit="sglang.service")


def test_sglang_api_url_defaults_to_the_health_urls_origin_on_both_sides():
    wire = ServiceSpec(**BASE, free="sglang").wire()
    assert wire["free"] == "sglang" and wire["api_url"] == "http://127.0.0.1:30000" and wire["pause_mode"] is None
    host = check_service(dict(wire, api_url=None))
    assert host["api_url"] == "http://127.0.0.1:30000" and host["free"] == "sglang"
    assert check_service(wire) == host


def test_an_explicit_api_url_and_pause_mode_travel():
    wire = ServiceSpec(**BASE, free="sglang", api_url="http://127.0.0.1:31000/", pause_mode="retract").wire()
    assert wire["api_url"] == "http://127.0.0.1:31000" and wire["pause_mode"] == "retract"
    assert check_service(wire)["pause_mode"] == "retract"


@pytest.mark.parametrize("fields, message", [
    ({"free": "sglang", "pause_mode": "sideways"}, "pause_mode"),   # not one of SGLang's modes
    ({"free": "vllm", "drain_timeout": 10}, "drain_timeout"),        # SGLang's drain only
    ({"free": "sglang", "drain_timeout": 301}, "drain_timeout"),     # the release's own bound must hold it
    ({"free": "vllm", "pause_mode": "abort"}, "pause_mode"),
    ({"api_url": "http://127.0.0.1:1"}, "api_url"),                  # with free: stop
    ({"free": "sglang", "health_url": None}, "api_url"),
    ({"free": "kill"}, "free"),
    ({"drain_fallback": "abort"}, "drain_fallback"),                 # with free: stop
    ({"free": "vllm", "drain_fallback": "abort"}, "drain_fallback"),
    ({"free": "sglang", "drain_fallback": "retry"}, "drain_fallback"),
    ({"free": "sglang", "pause_mode": "abort", "drain_fallback": "abort"}, "drain_fallback"),
    ({"free": "sglang", "api_url": "ftp://x"}, "URL"),
])
def test_bad_engine_fields_are_refused_by_both_sides(fields, message):
    raw = dict(BASE, **fields)
    with pytest.raises(ValidationError, match=message):
        ServiceSpec(**raw)
    with pytest.raises(Fail, match=message) as info:
        check_service(raw)
    assert info.value.code == "bad-spec"


def test_drain_timeout_travels_only_when_set():
    assert "drain_timeout" not in ServiceSpec(**BASE, free="sglang").wire()
    wire = ServiceSpec(**BASE, free="sglang", drain_timeout="45s").wire()
    assert wire["drain_timeout"] == 45.0 and check_service(wire)["drain_timeout"] == 45.0


def test_drain_fallback_travels_only_when_set_and_only_with_the_drain():
    assert "drain_fallback" not in ServiceSpec(**BASE, free="sglang").wire()
    for mode in (None, "drain"):
        wire = ServiceSpec(**BASE, free="sglang", pause_mode=mode, drain_fallback="abort").wire()
        assert wire["drain_fallback"] == "abort" and check_service(wire)["drain_fallback"] == "abort"
    assert check_service(ServiceSpec(**BASE, free="sglang", drain_fallback="skip").wire())["drain_fallback"] == "skip"


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_modes_sglang_cannot_release_after_pass_the_spec_and_are_refused_by_admission_with_the_reason(mode):
    """Valid SGLang modes (the spec takes them), refused before anything is touched: exit 4 with why."""
    wire = ServiceSpec(**BASE, free="sglang", pause_mode=mode).wire()
    assert check_service(wire)["pause_mode"] == mode
    spec = {"job_id": "j", "gpu": {"devices": [], "required_mib": 0}, "service": wire}
    report = {"gpus": [], "locks": [], "service": {"unit": "sglang.service", "active_state": "active",
                                                    "engine": {"engine": "sglang", "version": "0.5.17"}}}
    verdict = admit(spec, report)["refuse"]
    assert verdict["code"] == "preflight-refused" and "release_memory_occupation asserts" in verdict["message"]
    assert verdict["message"].startswith(f"service.pause_mode {mode}: ") and "drain" in verdict["hint"]
    drained = dict(spec, service=ServiceSpec(**BASE, free="sglang").wire())
    assert admit(drained, report).get("start") is True  # the default on the same report


def test_free_through_an_api_needs_a_unit_to_fall_back_on():
    with pytest.raises(ValidationError, match="needs `manager: systemd`"):
        ServiceSpec(manager="none", free="vllm", api_url="http://127.0.0.1:8000")
