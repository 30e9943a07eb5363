"""Faults on a separate host (its own network namespace, real sshd + confined systemd + the dummy
inference unit), driven through the real CLI. Every case ends with the same checks (`assert_recovered`):
the service is active and healthy, status.json is terminal with `restored: true`, output.log is intact,
and the controller's next calls (`status`, `tail --from-start`) tell the truth. Each records a row for
docs/reliability.md.

Cases test_service.py already covers over loopback (exception crash, TERM-able hang, supervisor SIGTERM
and SIGKILL with the link up) are not repeated; here the fault strikes while the link is cut, so the host
must recover with no controller in reach.

Host files are read through /proc/<sshd pid>/root (the host's mount namespace), which works while its
link is cut. The host shares this machine's PID namespace, so pids in status.json are ours to signal;
`kill_checked` signals only a process whose command line names this test's job.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from remote_payload.contract import TERMINAL
from remote_payload.host.processes import proc_stat
from runner.deadline import ROUND_TRIP_ALLOWANCE_S
from runner.remote.host import LAUNCH
from tests.case_report import record
from tests.cli_helpers import REPO, Target, python_payload, run_cli, submit, wait_for, write_job
from tests.hosts.prereqs import cgroup2_root

pytestmark = pytest.mark.netns

HOST_ROOT = "/root/.runner"
CONNECT_TIMEOUT = "3s"  # spec host.connect_timeout: a refused connect costs 3 s, not the default 10
HOLD = str(Path(__file__).parents[1] / "hosts" / "hold_gpu.py")

TICKER = """
import os, sys, time
gate, i = sys.argv[1], 0
while not os.path.exists(gate):
    print("line %06d" % i, flush=True)
    i += 1
    time.sleep(0.1)
print("end", flush=True)
"""
# Prints, then waits for the test's gate: the fault can then be timed against a known log.
GATED = """
import os, sys, time
print("working", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("gate open", flush=True)
"""
SEGFAULT = """
import ctypes, os, sys, time
print("working", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("crashing now", flush=True)
ctypes.string_at(0)
"""
DEAF_HANG = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("hanging, deaf to SIGTERM", flush=True)
while True:
    time.sleep(1)
"""
SLEEPER = """
import time
print("working", flush=True)
time.sleep(600)
"""
COUNTED = """
import os, sys, time
with open(sys.argv[1], "a") as fh:
    fh.write("ran\\n")
print("started", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
print("done", flush=True)
"""
FILLER = """
import sys
print("filling the disk", flush=True)
block = ("x" * 1023 + "\\n") * 64
while True:
    sys.stdout.write(block)
    sys.stdout.flush()
"""


# -- the host, seen from here -----------------------------------------------------------------------------

def target_for(host, ssh_config: Path | None = None, **host_extra) -> Target:
    spec_host = {"address": host.alias, "connect_timeout": CONNECT_TIMEOUT, **host_extra}
    return Target("ssh", spec_host, Path(host_extra.get("root", HOST_ROOT)),
                  {"RUNNER_SSH_CONFIG": str(ssh_config or host.ssh_config)}, host)


def on_host(host, path: str) -> Path:
    """`path` inside the host's mount namespace, reachable from here whatever its link does."""
    return Path(f"/proc/{host.process.pid}/root") / path.lstrip("/")


def job_file_on_host(host, job_id: str, name: str, root: str = HOST_ROOT) -> Path:
    return on_host(host, f"{root}/jobs/{job_id}/{name}")


def host_status(host, job_id: str, root: str = HOST_ROOT) -> dict:
    try:
        return json.loads(job_file_on_host(host, job_id, "status.json", root).read_text())
    except FileNotFoundError:
        return {}


def wait_host_status(host, job_id: str, predicate, timeout: float = 60, what: str = "", root: str = HOST_ROOT) -> dict:
    wait_for(lambda: predicate(host_status(host, job_id, root)), timeout=timeout, what=what or f"{job_id} on host")
    return host_status(host, job_id, root)


def finished(status: dict) -> bool:
    return status.get("state") in TERMINAL and status.get("restored") is True


def health_inside(host) -> int:
    """HTTP status of the unit's health URL from inside the host's network namespace (works during a cut)."""
    probe = ("import sys, urllib.request\ntry:\n print(urllib.request.urlopen(sys.argv[1], timeout=2).status)\n"
             "except Exception:\n print(0)\n")
    done = subprocess.run(["nsenter", f"--net=/run/netns/{host.link.netns}", sys.executable, "-c", probe,
                           host.health_url], capture_output=True, text=True, timeout=20)
    return int(done.stdout.strip() or 0)


def command_line(pid: int) -> str:
    """pid's command line, with the launch line's base64 word decoded (a host call runs the supervisor
    in the interpreter of `python3 -S -c LAUNCH WORD`: its subcommand and job id are inside WORD)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").rstrip("\0").split("\0")
    if LAUNCH in argv and argv[-1] != LAUNCH:
        argv += base64.b64decode(argv[-1]).decode("utf-8", "replace").split("\0")[1:]
    return " ".join(argv)


def kill_checked(pid: int, needle: str, sig: signal.Signals) -> None:
    """Signal pid only if its command line names `needle` (this test's job id or script)."""
    cmdline = command_line(pid)
    assert needle in cmdline, f"pid {pid} is not ours: {cmdline!r}"
    os.kill(pid, sig)


def service_section(host, stop: str = "always") -> dict:
    return {"manager": "systemd", "unit": host.unit, "stop": stop, "health_url": host.health_url,
            "health_timeout": "30s"}


def job_spec(work: Path, host, command: list[str], *, target: Target | None = None, gpu: dict | None = None,
             stop: str = "always", max_runtime: str = "2m", grace: str = "2s") -> Path:
    return write_job(work / "job.yaml", target or target_for(host), command=command, max_runtime=max_runtime,
                     grace=grace, service=service_section(host, stop), gpu=gpu)


def cli_process(target: Target, *args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner", *args], stdout=stdout, stderr=subprocess.PIPE,
                            env={**os.environ, **target.env}, cwd=REPO)


# -- the checks every case ends with ----------------------------------------------------------------------

def assert_recovered(host, target: Target, job_id: str, case: str, expected: str, *, note: str = "",
                     root: str = HOST_ROOT) -> dict:
    """Service active + healthy, status.json terminal + restored, `status` and `tail` agree with the host."""
    done = run_cli(target, "status", job_id, "--json")
    answered = done.stdout.strip().startswith(b"{") and b'"job_id"' in done.stdout
    job = json.loads(done.stdout) if answered else host_status(host, job_id, root)
    now, health = host.service_state(), host.health_status()
    record(case, job, expected=expected, service_now=now, healthy=(now == "active" and health == 200), note=note)
    # status exits by the job's state: 0 SUCCEEDED, 1 any other end
    assert answered and done.returncode == (0 if expected == "SUCCEEDED" else 1), (done.returncode, done.stdout,
                                                                                    done.stderr.decode())
    assert job["state"] == expected, job
    on_disk = host_status(host, job_id, root)
    assert on_disk["state"] == expected and on_disk["restored"] is True, on_disk
    assert now == "active" and health == 200, f"service {now}, health {health}"
    assert job["service"]["now"] == "active" and job["service"]["healthy"] is True, job["service"]
    log_path = job_file_on_host(host, job_id, "output.log", root)
    log = log_path.read_bytes() if log_path.exists() else b""  # absent when the payload never started
    again = run_cli(target, "tail", job_id, "--from-start")
    assert again.stdout == log, "tail --from-start differs from the host's output.log"
    assert again.returncode == (0 if expected == "SUCCEEDED" else 1), again.stderr.decode()
    return job


def assert_ticker_log(log: bytes) -> None:
    """The ticker's log is intact: lines 0..n in order, none missing or doubled, then "end"."""
    lines = log.decode().splitlines()
    assert lines[-1] == "end", lines[-3:]
    assert lines[:-1] == ["line %06d" % i for i in range(len(lines) - 1)]


# -- link cuts while the controller is talking ------------------------------------------------------------

MAX_WAIT = 4.0
OUTAGE_S = 30.0


@pytest.mark.slow(seconds=50)
def test_link_cut_while_tail_follows_then_resumes_exactly_once(netns_host, work):
    """A 30 s outage while `tail -f --max-wait 4` streams: the tail gives up within its max-wait plus one
    round trip's allowance (exit 3, or 75 if its last answer arrived), never blocking for the outage; after
    the link returns, the next tails resume at the cursor and every byte arrives exactly once."""
    target, gate = target_for(netns_host), work / "gate"
    job_id = submit(target, job_spec(work, netns_host, python_payload(work, "ticker.py", TICKER) + [str(gate)]))
    wait_host_status(netns_host, job_id, lambda s: s.get("state") == "RUNNING", what="running")
    t0 = time.monotonic()
    follower = cli_process(target, "tail", job_id, "-f", "--max-wait", str(MAX_WAIT))
    # it is streaming: its first bytes came through (read from the pipe itself: communicate reads on from there)
    streamed = os.read(follower.stdout.fileno(), 1 << 16)
    netns_host.cut()
    cut_at = time.monotonic()
    try:
        rest, err = follower.communicate(timeout=MAX_WAIT + ROUND_TRIP_ALLOWANCE_S + 30)
        first = streamed + rest
        returned_after = time.monotonic() - t0
        time.sleep(max(0.0, cut_at + OUTAGE_S - time.monotonic()))  # the outage goes on after tail returned
    finally:
        netns_host.restore()
    cut_for = time.monotonic() - cut_at
    assert follower.returncode in (75, 3), err.decode()
    # --max-wait, one round trip's allowance, and the CLI's own start-up (imports) under load
    assert returned_after <= MAX_WAIT + ROUND_TRIP_ALLOWANCE_S + 3, f"tail took {returned_after:.1f}s"
    assert first.startswith(b"line 000000\n")
    resumed = run_cli(target, "tail", job_id, "-f", "--max-wait", "3")
    assert resumed.returncode == 75, resumed.stderr.decode()  # the job ran on through the outage
    gate.touch()
    final = run_cli(target, "tail", job_id, "-f", "--max-wait", "30")
    assert final.returncode == 0, final.stderr.decode()
    log = job_file_on_host(netns_host, job_id, "output.log").read_bytes()
    assert first + resumed.stdout + final.stdout == log  # every byte exactly once across the outage
    assert_ticker_log(log)
    assert_recovered(netns_host, target, job_id, f"link cut {cut_for:.0f}s during tail -f: exit "
                     f"{follower.returncode} after {returned_after:.0f}s, resumed, bytes exactly once", "SUCCEEDED")


def test_link_down_at_submit_creates_nothing_and_retry_runs_once(netns_host, work):
    target, gate, counter = target_for(netns_host), work / "gate", work / "runs"
    spec = job_spec(work, netns_host, python_payload(work, "counted.py", COUNTED) + [str(counter), str(gate)])
    netns_host.cut()
    try:
        refused = run_cli(target, "submit", str(spec), "--job-id", "cut-before.1", timeout=90)
    finally:
        netns_host.restore()
    assert refused.returncode == 3, refused.stderr.decode()
    assert not job_file_on_host(netns_host, "cut-before.1", "").exists()  # not at all
    retry = run_cli(target, "submit", str(spec), "--job-id", "cut-before.1", "--json")
    assert retry.returncode == 0 and json.loads(retry.stdout)["already"] is False, retry.stderr.decode()
    gate.touch()
    wait_host_status(netns_host, "cut-before.1", finished, what="finished")
    assert_recovered(netns_host, target, "cut-before.1", "link down at submit: exit 3, nothing created; "
                     "retry with the same --job-id runs once", "SUCCEEDED")
    assert counter.read_text() == "ran\n"


def host_process(host, needle: str) -> int | None:
    """The pid of a process of `host` whose command line contains `needle` (the host shares our PID
    namespace; only its cgroup is searched, so another test run's process with that command line is not
    taken for ours)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in command_line(int(entry.name)) \
                    and in_cgroup(int(entry.name), host.cgroup):
                return int(entry.name)
        except OSError:
            continue
    return None


def in_cgroup(pid: int, cgroup: Path) -> bool:
    """Whether `pid` lives in `cgroup` or below it (its cgroup2 line, "0::/PATH")."""
    relative = "/" + str(cgroup.relative_to(cgroup2_root()))
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            path = line[3:]
            return path == relative or path.startswith(relative + "/")
    return False


def cut_both_ways(host) -> None:
    """`cut` drops what arrives at the host; an answer the host sends would still get out. Drop that too."""
    host.cut()
    host.link.iptables("-A", "OUTPUT", "-o", host.link.inner_veth, "-j", "DROP")


def restore_both_ways(host) -> None:
    while host.link.iptables("-D", "OUTPUT", "-o", host.link.inner_veth, "-j", "DROP", check=False).returncode == 0:
        pass
    host.restore()


def poll_tightly(probe, what: str, timeout: float = 60):
    """Like wait_for, polling every millisecond (a host step lasting tens of ms must not be missed)."""
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)
    return found


def state_of(pid: int) -> str:
    """pid's state letter (/proc/PID/stat), "X" once it is gone."""
    fields = proc_stat(pid)
    return fields[0] if fields else "X"


def stop(pid: int) -> None:
    """SIGSTOP pid and wait until it is stopped (kill returns before a process running on another CPU is), or
    has ended."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    poll_tightly(lambda: state_of(pid) in "TtZX", what=f"pid {pid} stopped", timeout=10)


def carry_on(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def session_of(host, pid: int) -> int:
    """The sshd session process that carries pid's input and output: its nearest sshd ancestor (the host's)."""
    current = int(proc_stat(pid)[1])
    while Path(f"/proc/{current}/comm").read_text().strip() != "sshd":
        current = int(proc_stat(current)[1])
        assert current > 1, f"no sshd above pid {pid}"
    assert in_cgroup(current, host.cgroup), f"pid {current} is not the test host's"
    return current


def hold_the_answer(host, start: int, needle: str, claimed, what: str, timeout: float = 60) -> int:
    """Run `start` until `claimed()` holds, its answer kept on the host: `start` and its sshd session are
    stopped and let run in turn, never both at once, the session only until the claim (it forwards the
    request's stdin), `start` on to its end (its answer stays in the pipe to the stopped session). Returns
    the session, stopped: the caller cuts the link, then lets it go, and the answer goes into the void.
    Not a race against the host: polling beside a running `start` missed its claim-to-answer step (tens of ms)
    whenever this test was not scheduled for that long (a loaded 2-core CI machine)."""
    kill_checked(start, needle, signal.SIGSTOP)
    session = session_of(host, start)
    stop(session)
    try:
        deadline = time.monotonic() + timeout
        while not claimed():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            carry_on(session)
            time.sleep(0.001)
            stop(session)
            carry_on(start)
            time.sleep(0.001)
            stop(start)
        carry_on(start)
        poll_tightly(lambda: state_of(start) in "ZX", what="the host's start to answer and exit")
    except BaseException:
        carry_on(start)
        carry_on(session)
        raise
    return session


@pytest.mark.slow(seconds=65)
def test_link_cut_during_start_then_retry_with_same_id_is_safe(netns_host, work):
    """The link goes down while the host's `start` is answering: its answer is held on the host (the sshd
    session that carries it stopped) until `start` claimed the job dir and answered, then the link is cut
    and the session let go: the answer goes into the void. The cut lasts until that submit gives up (the
    call's read deadline fires); then the same submit is retried at once."""
    target, gate, counter = target_for(netns_host), work / "gate", work / "runs"
    spec = job_spec(work, netns_host, python_payload(work, "counted.py", COUNTED) + [str(counter), str(gate)])
    first = cli_process(target, "submit", str(spec), "--job-id", "cut-start.1", "--json")
    try:
        # `submit` is the host's preflight + start in one call (the start path of a cached submit)
        start = poll_tightly(lambda: host_process(netns_host, "submit --job-id cut-start.1"),
                             what="the host's start call")
        session = hold_the_answer(netns_host, start, "cut-start.1",
                                  job_file_on_host(netns_host, "cut-start.1", "status.json").exists,
                                  what="the claimed job dir")
        cut_both_ways(netns_host)
        os.kill(session, signal.SIGCONT)
        _out, err = first.communicate(timeout=120)
    finally:
        restore_both_ways(netns_host)
    assert first.returncode == 3, err.decode()  # the answer was lost: the controller cannot know
    assert job_file_on_host(netns_host, "cut-start.1", "status.json").exists()  # but the job exists
    retry = run_cli(target, "submit", str(spec), "--job-id", "cut-start.1", "--json")
    gate.touch()
    wait_host_status(netns_host, "cut-start.1", finished, what="finished")
    assert counter.read_text() == "ran\n"  # the job exists once: one run
    # The retry must adopt the running job (exit 0, already), not call it a stranger holding the host.
    assert retry.returncode == 0, f"retried submit of a running job: {retry.stderr.decode()}"
    answer = json.loads(retry.stdout)
    assert answer["job_id"] == "cut-start.1" and answer["already"] is True
    assert_recovered(netns_host, target, "cut-start.1", "link cut both ways during start: submit exit 3, job "
                     "exists once; same submit again adopts it", "SUCCEEDED")


# -- the controller killed --------------------------------------------------------------------------------

def test_controller_sigkill_mid_submit(netns_host, work):
    """SIGKILL the submit the moment the host claimed the job dir: the job runs once, the service comes
    back, and the user's next move (the same submit again) adopts the job instead of starting another."""
    target, gate, counter = target_for(netns_host), work / "gate", work / "runs"
    spec = job_spec(work, netns_host, python_payload(work, "counted.py", COUNTED) + [str(counter), str(gate)])
    job_dir = job_file_on_host(netns_host, "killed-submit.1", "")
    controller = cli_process(target, "submit", str(spec), "--job-id", "killed-submit.1")
    try:
        poll_tightly(job_dir.exists, what="the host to claim the job dir")  # `start` has not answered yet
    finally:
        controller.kill()
        controller.communicate()
    gate.touch()
    wait_host_status(netns_host, "killed-submit.1", finished, what="finished with no controller")
    retry = run_cli(target, "submit", str(spec), "--job-id", "killed-submit.1", "--json")
    assert retry.returncode == 0, retry.stderr.decode()
    assert json.loads(retry.stdout)["already"] is True
    assert_recovered(netns_host, target, "killed-submit.1", "controller SIGKILL mid-submit; same submit again "
                     "adopts the job", "SUCCEEDED")
    assert counter.read_text() == "ran\n"


def test_controller_sigkill_mid_tail_gives_that_calls_bytes_again(netns_host, work):
    """Killed while its long poll waits on the host (after printing the first part): the call did not end by
    itself, so the cursor stayed and the next tail prints the killed call's bytes again, then the rest."""
    target, gate = target_for(netns_host), work / "gate"
    job_id = submit(target, job_spec(work, netns_host, python_payload(work, "gated.py", GATED) + [str(gate)]))
    wait_host_status(netns_host, job_id, lambda s: s.get("state") == "RUNNING", what="running")
    printed = work / "first-tail.out"
    with open(printed, "wb") as sink:
        follower = cli_process(target, "tail", job_id, "-f", "--max-wait", "30", stdout=sink)
    try:
        wait_for(lambda: printed.read_bytes() == b"working\n", timeout=30, what="first part printed")
        polling = "logs --job-id %s --offset 0 --max" % job_id  # the streaming call: still on the host after it
        wait_for(lambda: host_process(netns_host, polling), timeout=30, what="its call still waiting on the host")
    finally:
        follower.kill()
        follower.communicate()
    gate.touch()
    rest = run_cli(target, "tail", job_id, "-f", "--max-wait", "30")
    assert rest.returncode == 0, rest.stderr.decode()
    assert printed.read_bytes() == b"working\n" and rest.stdout == b"working\ngate open\n"
    assert_recovered(netns_host, target, job_id, "controller SIGKILL mid-tail: next tail prints that call's bytes "
                     "again, then the rest", "SUCCEEDED")


# -- faults on the host while its link is cut -------------------------------------------------------------

def fault_while_cut(host, work: Path, script: str, inject, *, max_runtime: str = "2m", grace: str = "2s",
                    gpu: dict | None = None, wait_state: str = "RUNNING") -> tuple[Target, str, dict]:
    """Submit, wait for `wait_state`, cut the link, inject the fault, wait (reading the host's disk) until
    the job is terminal and restored, check the service from inside the host, restore the link."""
    target, gate = target_for(host), work / "gate"
    command = python_payload(work, "payload.py", script) + [str(gate)]
    job_id = submit(target, job_spec(work, host, command, gpu=gpu, max_runtime=max_runtime, grace=grace))
    running = wait_host_status(host, job_id, lambda s: s.get("state") == wait_state, what=wait_state)
    if wait_state == "RUNNING":  # every payload here prints first: fault a payload that is really under way
        log = job_file_on_host(host, job_id, "output.log")
        wait_for(lambda: log.exists() and log.stat().st_size > 0, what="the payload's first line")
    host.cut()
    try:
        inject(running, gate)
        final = wait_host_status(host, job_id, finished, what="terminal and restored during the cut")
        assert health_inside(host) == 200  # back while the link is still down: no controller needed
    finally:
        host.restore()
    return target, job_id, final


def test_payload_segfault_while_link_cut(netns_host, work):
    target, job_id, final = fault_while_cut(netns_host, work, SEGFAULT, lambda status, gate: gate.touch())
    assert (final["exit_code"], final["payload"]["signal"]) == (128 + signal.SIGSEGV, "SIGSEGV")
    assert_recovered(netns_host, target, job_id, "payload segfault (SIGSEGV) while the link is cut", "FAILED")
    assert job_file_on_host(netns_host, job_id, "output.log").read_bytes() == b"working\ncrashing now\n"


def test_payload_deaf_to_term_hangs_past_deadline_while_link_cut(netns_host, work):
    target, job_id, final = fault_while_cut(netns_host, work, DEAF_HANG, lambda status, gate: None,
                                            max_runtime="3s", grace="1s")
    assert (final["exit_code"], final["payload"]["signal"]) == (128 + signal.SIGKILL, "SIGKILL")
    assert_recovered(netns_host, target, job_id, "payload ignores SIGTERM, hangs past max_runtime (link cut): "
                     "KILL after grace", "TIMED_OUT")
    assert job_file_on_host(netns_host, job_id, "output.log").read_bytes() == b"hanging, deaf to SIGTERM\n"


def test_payload_oom_like_sigkill_while_link_cut(netns_host, work):
    def oom_kill(status, gate):
        kill_checked(status["payload"]["pid"], str(work), signal.SIGKILL)

    target, job_id, final = fault_while_cut(netns_host, work, SLEEPER, oom_kill)
    assert (final["exit_code"], final["payload"]["signal"]) == (128 + signal.SIGKILL, "SIGKILL")
    assert_recovered(netns_host, target, job_id, "payload SIGKILLed (OOM-like) while the link is cut", "FAILED")
    assert job_file_on_host(netns_host, job_id, "output.log").read_bytes() == b"working\n"


def test_supervisor_sigterm_while_link_cut(netns_host, work):
    def term_supervisor(status, gate):
        kill_checked(status["supervisor"]["pid"], status["job_id"], signal.SIGTERM)

    target, job_id, final = fault_while_cut(netns_host, work, SLEEPER, term_supervisor)
    assert "SIGTERM" in final["message"]
    assert_recovered(netns_host, target, job_id, "supervisor SIGTERM while the link is cut", "FAILED")


def test_supervisor_sigkill_while_link_cut_guard_restores(netns_host, work):
    def kill_supervisor(status, gate):
        kill_checked(status["supervisor"]["pid"], status["job_id"], signal.SIGKILL)

    target, job_id, final = fault_while_cut(netns_host, work, SLEEPER, kill_supervisor)
    assert "guard" in final["message"], final["message"]
    assert not Path(f"/proc/{final['payload']['pid']}").exists()  # the payload's group went with it
    assert_recovered(netns_host, target, job_id, "supervisor SIGKILL while the link is cut: guard restores",
                     "FAILED")


def test_gpu_memory_never_drains_while_link_cut(netns_host, work):
    """A stray process holds 12 GiB of a 20 GiB card for good: the job gives up after drain_timeout,
    names the holder, and the service it stopped comes back."""
    netns_host.set_gpu(total_mib=20000)
    # Started from here: the host shares our PID namespace, and the stand-in reads its state dir.
    holder = subprocess.Popen([sys.executable, HOLD, "12000", "120"], stdout=subprocess.DEVNULL,
                              env={**os.environ, "RUNNER_FAKE_GPU_DIR": str(netns_host.gpu_dir)})
    try:
        wait_for(lambda: netns_host.gpu_used_mib() >= 16000, what="holder visible to nvidia-smi")
        gpu = {"devices": [0], "min_free_mib": 9000, "drain_timeout": "3s"}
        target, job_id, final = fault_while_cut(netns_host, work, GATED, lambda status, gate: None, gpu=gpu,
                                                wait_state="DRAINING")
    finally:
        holder.terminate()
        holder.wait(timeout=10)
    assert str(holder.pid) in final["message"], final["message"]
    assert_recovered(netns_host, target, job_id, "GPU memory never drains (stray holder), link cut: "
                     "holder named", "FAILED")


# -- the host itself in trouble ---------------------------------------------------------------------------

SMALL_ROOT = "/run/runner-small-root"


@pytest.fixture
def small_root(netns_host):
    """A 4 MiB tmpfs as the job root (the host code takes ~1.5 MiB of it), mounted inside the host's mount namespace
    only."""
    netns_host.ssh(["mkdir", "-p", SMALL_ROOT], check=True)
    netns_host.ssh(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", SMALL_ROOT], check=True)
    yield SMALL_ROOT
    netns_host.ssh(["umount", "-l", SMALL_ROOT])


def test_disk_full_for_the_log_fails_cleanly_and_restores(netns_host, work, small_root):
    """The payload writes until the job root's filesystem is full (ENOSPC)."""
    target = target_for(netns_host, root=small_root)
    command = python_payload(work, "filler.py", FILLER)
    job_id = submit(target, write_job(work / "job.yaml", target, command=command, max_runtime="1m", grace="2s",
                                      service=service_section(netns_host)))
    deadline = time.monotonic() + 30  # no raise on timeout: the checks below say what is wrong, and record it
    while host_status(netns_host, job_id, small_root).get("state") not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
    job = assert_recovered(netns_host, target, job_id, "disk full (ENOSPC) for the log: payload fails, "
                           "service restored", "FAILED", root=small_root)
    log = job_file_on_host(netns_host, job_id, "output.log", small_root).read_bytes()
    assert log.startswith(b"filling the disk\n") and len(log) > 512 * 1024
    assert set(log[len(b"filling the disk\n"):]) <= set(b"x\n")  # what was written is intact, nothing else
    assert job["exit_code"] != 0


def test_host_key_changed_between_submit_and_tail(netns_host, work):
    """The host's key no longer matches known_hosts (as after a reinstall or a man in the middle): every
    call is refused with exit 3 before any command runs; the job is unharmed and finishes; with the right
    key back, tail prints the whole log."""
    target, gate = target_for(netns_host), work / "gate"
    job_id = submit(target, job_spec(work, netns_host, python_payload(work, "gated.py", GATED) + [str(gate)]))
    # RUNNING first (submit answers while the service is still being stopped), so the check after the
    # refused calls can only fail if one of them reached the host.
    wait_host_status(netns_host, job_id, lambda s: s.get("state") == "RUNNING", what="running")
    changed = work / "ssh_config.changed-key"
    changed.write_text(netns_host.ssh_config.read_text().replace(str(netns_host.known_hosts),
                                                                 str(netns_host.wrong_known_hosts())))
    wrong_key = {"RUNNER_SSH_CONFIG": str(changed)}
    for args in (["tail", job_id, "-f", "--max-wait", "10"], ["status", job_id], ["cancel", job_id]):
        refused = run_cli(target, *args, env=wrong_key)
        assert refused.returncode == 3 and b"CHANGED" in refused.stderr, (args, refused.stderr.decode())
        assert refused.stdout == b""
    assert host_status(netns_host, job_id)["state"] == "RUNNING"  # the refused cancel did not reach it
    gate.touch()
    wait_host_status(netns_host, job_id, finished, what="finished")
    tail = run_cli(target, "tail", job_id, "-f", "--max-wait", "30")
    assert tail.returncode == 0 and tail.stdout == b"working\ngate open\n", tail.stderr.decode()
    assert_recovered(netns_host, target, job_id, "host key changed between submit and tail: refused (exit 3), "
                     "job unharmed", "SUCCEEDED")
