"""Healthy means the unit's own socket answered. A process of payload.user outside the job takes the service's
port the moment the stop frees it, answers one GET /health 200 having closed its listener just before, and
listens again 1.5 s later: the restarted unit cannot bind (Errno 98) and fails. Every restorer's health wait must
not take that answer for the unit's. On the confined systemd + sshd host; the squatter runs as the host's
nosudo login, started over its own ssh session (outside the job and the unit).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli_helpers import run_cli, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import gpu_job, target_for

pytestmark = pytest.mark.systemd

# argv[1]: the port. Waits until it is free, then, again and again: listen, accept one connection, hold it 1 s
# (the restarted unit tries to bind meanwhile, and fails), close the listener, answer 200, wait 1.5 s.
SQUATTER = r"""
import socket, sys, time
port = int(sys.argv[1])
print("squatter up", flush=True)
while True:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError:
        listener.close()
        time.sleep(0.02)
        continue
    listener.listen(8)
    conn, _ = listener.accept()
    time.sleep(1.0)
    listener.close()
    conn.recv(65536)
    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    conn.close()
    print("answered", time.time(), flush=True)
    time.sleep(1.5)
"""


def start_squatter(host, work) -> tuple:
    script = work / "squatter.py"
    script.write_text(SQUATTER)
    login = host.as_user(host.nosudo_user)
    proc = subprocess.Popen(["ssh", "-F", str(host.ssh_config), login.alias, "--",
                             f"python3 {script} {host.service_port} & echo pid $!; wait"],
                            stdout=subprocess.PIPE, text=True)
    pid = proc.stdout.readline().split()[-1]
    return proc, pid


def test_an_answer_from_a_listener_gone_before_it_is_not_the_units(service_host, work):
    """Before: the job SUCCEEDED, restored and healthy with the unit `failed`; `restore-service` then exited 0
    "healthy, was failed". Now the job says the service did not come back healthy, and so does restore-service."""
    target = target_for(service_host)
    proc, pid = start_squatter(service_host, work)
    try:
        job_id = submit(target, gpu_job(work, service_host, stop="always", command=["sleep", "3"]))
        job = wait_terminal(target, job_id, timeout=120)
        unit_now = service_host.service_state()
        print("\nHEALTH squatter: job %s healthy=%s; the unit is %s" % (job["state"], job["service"].get("healthy"),
                                                                         unit_now))
        if job["service"].get("healthy"):
            assert unit_now == "active", "the job says healthy, the unit is %s: %s" % (unit_now, job)
        assert job["state"] != "SUCCEEDED" or unit_now == "active", job
        if unit_now != "active":  # the squatter won the bind: the restorer said why the service is not back, the
            # answer it did not believe, or (when the unit failed to bind before the health was asked) the failed unit
            log = service_host.ssh(["cat", f"/root/.runner/jobs/{job_id}/restore.log"]).stdout
            assert ("nothing listens on port" in log or "outside the unit" in log
                    or f"{service_host.unit} is failed, NOT healthy" in log), log
        done = run_cli(target, "restore-service", "--host", service_host.alias, "--unit", service_host.unit,
                       "--health-url", service_host.health_url, "--max-wait", "8", "--json")
        answer = json.loads(done.stdout)
        unit_now = service_host.service_state()
        assert answer["state"] != "healthy" or unit_now == "active", (answer, unit_now)
        assert done.returncode != 0 or unit_now == "active", (done.returncode, answer, unit_now)
    finally:
        service_host.ssh(["kill", "-KILL", pid])
        proc.kill()
    wait_for(lambda: service_host.ssh(["kill", "-0", pid]).returncode != 0, timeout=10, what="the squatter gone")
