"""`runner restore-service`, the manual lever: it says whether it started the unit or found it up, takes --set
and a job file with another host, and its help names exit 4 for a host without systemd.
"""
from __future__ import annotations

import json

from tests.cli_helpers import Target, local_target, run_cli, write_job
from tests.harness.systemd_jobs import service_section, target_for
from tests.hosts._proc import free_port


def test_restore_service_help_names_exit_4_for_a_host_without_systemd():
    shown = run_cli(local_target(), "restore-service", "--help").stdout.decode()
    assert "4 the host cannot manage the unit (no systemd there" in " ".join(shown.split()), shown


def test_restore_service_says_whether_it_started_the_unit_takes_set_and_a_job_file_with_host(service_host, work):
    target = target_for(service_host)
    elsewhere = Target("ssh", {"address": "127.0.0.1", "port": free_port()}, work, {})
    job = write_job(work / "job.yaml", elsewhere, command=["true"], service=service_section(service_host))
    service_host.systemctl("stop", service_host.unit).check_returncode()
    first = run_cli(target, "restore-service", str(job), "--host", service_host.alias,
                    "--set", "service.health_timeout=40s", "--max-wait", "40")
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    assert b"healthy" in first.stdout and b"started it (it was inactive)" in first.stdout, first.stdout
    again = run_cli(target, "restore-service", str(job), "--host", service_host.alias, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["started"] is False, again.stdout
    shown = run_cli(target, "restore-service", str(job), "--host", service_host.alias)
    assert b"it was up already (not started)" in shown.stdout, shown.stdout
    bad = run_cli(target, "restore-service", str(job), "--host", service_host.alias, "--set", "service.nope=1")
    assert bad.returncode == 2 and b"service.nope" in bad.stderr, bad.stderr
