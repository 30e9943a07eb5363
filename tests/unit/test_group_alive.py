"""Whether a payload's process group still lives, as the supervisor and every restorer ask it before and after a
kill (host/processes.group_alive): a live leader, a member left behind by a leader that exited, a leader that is
only a zombie, a group that is gone, each with real processes; only the cases without a live leader read /proc."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from remote_payload.host import processes
from remote_payload.host.processes import group_alive

# A leader in a group of its own that forks a child (same group) and prints its pid, then exits or sleeps.
LEADER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
if sys.argv[1] == "exit":
    os._exit(0)
time.sleep(60)
"""


def group_leader(mode: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", LEADER, mode], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def scans(monkeypatch) -> list:
    read: list = []
    real = processes.group_members
    monkeypatch.setattr(processes, "group_members", lambda pgid: read.append(pgid) or real(pgid))
    return read


def test_a_live_leader_is_one_kill_and_one_stat(monkeypatch):
    read = scans(monkeypatch)
    proc, _child = group_leader("sleep")
    try:
        assert group_alive(proc.pid) and read == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_member_left_by_its_leader_keeps_the_group_alive(monkeypatch):
    read = scans(monkeypatch)
    proc, child = group_leader("exit")
    proc.wait()  # the leader reaped: only its child is left in the group
    assert group_alive(proc.pid) and read == [proc.pid]
    os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid):  # the child, reparented, is reaped by whoever adopted it
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_zombie_leader_alone_is_a_group_gone(monkeypatch):
    proc, child = group_leader("sleep")
    os.kill(child, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes.proc_stat(proc.pid)[0] != "Z":  # not reaped: it stays a member until it is
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while group_alive(proc.pid):  # the child, once its adopter has reaped it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.wait()
    assert not group_alive(proc.pid)
