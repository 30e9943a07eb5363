"""The one time budget (remote_payload/supervision/budget.py): every bound of a job computed once from its spec
when the job dir is claimed, recorded in status.json, and read from there by the guard, the guard timer, the
unit and the Slurm batch. Pure checks first, then the fork path, then the unit on the confined systemd host."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from remote_payload.supervision.restore.guard import hard_deadline
from remote_payload.slurm.launch import submit_argv
from remote_payload.supervision.budget import BOUNDS, budget, recorded
from remote_payload.host.answer import Fail
from remote_payload.supervision.files import JobPaths, read_status, write_json_atomic
from remote_payload.supervision.spec import check_spec
from remote_payload.supervision.start import claim_job_dir
from tests.harness.supervisor_calls import Host


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.cleanup()


PROTOCOL = Path(__file__).parents[2] / "docs" / "protocol.md"
SERVICE = {"manager": "systemd", "unit": "sg", "health_timeout": 300}
GPU = {"devices": ["0"], "required_mib": 1000, "drain_timeout": 90}
LIMITS = {"max_runtime": 1200, "grace": 15}
T = 1000.0
SPECS = {
    "single": {"service": SERVICE, "gpu": GPU, "limits": LIMITS, "payload": {"command": ["/bin/true"]}},
    "sweep": {"service": SERVICE, "gpu": GPU, "limits": LIMITS, "payload": {"command": ["/bin/true"]},
              "sweep": {"variants": [{"args": {"n": n}, "argv": ["/bin/true", str(n)]} for n in range(3)]}},
    "staged": {"service": SERVICE, "gpu": GPU, "limits": dict(LIMITS, stage_timeout=240),
               "payload": {"command": ["/bin/true"], "staged": True}},
    "prepare": {"service": SERVICE, "gpu": GPU, "limits": dict(LIMITS, prepare_timeout=500, queue_timeout=900),
                "payload": {"command": ["/bin/true"], "prepare": ["/bin/true", "prepare"]}},
    "slurm": {"launcher": "slurm", "slurm": {"time_min": 25}, "limits": LIMITS, "payload": {"command": ["/bin/true"]}},
}
# What 1e0bbea's five formulas gave for these specs (guard_timer_seconds, runtime_max_s without and with --queue,
# stop_timeout_s, hard_deadline per state minus its start, time_min): the refactor changes no number.
SERVICE_HUNG = {"hung_running_s": 1395, "hung_restoring_s": 615, "hung_draining_s": 170, "hung_stopping_s": 740}
PINNED = {
    "single": dict(SERVICE_HUNG, guard_timer_s=2475, runtime_max_s=(4275, 11475), timeout_stop_s=655),
    "sweep": dict(SERVICE_HUNG, guard_timer_s=4905, runtime_max_s=(6705, 13905), timeout_stop_s=655),
    "staged": dict(SERVICE_HUNG, guard_timer_s=2475, runtime_max_s=(4515, 11715), timeout_stop_s=655),
    "prepare": dict(SERVICE_HUNG, guard_timer_s=2475, runtime_max_s=(2975, 3875), timeout_stop_s=655),
    "slurm": {"guard_timer_s": 2235, "runtime_max_s": (4035, 11235), "timeout_stop_s": 385, "hung_running_s": 1425,
              "hung_restoring_s": 345, "hung_draining_s": 200, "hung_stopping_s": 740, "slurm_time_min": 25},
}


def checked(name: str) -> dict:
    return check_spec(dict({"name": name}, **SPECS[name]), "j1")


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("queue", [False, True])
def test_the_budget_keeps_the_numbers_of_the_five_formulas_it_replaces(name, queue):
    want = dict(PINNED[name], runtime_max_s=PINNED[name]["runtime_max_s"][queue])
    got = budget(checked(name), T, queue)
    assert {key: got[key] for key in want} == want
    assert got["ends_by_at"] == T + got["runtime_max_s"] + 2 * got["timeout_stop_s"]
    assert got["adopted_timer_s"] == PINNED[name]["runtime_max_s"][False]  # the prepare step and staging first
    assert set(got) == {b.name for b in BOUNDS if b.launcher in (None, SPECS[name].get("launcher", "ssh"))}


def test_slurms_time_is_the_controllers_never_below_our_deadline():
    spec = checked("slurm")
    assert budget(dict(spec, slurm=dict(spec["slurm"], time_min=22)), T)["slurm_time_min"] == 22  # the default
    assert budget(dict(spec, slurm=dict(spec["slurm"], time_min=1)), T)["slurm_time_min"] == 22


def test_slurms_time_covers_the_prepare_step_and_the_staging_the_allocation_runs_first():
    """slurm-run runs the whole choreography in the allocation: prepare step (limits.prepare_timeout), then the
    payload. A --time of max_runtime + grace + slack alone lets Slurm kill a job whose prepare step took a while
    before our own deadline ends it TIMED_OUT."""
    from runner.spec.spec import JobSpec

    base = {"name": "p", "host": {"address": "login-1"}, "launcher": "slurm",
            "payload": {"command": ["python3", "bench.py"], "prepare_command": ["python3", "bench.py", "--jit"]},
            "limits": {"max_runtime": "30m", "grace": "30s", "prepare_timeout": "10m"}}
    wire = JobSpec.model_validate(base).to_wire("j-1", 0, None)
    assert wire["slurm"]["time_min"] == 42  # 10 min prepare + 30 min run + 30 s grace + 60 s slack
    assert budget(check_spec(wire, "j-1"), T)["slurm_time_min"] == 42
    with pytest.raises(ValidationError, match="shorter than"):
        JobSpec.model_validate(dict(base, slurm={"time": "32m"}))
    with pytest.raises(Fail, match="shorter than"):
        check_spec(dict(wire, slurm=dict(wire["slurm"], time_min=32)), "j-1")
    staged = dict(base, payload={"command": ["python3", "bench.py"], "staged": True},
                  limits={"max_runtime": "30m", "grace": "30s", "stage_timeout": "5m"})
    assert JobSpec.model_validate(staged).to_wire("j-1", 0, None)["slurm"]["time_min"] == 37


def table_rows(text: str) -> list:
    """The rows of protocol.md's "Time budget" table: (bound, formula, reader) as written there."""
    section = text.split("## Time budget", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [tuple(re.sub(r"^`|`$", "", cell.strip()) for cell in row.strip("|").split(" | ")[:3]) for row in rows]


def test_protocol_md_shows_the_budgets_own_formulas():
    assert table_rows(PROTOCOL.read_text()) == [(b.name, b.formula, b.reader) for b in BOUNDS]


def test_the_guard_reads_the_recorded_budget_not_the_spec():
    spec = checked("single")
    status = {"state": "RUNNING", "created_at": T, "started_at": T, "payload": {"started_at": T},
              "budget": dict(budget(spec, T), hung_running_s=7.0)}
    assert hard_deadline(spec, status) == T + 7.0
    restoring = dict(status, state="RESTORING", updated_at=T + 50, budget=dict(status["budget"], hung_restoring_s=3))
    assert hard_deadline(spec, restoring) == T + 53


def test_a_budget_the_payload_overwrote_is_recomputed_from_the_spec():
    spec = checked("single")
    for damaged in (None, "x", {"hung_running_s": "soon"}, {"guard_timer_s": True}):
        assert recorded(spec, {"created_at": T, "budget": damaged}) == budget(spec, T)


def test_sbatch_gets_the_recorded_time(tmp_path):
    spec = check_spec(dict({"name": "slurm"}, **SPECS["slurm"]), "j1")
    paths = JobPaths(str(tmp_path), "j1")
    claim_job_dir(paths, spec, False)
    assert "--time=25" in submit_argv(paths, spec)
    status = read_status(paths)
    write_json_atomic(paths.status, dict(status, budget=dict(status["budget"], slurm_time_min=77)))
    assert "--time=77" in submit_argv(paths, spec)


def test_status_json_holds_the_budget_from_the_claim_on_the_fork_path(host):  # noqa: F811
    spec = host.spec("sleep", "0.2", "0")
    host.start("b1", spec)
    host.start("b2", spec, "--queue")
    for job_id, queue in (("b1", False), ("b2", True)):
        status = json.loads((host.root / "jobs" / job_id / "status.json").read_text())
        spec_json = json.loads((host.root / "jobs" / job_id / "spec.json").read_text())
        assert status["budget"] == budget(spec_json, status["created_at"], queue)
        host.wait(job_id, "SUCCEEDED")
    assert json.loads((host.root / "jobs" / "b1" / "status.json").read_text())["budget"]["runtime_max_s"] < \
        json.loads((host.root / "jobs" / "b2" / "status.json").read_text())["budget"]["runtime_max_s"]


SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def timespan_s(text: str) -> float:
    """systemd's timespan as `systemctl show` prints it ("45min 1s", "1h 2min"), in seconds."""
    parts = re.findall(r"([0-9.]+)\s*([a-z]+)", text)
    assert parts and " ".join(n + u for n, u in parts) == text.strip(), text
    return sum(float(number) * SPAN_UNITS[unit] for number, unit in parts)


@pytest.mark.systemd
def test_the_unit_and_the_guard_timer_carry_the_recorded_budget(service_host):
    from tests.harness.supervisor_calls import RemoteHost

    remote = RemoteHost(service_host)
    spec, runtime_max = remote.spec("always", "sleep", "30", "0"), {}
    try:
        for job_id, flags in (("u1", ()), ("u2", ("--queue",))):
            assert remote.call("start", "--job-id", job_id, *flags, spec=spec)["ok"]
            status = remote.wait(job_id, "RUNNING")
            bounds = json.loads((remote.root / "jobs" / job_id / "status.json").read_text())["budget"]
            runtime_max[job_id] = bounds["runtime_max_s"]
            unit = [remote.sh.systemctl("show", "-P", prop, "runner-job-%s.service" % job_id).stdout
                    for prop in ("RuntimeMaxUSec", "TimeoutStopUSec")]  # one each: -P prints in systemd's order
            timer = remote.sh.systemctl("show", "-P", "TimersMonotonic", "runner-guard-%s.timer" % job_id).stdout
            assert status["launch"]["mode"] == "systemd-unit", status.get("launch")
            assert [timespan_s(text) for text in unit] == [int(bounds["runtime_max_s"]), int(bounds["timeout_stop_s"])]
            on_active = re.search(r"OnActiveUSec=([^;]+);", timer)
            assert on_active and timespan_s(on_active.group(1)) == int(bounds["guard_timer_s"]), timer
            assert remote.call("cancel", "--job-id", job_id)["ok"]
            assert remote.wait(job_id, "CANCELLED")["service"]["healthy"]
        assert runtime_max["u2"] - runtime_max["u1"] == check_spec(dict(spec), "u2")["limits"]["queue_timeout"]
    finally:
        for job_id in ("u1", "u2"):
            remote.sh.systemctl("stop", "runner-job-%s.service" % job_id, "runner-guard-%s.timer" % job_id)
        remote.cleanup()


@pytest.mark.systemd
def test_a_job_adopting_a_dead_jobs_stop_times_its_guard_timer_past_its_prepare_step(service_host):
    """The adopting job makes its guard timer when it takes the ledger's stop, before its prepare step and its
    staging: a timer of guard_timer_s alone fires (and is spent) while the job still runs, leaving no last line
    for when its supervisor and guard die later."""
    from tests.harness.supervisor_calls import RemoteHost

    remote = RemoteHost(service_host)
    (remote.root / "launch-fork").touch()  # the fork + guard path: no unit restores the dead job first
    spec_b = remote.spec("always", "sleep", "1", "0")
    spec_b["payload"]["prepare"] = ["/usr/bin/python3", str(remote.root / "payload.py"), "sleep", "0.1", "0"]
    spec_b["limits"]["prepare_timeout"] = 300
    try:
        assert remote.call("start", "--job-id", "a1", spec=remote.spec("always", "sleep", "600", "0"))["ok"]
        a = remote.wait("a1", "RUNNING")
        remote.sh.ssh(["kill", "-KILL", str(a["supervisor"]["pid"]), str(a["guard"]["pid"])], check=True)
        assert remote.call("start", "--job-id", "b1", spec=spec_b)["ok"]
        b = remote.wait("b1", "SUCCEEDED", "FAILED", "LOST")
        assert b["state"] == "SUCCEEDED" and b["service"]["adopted_from"] == "a1", b
        events = [json.loads(line) for line in (remote.root / "jobs" / "b1" / "events.jsonl").read_text().splitlines()]
        timer = [e for e in events if e["event"] == "guard-timer" and "seconds" in e]
        assert [e["seconds"] for e in timer] == [int(300 + b["budget"]["guard_timer_s"])]  # prepare_timeout first
        assert b["budget"]["adopted_timer_s"] == 300 + b["budget"]["guard_timer_s"]
    finally:
        for job_id in ("a1", "b1"):
            remote.sh.systemctl("stop", "runner-guard-%s.timer" % job_id)
        remote.cleanup()


def test_several_services_are_waited_for_by_the_longest_health_timeout():
    """The freed services' restores run at once: every bound with a health wait counts the longest one, whichever
    service the spec lists first."""
    quick = dict(SERVICE, unit="a", gpus=[0], health_timeout=30)
    slow = dict(SERVICE, unit="b", gpus=[1], health_timeout=900)
    both = check_spec({"name": "two", "services": [quick, slow], "gpu": dict(GPU, devices=["0", "1"]),
                       "limits": LIMITS, "payload": {"command": ["/bin/true"]}}, "j1")
    alone = check_spec({"name": "one", "service": slow, "gpu": dict(GPU, devices=["1"]), "limits": LIMITS,
                        "payload": {"command": ["/bin/true"]}}, "j1")
    assert [s["unit"] for s in both["services"]] == ["a.service", "b.service"]
    for name in ("guard_timer_s", "timeout_stop_s", "hung_restoring_s"):
        assert budget(both, T)[name] == budget(alone, T)[name], name
