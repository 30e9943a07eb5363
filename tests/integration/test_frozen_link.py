"""One deadline per command, on a link that freezes, a host that never sends its banner, and a state dir that
cannot be written. Real loopback sshd (tests/hosts/sshd.py) behind a relay that can go silent
(tests/hosts/relay.py), driven through the real CLI.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from runner.commands import controller
from runner.deadline import ROUND_TRIP_ALLOWANCE_S, Deadline
from runner.remote.host import HostClient
from runner.state.store import JobRecord, Store
from tests.cli_helpers import Target, run_cli, wait_for, wait_terminal, write_job
from tests.harness.pace import Scale
from tests.hosts._proc import shared_tmpdir
from tests.hosts.relay import FreezableRelay, SilentListener

MAX_WAIT = 15.0
# The CLI's own start-up and the cleanup after a killed ssh, on a machine shared with other test runs: a
# generous "does not block" margin (the unbounded path took 66 s).
MARGIN_S = 8.0


@pytest.fixture
def relay(ssh_host):
    with FreezableRelay(ssh_host.port) as relay:
        yield relay


@pytest.fixture
def host_root():
    root = shared_tmpdir("runner-root-frozen-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def relayed_target(ssh_host, relay: FreezableRelay, tmp_path: Path, root: Path, transport: str) -> Target:
    """The test sshd reached through the relay as `relayed` ([127.0.0.1]:RELAY_PORT in known_hosts)."""
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{relay.port} {ssh_host.host_key}\n")
    block = ssh_host.ssh_config.read_text().split("\nHost ")[0]  # the root login's block
    block = block.replace("Host testhost", "Host relayed", 1).replace(f"Port {ssh_host.port}", f"Port {relay.port}")
    config = tmp_path / "ssh_config"
    config.write_text(block.replace(str(ssh_host.known_hosts), str(known)) + "\n")
    return Target("ssh", {"address": "relayed", "root": str(root), "transport": transport}, root,
                  {"RUNNER_SSH_CONFIG": str(config)}, ssh_host)


def counted_job(tmp_path: Path, target: Target, count: Path) -> Path:
    """A job whose payload appends one line to `count` each time it starts."""
    return write_job(tmp_path / "job.yaml", target, command=["sh", "-c", f"echo ran >> {count}; sleep 1"])


def starts(count: Path) -> int:
    return count.read_text().count("ran") if count.exists() else 0


def frozen_submit(relay: FreezableRelay, target: Target, job: Path, job_id: str,
                  freeze_after: float) -> tuple[subprocess.CompletedProcess, float]:
    relay.freeze_in(freeze_after)
    t0 = time.monotonic()
    done = run_cli(target, "submit", str(job), "--job-id", job_id, "--max-wait", str(MAX_WAIT), timeout=200)
    return done, time.monotonic() - t0


def assert_bounded_and_clean(done: subprocess.CompletedProcess, took: float) -> None:
    stderr = done.stderr.decode()
    assert done.returncode == 3, (done.returncode, stderr)
    assert "Traceback" not in stderr and "runner: error:" in stderr, stderr
    assert took <= MAX_WAIT + ROUND_TRIP_ALLOWANCE_S + MARGIN_S, f"submit took {took:.1f} s"


def assert_started_once_after_thaw(relay: FreezableRelay, target: Target, job: Path, job_id: str, count: Path) -> None:
    """The retry with the same --job-id finds the job the lost call may have started, or starts it: once."""
    relay.thaw()
    again = run_cli(target, "submit", str(job), "--job-id", job_id, "--json")
    assert again.returncode == 0, again.stderr.decode()
    assert json.loads(again.stdout)["job_id"] == job_id
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    time.sleep(1.0)  # a start held in the relay would have run by now
    assert starts(count) == 1, count.read_text()
    assert [p.name for p in (target.root / "jobs").iterdir()] == [job_id]


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_a_link_that_freezes_during_a_cold_submit_returns_within_max_wait(ssh_host, relay, tmp_path, host_root,
                                                                          transport):
    target = relayed_target(ssh_host, relay, tmp_path, host_root, transport)
    count = host_root / "starts"
    job = counted_job(tmp_path, target, count)
    done, took = frozen_submit(relay, target, job, "frozen-cold", freeze_after=0.4)
    assert_bounded_and_clean(done, took)
    assert_started_once_after_thaw(relay, target, job, "frozen-cold", count)


@pytest.mark.slow(seconds=30)
def test_a_link_that_freezes_under_a_warm_master_returns_within_max_wait(ssh_host, relay, tmp_path, host_root):
    target = relayed_target(ssh_host, relay, tmp_path, host_root, "openssh")
    count = host_root / "starts"
    job = counted_job(tmp_path, target, count)
    warm = run_cli(target, "submit", str(job), "--job-id", "warm-up")  # opens the master, caches the plan
    assert warm.returncode == 0, warm.stderr.decode()
    wait_terminal(target, "warm-up")
    count.unlink()
    # A warm submit (cached plan, open master) is over within 0.4 s: the link goes silent as it starts.
    done, took = frozen_submit(relay, target, job, "frozen-warm", freeze_after=0.05)
    assert_bounded_and_clean(done, took)
    relay.thaw()
    run_cli(target, "submit", str(job), "--job-id", "frozen-warm")
    assert wait_terminal(target, "frozen-warm")["state"] == "SUCCEEDED"
    time.sleep(1.0)  # a start held in the relay would have run by now
    assert starts(count) == 1, count.read_text()


# -- host.connect_timeout is the wait ----------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_connect_timeout_is_the_wait_for_a_host_that_sends_no_banner(tmp_path, transport):
    with SilentListener() as silent:
        host = {"address": "127.0.0.1", "port": silent.port, "user": "root", "transport": transport,
                "connect_timeout": 5.0}
        Store().save(JobRecord(job_id="silent", name="silent", host=host, spec_path="job.yaml", submitted_at=time.time()))
        target, scale = Target("ssh", host, tmp_path, {}), Scale()
        t0 = time.monotonic()
        done = run_cli(target, "status", "silent", timeout=120)
        took = time.monotonic() - t0
    stderr = done.stderr.decode()
    assert done.returncode == 3 and "Traceback" not in stderr, stderr
    assert took <= 5.0 + 1.0 + scale(1.5), f"status took {took:.1f} s ({scale})"  # scale(1.5): the CLI's start-up


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_the_commands_max_wait_caps_connect_timeout(tmp_path, transport):
    with SilentListener() as silent:
        host = {"address": "127.0.0.1", "port": silent.port, "user": "root", "transport": transport,
                "connect_timeout": 60.0}
        Store().save(JobRecord(job_id="silent", name="silent", host=host, spec_path="job.yaml", submitted_at=time.time()))
        target, scale = Target("ssh", host, tmp_path, {}), Scale()
        t0 = time.monotonic()
        done = run_cli(target, "status", "silent", "--max-wait", "2", timeout=120)
        took = time.monotonic() - t0
    assert done.returncode == 3, done.stderr.decode()
    assert took <= 2.0 + ROUND_TRIP_ALLOWANCE_S + scale(1.5), f"status took {took:.1f} s ({scale})"


# -- a state dir that cannot be written --------------------------------------------------------------------


def fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["read-only", "full"])
def test_submit_refuses_before_the_host_when_the_state_dir_cannot_be_written(ssh_host, tmpfs_state_dir, tmp_path,
                                                                             host_root, how):
    target = Target("ssh", {"address": ssh_host.alias, "root": str(host_root)}, host_root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    assert run_cli(target, "submit", str(job), "--dry-run").returncode == 0  # the plan is cached
    if how == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
    else:
        fill(tmpfs_state_dir)
    done = run_cli(target, "submit", str(job))
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "Traceback" not in stderr and "cannot be written" in stderr, stderr
    assert not (host_root / "jobs").exists() or not any((host_root / "jobs").iterdir())


def test_the_job_is_recorded_before_the_host_starts_it(ssh_host, tmpfs_state_dir, tmp_path, host_root, monkeypatch):
    """The record exists when the start call goes out; the state dir breaking right after the start (spied: the
    real call, then a remount read-only) leaves a job that `status` reaches and a clean end, no traceback."""
    target = Target("ssh", {"address": ssh_host.alias, "root": str(host_root)}, host_root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    monkeypatch.setenv("RUNNER_SSH_CONFIG", str(ssh_host.ssh_config))
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    seen = {}
    real_submit = HostClient.submit

    def submit_then_break(self, wire, **kwargs):
        seen["recorded"] = (Store().jobs_dir / f"{wire['job_id']}.json").exists()
        answer = real_submit(self, wire, **kwargs)
        subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
        return answer

    monkeypatch.setattr(HostClient, "submit", submit_then_break)
    notes: list[str] = []
    done = controller.submit(str(job), [], job_id="recorded-first", store=Store(), progress=notes.append,
                             deadline=Deadline.for_command(50))
    assert seen == {"recorded": True}
    assert done.job_id == "recorded-first"
    wait_for(lambda: run_cli(target, "status", "recorded-first").returncode == 0, what="the job SUCCEEDED")
    assert b"Traceback" not in run_cli(target, "status", "recorded-first").stderr


def test_status_reaches_the_host_from_a_read_only_state_dir(ssh_host, tmpfs_state_dir, host_root):
    """No ControlMaster socket can be made there: status connects without one and answers, no traceback."""
    host = {"address": ssh_host.alias, "root": str(host_root), "transport": "openssh"}
    Store().save(JobRecord(job_id="never-started", name="n", host=host, spec_path="job.yaml", submitted_at=time.time()))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_state_dir)], check=True)
    done = run_cli(Target("ssh", host, host_root, {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}),
                   "status", "never-started")
    stderr = done.stderr.decode()
    # the host answered it has no such job: a record no submit can still start ends NOT_STARTED (exit 1), said
    # even where the state dir cannot record it
    assert done.returncode == 1 and b"its host has no such job" in done.stdout and "Traceback" not in stderr, done
