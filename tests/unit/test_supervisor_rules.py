"""The supervisor's rules, checked without a host: how an interrupt is named (a real-time signal, Slurm's TERM),
the guard timer's budget, and what it refuses on both sides (a user scope with sudo, an unsafe root)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from remote_payload.host.answer import Fail
from remote_payload.supervision.budget import budget
from remote_payload.supervision.files import JobPaths
from remote_payload.supervision.payload import SIGNAL_SETTLE_S, check_interrupt, interrupt_after_exit
from remote_payload.supervision.record import Flags, Interrupted, Job
from remote_payload.supervision import variants
from remote_payload.supervision.spec import check_service
from runner.spec.spec import ServiceSpec


def test_a_real_time_signal_is_named_not_a_crash():
    flags = Flags()
    flags.signal = signal.SIGRTMIN + 2
    with pytest.raises(Interrupted, match="SIGRTMIN"):
        check_interrupt(None, flags)


class _Job:  # what check_interrupt reads of a job: its paths
    def __init__(self, root) -> None:
        self.paths = JobPaths(str(root), "j1")


def test_slurms_term_is_named_as_the_cancel_it_is(tmp_path):
    """Slurm's TERM reaches the payload and the supervisor at once: the first terminal state written already
    says Slurm cancelled it (a reader between two writes must not see FAILED, or a plain cancel)."""
    flags = Flags()
    flags.cancel, flags.slurm_term = True, True
    with pytest.raises(Interrupted, match="Slurm sent SIGTERM") as caught:
        check_interrupt(_Job(tmp_path), flags)
    assert caught.value.state == "CANCELLED"


class _CancelOnceThePayloadIsGone(Flags):
    """Slurm's TERM as the supervisor sees it: the payload dies of it, and the handler's flag is there only
    after the payload is gone (so the look before the poll finds nothing)."""

    def __init__(self, proc) -> None:
        self.proc = proc
        super().__init__()

    @property
    def cancel(self) -> bool:
        return self.proc.poll() is not None

    @cancel.setter
    def cancel(self, value) -> None:
        pass


@pytest.mark.parametrize("sweep", [None, {"variants": [{"args": {"k": 1}, "argv": []}], "fail_fast": False}],
                         ids=["plain", "sweep"])
def test_a_payload_that_failed_as_a_cancel_arrived_ends_with_the_cancel(tmp_path, sweep):
    """Slurm's TERM reaches the payload and the supervisor at once: the payload may be seen gone (exit 1)
    before the cancel is. The variant runner looks again after a failed variant, for a plain job and a
    sweep's variant alike, and records the job's ending before anything else is stopped."""
    paths = JobPaths(str(tmp_path), "j1")
    os.makedirs(paths.dir)
    spec = {"service": {"manager": "none"}, "limits": {"grace": 1, "max_runtime": 60}, "gpu": {"devices": []},
            **({"sweep": sweep} if sweep else {})}
    job = Job(paths, spec, {"ending": None, "state": "RUNNING"})
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"], start_new_session=True)
    proc.wait()
    run = variants.Run(1, {"args": {}, "argv": []}, 0, [], proc, None, 60, "limits.max_runtime (60s)",
                       str(tmp_path / "r.json"))
    gone, interrupt = variants.wait_for_ends(job, _CancelOnceThePayloadIsGone(proc), {0: run})
    assert gone == [run] and interrupt == ("CANCELLED", "cancelled on request")
    assert run.reason == "cancelled on request"
    assert job.status["state"] == "TERMINATING" and job.status["ending"]["state"] == "CANCELLED"


def test_a_payload_killed_by_the_steps_term_waits_for_the_supervisors_own(tmp_path):
    """Slurm's TERM reaches each process of the step in turn: the payload may die of it, and be seen gone, before
    the supervisor's own TERM is handled. The job still ends CANCELLED by Slurm, not FAILED with exit 143."""
    paths = JobPaths(str(tmp_path), "j1")
    os.makedirs(paths.dir)
    spec = {"service": {"manager": "none"}, "limits": {"grace": 1, "max_runtime": 60}, "gpu": {"devices": []}}
    job = Job(paths, spec, {"ending": None, "state": "RUNNING"})
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    flags = Flags()

    def supervisors_term_arrives() -> None:
        flags.cancel, flags.slurm_term = True, True
    late = threading.Timer(0.3, supervisors_term_arrives)
    late.start()
    run = variants.Run(1, {"args": {}, "argv": []}, 0, [], proc, None, 60, "limits.max_runtime (60s)",
                       str(tmp_path / "r.json"))
    try:
        gone, interrupt = variants.wait_for_ends(job, flags, {0: run})
    finally:
        late.cancel()
    assert gone == [run] and interrupt and interrupt[0] == "CANCELLED" and "Slurm sent SIGTERM" in interrupt[1]
    assert job.status["ending"]["state"] == "CANCELLED"


def test_a_payload_that_failed_by_itself_is_not_waited_on_for_a_cancel(tmp_path):
    """The wait for a late signal is for a death by a signal only, and bounded: an exit code is the payload's own."""
    job = SimpleNamespace(paths=SimpleNamespace(cancel=str(tmp_path / "cancel")))
    started = time.monotonic()
    assert interrupt_after_exit(job, Flags(), 1) is None
    assert interrupt_after_exit(job, Flags(), -signal.SIGKILL) is None
    assert time.monotonic() - started < SIGNAL_SETTLE_S + 30  # bounded: "does not block"


def test_the_guard_timer_outlasts_a_full_stop_and_start():
    """A stop may take 600 s (stop_service's bound); the timer must not fire while a job is still handled."""
    spec = {"limits": {"max_runtime": 60, "grace": 1}, "gpu": {"drain_timeout": 10},
            "service": {"health_timeout": 30}}
    assert budget(spec, 0.0)["guard_timer_s"] >= 60 + 1 + 2 * 10 + 600 + 120 + 30


def test_user_scope_with_sudo_is_refused_on_both_sides():
    raw = {"manager": "systemd", "unit": "x.service", "scope": "user", "sudo": True}
    with pytest.raises(Fail, match="scope: user"):
        check_service(raw)
    with pytest.raises(ValidationError, match="scope: user"):
        ServiceSpec(**raw)


def test_an_unsafe_root_is_refused_by_boot_and_by_the_supervisor(tmp_path):
    """A ROOT others may write to (e.g. `root: /tmp/runner`) is code execution for them: refuse it,
    in BOOT before it runs ROOT/payload/<digest>/supervisor.py, and in the supervisor itself."""
    import json
    import subprocess
    import sys

    from runner.remote.bundles import supervisor_bundle
    from runner.remote.host import BOOT

    root = tmp_path / "root"
    digest = "0123456789abcdef"
    payload = root / "payload" / digest
    payload.mkdir(parents=True)
    bundle = supervisor_bundle()
    for name, data in bundle.files.items():  # what the bundle carries
        (payload / name).parent.mkdir(parents=True, exist_ok=True)
        (payload / name).write_bytes(data)
    root.chmod(0o777)  # world-writable, as /tmp/runner would be made by a careless mkdir
    for argv in ([sys.executable, "-c", BOOT, str(root), digest, "status"],
                 [sys.executable, str(payload / "supervisor.py"), "status", "--root", str(root)]):
        done = subprocess.run(argv, capture_output=True, timeout=30)
        answer = json.loads(done.stdout.decode().splitlines()[0])
        assert answer["error"] == "unsafe-root" and "writable" in answer["message"], answer
