"""Every submit is one round trip: the host's `submit` applies admission.admit to its own preflight report and
starts the job (a stop of the service included) or answers the refusal, in one supervisor call.

The controller's preflight.decide (dry-run) is admit wrapped; a drift test walks one table of reports
through both. The round-trip counts are measured on a real loopback sshd and on the confined systemd host.
"""
from __future__ import annotations

import pytest

from remote_payload.admission import admit
from runner.deadline import Deadline
from runner.commands import controller
from runner.errors import HostBusy, PreflightError, RunnerError
from runner.remote import preflight
from runner.state.store import Store
from tests.cli_helpers import Target, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

JOB = "bench-20260101-000000-abc123"


def wire(devices=(), need=1000, stop="never", manager="systemd") -> dict:
    service = {"manager": manager, "unit": "sglang.service" if manager == "systemd" else None, "stop": stop}
    return {"job_id": JOB, "gpu": {"devices": list(devices), "required_mib": need}, "service": service}


def gpu(index=0, free=80000, total=81920) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "total_mib": total, "free_mib": free}


def lock(holder_job) -> dict:
    return {"key": "gpu-0", "held": True, "holder": {"job_id": holder_job, "pid": 1}}


REPORTS = {
    "free, no gpus": (wire(), {"locks": []}),
    "free gpu": (wire(["0"]), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "gpu by uuid": (wire(["GPU-0"]), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "short, stop never": (wire(["0"], need=90000), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "short, stop if-needed": (wire(["0"], need=90000 - 9000, stop="if-needed"),
                              {"locks": [], "gpus": [gpu(free=100)], "nvidia_smi": True,
                               "service": {"active_state": "active"}}),
    "too small": (wire(["0"], need=10 ** 6), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "unknown free": (wire(["0"]), {"locks": [], "gpus": [gpu(free=None)], "nvidia_smi": True}),
    "missing gpu": (wire(["3"]), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "no nvidia-smi": (wire(["0"]), {"locks": [], "gpus": [], "nvidia_smi": False}),
    "held by another": (wire(), {"locks": [lock("other-job")]}),
    "held by itself": (wire(), {"locks": [lock(JOB)]}),
    "short, service inactive": (wire(["0"], stop="if-needed"), {"locks": [], "gpus": [gpu(free=10)], "nvidia_smi": True,
                                                               "service": {"active_state": "inactive"}}),
    "short, stopped by a runner job": (wire(["0"], stop="if-needed"),
                                       {"locks": [], "gpus": [gpu(free=10)], "nvidia_smi": True,
                                        "service": {"active_state": "inactive", "ledger": {"job_id": "other-job"}}}),
    "always, memory enough": (wire(["0"], stop="always"), {"locks": [], "gpus": [gpu()], "nvidia_smi": True}),
    "no service, short": (wire(["0"], manager="none"), {"locks": [], "gpus": [gpu(free=10)], "nvidia_smi": True}),
    "engine cannot free": (dict(wire(["0"], stop="if-needed"), service={"manager": "systemd", "unit": "sglang.service",
                                                                         "stop": "if-needed", "free": "sglang"}),
                           {"locks": [], "gpus": [gpu(free=10)], "nvidia_smi": True,
                            "service": {"active_state": "active", "engine": {"error": "no memory API"}}}),
}


@pytest.mark.parametrize("queue", [False, True])
@pytest.mark.parametrize("case", sorted(REPORTS))
def test_the_hosts_verdict_and_the_controllers_decision_never_drift(case, queue):
    spec, report = REPORTS[case]
    verdict = admit(spec, report, queue)
    try:
        decision = preflight.decide(spec, report, queue=queue)
    except RunnerError as exc:
        refusal = verdict.get("refuse")
        assert refusal, f"{case}: the controller refuses a job the host would start"
        assert exc.exit_code == (5 if refusal["code"] == "busy" else 4) and exc.hint == refusal["hint"]
        assert str(exc) == ("host busy: " if refusal["code"] == "busy" else "") + refusal["message"]
        return
    assert verdict == {"start": True, "stop_service": decision.stop_service, "notes": decision.notes}, case


def test_a_cached_submit_is_one_round_trip(ssh_host, tmp_path):
    root = shared_tmpdir("runner-root-one-")
    target = Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    store = Store()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNNER_SSH_CONFIG", str(ssh_host.ssh_config))
        first = controller.submit(str(job), [], store=store, progress=lambda _m: None,
                                  deadline=Deadline.for_command(50))
        second = controller.submit(str(job), [], store=store, progress=lambda _m: None,
                                   deadline=Deadline.for_command(50))
    assert first.round_trips == 3  # submit answers payload-missing, the upload, submit again
    assert second.round_trips == 1
    for done in (first, second):
        assert wait_terminal(target, done.job_id)["state"] == "SUCCEEDED"


# -- every verdict is one round trip, on the confined systemd host (its unit holds GPU memory) ----------

SMALL_GPU = 20000  # MiB; the dummy unit holds 4096 of it while active


def service_target(host) -> Target:
    return Target("ssh", {"address": host.alias}, shared_tmpdir("unused-"), {"RUNNER_SSH_CONFIG": str(host.ssh_config)},
                  host)


def service_job(tmp_path, host, *, stop: str, need: int = 8000, command=None):
    service = {"manager": "systemd", "unit": host.unit, "stop": stop, "health_url": host.health_url,
               "health_timeout": "30s"}
    return write_job(tmp_path / f"job-{stop}.yaml", service_target(host), command=command or ["true"],
                     grace="2s", service=service, gpu={"devices": [0], "min_free_mib": need, "drain_timeout": "20s"})


@pytest.fixture
def warm_service_host(service_host, monkeypatch):
    """The systemd host with the payload already uploaded, so a submit's round trips are the warm path's."""
    monkeypatch.setenv("RUNNER_SSH_CONFIG", str(service_host.ssh_config))
    with controller.connect({"address": service_host.alias}, deadline=Deadline.for_command(50)) as client:
        client.upload()
    return service_host


def main_pid(host) -> str:
    return host.systemctl("show", "-P", "MainPID", host.unit).stdout.strip()


@pytest.mark.systemd
def test_a_submit_that_must_stop_the_service_is_one_round_trip(warm_service_host, tmp_path):
    host = warm_service_host
    host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)  # 5904 MiB free while the unit runs: short of 8000
    job = service_job(tmp_path, host, stop="if-needed")
    done = controller.submit(str(job), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
    assert done.stop_service is True and any(f"will stop {host.unit}" in n for n in done.notes), done
    assert done.round_trips == 1
    ended = wait_terminal(service_target(host), done.job_id)
    assert ended["state"] == "SUCCEEDED" and ended["service"]["stopped"] is True, ended


@pytest.mark.systemd
def test_a_busy_host_is_exit_5_in_one_round_trip(warm_service_host, tmp_path):
    host = warm_service_host
    holder = controller.submit(str(service_job(tmp_path, host, stop="never", need=1000, command=["sleep", "30"])),
                               [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
    try:
        job = service_job(tmp_path, host, stop="if-needed", need=1000)
        client_trips = _round_trips_of_failed_submit(job)
        with pytest.raises(HostBusy, match=holder.job_id) as refused:
            controller.submit(str(job), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
        assert refused.value.exit_code == 5 and "--queue" in refused.value.hint
        assert client_trips == 1
    finally:
        controller.cancel(holder.job_id, store=Store(), deadline=Deadline.for_command(50))
        wait_terminal(service_target(host), holder.job_id)


@pytest.mark.systemd
def test_short_memory_with_stop_never_is_exit_4_in_one_round_trip_nothing_touched(warm_service_host, tmp_path):
    host = warm_service_host
    host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)
    before = main_pid(host)
    job = service_job(tmp_path, host, stop="never")
    assert _round_trips_of_failed_submit(job) == 1
    with pytest.raises(PreflightError, match="service.stop is never") as refused:
        controller.submit(str(job), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
    assert refused.value.exit_code == 4 and "service.stop: if-needed" in refused.value.hint
    assert host.service_state() == "active" and main_pid(host) == before
    assert not list(Store().all())  # the refused job's record is gone


def _round_trips_of_failed_submit(job) -> int:
    """The round trips a refused submit made (the client it used counts them)."""
    made = []
    real = controller.connect

    def counting(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(controller, "connect", counting)
        with pytest.raises(RunnerError):
            controller.submit(str(job), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
    return sum(client.round_trips for client in made)
