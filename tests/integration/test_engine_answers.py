"""An engine that answers badly (tests/hosts/engine_standin.py --misbehave, a labelled stand-in): every way its
HTTP answer can go wrong is an EngineError within the caller's deadline, never a crash, a hang, a huge read or a
followed redirect. `call` first, against the stand-in run as a plain process (fast); then every restorer on the
confined systemd test host, each bringing the unit back by the documented restart (tests marked systemd)."""
from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from remote_payload.host import http_client as http
from remote_payload.host.processes import identity
from remote_payload.supervision.restore.restorers import take_over_hung_restorer
from tests.cli_helpers import REPO, run_cli, status, submit, wait_for, wait_terminal
from tests.harness.multi_services import two_services
from tests.harness.pace import Scale
from tests.harness.supervisor_calls import RemoteHost
from tests.harness.systemd_jobs import (HANG, assert_service_back, gpu_job, hold, host_status, main_pid,
                                        restored_within, target_for)
from tests.harness.standin_process import Standin
from tests.hosts._proc import free_port, wait_until

KINDS = ("cut-short", "trickle", "huge", "header-flood", "bad-status-line", "long-header-line", "reset", "not-json")
BOUND_S = 2.0  # the deadline each call gets here
RESTORE_BOUND_S = 120  # a restorer's whole restore here: health_timeout 30 s, the restart, the polls


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    server = Standin(tmp_path_factory.mktemp("bad"), *(f"/{kind}={kind}" for kind in KINDS))
    yield server
    server.stop()


def timed_failure(method: str, url: str, body=None) -> tuple[str, float]:
    began = time.monotonic()
    with pytest.raises(http.EngineError) as caught:
        http.call(method, url, began + BOUND_S, body)
    return str(caught.value), time.monotonic() - began


@pytest.mark.parametrize("kind", KINDS)
def test_every_bad_answer_is_an_engine_error_within_the_deadline(bad, kind):
    slack = min(Scale()(1.0), 10.0)  # past the deadline: the last read's wake-up, at this machine's pace
    message, seconds = timed_failure("POST", f"{bad.url}/{kind}", {"tags": ["kv_cache"]})
    print(f"{kind}: EngineError after {seconds:.2f} s: {message[:120]}")
    assert seconds < BOUND_S + slack, f"{kind} took {seconds:.1f} s"  # a trickle or a 1 GiB body never holds it longer


def test_a_huge_body_is_refused_at_the_cap_not_read_to_its_end(bad):
    message, _ = timed_failure("GET", f"{bad.url}/huge")
    assert f"over {http.MAX_BODY_BYTES} bytes" in message


def test_a_trickled_body_ends_at_the_deadline_not_per_read(bad):
    message, seconds = timed_failure("GET", f"{bad.url}/trickle")
    assert "deadline" in message or "timed out" in message, message
    assert seconds >= BOUND_S - 0.1


def test_a_redirect_to_another_port_is_not_followed(tmp_path):
    good = Standin(tmp_path / "good")
    redirecting = Standin(tmp_path / "bad", f"/release_memory_occupation=redirect:{good.url}/release_memory_occupation")
    try:
        message, _ = timed_failure("POST", redirecting.url + "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert "302" in message and "not followed" in message
        assert good.paths() == []  # the other port never heard of it
    finally:
        good.stop()
        redirecting.stop()


def test_a_redirect_to_ftp_opens_no_connection(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    accepted = []

    def watch():
        try:
            accepted.append(listener.accept())
        except OSError:
            pass
    threading.Thread(target=watch, daemon=True).start()
    ftp = f"ftp://127.0.0.1:{listener.getsockname()[1]}/x"
    redirecting = Standin(tmp_path, f"/release_memory_occupation=redirect:{ftp}")
    try:
        message, _ = timed_failure("POST", redirecting.url + "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert "not followed" in message
        time.sleep(0.6)
        assert accepted == []
    finally:
        redirecting.stop()
        listener.close()


def test_a_closed_port_and_a_url_that_is_not_http_are_engine_errors():
    timed_failure("GET", f"http://127.0.0.1:{free_port()}/health")
    timed_failure("GET", "ftp://127.0.0.1:21/health")
    timed_failure("GET", "http://127.0.0.1:notaport/health")


def test_json_nested_past_the_parsers_depth_is_an_engine_error_not_a_crash():
    with pytest.raises(http.EngineError):
        http.parse_body(b"[" * 200000, "GET /x")
    assert http.parse_body(b" ", "GET /x") is None and http.parse_body(b'{"a": 1}', "GET /x") == {"a": 1}


def test_a_body_that_follows_its_headers_late_is_read_whole(tmp_path):
    # http.client closes the connection as soon as it has the headers of a `Connection: close` answer; the
    # body still on the wire must be read, not lost to a closed descriptor (EBADF, seen in CI on 358dedc)
    slow = Standin(tmp_path, "/slow=slow-body")
    try:
        for _ in range(3):
            assert http.call("GET", slow.url + "/slow", time.monotonic() + 5) == (200, {"ok": True})
    finally:
        slow.stop()


def test_a_good_engine_still_answers(tmp_path):
    good = Standin(tmp_path)
    try:
        assert http.call("GET", good.url + "/get_server_info", time.monotonic() + 5)[1]["enable_memory_saver"]
        assert http.call("GET", good.url + "/nope", time.monotonic() + 5) == (404, {"detail": "Not Found"})
    finally:
        good.stop()


# ── every restorer on the confined systemd test host: the resume answered badly, the unit restarted ─────────

def misbehaving_engine(host, kind: str) -> Path:
    """The unit: the SGLang stand-in whose resume route answers `kind`; the release routes work."""
    return host.install_engine_unit("sglang", "--memory-saver", f"--misbehave=/resume_memory_occupation={kind}")


def assert_restarted(host, target, job_id: str, pid: str, case: str, expected: str | None, seconds: float) -> None:
    """The unit restarted (a new MainPID) and healthy, the job's record and `runner status` saying so, no
    restorer ended in an internal error."""
    job = host_status(host, job_id)
    assert_service_back(host, job, f"{case}: unit restarted ({seconds:.1f} s)", expected or job["state"])
    print(f"{case}: serving again {seconds:.1f} s after the restorer began")
    assert main_pid(host) != pid and job["service"]["resumed"]["how"] == "restart", job["service"]
    restore_log = host.ssh(["cat", f"/root/.runner/jobs/{job_id}/restore.log"]).stdout
    assert "did not bring" in restore_log and "restarted" in restore_log, restore_log
    assert "internal" not in json.dumps(job) and "Traceback" not in restore_log
    shown = run_cli(target, "status", job_id).stdout.decode()
    assert f"{host.unit} was active now active, downtime" in shown, shown


def sigkill(host, job_id: str, *who: str) -> None:
    job = host_status(host, job_id)
    host.ssh(["kill", "-KILL", *(str(job[name]["pid"]) for name in who)], check=True)


def hanging_job(host, work: Path, target) -> str:
    job_id = submit(target, gpu_job(work, host, need=30000, command=HANG, free="sglang"))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    return job_id


SUPERVISOR_KINDS = ("cut-short", "trickle", "huge", "header-flood", "bad-status-line", "reset", "not-json")
KILLED_KINDS = ("cut-short", "trickle")


@pytest.mark.slow(seconds=35)
@pytest.mark.systemd
@pytest.mark.parametrize("kind", SUPERVISOR_KINDS)
def test_the_supervisor_restarts_the_unit_when_the_resume_is_answered_badly(service_host, work, kind):
    misbehaving_engine(service_host, kind)
    pid, target = main_pid(service_host), target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang")), timeout=RESTORE_BOUND_S)
    parts = job["service"].get("downtime") or {}
    assert_restarted(service_host, target, job["job_id"], pid, f"supervisor, resume {kind}", "SUCCEEDED",
                     (parts.get("resume_s") or 0) + (parts.get("health_s") or 0))


@pytest.mark.slow(seconds=35)
@pytest.mark.systemd
@pytest.mark.parametrize("kind", KILLED_KINDS)
def test_the_guard_restarts_the_unit_when_the_supervisor_died(service_host, work, fork_path, kind):
    misbehaving_engine(service_host, kind)
    pid, target = main_pid(service_host), target_for(service_host)
    job_id = hanging_job(service_host, work, target)
    sigkill(service_host, job_id, "supervisor")
    seconds = restored_within(service_host, job_id, timeout=RESTORE_BOUND_S)
    assert_restarted(service_host, target, job_id, pid, f"guard, resume {kind}", "FAILED", seconds)


@pytest.mark.slow(seconds=30)
@pytest.mark.systemd
@pytest.mark.parametrize("kind", KILLED_KINDS)
def test_exec_stop_post_restarts_the_unit_when_supervisor_and_guard_died(service_host, work, kind):
    misbehaving_engine(service_host, kind)
    pid, target = main_pid(service_host), target_for(service_host)
    job_id = hanging_job(service_host, work, target)
    job = host_status(service_host, job_id)
    bounds = {"ExecStopPost": ("TimeoutStopUSec", job["launch"]["unit"]),  # systemd bounds stop-post by it
              "the guard timer's restore": ("RuntimeMaxUSec", job["timer"].replace(".timer", ".service"))}
    for what, (prop, unit) in bounds.items():
        assert service_host.systemctl("show", "-P", prop, unit).stdout.strip() not in ("", "infinity"), what
    sigkill(service_host, job_id, "supervisor", "guard")
    seconds = restored_within(service_host, job_id, timeout=RESTORE_BOUND_S)
    assert_restarted(service_host, target, job_id, pid, f"ExecStopPost, resume {kind}", None, seconds)


@pytest.mark.slow(seconds=30)
@pytest.mark.systemd
@pytest.mark.parametrize("kind", KILLED_KINDS)
def test_the_reapers_restore_restarts_the_unit_of_a_lost_job(service_host, work, fork_path, kind):
    misbehaving_engine(service_host, kind)
    pid, target = main_pid(service_host), target_for(service_host)
    job_id = hanging_job(service_host, work, target)
    sigkill(service_host, job_id, "supervisor", "guard")
    began = time.monotonic()
    assert status(target, job_id)["state"] == "LOST"  # `runner status` reaps it and starts a restore
    restored_within(service_host, job_id, timeout=RESTORE_BOUND_S)
    assert_restarted(service_host, target, job_id, pid, f"reaper, resume {kind}", "LOST", time.monotonic() - began)


@pytest.mark.slow(seconds=30)
@pytest.mark.systemd
@pytest.mark.parametrize("kind", KILLED_KINDS)
def test_restore_service_restarts_the_unit_a_dead_job_released(service_host, work, fork_path, kind):
    misbehaving_engine(service_host, kind)
    pid, target = main_pid(service_host), target_for(service_host)
    job_id = hanging_job(service_host, work, target)
    sigkill(service_host, job_id, "supervisor", "guard")
    began = time.monotonic()
    done = run_cli(target, "restore-service", str(work / "job.yaml"), "--json", timeout=RESTORE_BOUND_S)
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["state"] == "healthy", (answer, done.stderr)
    assert answer["released"]["job_id"] == job_id and "error" not in answer["released"], answer
    assert_restarted(service_host, target, job_id, pid, f"restore-service, resume {kind}", None,
                     time.monotonic() - began)


# ── README's least-privilege sudoers rule, exactly: every restore path through `sudo -n` ──────────────────

README_USER, README_UNIT = "bench", "sglang-k26-ddtree.service"


def readme_rule(user: str, units: list[str]) -> str:
    """README's rule (the code block after "A least-privilege rule for one unit"), for `user`; each command
    that names README's unit repeated for each of `units`, as README says to do for several services."""
    block = (REPO / "docs" / "guide.md").read_text().split("A least-privilege rule for one unit", 1)[1].split("```", 2)[1]
    line = " ".join(block.replace("\\\n", " ").split())
    head, commands = line.split("NOPASSWD:", 1)
    assert head.split()[0] == README_USER, head
    commands = [c.strip() for c in re.split(r"(?<!\\),", commands)]
    own = [c.replace(README_UNIT, unit) for unit in units for c in commands if README_UNIT in c]
    return f"{user}{head[len(README_USER):]}NOPASSWD: " + ", ".join(own + [c for c in commands
                                                                          if README_UNIT not in c]) + "\n"


@pytest.fixture
def sudo_remote(service_host):
    remote = RemoteHost(service_host, user=service_host.sudo_user, sudo=True)
    yield remote
    remote.cleanup()


def restore_log(remote, job_id: str) -> str:
    path = remote.root / "jobs" / job_id / "restore.log"
    return path.read_text() if path.exists() else ""


@pytest.mark.systemd
def test_the_readme_rule_stops_starts_and_makes_and_stops_the_guard_timer(service_host, sudo_remote):
    with service_host.sudo_rule(readme_rule(service_host.sudo_user, [service_host.unit])):
        assert sudo_remote.call("start", "--job-id", "s", spec=sudo_remote.spec("always", "sleep", "0.5", "0"))["ok"]
        job = sudo_remote.wait("s", "SUCCEEDED", "FAILED")
        assert job["state"] == "SUCCEEDED" and job["service"]["stopped"] and job["service"]["healthy"], job
        events = (sudo_remote.root / "jobs" / "s" / "events.jsonl").read_text()
        timers = [json.loads(line) for line in events.splitlines() if '"guard-timer"' in line]
        assert timers[0]["created"] is True and all(t.get("stopped") is not False for t in timers), timers
        service_host.systemctl("stop", service_host.unit).check_returncode()
        answer = sudo_remote.call("restore-service", "--unit", service_host.unit, "--health-url",
                                  service_host.health_url, "--sudo", "--max-wait", "20")
        assert answer["ok"] and answer["state"] == "healthy", answer


@pytest.mark.systemd
def test_the_readme_rule_lets_the_engine_fallback_restart_the_unit(service_host, sudo_remote):
    misbehaving_engine(service_host, "cut-short")
    pid = main_pid(service_host)
    spec = sudo_remote.spec("if-needed", "sleep", "0.5", "0", required=30000)
    spec["service"]["free"] = "sglang"
    with service_host.sudo_rule(readme_rule(service_host.sudo_user, [service_host.unit])):
        assert sudo_remote.call("start", "--job-id", "e", spec=spec)["ok"]
        job = sudo_remote.wait("e", "SUCCEEDED", "FAILED", timeout=RESTORE_BOUND_S)
    assert "password" not in restore_log(sudo_remote, "e"), restore_log(sudo_remote, "e")
    assert job["state"] == "SUCCEEDED" and job["service"]["healthy"] is True, job
    assert job["service"]["resumed"]["how"] == "restart" and main_pid(service_host) != pid
    assert service_host.service_state() == "active" and service_host.health_status() == 200


@pytest.mark.systemd
def test_the_readme_rule_starts_several_services_at_once(service_host, sudo_remote):
    services = [dict(s, sudo=True, health_timeout=30) for s in two_services(service_host)]  # the host spec: seconds
    spec = sudo_remote.spec("always", "sleep", "0.5", "0", required=1000)
    del spec["service"]
    spec.update(services=services, gpu=dict(spec["gpu"], devices=["1", "2"]))
    with service_host.sudo_rule(readme_rule(service_host.sudo_user, [s["unit"] for s in services])):
        answer = sudo_remote.call("start", "--job-id", "m", spec=spec)
        assert answer["ok"], answer
        job = sudo_remote.wait("m", "SUCCEEDED", "FAILED")
    assert "password" not in restore_log(sudo_remote, "m"), restore_log(sudo_remote, "m")
    assert job["state"] == "SUCCEEDED", job
    assert [(s["unit"], s["stopped"], s["healthy"]) for s in job["services"]] == [
        (s["unit"], True, True) for s in services]


@pytest.mark.systemd
def test_the_readme_rule_lets_the_login_stop_no_unit_it_does_not_name(service_host):
    """The rule's line for the guard timer matched further arguments (`stop runner-x my-llm.service`): with it the
    login could stop any unit. Now it grants only the stop of one runner guard timer; each line names exactly
    what it grants (README)."""
    other = service_host.install_unit("other-llm.service", port=free_port())
    service_host.systemctl("start", other).check_returncode()
    login = service_host.as_user(service_host.sudo_user)
    with service_host.sudo_rule(readme_rule(service_host.sudo_user, [service_host.unit])):
        done = login.ssh(["sudo", "-n", "systemctl", "stop", "runner-x", other])
        assert service_host.service_state(other) == "active", (done.returncode, done.stderr)
        allowed = login.ssh(["sudo", "-n", "-l", "/usr/bin/systemctl", "stop", "runner-guard-k26-1.timer"])
        assert allowed.returncode == 0, allowed.stderr
        for denied in (["stop", "runner-guard-x.timer", other], ["stop", other], ["stop", "runner-job-x.service"]):
            assert login.ssh(["sudo", "-n", "-l", "/usr/bin/systemctl", *denied]).returncode != 0, denied


# ── a restorer's lock held past its bound is taken over ──────────────────────────────────────────────────

LOCK_HOLDER = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(600)\n")


class LockOnly:
    """What take_over_hung_restorer reads of a Job: the restore lock's path; its notes."""

    def __init__(self, lock: Path) -> None:
        self.paths, self.notes = types.SimpleNamespace(restore_lock=str(lock)), []

    def note_restore(self, text: str) -> None:
        self.notes.append(text)


def hold_lock(lock: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock)], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"held\n"
    return proc


def write_holder(lock: Path, pid: int, until: float) -> None:
    with open(lock, "r+") as fh:  # another open file description: the holder's flock stays
        fh.truncate()
        fh.write(json.dumps(dict(identity(pid), until=until)))


@pytest.mark.parametrize("named, until, taken", [("holder", -5, True), ("holder", 600, False),
                                                 ("bystander", -5, False)])
def test_a_restorer_holding_the_lock_past_its_bound_is_killed_and_only_that_one(tmp_path, named, until, taken):
    lock = tmp_path / "restore.lock"
    holder = hold_lock(lock)
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        write_holder(lock, (holder if named == "holder" else bystander).pid, time.time() + until)
        job = LockOnly(lock)
        assert take_over_hung_restorer(job) is taken
        assert (holder.wait(timeout=10) == -9) if taken else holder.poll() is None
        assert bystander.poll() is None and bool(job.notes) is taken
    finally:
        for proc in (holder, bystander):
            proc.kill()
            proc.wait()


HUNG_RESTORER = ("import fcntl, json, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
                 "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                 "start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n"
                 "os.ftruncate(fd, 0)\n"
                 "record = {'pid': os.getpid(), 'start_time': start, 'until': time.time() - 1}\n"
                 "os.write(fd, json.dumps(record).encode())\n"
                 "time.sleep(600)\n")


def engine_state(host) -> dict:
    url = f"http://127.0.0.1:{host.service_port}/standin_state"
    probe = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    done = host.ssh(["python3", "-c", probe], check=True)
    return json.loads(done.stdout)


@pytest.mark.systemd
def test_restore_service_takes_over_from_a_restorer_hung_past_its_bound(service_host, work, fork_path):
    service_host.install_engine_unit("sglang", "--memory-saver")
    target = target_for(service_host)
    job_id = hanging_job(service_host, work, target)
    sigkill(service_host, job_id, "supervisor", "guard")
    lock = f"/root/.runner/jobs/{job_id}/restore.lock"
    hung = service_host.ssh(["sh", "-c", f"nohup python3 -c {shlex.quote(HUNG_RESTORER)} {lock} >/dev/null 2>&1 "
                                         "</dev/null & echo $!"], check=True).stdout.strip()
    try:
        wait_for(lambda: "until" in service_host.ssh(["cat", lock]).stdout, what="the hung restorer's record")
        began = time.monotonic()
        done = run_cli(target, "restore-service", str(work / "job.yaml"), "--json", timeout=RESTORE_BOUND_S)
        answer = json.loads(done.stdout)
        print(f"restore-service past a hung restorer: serving again after {time.monotonic() - began:.1f} s")
        assert done.returncode == 0 and answer["state"] == "healthy", (answer, done.stderr)
        state = engine_state(service_host)
        assert state["paused"] is False and all(state["on_gpu"].values()), state  # resumed, not just "active"
        gone = service_host.ssh(["sh", "-c", f"cut -d' ' -f3 /proc/{hung}/stat 2>/dev/null"]).stdout.strip()
        assert gone in ("", "Z"), gone  # the hung one was ended (a zombie until whoever adopted it reaps it)
        assert "taken over" in service_host.ssh(["cat", f"/root/.runner/jobs/{job_id}/restore.log"]).stdout
    finally:
        service_host.ssh(["kill", "-KILL", hung])


def test_a_request_that_never_reached_the_engine_is_asked_again_within_the_deadline():
    """An engine holding many clients' connections may refuse a new one for a while (seen on a real SGLang 0.5.21
    after a long window): the admin call is asked again until it is sent, not given up on (its failure would be a
    restart that drops every held request)."""
    import http.server

    from remote_payload.host.engine_api import Api

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_args):
            pass

    port, servers = free_port(), []

    def listen_late():
        servers.append(http.server.HTTPServer(("127.0.0.1", port), Answer))
        servers[0].serve_forever()

    threading.Timer(1.5, listen_late).start()
    began = time.monotonic()
    try:
        answer = Api(f"http://127.0.0.1:{port}", {}).expect_ok("POST", "/resume_memory_occupation", began + 30,
                                                              {"tags": ["kv_cache"]})
        assert answer == {} and time.monotonic() - began >= 1.5
    finally:
        wait_until(lambda: servers, timeout=30, what="the late listener")
        servers[0].shutdown()
        servers[0].server_close()


def test_a_request_refused_past_the_deadline_is_not_sent_and_says_so():
    from remote_payload.host.engine_api import Api

    began = time.monotonic()
    with pytest.raises(http.NotSent, match="cannot connect"):
        Api(f"http://127.0.0.1:{free_port()}", {}).call("POST", "/resume_memory_occupation", began + 2.0)
    assert 1.0 <= time.monotonic() - began < 2.0 + BOUND_S  # asked again, and given up on by the deadline
