"""Several services on one host, each on its own GPUs (`services:` with `gpus:`), on the confined real systemd +
sshd test host with the nvidia-smi stand-in showing 8 GPUs: two dummy units, `dummy-infer.service` on GPUs 0-1
and `second-infer.service` on GPUs 2-3. A job frees only the services whose GPUs meet its own (gpu.devices;
none = every GPU); the others keep serving, their MainPID unchanged, and are never locked or recorded.
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal
from tests.harness.multi_services import SECOND, multi_job, two_services as services_on_two_gpu_pairs
from tests.harness.systemd_jobs import HANG, host_status, restored_within, target_for
from tests.hosts._proc import wait_until

pytestmark = pytest.mark.systemd


@pytest.fixture
def two_services(service_host):
    return services_on_two_gpu_pairs(service_host)


def main_pids(host) -> dict:
    return {unit: host.systemctl("show", "-P", "MainPID", unit).stdout.strip() for unit in (host.unit, SECOND)}


def states(host) -> dict:
    return {unit: host.service_state(unit) for unit in (host.unit, SECOND)}


def freed(job: dict) -> list:
    """The units this job stopped, from its status (every service record it holds)."""
    records = job.get("services") or ([job["service"]] if job["service"].get("manager") == "systemd" else [])
    return sorted(r["unit"] for r in records if r.get("stopped"))


def test_a_job_on_a_gpu_no_service_holds_stops_nothing(service_host, two_services, work):
    before = main_pids(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, multi_job(work / "job.yaml", service_host, two_services, [4])))
    assert job["state"] == "SUCCEEDED", job
    assert freed(job) == [] and job["service"] == {"manager": "none"}
    assert main_pids(service_host) == before and set(states(service_host).values()) == {"active"}
    assert sorted(job["gpu"]["devices"]) == ["4"]
    assert "ledger-" not in service_host.ssh(["ls", "/run/lock"]).stdout


def test_a_job_on_gpu_0_stops_only_the_unit_on_0_and_1(service_host, two_services, work):
    before = main_pids(service_host)
    target = target_for(service_host)
    job_id = submit(target, multi_job(work / "job.yaml", service_host, two_services, [0], command=HANG))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    assert states(service_host) == {service_host.unit: "inactive", SECOND: "active"}
    run_cli(target, "cancel", job_id)
    job = wait_terminal(target, job_id)
    assert job["state"] == "CANCELLED" and job["restored"] is True, job
    assert freed(job) == [service_host.unit]
    after = main_pids(service_host)
    assert after[SECOND] == before[SECOND] and after[service_host.unit] != before[service_host.unit]
    assert set(states(service_host).values()) == {"active"} and service_host.health_status() == 200
    assert job["service"]["healthy"] is True


def test_two_jobs_on_gpus_0_and_2_run_at_once_each_freeing_its_own_unit(service_host, two_services, work):
    target = target_for(service_host)
    (work / "a").mkdir()
    (work / "b").mkdir()
    a = submit(target, multi_job(work / "a" / "job.yaml", service_host, two_services, [0], command=HANG))
    b = submit(target, multi_job(work / "b" / "job.yaml", service_host, two_services, [2], command=HANG))
    wait_for(lambda: status(target, a)["state"] == status(target, b)["state"] == "RUNNING", what="both running")
    assert set(states(service_host).values()) == {"inactive"}
    run_cli(target, "cancel", a)
    run_cli(target, "cancel", b)
    job_a, job_b = wait_terminal(target, a), wait_terminal(target, b)
    assert freed(job_a) == [service_host.unit] and freed(job_b) == [SECOND]
    assert job_a["restored"] is True and job_b["restored"] is True
    assert set(states(service_host).values()) == {"active"}


def test_a_job_on_gpus_of_both_services_frees_both_and_a_kill_restores_both(service_host, two_services, work):
    """Supervisor and guard SIGKILLed while both units are stopped: the host's own restorers (the unit's
    ExecStopPost=) bring both back, with no controller call; the ledger holds one entry per unit meanwhile."""
    before = main_pids(service_host)
    target = target_for(service_host)
    job_id = submit(target, multi_job(work / "job.yaml", service_host, two_services, [1, 2], command=HANG))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    assert set(states(service_host).values()) == {"inactive"}
    ledger = service_host.ssh(["ls", "/run/lock"]).stdout.split()
    assert sorted(n for n in ledger if n.startswith("runner-ledger-")) == sorted([
        f"runner-ledger-service-{SECOND}.json", f"runner-ledger-service-{service_host.unit}.json"])
    job = host_status(service_host, job_id)
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    restored_within(service_host, job_id, timeout=120)
    job = host_status(service_host, job_id)
    wait_until(lambda: set(states(service_host).values()) == {"active"}, timeout=30, what="both units active")
    assert freed(job) == sorted([service_host.unit, SECOND])
    assert all(r["healthy"] is True for r in job["services"]), job["services"]
    after = main_pids(service_host)
    assert after[SECOND] != before[SECOND] and after[service_host.unit] != before[service_host.unit]
    assert "ledger-" not in service_host.ssh(["ls", "/run/lock"]).stdout


def test_a_job_without_devices_waits_for_every_gpu_of_the_host(service_host, two_services, work):
    """No gpu.devices means every GPU: it takes every GPU's lock, so it is busy while a job holds GPU 5."""
    target = target_for(service_host)
    (work / "a").mkdir()
    a = submit(target, multi_job(work / "a" / "job.yaml", service_host, two_services, [5], command=HANG))
    wait_for(lambda: status(target, a)["state"] == "RUNNING", what="running")
    done = run_cli(target, "submit", str(multi_job(work / "job.yaml", service_host, two_services, [])))
    assert done.returncode != 0 and b"gpu-5" in done.stderr, done.stderr.decode()
    run_cli(target, "cancel", a)
    assert wait_terminal(target, a)["state"] == "CANCELLED"
    assert set(states(service_host).values()) == {"active"}


@pytest.mark.parametrize("change, words", [
    (lambda spec: spec["services"][0].update(gpus=["gpu0"]), "services.0.gpus"),
    (lambda spec: spec.update(service=dict(spec["services"][0])), "`service` (one) or `services` (a list), not both"),
    (lambda spec: spec["services"][1].update(unit=spec["services"][0]["unit"]), "twice"),
])
def test_spec_errors_exit_2(service_host, two_services, work, change, words):
    path = multi_job(work / "job.yaml", service_host, two_services, [0])
    spec = yaml.safe_load(path.read_text())
    change(spec)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli(target_for(service_host), "submit", str(path), "--json")
    said = (done.stdout + done.stderr).decode()
    assert done.returncode == 2, (done.returncode, said)
    assert words in said, said
    assert json.loads(done.stdout or "{}").get("job_id") is None


def test_restore_service_of_one_unit_resumes_only_that_one(service_host, two_services, work, fork_path):
    """A job on GPUs 1 and 2 released the engine on 0-1 (free: sglang) and stopped the unit on 2-3; both of its
    processes SIGKILLed (the fork path: no ExecStopPost). `restore-service JOB --unit` the engine resumes it
    alone through the dead job's own restore; the unit on 2-3 and its ledger entry are left as they were."""
    calls = service_host.install_engine_unit("sglang", "--memory-saver")
    engine_pid = main_pids(service_host)[service_host.unit]
    services = [dict(two_services[0], free="sglang", stop="always"), two_services[1]]
    target = target_for(service_host)
    job_file = multi_job(work / "job.yaml", service_host, services, [1, 2], command=HANG)
    job_id = submit(target, job_file)
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    assert states(service_host) == {service_host.unit: "active", SECOND: "inactive"}
    job = host_status(service_host, job_id)
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    done = run_cli(target, "restore-service", str(job_file), "--unit", service_host.unit, "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["state"] == "healthy", answer
    assert answer["released"]["job_id"] == job_id and answer["released"]["deferred"] is False
    assert any("resume_memory_occupation" in line for line in calls.read_text().splitlines())
    assert main_pids(service_host)[service_host.unit] == engine_pid
    assert states(service_host)[SECOND] == "inactive"
    ledger = service_host.ssh(["ls", "/run/lock"]).stdout.split()
    assert [n for n in ledger if n.startswith("runner-ledger-")] == [f"runner-ledger-service-{SECOND}.json"]
    record = host_status(service_host, job_id)["services"][0]
    assert record["restored_alone"] is True and record["healthy"] is True
    done = run_cli(target, "restore-service", str(job_file), "--json")
    assert done.returncode == 2 and b"--unit" in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.slow(seconds=30)
def test_the_guard_restores_both_and_the_next_job_adopts_only_its_own(service_host, two_services, work, fork_path):
    """The fork path: A (GPUs 1 and 2) loses its supervisor; its guard restores both units. Then B (GPUs 1 and 2)
    loses supervisor and guard; C on GPU 0 adopts only the stop of the unit on 0-1 and restores it after its
    run, while B's stop of the unit on 2-3 stays owed to B (its ledger entry untouched)."""
    target = target_for(service_host)
    for name in ("a", "b", "c"):
        (work / name).mkdir()
    a = submit(target, multi_job(work / "a" / "job.yaml", service_host, two_services, [1, 2], command=HANG))
    wait_for(lambda: status(target, a)["state"] == "RUNNING", what="A running")
    service_host.ssh(["kill", "-KILL", str(host_status(service_host, a)["supervisor"]["pid"])], check=True)
    restored_within(service_host, a, timeout=120)
    assert all(r["healthy"] is True for r in host_status(service_host, a)["services"])
    wait_until(lambda: set(states(service_host).values()) == {"active"}, timeout=30, what="both units active")
    b = submit(target, multi_job(work / "b" / "job.yaml", service_host, two_services, [1, 2], command=HANG))
    wait_for(lambda: status(target, b)["state"] == "RUNNING", what="B running")
    job_b = host_status(service_host, b)
    service_host.ssh(["kill", "-KILL", str(job_b["supervisor"]["pid"]), str(job_b["guard"]["pid"])], check=True)
    c = wait_terminal(target, submit(target, multi_job(work / "c" / "job.yaml", service_host, two_services, [0])))
    assert c["state"] == "SUCCEEDED" and c["service"]["adopted_from"] == b, c
    assert states(service_host) == {service_host.unit: "active", SECOND: "inactive"}
    ledger = service_host.ssh(["cat", f"/run/lock/runner-ledger-service-{SECOND}.json"]).stdout
    assert json.loads(ledger)["job_id"] == b
    assert host_status(service_host, b).get("restored") is not True
