"""`runner tail` streams: one host call reads the log for as long as --max-wait allows, over OpenSSH as a
non-root login, and the cursor rule holds under it — the calls that end by themselves join to the log byte
for byte whatever is killed, two tails share it each byte once, and a 10 MB/s writer is followed to its end."""
from __future__ import annotations

import io
import random
import subprocess
import threading

import pytest

from runner.commands import controller
from runner.remote.host import HostClient
from runner.state.store import Store
from tests.cli_helpers import Target, python_payload, run_cli, submit, wait_for, write_job
from tests.hosts._proc import shared_tmpdir
from tests.harness.tail_calls import job_ended, kill_loop, output_log, tail_loop, tile_the_log

# BLOCKS blocks of KIB KiB of bytes of every value (not UTF-8), one each 0.1 s: 1024 KiB is about 10 MB/s.
WRITER = """
import os, sys, time
for _ in range(int(sys.argv[1])):
    sys.stdout.buffer.write(os.urandom(int(sys.argv[2]) << 10))
    sys.stdout.flush()
    time.sleep(0.1)
"""


@pytest.fixture
def user_target(ssh_host):
    user_host = ssh_host.as_user(ssh_host.non_root_user)
    root = shared_tmpdir("runner-root-stream-")
    subprocess.run(["chown", user_host.user, str(root)], check=True)
    yield Target("ssh", {"address": user_host.alias, "root": str(root), "transport": "openssh"}, root,
                 {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, user_host)
    subprocess.run(["rm", "-rf", str(root)], check=False)


def start_writer(target: Target, blocks: int, kib: int = 1024) -> str:
    work = shared_tmpdir("runner-work-stream-")
    return submit(target, write_job(work / "job.yaml", target, command=python_payload(work, "writer.py", WRITER)
                                    + [str(blocks), str(kib)]))


def test_one_host_call_per_tail_call_follows_a_10_mb_s_writer_to_its_end(user_target, monkeypatch):
    monkeypatch.setenv("RUNNER_SSH_CONFIG", user_target.env["RUNNER_SSH_CONFIG"])
    job_id = start_writer(user_target, 40)
    calls = []
    real = HostClient.boot_argv
    monkeypatch.setattr(HostClient, "boot_argv", lambda self, sub, args: calls.append(sub) or real(self, sub, args))
    out, outcomes = io.BytesIO(), []
    while not outcomes or not outcomes[-1].terminal:
        calls.clear()
        outcomes.append(controller.tail(job_id, store=Store(), out=out, follow=True, max_wait=3, from_start=False))
        assert calls == ["logs"], calls  # the whole call on one exec (a `logs` call per MiB before)
        assert len(outcomes) < 60
    assert out.getvalue() == output_log(user_target, job_id) and len(out.getvalue()) == 40 << 20


@pytest.mark.slow(seconds=30)
def test_streamed_calls_that_end_by_themselves_join_to_the_log_whatever_is_killed(user_target):
    job_id = start_writer(user_target, 240, 128)  # 30 MiB over 24 s
    ended, killed = kill_loop(user_target, job_id, random.Random(37), 100, (0.3, 1.5))
    log = output_log(user_target, job_id)
    assert len(log) == 30 << 20 and len(killed) >= 3
    assert b"".join(ended) == log, f"ended calls delivered {sum(map(len, ended))} of {len(log)} B"
    for start, out in killed:
        assert out == log[start:start + len(out)]


def test_two_streaming_tails_share_a_fast_log_each_byte_once(user_target):
    job_id = start_writer(user_target, 30)
    calls: list = []
    threads = [threading.Thread(target=tail_loop, args=(user_target, job_id, calls)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    log = output_log(user_target, job_id)
    assert sum(len(out) for _c, out in calls) == len(log) == 30 << 20
    assert tile_the_log(log, [out for _c, out in calls])


def test_a_streaming_tail_uploads_the_supervisor_the_host_lacks(user_target):
    """The host answers `payload-missing` (exit 42) to the stream's first line: the bundle is uploaded and the
    stream opened again, whatever the moment ssh's exit status arrives."""
    work = shared_tmpdir("runner-work-stream-")
    job_id = submit(user_target, write_job(work / "job.yaml", user_target, command=["echo", "hello"]))
    wait_for(lambda: job_ended(user_target, job_id), what="the job's end")
    for _ in range(3):
        subprocess.run(["rm", "-rf", str(user_target.root / "payload")], check=True)
        done = run_cli(user_target, "tail", job_id, "--from-start")
        assert (done.returncode, done.stdout) == (0, b"hello\n"), done.stderr.decode()
