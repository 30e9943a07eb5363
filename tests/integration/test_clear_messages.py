"""What a newcomer reads when a local thing is wrong or a command waits: the file, the variable, the reason, said
plainly, with the exit code of the error's kind (2: local configuration), through the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import yaml

from runner.state.store import Store
from tests.cli_helpers import REPO, Target, local_target, run_cli, submit, wait_terminal, write_job
from tests.harness.pace import Scale


@pytest.mark.parametrize("transport", ["openssh", "paramiko"])
def test_a_missing_ssh_config_file_is_a_local_error_naming_the_variable(work, transport):
    target = Target("ssh", {"address": "127.0.0.1", "port": 9, "transport": transport}, work,
                    {"RUNNER_SSH_CONFIG": "/nonexistent/ssh_config"})
    job = write_job(work / "job.yaml", target, command=["true"])
    for args in (("submit", str(job)), ("submit", str(job), "--dry-run")):
        done = run_cli(target, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert b"RUNNER_SSH_CONFIG" in done.stderr and b"/nonexistent/ssh_config" in done.stderr, done.stderr
        assert b"Traceback" not in done.stderr
    assert json.loads(run_cli(target, "list", "--json").stdout) == []  # nothing recorded, nothing to forget


def test_a_missing_script_names_the_path_it_looked_for(work, target):
    spec = {"name": "missing script", "host": target.host, "service": {"manager": "none"},
            "payload": {"script": "nosuch_bench.py"}}
    (work / "job.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "runner", "submit", "job.yaml", "--dry-run"], capture_output=True,
                          cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2, done.stderr
    message = done.stderr.decode()
    assert "nor in ." not in message and "`.`" not in message, message
    assert f"'nosuch_bench.py' is not in {work} (a script is found beside the job file" in message, message


def test_a_state_dir_that_cannot_be_written_names_the_real_variable(work, target):
    blocker = work / "a-file"
    blocker.write_text("not a directory")
    job = write_job(work / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job), env={"RUNNER_STATE_DIR": str(blocker / "state")})
    assert done.returncode == 2, done.stderr
    assert b"RUNNER_STATE_DIR" in done.stderr and b"runner_state_dir" not in done.stderr, done.stderr


def test_a_tail_that_waits_for_another_tails_turn_says_so(work, target):
    scale = Scale()
    job_id = submit(target, write_job(work / "sleep.yaml", target, command=["sleep", f"{scale(30):.0f}"]))
    held, release = threading.Event(), threading.Event()

    def hold_the_turn() -> None:  # what another `runner tail` of this job does while it prints
        with Store().cursor_turn(job_id, 10) as (_record, turn):
            assert turn
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_turn)
    holder.start()
    try:
        held.wait(30)
        threading.Timer(scale(1.5), release.set).start()  # the other tail ends while this one waits
        done = run_cli(target, "tail", job_id, "--max-wait", f"{scale(10):.0f}")
    finally:
        release.set()
        holder.join()
        run_cli(target, "cancel", job_id)
    assert done.returncode == 75, done.stderr
    assert b"another `runner tail " + job_id.encode() + b"`" in done.stderr, done.stderr
    wait_terminal(target, job_id)


def test_status_of_every_job_exits_by_the_jobs_still_running(work, target):
    failed = submit(target, write_job(work / "fail.yaml", target, command=["false"]))
    assert wait_terminal(target, failed)["state"] == "FAILED"
    every = run_cli(target, "status")
    assert every.returncode == 0, every.stderr  # a past failure is history, not this call's outcome
    assert failed.encode() in every.stdout and b"FAILED" in every.stdout
    running = submit(target, write_job(work / "sleep.yaml", target, command=["sleep", f"{Scale()(30):.0f}"]))
    try:
        assert run_cli(target, "status").returncode == 75
        assert run_cli(target, "status", failed).returncode == 1  # one job by id: its own state
    finally:
        run_cli(target, "cancel", running)
    wait_terminal(target, running)
    assert run_cli(target, "status").returncode == 0
    helped = run_cli(target, "status", "--help").stdout.decode()
    assert "still running" in helped and "ended jobs do not count" in " ".join(helped.split()), helped


def test_a_whole_spec_rule_names_its_fields_without_a_top_level_prefix(work):
    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    path = write_job(work / "j.yaml", target, command=["true"], gpu={"devices": [0, 1, 2]})
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": [{"a": 1}, {"a": 2}], "gpus_per_variant": 2}
    path.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(path), "--dry-run")
    assert done.returncode == 2, done.stderr
    assert b"(top level)" not in done.stderr, done.stderr
    assert f"{path}: gpu.devices holds 3 devices, not a multiple of sweep.gpus_per_variant".encode() in done.stderr


def test_a_read_only_state_dir_is_not_told_to_free_space(work):
    """Read-only for root too: the immutable attribute (chattr +i), else a 0500 mode for a plain user."""
    state = work / "read-only state"
    state.mkdir(mode=0o500)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(state)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute, and root writes a 0500 directory anyway")
    target = local_target({"RUNNER_STATE_DIR": str(state)})
    try:
        done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    finally:
        subprocess.run(["chattr", "-i", str(state)], capture_output=True)
        state.chmod(0o700)
    assert done.returncode == 2, done.stderr
    assert b"free space" not in done.stderr and b"make it writable" in done.stderr, done.stderr
