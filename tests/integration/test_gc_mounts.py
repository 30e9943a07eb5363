"""`gc` (and every submit's retention) stays on host.root's filesystem: a root payload may leave a bind mount in
its job dir, and deleting the job dir must not empty the folder mounted there. On the confined systemd + sshd
host, whose mount namespace the payload's mount lives in (never this machine's).
"""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import Target, run_cli, submit, wait_terminal, write_job

pytestmark = pytest.mark.systemd


def test_gc_does_not_delete_through_a_mount_point_a_payload_left(service_host, work):
    precious = work / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("someone's data\n")
    root = work / "root"
    target = Target("ssh", {"address": service_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, service_host)
    job_file = write_job(work / "job.yaml", target, command=["sh", "-c", f"mkdir mnt && mount --bind {precious} mnt"])
    try:
        job = wait_terminal(target, submit(target, job_file), timeout=120)
        assert job["state"] == "SUCCEEDED", job
        done = run_cli(target, "gc", str(job_file), "--keep-jobs", "0", "--keep-days", "0", "--json")
        assert done.returncode == 0, done.stderr.decode()
        assert (precious / "keep.txt").read_text() == "someone's data\n", "gc emptied the mounted folder"
        answer = json.loads(done.stdout)
        assert job["job_id"] not in answer["jobs"], answer
    finally:
        service_host.ssh(["sh", "-c", f"findmnt -rn -o TARGET | grep '^{root}/' | xargs -r umount"])
