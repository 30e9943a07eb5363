"""Shared by the cost benches: a loopback sshd with a non-root login, and commands timed against a baseline in
turn (A B A B …), the ratio taken pair by pair, so that a machine whose speed drifts (it is shared) moves both.

The baseline is another checkout of runner (`--base DIR`, e.g. `git worktree add /tmp/base e70e18f`): its CLI
runs as `python -m runner` with that checkout first on PYTHONPATH, the code under test likewise with this one.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.hosts._proc import shared_tmpdir  # noqa: E402
from tests.hosts.sshd import start_sshd  # noqa: E402


def start_hosts(n: int) -> list:
    """n test sshd, started from this thread: each dies with the thread that started it (PR_SET_PDEATHSIG)."""
    hosts = []
    try:
        for _ in range(n):
            hosts.append(start_sshd())
    except BaseException:
        for host in hosts:
            host.stop()
        raise
    return hosts


def user_host():
    """(the sshd, its non-root login as an SshHost, a ROOT dir that login owns)."""
    host = start_sshd()
    login = host.as_user(host.non_root_user)
    root = shared_tmpdir("runner-bench-root-")
    subprocess.run(["chown", login.user, str(root)], check=True)
    return host, login, root


def on_user_host(prefix: str, out: str, measure) -> int:
    """Run measure(login, root, work, env) against a fresh user_host (env: its ssh config, a state dir in
    work), write its report to `out` and print it; the host, work and root are gone afterwards."""
    host, login, root = user_host()
    work = shared_tmpdir(prefix)
    env = {"RUNNER_SSH_CONFIG": str(host.ssh_config), "RUNNER_STATE_DIR": str(work / "state")}
    try:
        report = measure(login, root, work, env)
    finally:
        host.stop()
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["rm", "-rf", str(root)], check=False)
    Path(out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


# cgroup2: its own mount on a hybrid machine (v1 controllers beside it), else the one hierarchy
CGROUP2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else Path("/sys/fs/cgroup")


class HostCpu:
    """The CPU a test sshd and everything it starts spend (its sessions, the host programs they run, the jobs
    they detach): a cgroup2 group of its own (cpu.stat's usage_usec counts with no controller enabled) that the
    sshd is moved into before its first session, so all it forks is born there. `set_aside` moves a job's
    processes to a sibling group, for a bench that measures what watches the job, not the job. Needs root."""

    def __init__(self, host) -> None:
        from tests.hosts._proc import child_pids

        self.group = CGROUP2 / f"runner-bench-{os.getpid()}"
        self.aside = CGROUP2 / f"runner-bench-{os.getpid()}-aside"
        for group in (self.group, self.aside):
            group.mkdir()
        for pid in [host.process.pid, *child_pids(host.process.pid)]:
            (self.group / "cgroup.procs").write_text(str(pid))

    def cpu_s(self) -> float:
        """The group's CPU time so far, the processes that ended in it included."""
        line = next(l for l in (self.group / "cpu.stat").read_text().splitlines() if l.startswith("usage_usec"))
        return int(line.split()[1]) / 1e6

    def set_aside(self, sessions_of: list[int]) -> int:
        """Move every process of the sessions of `sessions_of` (pids as the sshd's namespace numbers them) out
        of the group; how many were moved."""
        table = {}
        for pid in (self.group / "cgroup.procs").read_text().split():
            status = _proc_status(int(pid))
            if status:
                table[int(status["NSpid"].split()[-1])] = (int(pid), int(status["NSsid"].split()[-1]))
        sids = {table[p][1] for p in sessions_of if p in table}
        moved = 0
        for host_pid, sid in table.values():
            if sid in sids:
                try:
                    (self.aside / "cgroup.procs").write_text(str(host_pid))
                    moved += 1
                except OSError:
                    pass  # gone meanwhile
        return moved

    def close(self) -> None:
        """After the host stopped: the groups removed once empty."""
        for group in (self.group, self.aside):
            for _ in range(100):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def _proc_status(pid: int) -> dict | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return dict(line.split(":", 1) for line in lines if ":" in line)


def cli(checkout: Path, env: dict, *args: str) -> tuple:
    """(argv, env, cwd) of `runner ARGS…` from `checkout`, for `timed` and `pairs`. Without this shell's
    PYTHONDONTWRITEBYTECODE (set on this machine), which made every run compile the checkout from source
    (~40 ms): an installed runner has its bytecode."""
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return [sys.executable, "-m", "runner", *args], {**inherited, **env, "PYTHONPATH": str(checkout)}, checkout


FAILURES: list[dict] = []  # the stderr of each run that exited other than 0 or 75, for the report


def submit_one(login, root: Path, work: Path, env: dict) -> str:
    """A job of `true` submitted to the login's host (this checkout's CLI), given 3 s to end: its id."""
    spec = work / "job.json"
    spec.write_text(json.dumps({"name": "one", "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": ["true"]}}))
    argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    time.sleep(3)
    return job_id


def timed(argv: list[str], env: dict, cwd: Path, stdout=subprocess.DEVNULL) -> tuple[float, int]:
    t0 = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE)
    wall = time.monotonic() - t0
    if done.returncode not in (0, 75):
        FAILURES.append({"argv": argv[-6:], "exit": done.returncode, "stderr": done.stderr.decode()[-1500:]})
    return wall, done.returncode


def pairs(a: tuple, b: tuple, runs: int, warmup: int = 1) -> dict:
    """Time A and B in turn, `runs` pairs after `warmup`: each is (argv, env, cwd). Medians, min, max, and
    the median of the per-pair ratios A/B; each side's exit codes."""
    for _ in range(warmup):
        timed(*a)
        timed(*b)
    wall_a, wall_b, codes_a, codes_b = [], [], set(), set()
    for _ in range(runs):
        s, code = timed(*a)
        wall_a.append(s)
        codes_a.add(code)
        s, code = timed(*b)
        wall_b.append(s)
        codes_b.add(code)
    return {"a_s": summary(wall_a), "b_s": summary(wall_b),
            "ratio_a_over_b": round(statistics.median(x / y for x, y in zip(wall_a, wall_b)), 3),
            "a_exits": sorted(codes_a), "b_exits": sorted(codes_b), "load": os.getloadavg()}


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}
