"""An interrupted `runner submit` never leaves a job that goes on unsaid: Ctrl-C typed on a real terminal (a pty:
the terminal driver signals the whole foreground process group) and SIGTERM, at several instants of the
submit, against the confined systemd host whose unit the job stops. After the CLI's exit 130, either nothing was
started, or the job was cancelled before the CLI ended (its cancel request is on the host) and the unit is
back, or the message named the job and `runner cancel ID` stops it. A SIGKILLed submit's record is resolved by
the next `runner status`."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from runner.state.store import JobRecord, Store
from tests.cli_helpers import REPO, Target, run_cli, wait_for, wait_terminal, write_job
from tests.harness.pace import Scale
from tests.hosts._proc import shared_tmpdir

pytestmark = pytest.mark.systemd

CTRL_C = b"\x03"
JOB_ID = re.compile(rb"[a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{6}")


def service_target(host) -> Target:
    return Target("ssh", {"address": host.alias}, shared_tmpdir("unused-"), {"RUNNER_SSH_CONFIG": str(host.ssh_config)},
                  host)


def stopping_job(tmp_path, host, target: Target | None = None) -> str:
    service = {"manager": "systemd", "unit": host.unit, "stop": "always", "health_url": host.health_url,
               "health_timeout": "30s"}
    return str(write_job(tmp_path / "job.yaml", target or service_target(host), command=["sleep", "120"], grace="2s",
                         service=service))


def on_a_terminal(job: str, env: dict, steps: list, bound_s: float, *args: str) -> tuple[int, bytes, float]:
    """`runner submit JOB` on a pty of its own (its controlling terminal, its group in the foreground), driven by
    `steps`, each (when, what): when a number of seconds after the step before (the first: after the start) or
    bytes the terminal has shown, what "ctrl-c" (typed on the terminal), "sigterm" (to the CLI's pid) or "mark"
    (nothing: a point to count the next step's seconds from). (exit
    status, what the terminal showed, seconds from the last step to the exit)."""
    pid, master = pty.fork()
    if pid == 0:  # the child: becomes the CLI
        os.chdir(REPO)
        os.execve(sys.executable, [sys.executable, "-m", "runner", "submit", job, *args], env)
    shown, began, last, status = bytearray(), time.monotonic(), time.monotonic(), None
    todo = list(steps)
    try:
        while status is None:
            now = time.monotonic()
            if todo and (now - last >= todo[0][0] if isinstance(todo[0][0], float) else todo[0][0] in shown):
                what = todo.pop(0)[1]
                if what == "ctrl-c":
                    os.write(master, CTRL_C)
                elif what == "sigterm":
                    os.kill(pid, signal.SIGTERM)
                last = now
            assert now - began < bound_s, f"the CLI did not exit: {bytes(shown)!r}"
            shown += read_some(master, 0.02)
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(code)
        shown += read_some(master, 0.2)
    finally:
        os.close(master)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return status, bytes(shown), time.monotonic() - last


def read_some(fd: int, wait_s: float) -> bytes:
    if not select.select([fd], [], [], wait_s)[0]:
        return b""
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the terminal's other end closed
        return b""


def host_jobs(host) -> set[str]:
    listed = host.ssh(["sh", "-c", "ls ~/.runner/jobs 2>/dev/null || true"])
    return set(listed.stdout.split())


def what_became_of_it(host, target: Target, status: int, shown: bytes, before: set[str]) -> str:
    """Check one interrupted submit; its outcome's name."""
    text = shown.decode(errors="replace")
    if status == 0:  # it ended before the interrupt came: nothing to judge, the job is only cancelled
        run_cli(target, "cancel", JOB_ID.findall(shown)[-1].decode())
        wait_terminal(target, JOB_ID.findall(shown)[-1].decode())
        return "finished first"
    assert status == 130, (status, text)
    assert "runner: error: interrupted" in text and "error: aborted" not in text, text
    named = [m.decode() for m in JOB_ID.findall(shown)]
    if "nothing was" in text:
        assert host_jobs(host) == before, text  # nothing reached the host
        assert not [r for r in json.loads(run_cli(target, "list", "--json").stdout)
                    if r["last_state"] not in ("NOT_STARTED",)], text
        return "nothing started"
    assert named, text
    job_id = named[-1]
    if "was cancelled on" in text:
        assert host.ssh(["test", "-e", f".runner/jobs/{job_id}/cancel"]).returncode == 0, text  # before the exit
        outcome = "cancelled"
    else:
        assert f"runner cancel {job_id}" in text, text
        assert run_cli(target, "cancel", job_id).returncode == 0
        outcome = "named"
    assert wait_terminal(target, job_id)["state"] == "CANCELLED", text
    wait_for(lambda: host.service_state() == "active" and host.health_status() == 200, 60, "the unit back")
    return outcome


def slow_to_plan(tmp_path, host, seconds: float) -> str:
    """A job whose planning takes `seconds` (its script sleeps at import, which the args check runs): a point
    of the submit before anything can reach the host."""
    (tmp_path / "slow_to_plan.py").write_text(f"import time\ntime.sleep({seconds:.1f})\n\n\n"
                                              "def parse_args(argv):\n    return argv\n")
    spec = yaml.safe_load(Path(stopping_job(tmp_path, host)).read_text())
    spec["payload"] = {"script": "slow_to_plan.py"}
    (tmp_path / "slow_to_plan.yaml").write_text(yaml.safe_dump(spec))
    return str(tmp_path / "slow_to_plan.yaml")


def slow_host(host, work, seconds: int) -> Target:
    """The service host with an interpreter that starts `seconds` late: every host call lasts that much more."""
    slow = work / f"python-{seconds}s-late"
    slow.write_text(f'#!/bin/sh\nsleep {seconds}\nexec python3 "$@"\n')
    slow.chmod(0o755)
    target = service_target(host)
    target.host["python"] = str(slow)
    return target


@pytest.mark.parametrize("interrupt", ["ctrl-c", "sigterm"])
def test_an_interrupted_submit_cancels_its_job_or_names_it(service_host, tmp_path, work, interrupt):
    """Points of a submit, found by what the terminal shows or inside its planning (made 4 s long): while it
    plans (nothing was started), as its host
    call starts (a Ctrl-C there may reach the call's process between its fork and its own session: the call is
    made again) and inside it (made 1 s longer): the job is cancelled before the exit; while it follows the log:
    the job goes on, named."""
    host, scale = service_host, Scale()
    target = service_target(host)
    env = {**os.environ, **target.env}
    plain, in_call = stopping_job(tmp_path, host), stopping_job(work, host, slow_host(host, work, 1))
    planning = slow_to_plan(work, host, scale(4))
    points = [(planning, scale(0.5), (), "nothing started"), (plain, b"preflight on", (), "cancelled"),
              (in_call, b"preflight on", (), "cancelled"), (plain, b"accepted:", ("--follow",), "named")]
    for job, when, args, expected in points:
        before = host_jobs(host)
        status, shown, took = on_a_terminal(job, env, [(when, interrupt)], scale(60), *args)
        assert what_became_of_it(host, target, status, shown, before) == expected, (when, shown)
        assert took < scale(20), (when, took, shown)  # held at most the rest of the host call and a cancel
    assert host.service_state() == "active"


def test_ctrl_c_at_any_instant_of_a_submit_leaves_nothing_unsaid(service_host, tmp_path):
    host, scale = service_host, Scale()
    target = service_target(host)
    env = {**os.environ, **target.env}
    job = stopping_job(tmp_path, host)
    for after_s in (scale(0.3), scale(1.2), scale(1.6)):
        before = host_jobs(host)
        status, shown, took = on_a_terminal(job, env, [(after_s, "ctrl-c")], scale(60))
        what_became_of_it(host, target, status, shown, before)
        assert took < scale(20), (after_s, took, shown)
    assert host.service_state() == "active"


def test_a_second_interrupt_leaves_at_once_naming_the_job(service_host, tmp_path, work):
    """The host's interpreter made slow (3 s a call), so both Ctrl-C come inside the submit's host call, well
    after its start (1 s and 1.5 s: the spec sent): the first is held, the second leaves at once; the call goes
    on in its own session and starts the job, which the message named: `runner cancel` stops it and the unit
    comes back."""
    host, scale = service_host, Scale()
    target = slow_host(host, work, 3)
    job = stopping_job(tmp_path, host, target)
    warm = run_cli(service_target(host), "submit", stopping_job(work, host), "--dry-run")  # the upload, done now
    assert warm.returncode == 0, warm.stderr
    status, shown, took = on_a_terminal(job, {**os.environ, **target.env},
                                        [(b"preflight on", "mark"), (1.0, "ctrl-c"), (0.5, "ctrl-c")], scale(60))
    text = shown.decode(errors="replace")
    assert "[runner] SIGINT: cancelling" in text, text  # the first was held, and said so
    assert status == 130 and "runner: error: interrupted again (SIGINT)" in text, (status, text)
    assert took < 1.0, (took, text)  # not after the rest of the host call's 3 s
    job_id = JOB_ID.findall(shown)[-1].decode()
    assert f"may have started on {host.alias}" in text and f"runner cancel {job_id}" in text, text
    wait_for(lambda: job_id in host_jobs(host), 60, "the call that went on to start the job")
    assert run_cli(target, "cancel", job_id).returncode == 0
    assert wait_terminal(target, job_id)["state"] == "CANCELLED"
    wait_for(lambda: host.service_state() == "active" and host.health_status() == 200, 60, "the unit back")


def test_a_killed_submits_record_is_resolved_by_status(service_host, tmp_path):
    """A submit SIGKILLed before its host call reached the host leaves a record its host has no job for: the next
    `runner status` asks, and the record ends NOT_STARTED (never the ghost UNKNOWN `list` kept for ever); one
    whose submit is still under way is left alone."""
    host = service_host
    target = service_target(host)
    store = Store()
    ghost = JobRecord(job_id="ghost-20260101-000000-abcdef", name="ghost", host={"address": host.alias},
                      spec_path="job.yaml", submitted_at=time.time())
    store.save(ghost)
    under_way = JobRecord(**{**ghost.__dict__, "job_id": "busy-20260101-000000-abcdef",
                             "submit_until": time.time() + 600})  # a host call of its submit may still start it
    store.save(under_way)
    shown = run_cli(target, "status", "--json")
    rows = {row["job_id"]: row for row in json.loads(shown.stdout)}
    assert rows[ghost.job_id]["state"] == "NOT_STARTED" and "no such job" in rows[ghost.job_id]["message"], rows
    assert rows[under_way.job_id]["state"] == "UNKNOWN", rows
    assert shown.returncode == 0, shown.stderr  # neither runs
    listed = {r["job_id"]: r["last_state"] for r in json.loads(run_cli(target, "list", "--json").stdout)}
    assert listed[ghost.job_id] == "NOT_STARTED", listed
    again = run_cli(target, "status", ghost.job_id)
    assert again.returncode == 1 and b"NOT_STARTED" in again.stdout, again
