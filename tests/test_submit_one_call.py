"""The warm path's one round trip: `submit` = preflight + start in one supervisor call (issue 10).

The host starts only when the controller's preflight.decide cannot refuse; the pure rule is checked here
against decide itself on the same reports, and the round-trip count on a real loopback sshd.
"""
from __future__ import annotations

import pytest

from remote_payload.supervisor_submit import starts_without_asking
from runner import controller, preflight
from runner.errors import RunnerError
from runner.store import Store
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
}


@pytest.mark.parametrize("queue", [False, True])
@pytest.mark.parametrize("case", sorted(REPORTS))
def test_the_host_starts_only_where_decide_would_start_without_a_stop(case, queue):
    spec, report = REPORTS[case]
    started = starts_without_asking(JOB, spec, report, queue)
    try:
        decision = preflight.decide(spec, report, queue=queue)
    except RunnerError:
        assert not started, f"{case}: the host would start a job the controller refuses"
        return
    if started:
        assert decision is not None  # decide passes: the host's start is the controller's own decision
    else:
        assert case.startswith(("short", "unknown")) or decision.stop_service, f"{case}: needless second call"


def test_a_cached_submit_is_one_round_trip(ssh_host, tmp_path):
    root = shared_tmpdir("runner-root-one-")
    target = Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    store = Store()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNNER_SSH_CONFIG", str(ssh_host.ssh_config))
        first = controller.submit(str(job), [], store=store, progress=lambda _m: None)
        second = controller.submit(str(job), [], store=store, progress=lambda _m: None)
    assert first.round_trips == 3  # submit answers payload-missing, the upload, submit again
    assert second.round_trips == 1
    for done in (first, second):
        assert wait_terminal(target, done.job_id)["state"] == "SUCCEEDED"
