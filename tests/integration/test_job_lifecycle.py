"""A job's life through the real CLI, on each transport: submit returns while the payload runs, tail gives every
byte once within --max-wait, cancel and max_runtime end the whole group, exit codes and results are recorded,
hostile names round-trip, a second start of one id is refused, status survives a killed controller.

Each test runs three times: `openssh` and `paramiko` (the two SSH transports, `host.transport`, to an OpenSSH
sshd on 127.0.0.1 through an ssh_config alias, known_hosts checked) and `local` (`address: local`). The host side
is the real supervisor, detached. A non-root login's jobs run in its home (SSH only).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import (Target, job_dir, pid_alive_on, python_payload, run_cli, status, submit,
                               wait_for, wait_terminal, write_job)
from tests.hosts._proc import shared_tmpdir
from tests.harness.pace import Scale

HOSTILE = "it's \"quoted\"; $(touch /tmp/runner-pwned) `id` & spaces"


@pytest.fixture(params=["local", "openssh", "paramiko"])
def target(request) -> Target:
    root = shared_tmpdir("runner-root-")
    if request.param == "local":
        return Target("local", {"address": "local", "root": str(root)}, root, {})
    host = request.getfixturevalue("ssh_host")
    return Target("ssh", {"address": host.alias, "root": str(root), "transport": request.param}, root,
                  {"RUNNER_SSH_CONFIG": str(host.ssh_config)}, host)


SLEEPER = """
import sys, time
print("started", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 30)
print("finished", flush=True)
"""


def test_submit_returns_while_payload_keeps_running(target, work):
    scale = Scale()  # the bound and the payload it must stay under, both at this machine's pace
    job = write_job(work / "job.yaml", target, command=python_payload(work, "sleep.py", SLEEPER) + [f"{scale(20):.0f}"])
    t0 = time.monotonic()
    job_id = submit(target, job)
    elapsed = time.monotonic() - t0
    assert elapsed < scale(15), f"submit held the caller {elapsed:.1f}s ({scale})"
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", timeout=scale(30), what="RUNNING")
    job_state = status(target, job_id)
    assert job_state["state"] == "RUNNING" and pid_alive_on(target, job_state["payload"]["pid"])
    run_cli(target, "cancel", job_id)
    wait_terminal(target, job_id)


CHUNKED = """
import os, sys, time
directory = sys.argv[1]
chunks = [b"line one\\n", b"\\xff\\xfe not utf-8 \\x00 bytes\\n", b"a partial line without newline", b" ...ends\\n", b"tail-partial"]
for i, chunk in enumerate(chunks):
    while not os.path.exists(os.path.join(directory, "go-%d" % i)):
        time.sleep(0.02)
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    open(os.path.join(directory, "wrote-%d" % i), "w").close()
"""
EXPECTED = b"line one\n\xff\xfe not utf-8 \x00 bytes\na partial line without newline ...ends\ntail-partial"


def test_tail_prints_every_byte_exactly_once(target, work):
    job = write_job(work / "job.yaml", target, command=python_payload(work, "chunks.py", CHUNKED) + [str(work)])
    job_id = submit(target, job)
    seen = b""
    for i in range(5):
        (work / f"go-{i}").touch()
        wait_for(lambda: (work / f"wrote-{i}").exists(), what=f"chunk {i}")
        if i % 2 == 0:  # interleave: sometimes two chunks land between tails
            done = run_cli(target, "tail", job_id)
            assert done.returncode in (0, 75), done.stderr.decode()
            seen += done.stdout
    wait_terminal(target, job_id)
    done = run_cli(target, "tail", job_id)
    seen += done.stdout
    assert done.returncode == 0, done.stderr.decode()
    assert seen == EXPECTED
    assert run_cli(target, "tail", job_id).stdout == b""  # nothing twice
    again = run_cli(target, "tail", job_id, "--from-start")
    assert again.stdout == EXPECTED == (job_dir(target, job_id) / "output.log").read_bytes()


def test_tail_follow_returns_75_within_max_wait(target, work):
    scale = Scale()  # the round trip past --max-wait, and the payload it must stay under, at this machine's pace
    job = write_job(work / "job.yaml", target, command=python_payload(work, "sleep.py", SLEEPER) + [f"{scale(60):.0f}"])
    job_id = submit(target, job)
    t0 = time.monotonic()
    done = run_cli(target, "tail", job_id, "-f", "--max-wait", "2")
    elapsed = time.monotonic() - t0
    assert done.returncode == 75, done.stderr.decode()
    assert elapsed < 2 + scale(6), f"tail -f --max-wait 2 took {elapsed:.1f}s ({scale})"
    assert b"started" in done.stdout
    run_cli(target, "cancel", job_id)
    final = run_cli(target, "tail", job_id, "-f", "--max-wait", "30")
    assert final.returncode == 1  # CANCELLED is not success
    assert b"started" not in final.stdout  # already printed by the first call


FAMILY = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child up', flush=True); time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
"""


def test_cancel_kills_the_whole_group_even_a_child_ignoring_term(target, work):
    pid_file = work / "child.pid"
    job = write_job(work / "job.yaml", target, command=python_payload(work, "family.py", FAMILY) + [str(pid_file)],
                    grace="1s")
    job_id = submit(target, job)
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="child pid")
    child = int(pid_file.read_text())
    assert pid_alive_on(target, child)
    done = run_cli(target, "cancel", job_id)
    assert done.returncode == 0, done.stderr.decode()
    final = wait_terminal(target, job_id)
    assert final["state"] == "CANCELLED"
    wait_for(lambda: not pid_alive_on(target, child), timeout=10, what="child killed")
    assert final["exit_code"] == 128 + signal.SIGKILL  # both ignored TERM: the group got KILL after grace


def test_max_runtime_kills_and_reports_timed_out(target, work):
    job = write_job(work / "job.yaml", target, command=python_payload(work, "sleep.py", SLEEPER) + ["60"],
                    max_runtime="2s", grace="1s")
    job_id = submit(target, job)
    final = wait_terminal(target, job_id)
    assert final["state"] == "TIMED_OUT"
    assert final["payload"]["signal"] == "SIGTERM"  # the sleeper dies of TERM within the grace
    assert final["exit_code"] == 128 + signal.SIGTERM
    assert b"finished" not in (job_dir(target, job_id) / "output.log").read_bytes()


def test_exit_code_recorded_and_tail_exits_1(target, work):
    job = write_job(work / "job.yaml", target, command=["python3", "-c", "import sys; print('bye'); sys.exit(3)"])
    job_id = submit(target, job)
    final = wait_terminal(target, job_id)
    assert (final["state"], final["exit_code"], final["payload"]["signal"]) == ("FAILED", 3, None)
    done = run_cli(target, "tail", job_id, "-f", "--max-wait", "10")
    assert done.returncode == 1 and done.stdout == b"bye\n"


COUNTER = """
import sys
with open(sys.argv[1], "a") as fh:
    fh.write("ran\\n")
"""


def test_a_second_start_of_one_id_is_refused(target, work):
    counter = work / "runs.txt"
    job = write_job(work / "job.yaml", target, command=python_payload(work, "count.py", COUNTER) + [str(counter)])
    first = run_cli(target, "submit", str(job), "--job-id", "fixed-id.1", "--json")
    assert first.returncode == 0, first.stderr.decode()
    wait_terminal(target, "fixed-id.1")
    second = run_cli(target, "submit", str(job), "--job-id", "fixed-id.1", "--json")
    assert second.returncode == 0, second.stderr.decode()
    assert json.loads(second.stdout)["already"] is True
    time.sleep(0.5)  # a window: a second run, wrongly started, would have counted itself by now
    assert counter.read_text() == "ran\n"


ECHO_ENV = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": os.environ["HOSTILE_VALUE"]}), flush=True)
"""


def test_hostile_names_args_and_env_round_trip_untouched(target, work):
    weird_dir = work / "dir with spaces; $(x) 'q'"
    weird_dir.mkdir()
    weird_dir.chmod(0o755)
    value = HOSTILE + "\nsecond line"
    command = python_payload(weird_dir, "echo env.py", ECHO_ENV) + [HOSTILE, "--flag=$(id)"]
    job = write_job(work / "job.yaml", target, command=command, name=HOSTILE, env={"HOSTILE_VALUE": value})
    job_id = submit(target, job)
    final = wait_terminal(target, job_id)
    assert final["state"] == "SUCCEEDED", final
    printed = json.loads(run_cli(target, "tail", job_id).stdout)
    assert printed == {"argv": [HOSTILE, "--flag=$(id)"], "env": value}
    assert final["name"] == HOSTILE
    assert not Path("/tmp/runner-pwned").exists()


def test_status_survives_a_killed_controller(target, work):
    job = write_job(work / "job.yaml", target, command=python_payload(work, "sleep.py", SLEEPER) + ["3"])
    job_id = submit(target, job)
    env = {**os.environ, **target.env}
    follower = subprocess.Popen([sys.executable, "-m", "runner", "tail", job_id, "-f", "--max-wait", "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = follower.stdout.readline()  # mid-tail: it has printed the job's first line
    follower.kill()  # the controller dies mid-tail; the job must not care
    follower.communicate()
    assert first == b"started\n"
    final = wait_terminal(target, job_id)
    assert final["state"] == "SUCCEEDED"
    rest = run_cli(target, "tail", job_id, "--from-start")
    assert rest.stdout == b"started\nfinished\n"


def test_results_of_the_demo_payload(target, work):
    job = write_job(work / "job.yaml", target, script="demo_payload.py", args={"seconds": 1, "sizes": [1, 2]})
    job_id = submit(target, job)
    done = run_cli(target, "tail", job_id, "-f", "--max-wait", "60")
    assert done.returncode == 0, done.stderr.decode()
    assert b'"event": "done"' in done.stdout
    result = run_cli(target, "results", job_id, "--json")
    assert result.returncode == 0, result.stderr.decode()
    assert [r["size"] for r in json.loads(result.stdout)["rows"]] == [1, 2]


def test_unknown_job_id_and_bad_id_exit_2(target):
    assert run_cli(target, "tail", "no-such-job").returncode == 2
    bad = run_cli(target, "status", "../etc")
    assert bad.returncode == 2 and b"job id" in bad.stderr


def test_non_root_login_runs_jobs_in_its_home(ssh_host, work):
    user_host = ssh_host.as_user(ssh_host.non_root_user)
    root = shared_tmpdir("runner-root-user-")
    subprocess.run(["chown", user_host.user, str(root)], check=True)
    target = Target("ssh", {"address": user_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)})
    job = write_job(work / "job.yaml", target, command=["id", "-un"])
    job_id = submit(target, job)
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    assert run_cli(target, "tail", job_id).stdout == f"{user_host.user}\n".encode()


def test_large_backlog_drains_across_calls_never_past_max_wait(target, work):
    expected = bytes(range(256)) * 16384  # 4 MiB: several chunks
    job = write_job(work / "job.yaml", target,
                    command=["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 16384)"])
    job_id = submit(target, job)
    wait_terminal(target, job_id)
    seen, codes = b"", []
    while not codes or codes[-1] == 75:
        done = run_cli(target, "tail", job_id, "--max-wait", "0")
        seen += done.stdout
        codes.append(done.returncode)
        assert len(codes) < 50
    assert codes[-1] == 0 and len(codes) > 1  # max-wait 0: one chunk per call, then "call again"
    assert seen == expected


def test_tail_max_wait_0_on_a_100_mib_backlog_prints_one_chunk_and_returns(target, work):
    # Before the streamed tail (e70e18f) this call drained for 1.22 s past --max-wait 0 on such a log.
    job = write_job(work / "job.yaml", target, command=["head", "-c", str(100 << 20), "/dev/zero"])
    job_id = submit(target, job)
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    scale = Scale()
    t0 = time.monotonic()
    done = run_cli(target, "tail", job_id, "--max-wait", "0")
    elapsed = time.monotonic() - t0
    assert done.returncode == 75, done.stderr.decode()  # the rest comes with the next call
    assert 0 < len(done.stdout) <= 1 << 20 and done.stdout == bytes(len(done.stdout))  # one chunk of the log
    assert elapsed < scale(3), f"tail --max-wait 0 took {elapsed:.1f}s ({scale})"
    again = run_cli(target, "tail", job_id, "--max-wait", "0")
    assert again.returncode == 75 and len(again.stdout) == len(done.stdout)  # from where the first call ended
