"""The supervisor (remote_payload/supervisor.py) called as the controller calls it, with one payload script of
many behaviours: in local subprocesses (Host, with the nvidia-smi stand-in on PATH) or over the systemd test
host's sshd (RemoteHost)."""
from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.hosts import gpu_state

SUPERVISOR = Path(__file__).resolve().parent.parent.parent / "remote_payload" / "supervisor.py"

# One payload script, many behaviours (argv[1]); a test double for a benchmark, run as a real process.
PAYLOAD = r'''
import json, os, signal, subprocess, sys, time
mode, args = sys.argv[1], sys.argv[2:]
def pidfile(name):
    with open(os.path.join(os.environ["MARKS"], name), "w") as fh:
        fh.write(str(os.getpid()))
if mode == "sleep":
    print("started", flush=True); time.sleep(float(args[0])); print("finished", flush=True); sys.exit(int(args[1]))
if mode == "gate":            # runs until the test makes the mark args[0], then exits 0
    print("started", flush=True)
    while not os.path.exists(os.path.join(os.environ["MARKS"], args[0])):
        time.sleep(0.05)
if mode == "chunks":          # writes a file's bytes in pieces, pausing between them
    data = open(args[0], "rb").read()
    for i in range(0, len(data), 7):
        sys.stdout.buffer.write(data[i:i + 7]); sys.stdout.buffer.flush(); time.sleep(0.01)
if mode == "stubborn":        # itself and a child both ignore SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(os.path.join(os.environ["MARKS"], "child"), "w") as fh:
        fh.write(str(child.pid))
    pidfile("payload"); print("stubborn", flush=True); time.sleep(600)
if mode == "report":          # what the payload saw: argv, env, cwd
    keys = [k for k in os.environ if k.startswith(("RUNNER_", "HOSTILE", "CUDA_", "PYTHONUNBUFFERED"))]
    with open(os.environ["RUNNER_RESULT"], "w") as fh:
        json.dump({"argv": args, "env": {k: os.environ[k] for k in keys}, "cwd": os.getcwd()}, fh)
if mode == "hold-gpu":        # "holds" MiB on the stand-in GPU while it lives
    with open(os.path.join(os.environ["RUNNER_FAKE_GPU_DIR"], "apps", str(os.getpid())), "w") as fh:
        fh.write("%d,%s" % (os.getpid(), args[0]))
    time.sleep(float(args[1]))
'''


class Host:
    """One supervisor ROOT plus the env the calls run with (the stand-in nvidia-smi first on PATH)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "root"
        self.payload = tmp / "payload.py"
        self.payload.write_text(PAYLOAD)
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.gpu_dir = gpu_state.make_state_dir(tmp / "gpu")
        self.env = dict(os.environ, MARKS=str(self.marks), RUNNER_FAKE_GPU_DIR=str(self.gpu_dir),
                        PATH=f"{gpu_state.STANDIN.parent}:{os.environ['PATH']}")

    def call(self, *args: str, spec: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
        done = subprocess.run([sys.executable, str(SUPERVISOR), *args, "--root", str(self.root)],
                              input=json.dumps(spec).encode() if spec is not None else b"",
                              capture_output=True, timeout=timeout, env=self.env)
        lines = done.stdout.decode().splitlines()
        assert len(lines) == 1, (done.stdout, done.stderr)
        return done.returncode, json.loads(lines[0])

    def ok(self, *args: str, **kwargs) -> dict:
        rc, answer = self.call(*args, **kwargs)
        assert rc == 0 and answer["ok"], answer
        return answer

    def spec(self, mode: str, *args: str, max_runtime: float = 60, grace: float = 1.0, **extra) -> dict:
        spec = {"name": "t", "service": {"manager": "none"},
                "payload": {"command": [sys.executable, str(self.payload), mode, *args], "env": {}},
                "limits": {"max_runtime": max_runtime, "grace": grace}}
        spec.update(extra)
        return spec

    def start(self, job_id: str, spec: dict, *flags: str) -> dict:
        return self.ok("start", "--job-id", job_id, *flags, spec=spec)

    def status(self, job_id: str) -> dict:
        return self.ok("status", "--job-id", job_id)["jobs"][0]

    def wait(self, job_id: str, *states: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if status["state"] in states:
                return status
            assert time.monotonic() < deadline, f"{job_id} still {status['state']}, wanted {states}: {status}"
            time.sleep(0.1)

    def mark(self, name: str, timeout: float = 30) -> int:
        path = self.marks / name
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.read_text()):
            assert time.monotonic() < deadline, f"no mark {name}"
            time.sleep(0.05)
        return int(path.read_text())

    def cleanup(self) -> None:
        """Kill what our jobs left behind, by the pids and groups they recorded (only ours)."""
        for status_file in self.root.glob("jobs/*/status.json"):
            try:
                status = json.loads(status_file.read_text())
            except ValueError:
                continue
            for who in ("supervisor", "guard"):
                if alive(status.get(who)):
                    os.kill(status[who]["pid"], signal.SIGKILL)
            payload = status.get("payload") or {}
            if alive(payload):
                os.killpg(payload["pgid"], signal.SIGKILL)


def sweep_spec(host: Host, tmp_path: Path, writer: str, kinds: list) -> dict:
    """A sweep whose variant K runs the python source `writer` with kinds[K] as its one argument."""
    script = tmp_path / "writer.py"
    script.write_text(writer)
    spec = host.spec("sleep", "0", "0")
    spec["payload"]["command"] = [sys.executable, str(script), "{kind}"]
    spec["sweep"] = {"variants": [{"args": {"kind": k}, "argv": [sys.executable, str(script), k]} for k in kinds]}
    return spec


def alive(ident: dict | None) -> bool:
    from remote_payload.host.processes import is_alive

    return is_alive(ident)


def pid_gone(pid: int, timeout: float = 10) -> bool:
    from remote_payload.host.processes import proc_stat

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = proc_stat(pid)
        if fields is None or fields[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def gpu_spec(host: Host, mode: str, *args: str, required: int = 0, drain: float = 5.0, **extra) -> dict:
    return host.spec(mode, *args, gpu={"devices": ["0"], "required_mib": required, "drain_timeout": drain}, **extra)


class RemoteHost:
    """The supervisor called through the systemd test host's sshd; ROOT in a dir the host can see."""

    def __init__(self, service_host, user: str = "root", sudo: bool = False) -> None:
        from tests.hosts._proc import shared_tmpdir

        self.sh = service_host.as_user(user)
        self.sudo = sudo
        self.base = shared_tmpdir("runner-supervisor-")
        # ROOT is the login's own, mode 0755: a ROOT others may write to is refused (`unsafe-root`)
        self.root = self.base / "root"
        self.root.mkdir(mode=0o755)
        account = pwd.getpwnam(user)
        os.chown(self.root, account.pw_uid, account.pw_gid)
        (self.root / "payload.py").write_text(PAYLOAD)

    def call(self, *args: str, spec: dict | None = None) -> dict:
        argv = ["/usr/bin/python3", str(SUPERVISOR), *args, "--root", str(self.root)]
        done = self.sh.ssh(argv, input=json.dumps(spec) if spec is not None else "", timeout=60)
        return json.loads(done.stdout.splitlines()[-1])

    def spec(self, stop: str, *payload_args: str, required: int = 9100, drain: float = 15) -> dict:
        return {"name": "svc", "service": {"manager": "systemd", "unit": self.sh.unit, "stop": stop, "sudo": self.sudo,
                                           "health_url": self.sh.health_url, "health_timeout": 30},
                "gpu": {"devices": ["0"], "required_mib": required, "drain_timeout": drain},
                "payload": {"command": ["/usr/bin/python3", str(self.root / "payload.py"), *payload_args],
                            "env": {"MARKS": str(self.root)}},
                "limits": {"max_runtime": 60, "grace": 1}}

    def wait(self, job_id: str, *states: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.call("status", "--job-id", job_id)["jobs"][0]
            if status["state"] in states:
                return status
            assert time.monotonic() < deadline, status
            time.sleep(0.2)

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.base, ignore_errors=True)
