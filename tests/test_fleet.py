"""Fleets: one run over three real hosts (three loopback sshd, each with its own confined systemd and its
own dummy-infer.service), rolled out with max_unavailable 1; an unreachable host; a duplicate host."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import yaml

from tests.cli_helpers import Target, run_cli
from tests.hosts._proc import free_port, shared_tmpdir
from tests.hosts.recording import connection_attempts, recording_ssh_config
from tests.hosts.systemd_host import start_service_host

pytestmark = pytest.mark.systemd
ALIASES = ("fleet-a", "fleet-b", "fleet-c")


@pytest.fixture(scope="module")
def fleet():
    hosts = []
    try:
        for _ in ALIASES:
            hosts.append(start_service_host())
        yield hosts
    finally:
        for host in hosts:
            host.stop()


def fleet_target(hosts, work, dead_alias: str | None = None) -> Target:
    """One ssh_config naming every host by its own alias (and, if asked, one where nothing listens)."""
    blocks = [host.ssh_config.read_text().split("\n\n")[0].replace("Host testhost", f"Host {alias}", 1)
              for alias, host in zip(ALIASES, hosts)]
    if dead_alias:
        blocks.append(blocks[0].replace(f"Host {ALIASES[0]}", f"Host {dead_alias}", 1)
                      .replace(f"Port {hosts[0].port}", f"Port {free_port()}"))
    config = work / "ssh_config"
    config.write_text("\n\n".join(blocks) + "\n")
    return Target("ssh", {}, work, {"RUNNER_SSH_CONFIG": str(config)})


def fleet_spec(work, hosts, addresses, **rollout) -> str:
    spec = {"name": "fleet", "host": {"address": list(addresses)},
            # no health_url: each host's dummy service listens on its own port (active for 2 s = back)
            "service": {"manager": "systemd", "unit": hosts[0].unit, "stop": "always", "health_timeout": "30s"},
            "payload": {"command": ["sh", "-c", "echo start; sleep 2; echo end"]},
            "limits": {"max_runtime": "1m", "grace": "2s"}, "rollout": {"max_unavailable": 1, **rollout}}
    path = work / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


class Sampler:
    """Every host's unit ActiveState, read on the host by one ssh session each, every 0.2 s."""

    LOOP = "while :; do systemctl show -P ActiveState {unit}; sleep 0.2; done"

    def __init__(self, hosts) -> None:
        self.latest = {i: "active" for i in range(len(hosts))}
        self.procs = [subprocess.Popen(["ssh", "-F", str(h.ssh_config), h.alias, self.LOOP.format(unit=h.unit)],
                                       stdout=subprocess.PIPE, text=True) for h in hosts]
        self.samples: list[int] = []
        self.stop = threading.Event()
        for i, proc in enumerate(self.procs):
            threading.Thread(target=self._read, args=(i, proc), daemon=True).start()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _read(self, i, proc) -> None:
        for line in proc.stdout:
            self.latest[i] = line.strip()

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append(sum(1 for state in self.latest.values() if state != "active"))
            time.sleep(0.2)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for proc in self.procs:
            proc.kill()
            proc.wait()


def drive(target, spec: str, timeout: float = 240) -> dict:
    """Submit, then `runner wait RUN` in bounded calls (exit 75 while unfinished) until the run ends."""
    done = run_cli(target, "submit", spec, "--json", "--max-wait", "20")
    run = json.loads(done.stdout)
    deadline = time.monotonic() + timeout
    while done.returncode == 75 and time.monotonic() < deadline:
        done = run_cli(target, "wait", run["run_id"], "--timeout", "20s", "--json")
        run = json.loads(done.stdout)
    return {**run, "rc": done.returncode}


def test_max_unavailable_1_never_two_hosts_down(fleet):
    work = shared_tmpdir("runner-fleet-")
    target = fleet_target(fleet, work)
    sampler = Sampler(fleet)
    try:
        run = drive(target, fleet_spec(work, fleet, ALIASES))
    finally:
        sampler.close()
    peak = max(sampler.samples)
    print(f"fleet of 3, max_unavailable 1: {len(sampler.samples)} samples, most hosts down at once: {peak}")
    assert run["rc"] == 0 and run["state"] == "SUCCEEDED", run
    assert [h["state"] for h in run["hosts"]] == ["SUCCEEDED"] * 3, run
    assert 1 in sampler.samples, "no host was ever seen down: the sampler saw nothing"
    assert peak <= 1, sampler.samples
    assert all(h.service_state() == "active" for h in fleet)
    status = run_cli(target, "status", run["run_id"])
    assert status.returncode == 0 and status.stdout.decode().count("SUCCEEDED") >= 3, status.stdout


def test_an_unreachable_host_is_reported_and_the_others_run(fleet):
    work = shared_tmpdir("runner-fleet-dead-")
    target = fleet_target(fleet, work, dead_alias="fleet-dead")
    run = drive(target, fleet_spec(work, fleet, [ALIASES[0], "fleet-dead", ALIASES[1]]))
    by_host = {h["address"]: h for h in run["hosts"]}
    assert run["rc"] == 1 and run["state"] == "FAILED", run
    assert by_host["fleet-dead"]["phase"] == "skipped" and by_host["fleet-dead"]["exit"] == 3, by_host
    assert "unreachable" in by_host["fleet-dead"]["note"]
    assert by_host[ALIASES[0]]["state"] == by_host[ALIASES[1]]["state"] == "SUCCEEDED", by_host
    status = run_cli(target, "status", run["run_id"])
    assert b"fleet-dead" in status.stdout and b"unreachable" in status.stdout, status.stdout


def test_a_host_listed_twice_exits_2_naming_the_field_and_contacts_no_host(fleet):
    work = shared_tmpdir("runner-fleet-dup-")
    target = fleet_target(fleet, work)
    log = work / "connections.log"
    config = recording_ssh_config(work / "ssh_config", log, work / "recording_config")
    spec = fleet_spec(work, fleet, [ALIASES[0], ALIASES[1], ALIASES[0]])
    done = run_cli(target, "submit", spec, env={"RUNNER_SSH_CONFIG": str(config)})
    assert done.returncode == 2 and b"host.address" in done.stderr and b"twice" in done.stderr, done.stderr
    assert connection_attempts(log) == []
