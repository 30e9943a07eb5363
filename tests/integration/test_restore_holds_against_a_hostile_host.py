"""The restore guarantee against a hostile host: the service's health answer (the engine's own route, read by
every restorer's health wait), the processes of payload.user (one that leaves the job's process group, swaps the
code root or holds the service lock) and a status.json rewritten against the ledger.

The health check is the one engine route not behind engine.call: any answer it cannot read is "not healthy"
within its bound, never a crash, a hang or a followed redirect. First against the SGLang stand-in as a plain
process (fast), then `runner restore-service` on the confined systemd test host.
"""
from __future__ import annotations

import json
import shlex
import socket
import subprocess
import threading
import time

import pytest
import yaml

from remote_payload.host.health import health_ok
from tests.cli_helpers import Target, run_cli, status, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import gpu_job, target_for
from tests.harness.standin_process import Standin
from tests.hosts._proc import free_port, wait_until


UNREADABLE = ("bad-status-line", "header-flood", "long-header-line")
BOUND_S = 1.0  # the health check's timeout here


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """A stand-in whose /h-KIND routes answer KIND, and /h-redirect a 302 to a healthy stand-in's /health."""
    good = Standin(tmp_path_factory.mktemp("good"))
    rules = [f"/h-{kind}={kind}" for kind in UNREADABLE] + [f"/h-redirect=redirect:{good.url}/health"]
    server = Standin(tmp_path_factory.mktemp("health"), *rules)
    yield server
    server.stop()
    good.stop()


def checked(url: str) -> tuple[object, float]:
    """health_ok's answer (or the exception it raised) and its seconds, run in a thread so a hang shows."""
    outcome = {}

    def run():
        began = time.monotonic()
        try:
            outcome["answer"] = health_ok(url, BOUND_S)
        except Exception as exc:  # a crash of the check: the restorer's health wait would end in it
            outcome["answer"] = exc
        outcome["seconds"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S + 15.0)  # generous: a bounded check ends within its timeout
    assert not thread.is_alive(), f"health_ok({url}) still runs after {BOUND_S + 15.0:.0f} s: unbounded"
    return outcome["answer"], outcome["seconds"]


@pytest.mark.parametrize("kind", UNREADABLE)
def test_a_health_answer_that_cannot_be_read_is_unhealthy_not_a_crash(bad, kind):
    answer, _ = checked(f"{bad.url}/h-{kind}")
    assert answer is False, f"{kind}: {answer!r}"


def test_a_health_redirect_is_not_followed(bad):
    """The engine's route answers the question, not whatever its Location names (engine.call's rule too)."""
    answer, _ = checked(f"{bad.url}/h-redirect")
    assert answer is False, answer


def test_a_health_answer_trickled_in_its_headers_ends_within_the_bound():
    """One header byte every 0.2 s: each read is within the socket timeout, the whole answer never ends."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        try:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
            while not stop.is_set():
                conn.sendall(b"x")
                time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        answer, seconds = checked(f"http://127.0.0.1:{listener.getsockname()[1]}/health")
        assert answer is False and seconds < BOUND_S + 2.0, (answer, seconds)
    finally:
        stop.set()
        listener.close()


@pytest.mark.systemd
def test_restore_service_answers_a_bad_health_route_without_an_internal_error(service_host):
    """The manual lever on a unit whose health route answers a bad status line: it answers (not healthy),
    it does not end `internal`."""
    service_host.install_engine_unit("sglang", "--memory-saver", "--misbehave=/h-bad=bad-status-line")
    url = service_host.health_url.rsplit("/", 1)[0] + "/h-bad"
    done = run_cli(target_for(service_host), "restore-service", "--host", service_host.alias, "--unit",
                   service_host.unit, "--health-url", url, "--max-wait", "3", "--json")
    out = (done.stdout + done.stderr).decode()
    assert "internal" not in out and "BadStatusLine" not in out, out
    assert json.loads(done.stdout)["state"] != "healthy", out


# ── a payload (running as payload.user) that leaves its process group ────────────────────────────────────

# argv[1]: the port. Answers 200 to everything: a health route, as far as any client can tell.
ANSWERS_OK = """
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


# argv[1]: the service's port. A child in a session of its own (setsid: a new process group, so the kill of
# the payload's group misses it) answers 200 to everything on the stopped service's port; the payload then
# writes its result and exits 0.
ESCAPER = """
import json, os, subprocess, sys, time
child = CHILD
proc = subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], start_new_session=True,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print("escaped", proc.pid, flush=True)
time.sleep(2)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    json.dump({"escaped": proc.pid}, fh)
print("ended", time.time(), flush=True)
""".replace("CHILD", repr(ANSWERS_OK))


@pytest.mark.systemd
def test_a_payload_users_process_in_its_own_session_does_not_outlive_the_job(service_host, work):
    """payload.user's guarantee: whatever the payload does as its user, the restore brings the unit back. A child
    that left the payload's process group (setsid) must still be ended with the job: alive, it holds the
    stopped service's port, answers the restorer's health check itself, and the restarted unit cannot bind."""
    root = work / "root"
    target = Target("ssh", {"address": service_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, service_host)
    script = work / "escaper.py"
    script.write_text(ESCAPER)
    path = gpu_job(work, service_host, stop="always", command=["python3", str(script), str(service_host.service_port)],
                   target=target)
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["user"] = service_host.nosudo_user
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job_id = submit(target, path)
    log = f"{root}/jobs/{job_id}/output.log"
    escaped = None
    try:
        wait_for(lambda: "ended" in service_host.ssh(["cat", log]).stdout, timeout=60, what="payload ended")
        escaped = service_host.ssh(["cat", log]).stdout.split("escaped")[1].split()[0]
        job = wait_terminal(target, job_id, timeout=120)
        time.sleep(3)  # the restarted unit tries its port
        alive = service_host.ssh(["kill", "-0", escaped]).returncode == 0
        print("\nescaper: job %s restored=%s healthy=%s; escapee alive=%s; unit now %s"
              % (job["state"], job.get("restored"), job["service"].get("healthy"), alive,
                 service_host.service_state()))
        assert service_host.service_state() == "active", "the job says %s, restored %s; the unit is %s" % (
            job["state"], job.get("restored"), service_host.service_state())
        assert not alive, "the payload's setsid child outlived the job (pid %s)" % escaped
        assert service_host.health_status() == 200
    finally:
        if escaped:
            service_host.ssh(["kill", "-KILL", escaped])


# ── a process outside the unit that holds its health port ────────────────────────────────────────────────

@pytest.mark.systemd
def test_a_health_answer_from_a_process_outside_the_unit_is_not_the_units(service_host):
    """A process started outside the job and the unit (a payload.user's cron job, a stray server) holds the
    unit's health port and answers 200, while the unit itself serves elsewhere: a restorer must not call the
    unit healthy on that answer, and says who answered (the listener's owner is outside the unit's cgroup)."""
    service_host.install_unit(port=free_port())  # the unit runs, active, but not on its health URL's port
    service_host.systemctl("restart", service_host.unit).check_returncode()
    started = service_host.ssh(["sh", "-c", "setsid python3 -c %s %d </dev/null >/dev/null 2>&1 & echo $!" % (
        shlex.quote(ANSWERS_OK), service_host.service_port)], check=True)
    squatter = started.stdout.strip()
    try:
        wait_until(lambda: service_host.health_status() == 200, timeout=20, what="the squatter answering")
        done = run_cli(target_for(service_host), "restore-service", "--host", service_host.alias, "--unit",
                       service_host.unit, "--health-url", service_host.health_url, "--max-wait", "4", "--json")
        answer = json.loads(done.stdout)
        assert answer["state"] != "healthy", answer
        assert f"pid {squatter} (python3" in answer["health_note"] and "outside the unit" in answer["health_note"]
        shown = run_cli(target_for(service_host), "restore-service", "--host", service_host.alias, "--unit",
                        service_host.unit, "--health-url", service_host.health_url, "--max-wait", "2")
        assert f"held by pid {squatter}" in shown.stdout.decode(), shown.stdout.decode()
    finally:
        service_host.ssh(["kill", "-KILL", squatter])


# ── payload.user where host.root lies in a dir that user owns ─────────────────────────────────────────────

# argv[1]: host.root, argv[2]: a file to mark. host.root's parent is the user's: it renames ROOT aside and puts
# its own in its place, the job dirs and locks linked back, and at the supervisor bundle's path (read from its
# command line; root runs it by path: ExecStopPost=, the guard timer) a supervisor.py that first writes its uid
# to the mark, then runs the original.
SWAPPER = """
import os, sys
root, mark = sys.argv[1], sys.argv[2]
aside = root + ".orig"
def bundle():  # the supervisor's own path, from its command line (any user may read /proc/PID/cmdline)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().decode().split("\\0")
        except OSError:
            continue
        for arg in argv:
            if arg.startswith(root + "/payload/") and arg.endswith("/supervisor.py"):
                return os.path.dirname(arg)
try:
    here = bundle()
    os.rename(root, aside)
    os.mkdir(root, 0o755)
    for name in os.listdir(aside):
        if name != "payload":
            os.symlink(os.path.join(aside, name), os.path.join(root, name))
    os.makedirs(here)
    orig = os.path.join(aside, os.path.relpath(here, root), "supervisor.py")
    with open(os.path.join(here, "supervisor.py"), "w") as fh:
        fh.write("import os, runpy, sys\\nopen(%r, 'w').write(str(os.getuid()))\\n"
                 "sys.path[0] = %r\\nrunpy.run_path(%r, run_name='__main__')\\n"
                 % (mark, os.path.dirname(orig), orig))
    print("swapped", here, flush=True)
except (OSError, TypeError) as exc:
    print("refused", exc, flush=True)
with open(os.environ["RUNNER_RESULT"], "w") as fh:
    fh.write("{}")
"""


@pytest.mark.systemd
def test_payload_user_cannot_swap_the_code_root_runs_when_host_roots_parent_is_its_own(service_host, work):
    """host.root under a dir payload.user owns (its home, say: root's own is 0700, so ROOT goes elsewhere): the
    user may rename ROOT, root's as it is, and put its own, whose supervisor.py root runs by path. Refused at
    submit, or nothing of the user's runs as root."""
    user = service_host.nosudo_user
    root, mark = work / "bench" / "runner", work / "pwned"
    service_host.ssh(["install", "-d", "-o", user, "-m", "0755", str(root.parent)], check=True)
    target = Target("ssh", {"address": service_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, service_host)
    script = work / "swapper.py"
    script.write_text(SWAPPER)
    path = gpu_job(work, service_host, stop="always", command=["python3", str(script), str(root), str(mark)],
                   target=target)
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["user"] = user
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_cli(target, "submit", str(path), "--json")
    if done.returncode == 0:
        job_id = json.loads(done.stdout)["job_id"]
        wait_for(lambda: "swapped" in service_host.ssh(["sh", "-c", f"cat {root}*/jobs/{job_id}/output.log"]).stdout
                 or "refused" in service_host.ssh(["sh", "-c", f"cat {root}*/jobs/{job_id}/output.log"]).stdout,
                 timeout=60, what="payload's swap")
        wait_for(lambda: service_host.ssh(["cat", str(mark)]).returncode == 0 or service_host.ssh(
            ["sh", "-c", f"grep -l '\"restored\": true' {root}.orig/jobs/{job_id}/status.json"]).returncode == 0,
            timeout=90, what="the job's end")
        time.sleep(3)
        ran = service_host.ssh(["cat", str(mark)]).stdout.strip()
        print("\nswapper: %s; the user's supervisor.py ran as uid %r" % (
            service_host.ssh(["sh", "-c", f"cat {root}*/jobs/{job_id}/output.log"]).stdout.strip(), ran))
        assert ran == "", "payload.user's code ran as uid %s" % ran
    else:
        assert done.returncode == 4 and b"payload.user" in done.stdout + done.stderr, (done.stdout, done.stderr)


# ── payload.user's process outside the job holds the job's service lock ──────────────────────────────────

# argv[1]: the lock file, argv[2], argv[3]: the user's uid and gid. Run by root, it becomes the user first (a
# process of that user outside the job: its login, its cron), opens the lock read-only and flocks it: it
# waits while the supervisor holds it, and holds it once the supervisor and its guard are gone.
HOLDER = """
import fcntl, os, sys, time
os.setgroups([]); os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))
print("pid", os.getpid(), flush=True)
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as exc:
    print("refused", exc.errno, flush=True)
    sys.exit(0)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.systemd
def test_a_process_of_payload_user_cannot_hold_the_service_lock_that_restorers_defer_to(service_host, work):
    """Every restorer defers while the job's service lock is held ('its supervisor or guard lives'): a process
    of payload.user may not take that lock. The supervisor and the guard die (SIGKILL); ExecStopPost= or the
    guard timer must bring the unit back."""
    user = service_host.nosudo_user
    root = work / "root"
    target = Target("ssh", {"address": service_host.alias, "root": str(root)}, root,
                    {"RUNNER_SSH_CONFIG": str(service_host.ssh_config)}, service_host)
    path = gpu_job(work, service_host, stop="always", command=["sleep", "600"], target=target, max_runtime="5m")
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["user"] = user
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job_id = submit(target, path)
    status_file = f"{root}/jobs/{job_id}/status.json"

    def host_job() -> dict:
        done = service_host.ssh(["cat", status_file])
        return json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}

    wait_for(lambda: host_job().get("state") == "RUNNING" and service_host.service_state() != "active", timeout=60,
             what="payload running, unit stopped")
    script = work / "holder.py"
    script.write_text(HOLDER)
    ids = service_host.ssh(["sh", "-c", f"id -u {user}; id -g {user}"], check=True).stdout.split()
    lock = f"/run/lock/runner-service-{service_host.unit}.lock"
    holder = subprocess.Popen(["ssh", "-F", str(service_host.ssh_config), service_host.alias, "--",
                               f"python3 {script} {lock} {ids[0]} {ids[1]}"], stdout=subprocess.PIPE, text=True)
    pid = holder.stdout.readline().split()[-1]
    try:
        time.sleep(1)
        job = host_job()
        service_host.ssh(["kill", "-KILL", str(job["guard"]["pid"]), str(job["supervisor"]["pid"])], check=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and service_host.service_state() != "active":
            time.sleep(1)
        print("\nlock holder: unit %s; the user's process %s; job %s" % (
            service_host.service_state(), holder.stdout.readline().strip() if holder.poll() is None else "gone",
            run_cli(target, "status", job_id).stdout.decode().splitlines()[:3]))
        assert service_host.service_state() == "active", "a process of payload.user held the service lock"
        restore_lock = f"{root}/jobs/{job_id}/restore.lock"  # the restorers' own lock: not the user's to hold
        wait_for(lambda: service_host.ssh(["test", "-e", restore_lock]).returncode == 0, timeout=30,
                 what="a restorer's restore.lock")
        opened = service_host.ssh(["python3", "-c", "import os, sys; os.setgroups([]); os.setgid(%s); os.setuid(%s)\n"
                                   "try:\n    os.open(sys.argv[1], os.O_RDONLY); print('opened')\n"
                                   "except OSError as exc:\n    print('refused', exc.errno)" % (ids[1], ids[0]),
                                   restore_lock]).stdout.strip()
        assert opened == "refused 13", "payload.user can open (and so flock) the job's restore.lock: " + opened
    finally:
        service_host.ssh(["kill", "-KILL", pid])
        holder.kill()


# ── `runner status` after a failed restore, the record rewritten ─────────────────────────────────────────

@pytest.mark.systemd
def test_status_does_not_say_restored_while_the_ledger_says_the_restore_failed(service_host, work):
    """A restore that failed leaves the ledger entry marked `restore_failed_at` and the unit down; a payload
    process still alive (same user, no payload.user) then rewrites status.json as SUCCEEDED and restored.
    `restored` is the ledger's word: not restored. Set up as those two writers would leave the host: the unit
    stopped and the entry marked by the supervisor's failed restore, status.json saying restored."""
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, stop="always", command=["true"]))
    job = wait_terminal(target, job_id, timeout=120)
    assert job["state"] == "SUCCEEDED" and job["restored"] is True, job
    unit = service_host.unit
    entry = {"unit": unit, "job_id": job_id, "was": "active", "scope": "system", "sudo": False,
             "health_url": service_host.health_url, "health_timeout": 30, "gpus": ["0"],
             "stopped_at": time.time() - 60, "restore_failed_at": time.time()}
    ledger = f"/run/lock/runner-ledger-service-{unit}.json"
    try:
        service_host.systemctl("stop", unit).check_returncode()
        service_host.ssh(["sh", "-c", f"cat > {ledger}"], input=json.dumps(entry), check=True)
        shown = status(target, job_id)
        print("\nfailed restore, forged record: state %s restored %s; unit %s"
              % (shown["state"], shown.get("restored"), service_host.service_state()))
        assert shown.get("restored") is not True, shown
    finally:
        service_host.ssh(["rm", "-f", ledger])
        service_host.systemctl("start", unit)
