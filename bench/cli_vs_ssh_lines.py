"""The `runner` CLI over the OpenSSH transport vs hand-written OpenSSH lines.

    python bench/cli_vs_ssh_lines.py --runs 12 --out bench/results/cli_vs_ssh_lines.json  (root: own sshd)

On one loopback test sshd (its non-root login, given Debian's default rc files from /etc/skel), runs
interleaved so both sides see the same load, medians over --runs:
- submit: `runner submit JOB.yaml` as a CLI process, with the master connection warm and cold (masters
  closed with `ssh -O exit` before each run), vs the hand-written `ssh host 'nohup … & echo $!'` (no master);
- tail with no new bytes: `runner tail ID` (warm) vs `ssh host cat FILE` (no master);
- round trips per cached submit (HostClient.round_trips, in process);
- through bench/latency_proxy.py (50 ms each way): the same submits, in RTTs (extra seconds / 0.1 s);
- with --edited: `runner submit` of a spec edited before every run (no cached plan: validated each time), warm,
  for the non-root login and for root (whose python3 is a pyenv shim and whose ~/.bashrc runs `pyenv init`),
  against the same hand-written line as that login, the round trips of such a submit, and whether its host
  call was opened while the spec was validated (`early_call`).
docs/performance.md explains the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from latency_proxy import LatencyProxy  # noqa: E402
from runner.commands import controller  # noqa: E402
from runner.deadline import Deadline  # noqa: E402
from runner.state.store import Store  # noqa: E402
os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.cli_helpers import Target, write_job  # noqa: E402
from tests.hosts import sshd  # noqa: E402
from tests.hosts._proc import shared_tmpdir  # noqa: E402

RTT_S = 0.1


def with_skel_rc_files(host: sshd.SshHost) -> str:
    """The host's non-root login, its empty HOME given Debian's default .bashrc/.profile (a user's usual shell)."""
    user = host.non_root_user
    home = Path(pwd.getpwnam(user).pw_dir)
    for name in (".bashrc", ".profile"):
        shutil.copy(Path("/etc/skel") / name, home / name)
        shutil.chown(home / name, user=user, group=user)
    return user


def alias_block(alias: str, port: int, host: sshd.SshHost, known_hosts: Path, user: str | None = None) -> str:
    return "\n".join([
        f"Host {alias}", f"    HostName {host.address}", f"    Port {port}", f"    User {user or host.non_root_user}",
        f"    IdentityFile {host.key_path}", "    IdentitiesOnly yes", f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes", "    BatchMode yes",
        "    ConnectTimeout 10", "    LogLevel ERROR", ""])


class Bench:
    def __init__(self, work: Path, host: sshd.SshHost, ports: dict[str, int]) -> None:
        self.work = work
        self.state = work / "state"
        known = work / "known_hosts"
        known.write_text("".join(sshd.known_hosts_line(port, host.host_key) for port in ports.values()))
        self.config = work / "ssh_config"
        blocks = [alias_block(f"b-{route}", port, host, known) for route, port in ports.items()]
        blocks.append(alias_block("b-root", host.port, host, known, user="root"))
        self.config.write_text("\n".join(blocks))
        # XDG_RUNTIME_DIR: the control sockets' home (transport_openssh.sockets_home), this bench's own
        self.env = {**os.environ, "RUNNER_SSH_CONFIG": str(self.config), "RUNNER_STATE_DIR": str(self.state),
                    "XDG_RUNTIME_DIR": str(work)}
        # As installed (pip compiles the package): bytecode cached. This machine's shells set
        # PYTHONDONTWRITEBYTECODE, which made every CLI run compile runner/ from source.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        root = work / "root"
        root.mkdir()
        shutil.chown(root, user=with_skel_rc_files(host), group=host.non_root_user)
        self.roots = {route: root for route in ports}
        self.roots["root"] = work / "root-of-root"
        self.roots["root"].mkdir(mode=0o700)
        self.jobs = {route: self.job(route) for route in self.roots}

    def job(self, route: str, edit: int | None = None) -> Path:
        """The route's job file; `edit` changes its bytes (an env value), so no cached plan serves it."""
        host = {"address": f"b-{route}", "root": str(self.roots[route]), "transport": "openssh"}
        return write_job(self.work / f"job-{route}.yaml", Target("ssh", host, self.roots[route], {}),
                         command=["sleep", "1"], name="bench submit",
                         env=None if edit is None else {"BENCH_EDIT": str(edit)})

    def runner(self, *args: str) -> float:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, env=self.env, cwd=REPO,
                              timeout=120)
        elapsed = time.perf_counter() - t0
        if done.returncode not in (0, 75):
            raise RuntimeError(f"runner {args[0]} exit {done.returncode}: {done.stderr.decode()[-1500:]}")
        return elapsed

    def ssh(self, route: str, command: str) -> float:
        t0 = time.perf_counter()
        done = subprocess.run(["ssh", "-F", str(self.config), f"b-{route}", command], capture_output=True, timeout=60)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"ssh {command!r}: {done.returncode} {done.stderr!r}")
        return elapsed

    def close_masters(self) -> None:
        for sock in (self.work / "runner-cm").glob("*/*"):
            subprocess.run(["ssh", "-F", str(self.config), "-S", str(sock), "-O", "exit", "b-direct"],
                           capture_output=True, timeout=10)

    def submit_json(self, route: str) -> str:
        done = subprocess.run([sys.executable, "-m", "runner", "submit", str(self.jobs[route]), "--json"],
                              capture_output=True, env=self.env, cwd=REPO, timeout=120, check=True)
        return json.loads(done.stdout)["job_id"]


NOHUP = "nohup sleep 1 >/dev/null 2>&1 </dev/null & echo $!"


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def bench_route(bench: Bench, route: str, runs: int) -> dict:
    job = str(bench.jobs[route])
    bench.submit_json(route)  # uploads the payload, opens the master
    warm, cold, plain = [], [], []
    for _ in range(runs):
        plain.append(bench.ssh(route, NOHUP))
        warm.append(bench.runner("submit", job))
        bench.close_masters()
        cold.append(bench.runner("submit", job))
    return {"runner_submit_warm_s": median(warm), "runner_submit_cold_s": median(cold),
            "openssh_nohup_s": median(plain), "warm_ratio": round(median(warm) / median(plain), 3),
            "cold_ratio": round(median(cold) / median(plain), 3), "runs": runs,
            "raw": {"warm": warm, "cold": cold, "openssh": plain}}


def bench_edited(bench: Bench, route: str, runs: int) -> dict:
    """Warm submits of a spec edited before each run (validated every time) vs the same login's nohup line."""
    bench.submit_json(route)  # uploads the payload, opens the master
    edited, plain = [], []
    for i in range(runs):
        plain.append(bench.ssh(route, NOHUP))
        edited.append(bench.runner("submit", str(bench.job(route, edit=i))))
    trips, early = edited_submit_round_trips(bench, route, runs)
    return {"runner_submit_edited_warm_s": median(edited), "openssh_nohup_s": median(plain),
            "ratio": round(median(edited) / median(plain), 3), "round_trips": trips, "early_call": early,
            "runs": runs, "raw": {"edited": edited, "openssh": plain}}


def edited_submit_round_trips(bench: Bench, route: str, edit: int) -> tuple[int, bool]:
    """In process, the CLI's path for an edited spec: its round trips, and whether its host call was opened
    before the validation (controller.early_submit) and used."""
    os.environ.update(RUNNER_SSH_CONFIG=str(bench.config), RUNNER_STATE_DIR=str(bench.state),
                      XDG_RUNTIME_DIR=str(bench.work))
    job, deadline = str(bench.job(route, edit=edit)), Deadline.for_command(60)
    with controller.early_submit(job, [], store=Store(), job_id=None, queue=False, deadline=deadline) as early:
        plan = controller.local_plan(job, [])
        done = controller.submit(job, [], store=Store(), progress=lambda _m: None, planned=plan, deadline=deadline,
                                 early=early)
    return done.round_trips, early is not None and done.job_id == early.job_id


def bench_tail(bench: Bench, runs: int) -> dict:
    job_id = bench.submit_json("direct")
    time.sleep(2.5)
    bench.runner("tail", job_id)  # cursor at the end: the timed calls find no new bytes
    tail, cat = [], []
    for _ in range(runs):
        cat.append(bench.ssh("direct", "cat /etc/hostname"))
        tail.append(bench.runner("tail", job_id))
    return {"runner_tail_warm_s": median(tail), "openssh_cat_s": median(cat),
            "ratio": round(median(tail) / median(cat), 3), "raw": {"tail": tail, "cat": cat}}


def cached_submit_round_trips(bench: Bench) -> int:
    os.environ.update(RUNNER_SSH_CONFIG=str(bench.config), RUNNER_STATE_DIR=str(bench.state),
                      XDG_RUNTIME_DIR=str(bench.work))
    done = controller.submit(str(bench.jobs["direct"]), [], store=Store(), progress=lambda _m: None)
    return done.round_trips


def import_time(args: list[str]) -> float:
    """runner.cli.cli's cumulative import time (µs → ms), median of 5 `python -X importtime` runs."""
    values = []
    for _ in range(5):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "runner", *args], capture_output=True,
                              cwd=REPO, text=True, env={k: v for k, v in os.environ.items()
                                                        if k != "PYTHONDONTWRITEBYTECODE"})
        line = next(l for l in done.stderr.splitlines() if l.rstrip().endswith("| runner.cli.cli"))
        values.append(int(line.split("|")[1]) / 1000)
    return round(statistics.median(values), 1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--proxy-runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--edited", action="store_true", help="only the edited-spec submits (both logins)")
    opts = parser.parse_args()
    host = sshd.start_sshd()
    work = shared_tmpdir("rb-")
    try:
        with LatencyProxy(host.port, delay=RTT_S / 2) as proxy:
            bench = Bench(work, host, {"direct": host.port, "proxy": proxy.port})
            report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
                      "cpus": os.cpu_count(), "ssh": subprocess.run(["ssh", "-V"], capture_output=True,
                                                                    text=True).stderr.strip(),
                      "import_ms_tail_help": import_time(["tail", "--help"])}
            if opts.edited:
                report["edited"] = {route: bench_edited(bench, route, opts.runs) for route in ("direct", "root")}
                bench.close_masters()
                print(json.dumps(report, indent=1))
                if opts.out:
                    opts.out.write_text(json.dumps(report, indent=1) + "\n")
                return
            report["direct"] = bench_route(bench, "direct", opts.runs)
            report["tail"] = bench_tail(bench, opts.runs)
            report["round_trips_cached_submit"] = cached_submit_round_trips(bench)
            proxied = bench_route(bench, "proxy", opts.proxy_runs)
            direct = report["direct"]
            report["proxy"] = dict(proxied, rtt_s=RTT_S, rtts={
                key: round((proxied[f"{key}_s"] - direct[f"{key}_s"]) / RTT_S, 1)
                for key in ("runner_submit_warm", "runner_submit_cold", "openssh_nohup")})
            bench.close_masters()
    finally:
        host.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text)
    if opts.out:
        opts.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
