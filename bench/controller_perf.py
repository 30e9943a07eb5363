"""How fast is the controller? Measured on a loopback sshd, directly and through a 50 ms-each-way proxy.

    python bench/controller_perf.py --out bench/results/controller_perf.json     (root: starts its own sshd)

Per set (a login on the test sshd, reached directly or through bench/latency_proxy.py), medians over
--runs runs of: submit-to-detached (runner in-process, runner CLI, hand-written OpenSSH `nohup … & echo $!`),
round trips per submit, a tail poll with no new bytes on a 1 GiB log, follow latency of `tail -f`, and
`status` of 100 jobs. Logins: `lean` (runnertest: Debian's default ~/.bashrc, /usr/bin/python3) and `root`
(this machine's root: ~/.bashrc runs `pyenv init`, python3 is a pyenv shim), because the remote login's
shell start-up is paid once per SSH command and turns out to be the largest fixed cost.

SSH commands per operation are counted three independent ways: HostClient.round_trips, SSH session
channels this process opens (paramiko, patched here), and sshd's own "Starting session" log lines (LogLevel
VERBOSE). The proxy's byte counters give bytes on the wire. Last, the same operations run alternately direct
and through the proxy: the paired difference over the RTT is the number of network round trips each costs.
docs/performance.md explains the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from latency_proxy import LatencyProxy  # noqa: E402
from remote_payload import contract  # noqa: E402
from runner.commands import controller  # noqa: E402
from runner.deadline import Deadline  # noqa: E402
from runner.remote.transport import SshTarget, SshTransport  # noqa: E402
from runner.spec.spec_load import load_spec  # noqa: E402
from runner.state.store import JobRecord, Store  # noqa: E402
os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.cli_helpers import Target, python_payload, write_job  # noqa: E402
from tests.hosts import sshd  # noqa: E402
from tests.hosts._proc import shared_tmpdir, wait_until  # noqa: E402

GIB = 1 << 30
LOGINS = {"lean": sshd.NON_ROOT_USER, "root": "root"}

SHORT_PAYLOAD = """
import time
print("started", flush=True)
time.sleep(1)
"""

# One line per 0.2-0.5 s: the host's wall clock when the line was written (same clock as ours: loopback).
CLOCK_PAYLOAD = """
import random, sys, time
time.sleep(1.5)  # let `tail -f` start first: lines written before it would measure our start-up, not follow
for _ in range(int(sys.argv[1])):
    print("%.6f" % time.time(), flush=True)
    time.sleep(random.uniform(0.2, 0.5))
"""


# -- statistics and counters ------------------------------------------------------------------------------

def summary(values: list[float]) -> dict:
    """median, p95 (nearest rank), min, max, n."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    p95 = ordered[max(0, -(-95 * len(ordered) // 100) - 1)]
    return {"median": round(statistics.median(ordered), 4), "p95": round(p95, 4), "min": round(ordered[0], 4),
            "max": round(ordered[-1], 4), "n": len(ordered)}


class ChannelCounter:
    """SSH session channels this process opens, counted in paramiko: one layer below HostClient's counter."""

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> None:
        import paramiko

        original = paramiko.Transport.open_session

        def counted(transport, *args, **kwargs):
            self.count += 1
            return original(transport, *args, **kwargs)

        paramiko.Transport.open_session = counted


class SshdLog:
    """Commands sshd started, from its own log (VERBOSE: one "Starting session: command" line each)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def sessions(self) -> int:
        return self.path.read_text(errors="replace").count("Starting session: command")


@dataclass
class Sample:
    """One timed operation and what it cost in round trips and bytes (None where not observable)."""

    seconds: float
    channels: int = 0
    sshd_sessions: int = 0
    round_trips: int | None = None
    traffic: dict | None = None


@dataclass
class Route:
    """One way to reach one login: an ssh_config alias, and the proxy in between (None: direct)."""

    login: str
    name: str
    alias: str
    root: Path
    proxy: LatencyProxy | None = None
    delay: float = 0.0

    @property
    def host(self) -> dict:
        return {"address": self.alias, "root": str(self.root)}

    @property
    def label(self) -> str:
        return f"{self.login}/{self.name}"


@dataclass
class Meters:
    channels: ChannelCounter
    sshd_log: SshdLog
    ssh_config: Path


def measure(meters: Meters, route: Route, action) -> tuple[Sample, object]:
    """Run action() once; return its wall time with the channel, sshd-session and proxy-traffic deltas."""
    channels, sessions = meters.channels.count, meters.sshd_log.sessions()
    traffic = route.proxy.traffic.snapshot() if route.proxy else None
    start = time.perf_counter()
    value = action()
    seconds = time.perf_counter() - start
    sample = Sample(seconds, meters.channels.count - channels, meters.sshd_log.sessions() - sessions)
    if traffic is not None:
        sample.traffic = asdict(route.proxy.traffic.snapshot() - traffic)
    return sample, value


def samples_summary(samples: list[Sample]) -> dict:
    out = {"seconds": summary([s.seconds for s in samples]),
           "channels": summary([s.channels for s in samples]),
           "sshd_sessions": summary([s.sshd_sessions for s in samples])}
    if samples and samples[0].round_trips is not None:
        out["round_trips"] = summary([s.round_trips for s in samples])
    if samples and samples[0].traffic is not None:
        for key in ("exchanges", "bytes_up", "bytes_down", "connections"):
            out[key] = summary([s.traffic[key] for s in samples])
        out["bytes_total"] = summary([s.traffic["bytes_up"] + s.traffic["bytes_down"] for s in samples])
    return out


# -- set-up: sshd, proxies, ssh_config aliases, host roots ------------------------------------------------

def start_verbose_sshd() -> sshd.SshHost:
    """tests.hosts.sshd's server, with LogLevel VERBOSE so that sshd logs every command it starts."""
    plain = sshd.sshd_config_text
    sshd.sshd_config_text = lambda *args: plain(*args) + "LogLevel VERBOSE\n"
    try:
        return sshd.start_sshd()
    finally:
        sshd.sshd_config_text = plain


def alias_block(alias: str, port: int, user: str, host: sshd.SshHost, known_hosts: Path) -> str:
    return "\n".join([
        f"Host {alias}", f"    HostName {host.address}", f"    Port {port}", f"    User {user}",
        f"    IdentityFile {host.key_path}", "    IdentitiesOnly yes", f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes", "    BatchMode yes",
        "    ConnectTimeout 10", "    LogLevel ERROR", ""])


def write_ssh_config(work: Path, host: sshd.SshHost, ports: dict[str, int]) -> Path:
    """One alias per (login, route); the proxies' ports are known_hosts entries for the same host key."""
    known_hosts = work / "known_hosts"
    known_hosts.write_text("".join(sshd.known_hosts_line(port, host.host_key) for port in ports.values()))
    blocks = [alias_block(f"bench-{login}-{route}", port, user, host, known_hosts)
              for login, user in LOGINS.items() for route, port in ports.items()]
    path = work / "ssh_config"
    path.write_text("\n".join(blocks))
    return path


def host_root(work: Path, login: str) -> Path:
    """The host-side ROOT for one login: a dir under /tmp (outside sshd's private mounts) it owns."""
    root = work / f"root-{login}"
    root.mkdir()
    shutil.chown(root, user=LOGINS[login], group=LOGINS[login])
    return root


# -- 1. submit-to-detached --------------------------------------------------------------------------------

@dataclass
class SubmitJob:
    spec: Path
    payload: list[str]
    job_ids: list[str] = field(default_factory=list)
    openssh_runs: int = 0


def prepare_submit(work: Path, route: Route) -> SubmitJob:
    directory = work / f"submit-{route.login}-{route.name}"
    directory.mkdir()
    os.chmod(directory, 0o777)  # the OpenSSH baseline writes its logs here as the login user
    payload = python_payload(directory, "payload.py", SHORT_PAYLOAD)
    spec = write_job(directory / "job.yaml", Target("ssh", route.host, route.root, {}), command=payload,
                     name="bench submit", max_runtime="5m", grace="2s")
    return SubmitJob(spec, payload)


def submit_api(job: SubmitJob, store: Store) -> int:
    done = controller.submit(str(job.spec), [], store=store, progress=lambda _message: None)
    job.job_ids.append(done.job_id)
    return done.round_trips


def submit_cli(job: SubmitJob) -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "submit", str(job.spec), "--json"],
                          capture_output=True, cwd=REPO, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"runner submit failed: {done.stderr.decode()[-2000:]}")
    job.job_ids.append(json.loads(done.stdout)["job_id"])


def submit_openssh(job: SubmitJob, route: Route, ssh_config: Path) -> None:
    """The hand-written equivalent: one ssh command that backgrounds the payload and prints its pid."""
    job.openssh_runs += 1
    log = job.spec.parent / f"openssh-{job.openssh_runs}.log"
    command = f"nohup {' '.join(job.payload)} >{log} 2>&1 </dev/null & echo $!"
    done = subprocess.run(["ssh", "-F", str(ssh_config), route.alias, command], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise RuntimeError(f"ssh baseline failed ({done.returncode}): {done.stdout!r} {done.stderr!r}")


def bench_submit(meters: Meters, route: Route, job: SubmitJob, store: Store, runs: int) -> dict:
    """Interleaved (api, cli, openssh) rounds, after one warm-up round that also uploads the payload bundle."""
    methods = {
        "runner_api": lambda: submit_api(job, store),
        "runner_cli": lambda: submit_cli(job),
        "openssh": lambda: submit_openssh(job, route, meters.ssh_config),
    }
    samples: dict[str, list[Sample]] = {name: [] for name in methods}
    for round_index in range(runs + 1):
        for name, action in methods.items():
            sample, round_trips = measure(meters, route, action)
            sample.round_trips = round_trips if name == "runner_api" else None
            if round_index > 0:
                samples[name].append(sample)
    result = {name: samples_summary(found) for name, found in samples.items()}
    result["runner_api_phases"] = submit_phases(meters, route, job, store, runs)
    for name in ("runner_api", "runner_cli"):
        result[f"ratio_{name}_to_openssh"] = round(
            result[name]["seconds"]["median"] / result["openssh"]["seconds"]["median"], 2)
    return result


def submit_phases(meters: Meters, route: Route, job: SubmitJob, store: Store, runs: int) -> dict:
    """Where a submit's time goes: its two host calls, timed one by one over an already-open connection
    (connection set-up is the exec floor's `connect_and_true` less its `true`)."""
    spec = load_spec(str(job.spec), [])
    client = controller.connect(route.host)
    samples: dict[str, list[Sample]] = {"preflight": [], "start": []}
    try:
        client.status([])  # opens the connection
        for index in range(runs):
            job_id = f"bench-phases-{route.login}-{route.name}-{index}"
            wire = spec.to_wire(job_id, 0, None)
            samples["preflight"].append(measure(meters, route, lambda: client.preflight(wire))[0])
            samples["start"].append(measure(meters, route, lambda: client.start(wire))[0])
            store.save(JobRecord(job_id=job_id, name=spec.name, host=route.host, spec_path=str(job.spec),
                                 submitted_at=time.time()))
            job.job_ids.append(job_id)
    finally:
        client.transport.close()
    return {name: samples_summary(found) for name, found in samples.items()}


# -- 2. tail poll on a 1 GiB log --------------------------------------------------------------------------

def start_big_log_job(work: Path, route: Route, store: Store) -> str:
    """A job whose output.log holds 1 GiB of real bytes (written by the payload), then sleeps."""
    directory = work / f"biglog-{route.login}"
    directory.mkdir()
    command = ["sh", "-c", f"head -c {GIB} /dev/zero; exec sleep 1800"]
    spec = write_job(directory / "job.yaml", Target("ssh", route.host, route.root, {}), command=command,
                     name="bench big log", max_runtime="40m", grace="2s")
    job_id = controller.submit(str(spec), [], store=store, progress=lambda _message: None).job_id
    log = route.root / "jobs" / job_id / "output.log"
    wait_until(lambda: log.exists() and log.stat().st_size >= GIB, timeout=120, what=f"1 GiB in {log}")
    record = store.load(job_id)
    record.cursor = log.stat().st_size  # the cursor at the end: a poll that finds no new bytes
    store.save(record)
    return job_id


def point_record_at(store: Store, job_id: str, route: Route) -> None:
    """The same job reached through another route (only this bench's private store is changed)."""
    record = store.load(job_id)
    record.host = route.host
    store.save(record)


def tail_cli(job_id: str) -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "tail", job_id], capture_output=True, cwd=REPO,
                          timeout=60)
    if done.returncode != 75 or done.stdout:
        raise RuntimeError(f"tail of a running job with no new bytes: exit {done.returncode}, "
                           f"{len(done.stdout)} bytes, {done.stderr.decode()[-500:]}")


def tail_api(job_id: str, store: Store) -> None:
    outcome = controller.tail(job_id, store=store, out=_Discard(), follow=False, max_wait=0, from_start=False)
    if outcome.printed or outcome.terminal:
        raise RuntimeError(f"tail poll printed {outcome.printed} bytes / ended {outcome.state}")


def poll_open(client, job_id: str, offset: int) -> int:
    answer = client.logs(job_id, offset, max_bytes=controller.LOG_CHUNK, wait=0.0)
    if answer["data"] or answer["size"] != offset:
        raise RuntimeError(f"poll at the end found {len(answer['data'])} new bytes")
    return answer["size"]


def bench_tail_poll(meters: Meters, route: Route, counted: Route, job_id: str, store: Store, runs: int) -> dict:
    """Whole calls (CLI, in-process: connect + one poll), then polls over one open connection; bytes on
    the wire through `counted` (this route when it has a proxy, else a zero-delay proxy to the same host)."""
    point_record_at(store, job_id, route)
    offset = store.load(job_id).cursor
    result = {"log_bytes": offset, "bytes_measured_via": counted.label}
    result["runner_cli"] = samples_summary([measure(meters, route, lambda: tail_cli(job_id))[0] for _ in range(runs)])
    result["runner_api"] = samples_summary([measure(meters, route, lambda: tail_api(job_id, store))[0]
                                            for _ in range(runs)])
    result["open_connection"] = polls_over_open_connection(meters, route, job_id, offset, runs)
    if counted is not route:
        result["open_connection_counted"] = polls_over_open_connection(meters, counted, job_id, offset, runs)
    return result


def polls_over_open_connection(meters: Meters, route: Route, job_id: str, offset: int, runs: int) -> dict:
    client = controller.connect(route.host)
    try:
        poll_open(client, job_id, offset)  # opens the connection: its set-up is not part of a poll
        return samples_summary([measure(meters, route, lambda: poll_open(client, job_id, offset))[0]
                                for _ in range(runs)])
    finally:
        client.transport.close()


class _Discard:
    def write(self, data: bytes) -> None:
        pass

    def flush(self) -> None:
        pass


# -- 3. follow latency ------------------------------------------------------------------------------------

class LineClock:
    """A tail sink that notes, for each complete line (a host timestamp), when it was printed here."""

    def __init__(self) -> None:
        self.pending = b""
        self.latencies: list[float] = []
        self.started = time.time()

    def write(self, data: bytes) -> None:
        now = time.time()
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            written = float(line)
            if written >= self.started:  # written while we were following
                self.latencies.append(now - written)

    def flush(self) -> None:
        pass


def bench_follow(meters: Meters, work: Path, route: Route, store: Store, lines: int) -> dict:
    directory = work / f"follow-{route.login}-{route.name}"
    directory.mkdir()
    spec = write_job(directory / "job.yaml", Target("ssh", route.host, route.root, {}),
                     command=python_payload(directory, "clock.py", CLOCK_PAYLOAD) + [str(lines)],
                     name="bench follow", max_runtime="5m", grace="2s")
    job_id = controller.submit(str(spec), [], store=store, progress=lambda _message: None).job_id
    clock = LineClock()
    calls = []
    deadline = time.monotonic() + lines * 0.6 + 60
    while time.monotonic() < deadline:
        sample, outcome = measure(meters, route, lambda: controller.tail(
            job_id, store=store, out=clock, follow=True, max_wait=50, from_start=False))
        calls.append(sample)
        if outcome.terminal:
            break
    return {"job_id": job_id, "lines": len(clock.latencies), "latency_s": summary(clock.latencies),
            "tail_calls": len(calls), "channels": sum(s.channels for s in calls),
            "sshd_sessions": sum(s.sshd_sessions for s in calls)}


# -- 4. status of 100 jobs --------------------------------------------------------------------------------

def clone_jobs(route: Route, template_id: str, count: int) -> list[str]:
    """`count` finished jobs on the host: copies of one real finished job's directory under new ids."""
    jobs = route.root / "jobs"
    ids = [f"bench-status-{index:03d}" for index in range(count)]
    for job_id in ids:
        if (jobs / job_id).exists():
            continue
        shutil.copytree(jobs / template_id, jobs / job_id)
        for name in ("status.json", "spec.json"):
            path = jobs / job_id / name
            path.write_text(json.dumps(dict(json.loads(path.read_text()), job_id=job_id)))
        shutil.chown(jobs / job_id, user=LOGINS[route.login], group=LOGINS[route.login])
        for path in (jobs / job_id).iterdir():
            shutil.chown(path, user=LOGINS[route.login], group=LOGINS[route.login])
    return ids


def status_store(work: Path, route: Route, template: Store, template_id: str, ids: list[str]) -> Path:
    """A store holding exactly the 100 jobs, so that `runner status` (all known jobs) asks for those."""
    path = work / f"state-status-{route.login}-{route.name}"
    store = Store(path)
    base = template.load(template_id)
    for job_id in ids:
        store.save(JobRecord(job_id=job_id, name=base.name, host=route.host, spec_path=base.spec_path,
                                        submitted_at=base.submitted_at, last_state=base.last_state))
    return path


def status_cli(state_dir: Path, count: int) -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "status", "--json"], capture_output=True, cwd=REPO,
                          timeout=60, env={**os.environ, "RUNNER_STATE_DIR": str(state_dir)})
    jobs = json.loads(done.stdout) if done.returncode == 0 else None
    if not isinstance(jobs, list) or len(jobs) != count:
        raise RuntimeError(f"runner status: exit {done.returncode}: {done.stderr.decode()[-500:]}")


def status_api(ids: list[str], store: Store) -> None:
    jobs = controller.status(ids, store=store)
    if len(jobs) != len(ids) or any(job["state"] not in contract.TERMINAL for job in jobs):
        raise RuntimeError(f"status of {len(ids)} jobs answered {len(jobs)}")


def bench_status(meters: Meters, route: Route, ids: list[str], state_dir: Path, runs: int) -> dict:
    own = Store(state_dir)
    return {"jobs": len(ids),
            "runner_api": samples_summary([measure(meters, route, lambda: status_api(ids, own))[0] for _ in range(runs)]),
            "runner_cli": samples_summary([measure(meters, route, lambda: status_cli(state_dir, len(ids)))[0]
                                           for _ in range(runs)])}


# -- fixed costs of one SSH command on this login ---------------------------------------------------------

def bench_exec_floor(meters: Meters, route: Route, runs: int) -> dict:
    """Connection set-up, and one command over an open connection: `true` (the login shell's start-up)
    and `python3 -c pass` (plus the interpreter's): the floor under every HostClient round trip."""
    transport = SshTransport(SshTarget(address=route.alias))
    try:
        first, _ = measure(meters, route, lambda: transport.run(["true"], deadline=Deadline(30)))
        out = {"connect_and_true": samples_summary([first])}
        for name, argv in (("true", ["true"]), ("python3_pass", ["python3", "-c", "pass"])):
            out[name] = samples_summary([measure(meters, route, lambda: transport.run(argv, deadline=Deadline(30)))[0]
                                         for _ in range(runs)])
        return out
    finally:
        transport.close()


# -- round trips, not CPU: the same operations directly and through the proxy, in pairs ------------------

@dataclass
class Fixture:
    """What one route's set left for the paired comparison: its submit job spec and its 100 status jobs."""

    route: Route
    submit_job: SubmitJob
    status_ids: list[str]
    status_store: Store


def one_command_on_new_connection(route: Route) -> None:
    transport = SshTransport(SshTarget(address=route.alias))
    try:
        transport.run(["true"], deadline=Deadline(30))
    finally:
        transport.close()


def paired_operations(meters: Meters, fixture: Fixture, client, store: Store, big_log_id: str) -> dict:
    """name -> (set-up outside the timing or None, the timed action) for one route."""
    route, offset = fixture.route, store.load(big_log_id).cursor
    return {
        "connect + one command": (None, lambda: one_command_on_new_connection(route)),
        "one command, open connection": (None, lambda: client.transport.run(["true"], deadline=Deadline(30))),
        "tail poll, open connection": (None, lambda: poll_open(client, big_log_id, offset)),
        "tail poll, runner API": (lambda: point_record_at(store, big_log_id, route),
                                  lambda: tail_api(big_log_id, store)),
        "submit, runner API": (None, lambda: submit_api(fixture.submit_job, store)),
        "submit, OpenSSH": (None, lambda: submit_openssh(fixture.submit_job, route, meters.ssh_config)),
        "status of 100, runner API": (None, lambda: status_api(fixture.status_ids, fixture.status_store)),
    }


def bench_round_trips_if_possible(meters: Meters, store: Store, state: dict, runs: int) -> dict:
    """For each login that ran both its direct and its proxy set."""
    out = {}
    for login in LOGINS:
        direct, proxied = state["fixtures"].get(f"{login}/direct"), state["fixtures"].get(f"{login}/proxy")
        if direct and proxied:
            print(f"[bench] {login}: direct vs proxy, paired …", file=sys.stderr, flush=True)
            out[login] = bench_round_trips(meters, store, state["big_log"][login], direct, proxied, runs)
    return out


def bench_round_trips(meters: Meters, store: Store, big_log_id: str, direct: Fixture, proxied: Fixture,
                      runs: int) -> dict:
    """Each operation alternately direct and through the proxy: load drifts out of the paired difference,
    which is then the network's share. implied_round_trips = difference / RTT (the proxy's TCP accept is
    local, so a real link adds one more RTT per new connection for the TCP handshake)."""
    rtt = 2 * proxied.route.delay
    clients = [controller.connect(fixture.route.host) for fixture in (direct, proxied)]
    try:
        for client in clients:
            client.status([])  # open both connections
        ops = [paired_operations(meters, fixture, client, store, big_log_id)
               for fixture, client in zip((direct, proxied), clients)]
        return {name: paired(meters, [direct.route, proxied.route], [found[name] for found in ops], runs, rtt)
                for name in ops[0]}
    finally:
        for client in clients:
            client.transport.close()


def paired(meters: Meters, routes: list[Route], actions: list[tuple], runs: int, rtt: float) -> dict:
    near, far = [], []
    for _ in range(runs):
        for route, (setup, action), found in zip(routes, actions, (near, far)):
            if setup:
                setup()
            found.append(measure(meters, route, action)[0])
    added = [b.seconds - a.seconds for a, b in zip(near, far)]
    return {"direct_s": summary([s.seconds for s in near]), "proxy_s": summary([s.seconds for s in far]),
            "added_s": summary(added), "implied_round_trips": round(statistics.median(added) / rtt, 1),
            "ssh_commands": statistics.median(s.sshd_sessions for s in far),
            "network_exchanges": statistics.median(s.traffic["exchanges"] for s in far)}


# -- one set, and the whole run ---------------------------------------------------------------------------

def run_set(meters: Meters, work: Path, route: Route, counted: Route, store: Store, state: dict, args) -> dict:
    """Everything for one route; `state` carries per-login jobs (1 GiB log, a finished job) across routes."""
    load_before = os.getloadavg()
    out: dict = {"route": route.label, "alias": route.alias, "delay_each_way_s": route.delay}
    out["exec_floor"] = bench_exec_floor(meters, route, args.runs)
    job = prepare_submit(work, route)
    out["submit"] = bench_submit(meters, route, job, store, args.runs)
    state["jobs"].extend(job.job_ids)
    if route.login not in state["big_log"]:
        state["big_log"][route.login] = start_big_log_job(work, route, store)
        state["jobs"].append(state["big_log"][route.login])
    out["tail_poll"] = bench_tail_poll(meters, route, counted, state["big_log"][route.login], store, args.runs)
    out["follow"] = bench_follow(meters, work, route, store, args.lines)
    state["jobs"].append(out["follow"]["job_id"])
    template_id = first_finished(job.job_ids, store)
    status_ids = clone_jobs(route, template_id, 100)
    state_dir = status_store(work, route, store, template_id, status_ids)
    out["status_100"] = bench_status(meters, route, status_ids, state_dir, args.runs)
    out["load_avg"] = {"before": load_before, "after": os.getloadavg()}
    state["fixtures"][route.label] = Fixture(route, job, status_ids, Store(state_dir))
    return out


def first_finished(job_ids: list[str], store: Store) -> str:
    """A submit job that has ended (they run 1 s), to serve as the template of the 100 status jobs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for job in controller.status(job_ids[:3], store=store):
            if job["state"] in contract.TERMINAL:
                return job["job_id"]
        time.sleep(0.5)
    raise RuntimeError(f"none of {job_ids[:3]} ended within 60 s")


def cancel_running(job_ids: list[str], store: Store) -> list[str]:
    """Cancel every job not yet terminal; return those cancelled."""
    cancelled = []
    for job in controller.status(sorted(set(job_ids)), store=store):
        if job["state"] not in contract.TERMINAL:
            controller.cancel(job["job_id"], store=store)
            cancelled.append(job["job_id"])
    return cancelled


def machine_facts() -> dict:
    ssh_version = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    import fabric
    import paramiko

    return {"cpus": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "openssh": ssh_version, "paramiko": paramiko.__version__,
            "fabric": fabric.__version__, "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE")
                                                                 * os.sysconf("SC_PHYS_PAGES") / GIB, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "controller_perf.json")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per measurement (after a warm-up)")
    parser.add_argument("--lines", type=int, default=55, help="timestamp lines in the follow-latency job")
    parser.add_argument("--delay", type=float, default=0.05, help="proxy delay each way, seconds")
    parser.add_argument("--sets", default="lean/direct,lean/proxy,root/direct",
                        help="comma-separated LOGIN/ROUTE (logins: lean, root; routes: direct, proxy)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    work = shared_tmpdir("runner-bench-")
    results = {"command": "python " + " ".join([os.path.relpath(__file__, REPO)] + sys.argv[1:]),
               "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_facts(),
               "load_avg_start": os.getloadavg(), "runs": args.runs, "sets": {}}
    host = start_verbose_sshd()
    store = Store(work / "state")
    state: dict = {"jobs": [], "big_log": {}, "fixtures": {}}
    try:
        with LatencyProxy(host.port, delay=args.delay) as proxy, LatencyProxy(host.port, delay=0.0) as counter:
            ports = {"direct": host.port, "proxy": proxy.port, "counted": counter.port}
            meters = Meters(ChannelCounter(), SshdLog(host.workdir / "sshd.log"), write_ssh_config(work, host, ports))
            meters.channels.install()
            os.environ.update(RUNNER_SSH_CONFIG=str(meters.ssh_config), RUNNER_STATE_DIR=str(store.root))
            roots = {login: host_root(work, login) for login in LOGINS}
            for label in args.sets.split(","):
                login, route_name = label.split("/")
                route = Route(login, route_name, f"bench-{login}-{route_name}", roots[login],
                              proxy if route_name == "proxy" else None, args.delay if route_name == "proxy" else 0.0)
                counted = route if route.proxy else Route(login, "counted", f"bench-{login}-counted", roots[login],
                                                          counter)
                print(f"[bench] {label} …", file=sys.stderr, flush=True)
                results["sets"][label] = run_set(meters, work, route, counted, store, state, args)
            results["round_trips_not_cpu"] = bench_round_trips_if_possible(meters, store, state, args.runs)
            for fixture in state["fixtures"].values():
                state["jobs"].extend(fixture.submit_job.job_ids)
            results["cancelled_at_end"] = cancel_running(state["jobs"], store)
    finally:
        host.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_end"] = os.getloadavg()
    results["duration_s"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({label: headline(found) for label, found in results["sets"].items()}, indent=1))
    return 0


def headline(found: dict) -> dict:
    """The numbers the targets are about, for the terminal."""
    return {"submit_api_s": found["submit"]["runner_api"]["seconds"]["median"],
            "submit_cli_s": found["submit"]["runner_cli"]["seconds"]["median"],
            "submit_openssh_s": found["submit"]["openssh"]["seconds"]["median"],
            "ratio_api": found["submit"]["ratio_runner_api_to_openssh"],
            "round_trips": found["submit"]["runner_api"]["round_trips"]["median"],
            "tail_poll_open_s": found["tail_poll"]["open_connection"]["seconds"]["median"],
            "tail_poll_api_s": found["tail_poll"]["runner_api"]["seconds"]["median"],
            "follow_p95_s": found["follow"]["latency_s"].get("p95"),
            "status_100_api_s": found["status_100"]["runner_api"]["seconds"]["median"]}


if __name__ == "__main__":
    sys.exit(main())
