"""A host that refuses the connection: the submit ends NOT_STARTED and says nothing was started, the message names
the port, the spec field that chose it and what to check, on both SSH transports; the shipped job files leave the
user and the port to ssh_config.
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import REPO, Target, run_cli, write_job
from tests.hosts._proc import free_port


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_submit_that_never_connected_ends_not_started_and_says_why(work, transport):
    state = work / "state"
    host = {"address": "127.0.0.1", "port": free_port(), "transport": transport, "connect_timeout": "5s"}
    target = Target("ssh", host, work, {"RUNNER_STATE_DIR": str(state)})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert b"Nothing was started" in done.stderr, done.stderr
    [record] = json.loads(run_cli(target, "list", "--json").stdout)
    assert record["last_state"] == "NOT_STARTED" and "cannot connect" in record["note"], record
    shown = run_cli(target, "status", record["job_id"])
    assert shown.returncode == 1, shown
    assert b"NOT_STARTED" in shown.stdout and b"never started: ssh 127.0.0.1" in shown.stdout, shown.stdout
    again = run_cli(target, "submit", str(work / "j.yaml"), "--job-id", record["job_id"])
    assert again.returncode == 3 and b"Nothing was started" in again.stderr, again.stderr


def test_paramiko_on_a_closed_port_names_the_port_and_what_to_check(work):
    host = {"address": "127.0.0.1", "port": free_port(), "transport": "paramiko", "connect_timeout": "5s"}
    target = Target("ssh", host, work, {"RUNNER_STATE_DIR": str(work / "state")})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert b"[Errno None]" not in done.stderr, done.stderr
    assert f"127.0.0.1 port {host['port']}: Connection refused".encode() in done.stderr, done.stderr
    assert b"runner: hint: Check that `ssh` itself reaches the host" in done.stderr, done.stderr


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_refused_connect_says_which_spec_field_decided_the_port(work, transport):
    port = free_port()
    target = Target("ssh", {"address": "127.0.0.1", "port": port, "transport": transport, "connect_timeout": "5s"},
                    work, {"RUNNER_STATE_DIR": str(work / "state")})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert f"the port {port} is host.port in the job spec".encode() in done.stderr, done.stderr


def test_shipped_job_files_leave_the_user_and_the_port_to_ssh_config():
    for path in sorted((REPO / "jobs").glob("*.yaml")):
        host = yaml.safe_load(path.read_text())["host"]
        assert not {"user", "port"} & set(host), (path.name, host)
