"""A fleet's fan-out: host calls run at once up to `rollout.forks` (`--forks`), one after another with 1; the
spec is validated once for the run, not once per host; a dead host's calls end with the command's deadline.

Three plain loopback sshd (tests/hosts/sshd.py) with no service. Every `ssh` command the runner runs goes
through a timing wrapper (a shell script first on PATH that logs when each command began and ended, and
which supervisor call it carried, then runs the real /usr/bin/ssh): the overlap is read from those times.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import time
from pathlib import Path

import pytest
import yaml

from runner.deadline import ROUND_TRIP_ALLOWANCE_S
from tests.cli_helpers import Target, run_cli, wait_for
from tests.hosts._proc import shared_tmpdir
from tests.hosts.prereqs import missing_for_sshd, require
from tests.hosts.sshd import start_sshd

ALIASES = ("fan-a", "fan-b", "fan-c")
SILENT = "fan-silent"  # a listener that accepts and never answers

TIMING_SSH = r"""#!/bin/sh
# Each ssh command (not `ssh -G` or `-O`): "begin|end EPOCH HOST PID B64" in LOG, B64 the supervisor call.
for a in "$@"; do case "$a" in -G|-O) exec /usr/bin/ssh "$@";; esac; done
host=""; next=0
for a in "$@"; do if [ "$next" = 1 ]; then host=$a; break; fi; [ "$a" = "--" ] && next=1; done
for last in "$@"; do :; done
echo "begin $(date +%s.%N) $host $$ ${last##* }" >> LOG
sleep 0.3
/usr/bin/ssh "$@"; rc=$?
echo "end $(date +%s.%N) $host $$ -" >> LOG
exit $rc
"""


@pytest.fixture(scope="module")
def hosts():
    require(missing_for_sshd())
    started = []
    try:
        for _ in ALIASES:
            started.append(start_sshd())
        yield started
    finally:
        for host in started:
            host.stop()


@pytest.fixture
def silent_port():
    """127.0.0.1:PORT accepts connections (the kernel's backlog) and never sends a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def fanout_target(hosts, work: Path, *, silent_port: int | None = None, timed: bool = False) -> Target:
    blocks = [host.ssh_config.read_text().split("\n\n")[0].replace("Host testhost", f"Host {alias}", 1)
              for alias, host in zip(ALIASES, hosts)]
    if silent_port is not None:
        blocks.append(blocks[0].replace(f"Host {ALIASES[0]}", f"Host {SILENT}", 1)
                      .replace(f"Port {hosts[0].port}", f"Port {silent_port}"))
    config = work / "ssh_config"
    config.write_text("\n\n".join(blocks) + "\n")
    env = {"RUNNER_SSH_CONFIG": str(config)}
    if timed:
        (work / "bin").mkdir()
        wrapper = work / "bin" / "ssh"
        wrapper.write_text(TIMING_SSH.replace("LOG", str(work / "ssh.log")))
        wrapper.chmod(0o755)
        env["PATH"] = f"{work / 'bin'}:{os.environ['PATH']}"
    return Target("ssh", {}, work, env)


def fanout_spec(work: Path, addresses, **rollout) -> str:
    spec = {"name": "fanout", "host": {"address": list(addresses)}, "service": {"manager": "none"},
            "payload": {"command": ["sh", "-c", "sleep 0.5"]}, "limits": {"max_runtime": "1m", "grace": "2s"},
            "rollout": {"max_unavailable": len(addresses), **rollout}}
    path = work / "fanout.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def ssh_calls(log: Path) -> list[dict]:
    """Every timed ssh command: host, begin, end, and the supervisor call it carried (preflight, submit, …)."""
    calls: dict[str, dict] = {}
    for line in log.read_text().splitlines():
        edge, when, host, pid, payload = line.split(" ")
        if edge == "begin":
            words = base64.b64decode(payload).decode().split("\0")
            calls[pid] = {"host": host, "begin": float(when), "sub": words[4] if len(words) > 4 else "upload"}
        else:
            calls[pid]["end"] = float(when)
    return sorted(calls.values(), key=lambda c: c["begin"])


def submit(target: Target, spec: str, *args: str) -> tuple[dict, int]:
    done = run_cli(target, "submit", spec, "--json", "--max-wait", "60", *args)
    return json.loads(done.stdout), done.returncode


def test_with_forks_at_least_n_every_hosts_start_overlaps_the_others(hosts):
    work = shared_tmpdir("runner-fanout-")
    target = fanout_target(hosts, work, timed=True)
    run, rc = submit(target, fanout_spec(work, ALIASES, forks=len(ALIASES)))
    assert rc == 0 and run["state"] == "SUCCEEDED", run
    calls = ssh_calls(work / "ssh.log")
    # A job that stops no service goes to its submit with no preflight of its own; on a fresh host that
    # submit finds no bundle, which is uploaded, and the submit made again (the one that starts the job).
    for alias in ALIASES:
        subs = [c["sub"] for c in calls if c["host"] == alias]
        assert "status" in subs and subs[:subs.index("status")] in (["submit"], ["submit", "upload", "submit"]), subs
    starts = [[c for c in calls if c["host"] == alias and c["sub"] == "submit"][-1] for alias in ALIASES]
    print("starts (s after the first):", [(c["host"], round(c["begin"] - starts[0]["begin"], 2),
                                           round(c["end"] - starts[0]["begin"], 2)) for c in starts])
    assert max(c["begin"] for c in starts) < min(c["end"] for c in starts), starts  # all in flight at once


def test_forks_1_makes_one_host_call_at_a_time_in_list_order(hosts):
    work = shared_tmpdir("runner-fanout-1-")
    target = fanout_target(hosts, work, timed=True)
    run, rc = submit(target, fanout_spec(work, ALIASES), "--forks", "1")
    assert rc == 0 and run["state"] == "SUCCEEDED", run
    calls = ssh_calls(work / "ssh.log")
    for before, after in zip(calls, calls[1:]):
        assert after["begin"] >= before["end"], (before, after)  # never two at once
    first_calls = [next(c for c in calls if c["host"] == alias) for alias in ALIASES]
    assert first_calls == sorted(first_calls, key=lambda c: c["begin"]), calls  # the canary first


def test_the_spec_is_validated_once_for_the_run_not_per_host(hosts, monkeypatch):
    """In-process: load_spec (pydantic validation of the whole spec) counted over one fleet submit."""
    from runner.fleet import fleet
    from runner.spec import spec_load
    from runner.state.store import Store

    work = shared_tmpdir("runner-fanout-valid-")
    target = fanout_target(hosts, work)
    monkeypatch.setenv("RUNNER_SSH_CONFIG", target.env["RUNNER_SSH_CONFIG"])
    loads = []
    real = spec_load.load_spec
    monkeypatch.setattr(spec_load, "load_spec", lambda *a, **k: loads.append(a) or real(*a, **k))
    run = fleet.submit(fanout_spec(work, ALIASES), [], run_id=None, queue=False, store=Store(), max_wait=60,
                       progress=lambda _: None)
    assert run.state == "SUCCEEDED", run
    assert len(loads) <= 2, loads  # the run record's and the plan's: the same however many hosts


def our_ssh_clients(config: Path) -> list[str]:
    """The ssh client processes still running with this test's ssh_config (masters are titled `ssh: … [mux]`)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(config).encode() in argv and b"[mux]" not in argv[0]:
            found.append(f"{proc.name}: {b' '.join(argv).decode(errors='replace')}")
    return found


def test_a_host_that_never_answers_neither_holds_back_the_others_nor_outlives_the_deadline(hosts, silent_port):
    work = shared_tmpdir("runner-fanout-dead-")
    target = fanout_target(hosts, work, silent_port=silent_port)
    max_wait = 15.0
    began = time.monotonic()
    done = run_cli(target, "submit", fanout_spec(work, [SILENT, *ALIASES], forks=2), "--json",
                   "--max-wait", str(max_wait))
    took = time.monotonic() - began
    run = json.loads(done.stdout)
    by_host = {h["address"]: h for h in run["hosts"]}
    # With two forks, one held by the silent host, the others go through the second one, in the call.
    assert [by_host[a]["state"] for a in ALIASES] == ["SUCCEEDED"] * 3, by_host
    assert by_host[SILENT]["phase"] in ("pending", "skipped"), by_host
    assert done.returncode == (75 if by_host[SILENT]["phase"] == "pending" else 1), done.returncode
    assert took <= max_wait + ROUND_TRIP_ALLOWANCE_S + 10, took  # the CLI's own start-up under load
    config = Path(target.env["RUNNER_SSH_CONFIG"])  # its calls ended with the command (1 s to see them gone)
    wait_for(lambda: our_ssh_clients(config) == [], timeout=1.0, what="its ssh clients to end with the command")


def test_forks_grants_in_list_order_and_gives_up_at_the_deadline():
    """Forks alone: with one fork held, hosts 2, 0, 1 ask (in that order) and get it 0, 1, 2; a host whose
    deadline passes first gets False and makes no call."""
    import threading

    from runner.deadline import Deadline
    from runner.fleet.fleet import Forks

    forks, granted, order = Forks(1), [], []
    held = threading.Event()

    def holder() -> None:
        with forks.call(-1, Deadline(5)):
            held.set()
            stop = time.monotonic() + 10
            while len(forks.asking) < 3 and time.monotonic() < stop:  # until all three are asking
                time.sleep(0.01)

    def asker(index: int) -> None:
        with forks.call(index, Deadline(10)) as got:
            granted.append(got)
            order.append(index)

    first = threading.Thread(target=holder)
    first.start()
    held.wait()
    askers = []
    for index in (2, 0, 1):
        askers.append(threading.Thread(target=asker, args=(index,)))
        askers[-1].start()
    for thread in [first, *askers]:
        thread.join()
    assert order == [0, 1, 2] and granted == [True] * 3, order
    with forks.call(0, Deadline(5)):
        began = time.monotonic()
        with forks.call(1, Deadline(0.3)) as got:
            assert got is False and time.monotonic() - began < 2


def test_forks_with_a_one_host_spec_is_refused_before_any_host(tmp_path):
    spec = tmp_path / "one.yaml"
    spec.write_text(yaml.safe_dump({"name": "one", "host": {"address": "local"}, "service": {"manager": "none"},
                                    "payload": {"command": ["true"]}}))
    done = run_cli(Target("local", {}, tmp_path, {}), "submit", str(spec), "--forks", "4")
    assert done.returncode == 2 and b"--forks goes with a fleet" in done.stderr, done.stderr


def test_for_each_host_keeps_to_its_forks_and_each_hosts_error_is_its_own():
    import threading

    from runner.errors import TransportError
    from runner.fleet.fleet import for_each_host
    from runner.state.fleet_store import HostEntry

    entries = [HostEntry(f"h{i}", f"R.{i}") for i in range(5)]
    lock, now, peak = threading.Lock(), [0], [0]

    def call(entry):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.1)  # a call that lasts: calls of several hosts overlap
        with lock:
            now[0] -= 1
        if entry.address == "h3":
            raise TransportError("h3: cannot connect")
        return entry.job_id

    for forks, most in ((2, 2), (None, 5)):
        peak[0] = 0
        answers, errors = for_each_host(entries, call, forks)
        assert answers == {e.address: e.job_id for e in entries if e.address != "h3"} and list(errors) == ["h3"]
        assert peak[0] <= most and (forks is None or peak[0] == forks), (forks, peak)
