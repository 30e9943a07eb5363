"""Fleets: one run over three real hosts (three loopback sshd, each with its own confined systemd and its
own dummy-infer.service), rolled out with max_unavailable 1 and 2; an unreachable host; a duplicate host;
stop_on_failure; `tail`, `cancel` and `results` of a run."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import yaml

from runner.deadline import ROUND_TRIP_ALLOWANCE_S
from tests.cli_helpers import Target, run_cli
from tests.hosts._proc import free_port, shared_tmpdir
from tests.hosts.recording import connection_attempts, recording_ssh_config
from tests.hosts.systemd_host import start_service_host

pytestmark = pytest.mark.systemd
ALIASES = ("fleet-a", "fleet-b", "fleet-c")


@pytest.fixture(scope="module")
def fleet_hosts():
    hosts = []
    try:
        for _ in ALIASES:
            hosts.append(start_service_host())
        yield hosts
    finally:
        for host in hosts:
            host.stop()


@pytest.fixture
def fleet(fleet_hosts):
    """The three hosts, each reset first (unit active and healthy, no locks): a test may leave one down."""
    for host in fleet_hosts:
        host.reset()
    return fleet_hosts


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


def fleet_spec(work, hosts, addresses, *, script: str = "echo start; sleep 2; echo end", stop: str = "always",
               **rollout) -> str:
    """`script` runs under `sh -c` on each host ($RUNNER_JOB_ID is RUN.N, N the host's place in the list)."""
    spec = {"name": "fleet", "host": {"address": list(addresses)},
            # no health_url: each host's dummy service listens on its own port (active for 2 s = back)
            "service": {"manager": "systemd", "unit": hosts[0].unit, "stop": stop, "health_timeout": "30s"},
            "payload": {"command": ["sh", "-c", script]},
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


def most_windows_at_once(jobs: list[dict]) -> int:
    """From the jobs' own records: the most [stopped_at, restored_at] service windows open at one time."""
    edges = sorted(edge for job in jobs for edge in ((job["service"]["stopped_at"], 1), (job["service"]["restored_at"], -1)))
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


# forks 1: one host call at a time, and a host waiting for its turn holds none (else the started hosts'
# polls, which free the slots, could never run)
@pytest.mark.slow(seconds=45)
@pytest.mark.parametrize("k, forks", [(1, None), (2, None), (2, 1)])
def test_max_unavailable_k_never_more_than_k_hosts_down(fleet, k, forks):
    work = shared_tmpdir("runner-fleet-")
    target = fleet_target(fleet, work)
    sampler = Sampler(fleet)
    try:
        run = drive(target, fleet_spec(work, fleet, ALIASES, max_unavailable=k, **({"forks": forks} if forks else {})))
    finally:
        sampler.close()
    peak = max(sampler.samples)
    assert run["rc"] == 0 and run["state"] == "SUCCEEDED", run
    assert [h["state"] for h in run["hosts"]] == ["SUCCEEDED"] * 3, run
    status = json.loads(run_cli(target, "status", run["run_id"], "--json").stdout)
    windows = most_windows_at_once([row["job"] for row in status["hosts"]])
    print(f"fleet of 3, max_unavailable {k}, forks {forks or 'default'}: {len(sampler.samples)} samples, "
          f"most hosts down at once: {peak} (sampled), {windows} (the jobs' own stop/restore times)")
    assert 1 in sampler.samples, "no host was ever seen down: the sampler saw nothing"
    assert peak <= k and windows <= k, (sampler.samples, windows)
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


def test_stop_on_failure_holds_the_hosts_not_yet_started(fleet):
    work = shared_tmpdir("runner-fleet-sof-")
    target = fleet_target(fleet, work)
    script = 'case "$RUNNER_JOB_ID" in *.1) echo failing here; exit 3;; esac; echo fine'
    run = drive(target, fleet_spec(work, fleet, ALIASES, script=script, stop_on_failure=True))
    first, *rest = run["hosts"]
    assert run["rc"] == 1 and run["state"] == "FAILED", run
    assert first["phase"] == "done" and first["state"] == "FAILED", first
    for entry in rest:
        assert entry["phase"] == "held" and entry["state"] is None, run["hosts"]
        assert "stop_on_failure" in entry["note"] and ALIASES[0] in entry["note"], entry
    for host, entry in zip(fleet[1:], rest):  # never started: no job on the host, its service never stopped
        assert host.ssh(["test", "-e", f"/root/.runner/jobs/{entry['job_id']}"]).returncode == 1
    assert all(h.service_state() == "active" for h in fleet)
    status = run_cli(target, "status", run["run_id"])
    text = status.stdout.decode()
    assert status.returncode == 1 and text.count("HELD: not started: rollout.stop_on_failure") == 2, text


def wait_until_started(target, run: dict, timeout: float = 90) -> dict:
    """The run (as `submit --json` printed it) driven on in `runner wait` calls until every host's job is
    started (or done). Each call is long enough to start a host: none starts within START_MARGIN_S of its end."""
    deadline = time.monotonic() + timeout
    while not all(h["phase"] in ("started", "done") for h in run["hosts"]) and time.monotonic() < deadline:
        run = json.loads(run_cli(target, "wait", run["run_id"], "--timeout", "8s", "--json").stdout)
    return run


def reassemble(printed: bytes, addresses) -> dict[str, bytes]:
    """Each host's bytes from `runner tail RUN` output: `[HOST] line`, and `[HOST]+ rest` continuing a line
    that an earlier call printed while still open (with a newline it did not have yet)."""
    streams = {a: b"" for a in addresses}
    for line in printed.split(b"\n")[:-1]:
        head, _, text = line.partition(b" ")
        continued = head.endswith(b"]+")
        address = head[1:-2 if continued else -1].decode()
        assert head.startswith(b"[") and address in streams, line
        stream = streams[address]
        if continued:
            assert stream.endswith(b"\n"), line
            stream = stream[:-1]
        streams[address] = stream + text + b"\n"
    return streams


def test_tail_of_a_run_gives_each_hosts_bytes_once_prefixed_within_the_bound(fleet):
    work = shared_tmpdir("runner-fleet-tail-")
    target = fleet_target(fleet, work)
    go = work / "go"  # /tmp is shared with the hosts: every payload waits for it, so the output starts after
    script = (f'while [ ! -e {go} ]; do sleep 0.1; done; for i in 1 2 3 4 5 6 7 8 9 10; do '
              'echo "$RUNNER_JOB_ID line $i"; printf "$RUNNER_JOB_ID open "; sleep 0.7; echo "closed $i"; done')
    done = run_cli(target, "submit", fleet_spec(work, fleet, ALIASES, script=script, stop="never"), "--json",
                   "--max-wait", "3")
    run = wait_until_started(target, json.loads(done.stdout))
    assert all(h["phase"] == "started" for h in run["hosts"]), run
    go.touch()
    max_wait, printed, calls = 2.0, b"", []
    while len(calls) < 40:
        began = time.monotonic()
        call = run_cli(target, "tail", run["run_id"], "-f", "--max-wait", str(max_wait))
        calls.append((call.returncode, time.monotonic() - began))
        printed += call.stdout
        if call.returncode != 75:
            break
    assert calls[-1][0] == 0, (calls, call.stderr)
    assert len(calls) >= 2, calls  # the payload outlasts one call: the cursors carry across calls
    # --max-wait, one round trip's allowance, and the CLI's own start-up under load
    assert all(took <= max_wait + ROUND_TRIP_ALLOWANCE_S + 10 for _, took in calls), calls
    assert b"]+ " in printed, printed.decode()  # a line open when a call ended was continued by the next
    streams = reassemble(printed, ALIASES)
    for entry in run["hosts"]:
        expected = "".join(f"{entry['job_id']} line {i}\n{entry['job_id']} open closed {i}\n" for i in range(1, 11))
        assert streams[entry["address"]].decode() == expected, (entry["address"], printed.decode())
    again = run_cli(target, "tail", run["run_id"])
    assert again.returncode == 0 and again.stdout == b"", again.stdout  # nothing twice


def test_cancel_of_a_run_cancels_every_hosts_job_and_every_service_comes_back(fleet):
    work = shared_tmpdir("runner-fleet-cancel-")
    target = fleet_target(fleet, work)
    spec = fleet_spec(work, fleet, ALIASES, script="echo start; sleep 120; echo end", max_unavailable=3)
    done = run_cli(target, "submit", spec, "--json", "--max-wait", "3")
    run = wait_until_started(target, json.loads(done.stdout))
    assert all(h["phase"] == "started" for h in run["hosts"]), run
    deadline = time.monotonic() + 60
    while any(h.service_state() == "active" for h in fleet) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [h.service_state() for h in fleet] != ["active"] * 3  # the jobs stopped their services
    cancel = run_cli(target, "cancel", run["run_id"], "--json")
    assert cancel.returncode == 0, cancel.stderr
    answers = json.loads(cancel.stdout)
    assert sorted(answers) == sorted(ALIASES) and all(a.get("already") is False for a in answers.values()), answers
    ended = run_cli(target, "wait", run["run_id"], "--timeout", "90s", "--json", timeout=150)
    final = json.loads(ended.stdout)
    assert ended.returncode == 1 and final["finished"], final
    assert [h["state"] for h in final["hosts"]] == ["CANCELLED"] * 3, final
    assert [h.service_state() for h in fleet] == ["active"] * 3


def test_results_of_a_run_side_by_side_and_plotted(fleet):
    work = shared_tmpdir("runner-fleet-results-")
    target = fleet_target(fleet, work)
    script = ("python3 -c 'import json, os; n = int(os.environ[\"RUNNER_JOB_ID\"].rsplit(\".\", 1)[1]); "
              "json.dump({\"host_n\": n, \"rows\": [{\"m\": m, \"median_us\": 10 * m * n} for m in (1, 2, 4)]}, "
              "open(os.environ[\"RUNNER_RESULT\"], \"w\"))'")
    run = drive(target, fleet_spec(work, fleet, ALIASES, script=script, stop="never"))
    assert run["rc"] == 0, run
    shown = run_cli(target, "results", run["run_id"])
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.decode().splitlines()]
    assert ["host_n", "1", "2", "3"] in lines, shown.stdout.decode()
    assert [ALIASES[0], ALIASES[1], ALIASES[2]] == [w for w in next(l for l in lines if ALIASES[0] in l) if w in ALIASES]
    assert ["4", "40", "80", "120"] in lines, shown.stdout.decode()  # m = 4: one column per host, in list order
    plot = work / "hosts.png"
    plotted = run_cli(target, "results", run["run_id"], "--plot", str(plot))
    assert plotted.returncode == 0, plotted.stderr
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
