"""The `launcher: slurm` spec on both sides: the controller's models and wire form (runner/spec/spec_slurm.py) and
the host's own check of that wire form (supervision/spec.py check_launcher): the same verdicts. Last, the same
refusals through the real CLI: exit 2 and no host contacted (no Slurm needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from remote_payload.host.answer import Fail
from remote_payload.supervision.spec import check_spec
from runner.spec.spec import JobSpec
from tests.cli_helpers import submit_refused

BASE = {"name": "k26 on slurm", "host": {"address": "login-1"}, "launcher": "slurm",
        "payload": {"command": ["python3", "bench.py"]}, "limits": {"max_runtime": "30m", "grace": "30s"}}


def spec(**changes) -> JobSpec:
    return JobSpec.model_validate({**BASE, **changes})


def test_wire_form_carries_launcher_and_time_in_whole_minutes_after_our_deadline():
    wire = spec(slurm={"partition": "gpu", "gpus": "h200:1", "extra_args": ["--exclusive"]}).to_wire("j-1", 0, None)
    assert wire["launcher"] == "slurm"
    assert wire["slurm"] == {"partition": "gpu", "gres": None, "gpus": "h200:1", "account": None, "qos": None,
                             "constraint": None, "extra_args": ["--exclusive"], "time_min": 32}
    assert spec(slurm={"time": "1h"}).to_wire("j-1", 0, None)["slurm"]["time_min"] == 60
    assert spec(slurm=None).to_wire("j-1", 0, None)["slurm"]["time_min"] == 32


def test_an_ssh_jobs_wire_form_is_unchanged():
    wire = spec(launcher="ssh").to_wire("j-1", 0, None)
    assert "launcher" not in wire and "slurm" not in wire


def test_the_host_accepts_the_controllers_wire_form_as_is():
    wire = spec(slurm={"gres": "gpu:1", "qos": "high"}).to_wire("j-1", 0, None)
    checked = check_spec(wire, "j-1")
    assert checked["launcher"] == "slurm" and checked["slurm"] == wire["slurm"]


@pytest.mark.parametrize("changes, words", [
    ({"launcher": "ssh", "slurm": {"partition": "gpu"}}, "launcher"),
    ({"service": {"manager": "systemd", "unit": "sglang.service"}}, "manager"),
    ({"gpu": {"devices": ["0"], "required_mib": 0, "drain_timeout": 10}}, "devices"),
    ({"slurm": {"time_min": 5}}, "shorter than limits.max_runtime"),
    ({"slurm": {"time_min": 40, "partition": "a b"}}, "slurm.partition"),
    ({"slurm": {"time_min": 40, "extra_args": ["--time=5"]}}, "may not set --time"),
    ({"slurm": None}, "slurm object"),
    ({"launcher": "pbs"}, "launcher must be ssh or slurm"),
])
def test_the_host_refuses_what_the_controller_refuses(changes, words):
    wire = dict(spec(slurm={}).to_wire("j-1", 0, None), **changes)
    with pytest.raises(Fail) as caught:
        check_spec(wire, "j-1")
    assert caught.value.code == "bad-spec" and words in str(caught.value)


@pytest.mark.parametrize("changes, words", [
    ({"launcher": "ssh", "slurm": {"partition": "gpu"}}, "needs `launcher: slurm`"),
    ({"service": {"manager": "systemd", "unit": "sglang"}}, "the scheduler owns the GPUs"),
    ({"gpu": {"devices": [0]}}, "Slurm hands out the GPUs"),
    ({"slurm": {"time": "31m"}}, "shorter than limits.max_runtime"),
    ({"slurm": {"gpus": True}}, "gpus must be a count"),
    ({"slurm": {"gres": "gpu:1", "gpus": 1}}, "give one"),
    ({"slurm": {"partiton": "gpu"}}, "partiton"),
])
def test_the_controller_refuses_with_the_reason(changes, words):
    with pytest.raises(ValidationError) as caught:
        spec(**changes)
    assert words in str(caught.value)


@pytest.mark.parametrize("change, words", [
    ({"launcher": "ssh", "slurm": {"partition": "debug"}}, "needs `launcher: slurm`"),
    ({"service": {"manager": "systemd", "unit": "sglang.service"}}, "the scheduler owns the GPUs"),
    ({"gpu": {"devices": [0]}}, "Slurm hands out the GPUs"),
    ({"slurm": {"time": "1m"}}, "slurm.time is 1 min, shorter"),
    ({"slurm": {"partition": "gpu;reboot"}}, "slurm.partition"),
])
def test_bad_slurm_specs_exit_2_and_reach_no_host(change, words, tmp_path):
    spec = {"name": "bad", "host": {"address": "local", "root": str(tmp_path / "never")}, "launcher": "slurm",
            "payload": {"command": ["true"]}, **change}
    assert words in submit_refused(tmp_path, spec)
