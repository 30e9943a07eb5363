"""A spec whose name changes at every submit, and `tail --max-wait 0` on a big backlog: the code under test (A)
against a baseline checkout (B) and the hand-written line.

    python bench/edited_name.py --base /tmp/base [--runs 9] [--mib 100] [--out bench/results/edited_name.json]

A loopback sshd, a non-root login (OpenSSH transport). 1. `runner submit JOB.json` with the job's name (and so
its bytes: no cached plan) changed before every run, master warm, A in its own process (RUNNER_RESIDENT=0), B,
A as it runs by default (its resident server warm: runner/resident.py) and `ssh HOST 'nohup … & echo $!'`
(a fresh connection, as a user would type it) in turn; medians and the per-run ratios; then, untimed, the ssh
commands one such submit runs on the host (an `ssh` on PATH that counts them, as
tests/integration/test_early_submit.py does). 2. A job that wrote --mib MiB and ended, its cursor at 0:
`runner tail ID --max-wait 0 > /dev/null` (each call moves the cursor by what it printed, so the backlog stays
~--mib MiB), A and B in turn, against `ssh HOST true` on a warm master (one round trip). Needs root (the sshd's
namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from interleave import FAILURES, REPO, cli, on_user_host, pairs, summary, timed

NOHUP = "nohup sleep 1 >/dev/null 2>&1 </dev/null & echo $!"
COUNTING_SSH = """#!/bin/sh
for a in "$@"; do case "$a" in -G|-O) exec /usr/bin/ssh "$@";; esac; done
echo exec >> LOG
exec /usr/bin/ssh "$@"
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--out", default="bench/results/edited_name.json")

    parser.add_argument("--no-tail", action="store_true", help="only the renamed submit")
    args = parser.parse_args()

    def measure(login, root, work, env) -> dict:
        return {"load_start": os.getloadavg(), "renamed_submit": renamed(args, login, root, work, env),
                "tail_max_wait_0": None if args.no_tail else tail_zero(args, login, root, work, env),
                "load_end": os.getloadavg(), "failures": FAILURES}

    return on_user_host("runner-bench-edited-", args.out, measure)


def write_spec(path: Path, login, root: Path, name: str, command: list[str]) -> Path:
    path.write_text(json.dumps({"name": name, "host": {"address": login.alias, "root": str(root),
                                                       "transport": "openssh"},
                                "payload": {"command": command}, "limits": {"max_runtime": "20m"}}))
    return path


def renamed(args, login, root: Path, work: Path, env: dict) -> dict:
    sides = ("a", "b", "a_resident")
    specs = {side: work / f"renamed-{side}.json" for side in sides}
    checkouts = {"a": REPO, "b": args.base, "a_resident": REPO}
    envs = {"a": dict(env, RUNNER_RESIDENT="0"), "b": env, "a_resident": dict(env, XDG_RUNTIME_DIR=str(work / "xdg"))}
    (work / "xdg").mkdir(mode=0o700)
    nohup = (["ssh", "-F", str(login.ssh_config), login.alias, NOHUP], None, REPO)
    walls: dict[str, list[float]] = {side: [] for side in (*sides, "nohup")}
    for i in range(-2, args.runs):  # < 0: the first plan of each spec, the masters and the resident server, untimed
        for side in sides:
            write_spec(specs[side], login, root, f"renamed-{side}-{i}", ["true"])
            wall, _ = timed(*cli(checkouts[side], envs[side], "submit", str(specs[side])))
            if i >= 0:
                walls[side].append(wall)
        wall, _ = timed(*nohup)
        if i >= 0:
            walls["nohup"].append(wall)
        if i == -2:
            time.sleep(2)  # the resident server's imports, started by its first submit
    ratio = {f"ratio_{side}_over_nohup": round(statistics.median(x / n for x, n in zip(walls[side], walls["nohup"])), 3)
             for side in sides}
    return {"s": {k: summary(v) for k, v in walls.items()}, **ratio,
            "ratio_a_over_b": round(statistics.median(a / b for a, b in zip(walls["a"], walls["b"])), 3),
            "execs_per_submit": {side: execs_of_renamed(checkouts[side], specs[side], login, root, work, envs[side])
                                 for side in sides},
            "load": os.getloadavg()}


def execs_of_renamed(checkout: Path, spec: Path, login, root: Path, work: Path, env: dict) -> list[int]:
    """The ssh commands each of three renamed submits ran on the host."""
    (work / "bin").mkdir(exist_ok=True)
    log = work / f"ssh-{checkout.name}.log"
    (work / "bin" / "ssh").write_text(COUNTING_SSH.replace("LOG", str(log)))
    (work / "bin" / "ssh").chmod(0o755)
    counted = dict(env, PATH=f"{work / 'bin'}:{os.environ['PATH']}")
    counts = []
    for i in range(3):
        write_spec(spec, login, root, f"counted-{checkout.name}-{i}", ["true"])
        before = len(log.read_text().splitlines()) if log.exists() else 0
        timed(*cli(checkout, counted, "submit", str(spec)))
        counts.append(len(log.read_text().splitlines()) - before)
    return counts


def tail_zero(args, login, root: Path, work: Path, env: dict) -> dict:
    spec = write_spec(work / "backlog.json", login, root, "backlog", ["head", "-c", str(args.mib << 20), "/dev/zero"])
    argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    status = root / "jobs" / job_id / "status.json"
    while '"SUCCEEDED"' not in (status.read_text() if status.exists() else ""):
        time.sleep(0.5)
    words = ("tail", job_id, "--max-wait", "0")
    master = ["-o", "ControlMaster=auto", "-o", f"ControlPath={work}/c.sock", "-o", "ControlPersist=300"]
    one_rtt = (["ssh", "-F", str(login.ssh_config), *master, login.alias, "true"], None, REPO)
    printed = subprocess.run(cli(REPO, env, *words)[0], env=cli(REPO, env, *words)[1], cwd=REPO,
                             capture_output=True).stdout
    return {"mib": args.mib, "printed_per_call_bytes": len(printed),
            "a_vs_b": pairs(cli(REPO, env, *words), cli(args.base, env, *words), args.runs),
            "a_vs_ssh_true": pairs(cli(REPO, env, *words), one_rtt, args.runs)}


if __name__ == "__main__":
    sys.exit(main())
