"""service.free / api_url / pause_mode: the controller's model and the host's check agree, and a job with
`free: stop` (the default) keeps the wire form it had."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

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


def test_the_spec_takes_the_pause_modes_some_release_can_release_after_and_no_other():
    assert check_service(ServiceSpec(**BASE, free="sglang", pause_mode="retract").wire())["pause_mode"] == "retract"
    with pytest.raises(ValidationError, match="'drain', 'abort' or 'retract'"):
        ServiceSpec(**BASE, free="sglang", pause_mode="in_place")


@pytest.mark.parametrize("value", ["file:/etc/sglang/key", "env:SGLANG_API_KEY"])
def test_an_engine_key_is_named_by_where_it_lives_on_the_host(value):
    wire = ServiceSpec(**BASE, free="sglang", api_key=value, admin_api_key=value).wire()
    assert check_service(wire)["api_key"] == value and check_service(wire)["admin_api_key"] == value


@pytest.mark.parametrize("value", ["sk-the-key-itself", "file:relative/path", "env:1BAD", "env:A B"])
def test_a_key_itself_is_refused_without_being_shown(value):
    with pytest.raises(ValidationError) as info:
        ServiceSpec(**BASE, free="sglang", api_key=value)
    assert "never the key itself" in str(info.value) and value not in str(info.value).split("input_value")[0]
    with pytest.raises(Fail, match="never the key itself") as host:
        check_service(dict(ServiceSpec(**BASE, free="sglang").wire(), api_key=value))
    assert value not in str(host.value)


def test_free_through_an_api_needs_a_unit_to_fall_back_on():
    with pytest.raises(ValidationError, match="needs `manager: systemd`"):
        ServiceSpec(manager="none", free="vllm", api_url="http://127.0.0.1:8000")
