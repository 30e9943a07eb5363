"""What a restorer acts on never comes from a file the payload can write. A payload rewrites its own status.json
as a live, healthy job that stopped nothing (state RUNNING, started_at 1, payload.started_at 1, service.stopped
false): no signal, nothing deleted. The guard must not take the supervisor for hung (its deadlines come from the
supervisor over a pipe, never from the file), and no restorer (the supervisor, the guard, ExecStopPost=, the
reaper) may take the stop for not owed (the host ledger says what is owed) nor clear the ledger entry while the
unit is down. On the confined systemd + sshd host; each case prints the seconds until the service serves again
(docs/reliability.md, "Hostile host-side input").
"""
from __future__ import annotations

import time

import pytest
import yaml

from tests.cli_helpers import pid_alive_on, run_cli, status, submit, wait_for, wait_terminal
from tests.harness.pace import Scale
from tests.harness.systemd_jobs import RECORDED_PRELUDE, gpu_job, host_events, host_status, target_for

pytestmark = pytest.mark.systemd

# argv[1]: "all" (state, deadlines and the stop forged) or "deadline" (started_at alone); argv[2]: "exit" (the
# payload then exits 0 after a few seconds) or "kill" (it SIGKILLs the supervisor and its guard, then waits).
FORGER = RECORDED_PRELUDE + """
forged = dict(status, state="RUNNING", started_at=1, payload=dict(status["payload"], started_at=1))
if sys.argv[1] == "all":
    forged["service"] = dict(status["service"], stopped=False)
print("forging", sys.argv[1], time.time(), flush=True)
for _ in range(12):  # kept forged for a while: the guard looks every 2 s
    with open(path, "w") as fh:
        json.dump(forged, fh)
    time.sleep(0.5)
if sys.argv[2] == "kill":
    print("ended", time.time(), flush=True)  # first: the unit's stop may end this process as soon as they die
    for who in ("guard", "supervisor"):
        os.kill(status[who]["pid"], signal.SIGKILL)
    time.sleep(600)
print("ended", time.time(), flush=True)
"""


def forging_job(work, host, what: str, then: str):
    script = work / "forger.py"
    script.write_text(FORGER)
    return gpu_job(work, host, stop="always", command=["python3", str(script), what, then], max_runtime="60s")


def forged_at(host, job_id: str, word: str = "forging"):
    """The epoch the payload forged its record at (from its own output), or None before; word "ended": when
    it exited or killed the supervisor and the guard."""
    out = host.ssh(["cat", f"/root/.runner/jobs/{job_id}/output.log"]).stdout
    line = next((line for line in out.splitlines() if line.startswith(word)), None)
    return float(line.split()[-1]) if line else None


def supervisor_and_guard_alive(host, job_id: str) -> list[bool]:
    """Whether the job's supervisor and guard are alive (their pids: the real ones, which the forgers keep)."""
    recorded = host_status(host, job_id)
    return [pid_alive_on(target_for(host), recorded[who]["pid"]) for who in ("supervisor", "guard")]


def serving(host) -> bool:
    return host.service_state() == "active" and host.health_status() == 200


def ledger_entries(host) -> str:
    return host.ssh(["sh", "-c", "ls /run/lock/runner-ledger-* 2>/dev/null; true"]).stdout.strip()


def serves_again_after(host, job_id: str, case: str, timeout: float, ended_within: float = 60) -> float:
    """Seconds from the payload's end (its exit, or its kills) until the unit is active and healthy, printed
    for docs/reliability.md."""
    wait_for(lambda: forged_at(host, job_id, "ended") is not None, timeout=ended_within, what="payload ended")
    wait_for(lambda: serving(host), timeout=timeout, what="service active and healthy")
    seconds = time.time() - forged_at(host, job_id, "ended")
    print("\nHOSTILE-INPUT %s: the service serves again %.1f s after the payload's end" % (case, seconds))
    return seconds


@pytest.mark.parametrize("what", ["all", "deadline"])
def test_a_forged_live_record_neither_kills_the_supervisor_nor_skips_the_restore(service_host, work, what):
    """The payload forges, then exits 0: the supervisor is never killed as hung, the job SUCCEEDS with the
    service restored by the supervisor itself, and the ledger entry is gone only then."""
    target = target_for(service_host)
    job_id = submit(target, forging_job(work, service_host, what, "exit"))
    wait_for(lambda: forged_at(service_host, job_id) is not None, timeout=Scale()(30),
             what="payload forged status.json")
    serves_again_after(service_host, job_id, "forged live record (%s), payload exits 0" % what, 90)
    job = wait_terminal(target, job_id, timeout=120)
    assert job["state"] == "SUCCEEDED" and "hard deadline" not in job["message"], job
    assert not [e for e in host_events(service_host, job_id) if "hung" in str(e.get("message"))]
    assert serving(service_host) and job["service"]["healthy"] is True and job["restored"] is True, job
    assert ledger_entries(service_host) == ""


@pytest.mark.parametrize("path", ["unit", "fork"])
def test_a_forged_record_then_both_killed_still_restores_from_the_ledger(service_host, work, path):
    """The payload forges "nothing stopped", then SIGKILLs the supervisor and the guard: ExecStopPost= (unit) or
    the reaper's restorer (fork: `runner status` reaps) must restore from the ledger, never clear it while
    the unit is down, and `runner status` must never say restored while it is."""
    if path == "fork":
        service_host.ssh(["sh", "-c", "mkdir -p /root/.runner && touch /root/.runner/launch-fork"], check=True)
    try:
        target = target_for(service_host)
        job_id = submit(target, forging_job(work, service_host, "all", "kill"))
        wait_for(lambda: forged_at(service_host, job_id) is not None, timeout=Scale()(30),
                 what="payload forged status.json")
        wait_for(lambda: not host_status(service_host, job_id).get("guard") or "ledger" in str(
            host_status(service_host, job_id).get("message")) or status(target, job_id)["state"] != "RUNNING",
            timeout=60, what="supervisor and guard gone")

        def claims_restored_while_down() -> bool:
            job = status(target, job_id)  # reaps (fork path)
            return job.get("restored") is True and not serving(service_host)

        deadline = time.monotonic() + 90
        while not serving(service_host) and time.monotonic() < deadline:
            assert not claims_restored_while_down(), (status(target, job_id), service_host.service_state())
            time.sleep(0.5)
        serves_again_after(service_host, job_id, "forged record, supervisor+guard SIGKILLed (%s path)" % path, 5)
        wait_for(lambda: status(target, job_id).get("restored") is True, timeout=30, what="settled")
        assert ledger_entries(service_host) == ""
        assert status(target, job_id)["state"] != "SUCCEEDED"
    finally:
        service_host.ssh(["rm", "-f", "/root/.runner/launch-fork"])


def test_restore_service_brings_back_a_unit_whose_job_forged_its_record(service_host, work, fork_path):
    """The manual lever against the same forged record (supervisor and guard killed, nobody reaps): it starts the
    unit; the job's restorer, started by the next `status`, then settles it from the ledger."""
    target, bound = target_for(service_host), Scale()
    job_id = submit(target, forging_job(work, service_host, "all", "kill"))
    wait_for(lambda: forged_at(service_host, job_id) is not None, timeout=bound(30), what="payload forged status.json")
    wait_for(lambda: forged_at(service_host, job_id, "ended") is not None, timeout=bound(30), what="payload's kills")
    wait_for(lambda: not any(supervisor_and_guard_alive(service_host, job_id)), timeout=bound(30),
             what="supervisor and guard dead")
    began = time.monotonic()
    done = run_cli(target, "restore-service", "--host", service_host.alias, "--unit", service_host.unit, "--health-url",
                   service_host.health_url, "--json")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert serving(service_host)
    print("\nHOSTILE-INPUT forged record, supervisor+guard SIGKILLed, `runner restore-service`: serving %.1f s "
          "after the call" % (time.monotonic() - began))
    wait_for(lambda: status(target, job_id).get("restored") is True, timeout=60, what="settled")
    assert ledger_entries(service_host) == "" and serving(service_host)


# argv[1]: a decoy's pid (the leader of a process group of its own, outside the job). Staged: the payload
# prints its staged line and waits for `go`; once the supervisor has recorded it running, it rewrites its
# status.json to name the decoy's group as its own (pid, pgid and start time: what a restorer checks), then
# SIGKILLs the guard and the supervisor.
STAGED_FORGER = """
import json, os, signal, sys, time
path = os.path.join(os.environ["RUNNER_JOB_DIR"], "status.json")
decoy = int(sys.argv[1])
text = open("/proc/%d/stat" % decoy).read()
start_time = int(text[text.rindex(")") + 2:].split()[19])
print(json.dumps({"event": "staged"}), flush=True)
sys.stdin.readline()  # go: the service is stopped
def forge():  # once the supervisor has recorded it running, with its guard's pid and its own
    status = json.load(open(path))
    if status.get("state") != "RUNNING" or (status.get("payload") or {}).get("pid") not in (os.getpid(), decoy) or \
            not all((status.get(who) or {}).get("pid") for who in ("guard", "supervisor")):
        return None
    with open(path, "w") as fh:
        json.dump(dict(status, payload=dict(status["payload"], pid=decoy, pgid=decoy, start_time=start_time)), fh)
    return status
deadline, status = time.time() + 30, None
while time.time() < deadline:
    status = forge() or status
    time.sleep(0.2)
    if status and (json.load(open(path)).get("payload") or {}).get("pid") == decoy:
        break
print("forging", time.time(), flush=True)
print("ended", time.time(), flush=True)  # first: the unit's stop may end this process as soon as they die
for who in ("guard", "supervisor"):
    os.kill(status[who]["pid"], signal.SIGKILL)
time.sleep(600)
"""


def test_a_staged_payload_cannot_point_the_restorer_at_another_process_group(service_host, work):
    """A staged payload starts before the stop, so its process group used to reach the restorers only through
    status.json: forged there to name an innocent group (pid, pgid and start time all matching it), the restorer
    killed that group. The supervisor now notes the staged payload in the ledger entry it writes before the
    stop; the restorer kills what the ledger names, and the decoy lives."""
    started = service_host.ssh(["sh", "-c", "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!"], check=True)
    decoy = started.stdout.strip()
    try:
        stat = service_host.ssh(["cat", f"/proc/{decoy}/stat"], check=True).stdout
        assert stat.rsplit(")", 1)[1].split()[2] == decoy  # the decoy leads a group of its own
        script = work / "staged_forger.py"
        script.write_text(STAGED_FORGER)
        path = gpu_job(work, service_host, stop="always", command=["python3", str(script), decoy],
                       max_runtime="60s")
        spec = yaml.safe_load(path.read_text())
        spec["payload"]["staged"] = True
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        target = target_for(service_host)
        job_id = submit(target, path)
        bound = Scale()  # the staging, the stop and the forging loop before the kills: a loaded machine's pace
        serves_again_after(service_host, job_id, "staged payload forged another group, supervisor+guard SIGKILLed",
                           bound(90), ended_within=bound(90))
        wait_for(lambda: status(target, job_id).get("restored") is True, timeout=bound(60), what="settled")
        assert forged_at(service_host, job_id) is not None
        assert service_host.ssh(["kill", "-0", decoy]).returncode == 0, "the restorer killed the decoy's group"
        assert ledger_entries(service_host) == "" and serving(service_host)
    finally:
        service_host.ssh(["kill", "-KILL", decoy])


# The payload replaces its status.json with a FIFO (an open for reading would block until a writer comes, for good)
# and, with argv[1] "kill", SIGKILLs the supervisor and the guard.
FIFO_MAKER = RECORDED_PRELUDE + """
os.unlink(path)
os.mkfifo(path)
print("forging fifo", time.time(), flush=True)
if sys.argv[1] == "kill":
    time.sleep(2)
    print("ended", time.time(), flush=True)  # first: the unit's stop may end this process as soon as they die
    for who in ("guard", "supervisor"):
        os.kill(status[who]["pid"], signal.SIGKILL)
time.sleep(600)
"""


@pytest.mark.parametrize("path", ["unit", "fork"])
def test_a_status_json_made_a_fifo_blocks_no_reader_and_no_restorer(service_host, work, path):
    """A FIFO where status.json was: every reader of the job's records opens without blocking and refuses what
    is not a regular file. `runner status` answers at once (the job's file cannot be read, said as such), and
    once the payload SIGKILLs the supervisor and the guard, ExecStopPost= (unit) or the reaper's restorer (fork)
    restores from the ledger. Before: the host's `status` blocked in open() until the controller's deadline
    ("host unreachable" after 55 s) and so did every restorer."""
    if path == "fork":
        service_host.ssh(["sh", "-c", "mkdir -p /root/.runner && touch /root/.runner/launch-fork"], check=True)
    try:
        target = target_for(service_host)
        script = work / "fifo_maker.py"
        script.write_text(FIFO_MAKER)
        job_id = submit(target, gpu_job(work, service_host, stop="always", command=["python3", str(script), "kill"],
                                        max_runtime="60s"))
        scale = Scale()
        wait_for(lambda: forged_at(service_host, job_id) is not None, timeout=scale(30), what="payload made the FIFO")
        bound = min(scale(15), 45)  # a blocked read lasts the command's whole deadline (55 s)
        began = time.monotonic()
        done = run_cli(target, "status", job_id, "--json")
        took = time.monotonic() - began
        assert took < bound, (took, done.stdout, done.stderr)
        assert b"unreachable" not in done.stdout, done.stdout
        wait_for(lambda: forged_at(service_host, job_id, "ended") is not None, timeout=scale(30), what="payload's kills")
        deadline = time.monotonic() + 90
        while not serving(service_host) and time.monotonic() < deadline:
            run_cli(target, "status", job_id, "--json")  # reaps (fork path): status.json unreadable, the ledger owed
            time.sleep(0.5)
        serves_again_after(service_host, job_id, "status.json made a FIFO, supervisor+guard SIGKILLed (%s path)"
                           % path, 5)
        wait_for(lambda: status(target, job_id).get("restored") is True, timeout=60, what="settled")
        assert ledger_entries(service_host) == ""
    finally:
        service_host.ssh(["rm", "-f", "/root/.runner/launch-fork"])
