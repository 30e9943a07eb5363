"""The submit-time decision for service.free sglang/vllm: an engine that says (through the host's probe,
which touches nothing) it cannot free memory is refused with exit 4 and the reason."""
import pytest

from runner.errors import EXIT_REFUSED, PreflightError
from runner.remote.preflight import decide
from tests.harness.host_reports import report

WHY = "the SGLang server at http://127.0.0.1:30000 runs without --enable-memory-saver: a release would free nothing"


def wire(free="sglang"):
    return {"job_id": "this-job", "gpu": {"devices": ["0"], "required_mib": 9000},
            "service": {"manager": "systemd", "unit": "sglang.service", "stop": "if-needed", "free": free}}


def with_engine(engine: dict, **kw) -> dict:
    answer = report(free=1000, **kw)
    answer["service"]["engine"] = engine
    return answer


def test_an_engine_without_the_api_is_refused_with_its_reason():
    with pytest.raises(PreflightError, match="without --enable-memory-saver") as info:
        decide(wire(), with_engine({"engine": "sglang", "error": WHY}))
    assert info.value.exit_code == EXIT_REFUSED and "service.free: stop" in info.value.hint


def test_an_engine_with_the_api_is_released_not_stopped():
    decision = decide(wire(), with_engine({"engine": "sglang", "weights_cpu_backup": False}))
    assert decision.stop_service is True
    assert any("release GPU memory of sglang.service through its sglang API" in n for n in decision.notes)


def test_a_unit_that_is_not_running_is_judged_as_before():
    with pytest.raises(PreflightError, match="is inactive, so stopping it frees nothing"):
        decide(wire(), with_engine({"engine": "sglang", "error": "did not answer"}, active="inactive"))


def test_an_engine_a_dead_runner_job_left_released_is_not_refused():
    """Its ledger entry says so: the host's job adopts the release and resumes it after its own run."""
    answer = with_engine({"engine": "vllm", "error": "the vLLM server is asleep already"})
    answer["service"]["ledger"] = {"job_id": "other", "released": {"engine": "vllm"}}
    assert decide(wire("vllm"), answer).stop_service is True
