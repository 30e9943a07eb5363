"""What a sweep's variant costs the host, for the code under test (A) and a baseline checkout (B), against a shell
loop of the same commands, at more than one count of the host's processes.

    python bench/variant_cost.py --base /tmp/base [--variants 50] [--runs 3] [--crowds 0,2000]
                                 [--out bench/results/variant_cost.json]

A loopback sshd, a non-root login; the sshd and all it starts in a cgroup2 group of its own (interleave.HostCpu).
A sweep of --variants variants of `sh -c 'sleep 0'`, and one of a single variant, submitted by A and by B in
turn and waited for to their end; the host's CPU a variant costs is the difference of the two sweeps' CPU over
the difference of their counts (the job's own start and end cancel out). The same for the shell loop (`ssh HOST
sh -c 'for …; do sh -c "sleep 0"; done'`). Beside the CPU, the host's wall time a variant takes (the first
variant's `start` event to the last one's `end`, over the count) and the seconds each variant recorded. Each
crowd adds that many sleeping processes to the sshd's PID namespace (the processes a variant's host sees).
Then, with strace where there is one, the syscalls a variant makes (fsync, openat, read, newfstatat) in a sweep
on this machine (`host.address: local`: every process of the machine in /proc), the same difference of two
sweeps. Needs root; removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from interleave import REPO, HostCpu, cli, user_host

STRACED = ("fsync", "openat", "read", "newfstatat")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--variants", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--crowds", default="0,2000")
    parser.add_argument("--out", default="bench/results/variant_cost.json")
    args = parser.parse_args()
    host, login, root = user_host()
    cpu = HostCpu(host)
    work = Path(tempfile.mkdtemp(prefix="runner-bench-variants-", dir="/tmp"))
    work.chmod(0o755)
    env = {"RUNNER_SSH_CONFIG": str(host.ssh_config), "RUNNER_STATE_DIR": str(work / "state"), "RUNNER_RESIDENT": "0"}
    try:
        report = {"variants": args.variants, "runs": args.runs,
                  "crowds": {crowd: at_crowd(args, login, root, work, env, cpu, int(crowd))
                             for crowd in args.crowds.split(",")}}
    finally:
        host.stop()
        cpu.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)
    report["syscalls_per_variant"] = syscalls(args, work) if shutil.which("strace") else None
    shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


def sweep_spec(work: Path, host: dict, count: int) -> Path:
    spec = work / f"sweep-{count}.json"
    spec.write_text(json.dumps({"name": "sweep", "host": host, "payload": {"command": ["sh", "-c", "sleep 0 # {n}"]},
                                "sweep": {"matrix": {"n": list(range(count))}}, "limits": {"max_runtime": "10m"}}))
    return spec


def settle(cpu: HostCpu, processes: int) -> None:
    """Until the group holds no more processes than it did before the job (its supervisor and guard gone)."""
    deadline = time.monotonic() + 10
    while len((cpu.group / "cgroup.procs").read_text().split()) > processes and time.monotonic() < deadline:
        time.sleep(0.05)


def sweep(checkout: Path, env: dict, spec: Path, root: Path, cpu: HostCpu) -> dict:
    """One sweep submitted and waited for: the host's CPU, its wall ms per variant, the variants' seconds."""
    processes = len((cpu.group / "cgroup.procs").read_text().split())
    before = cpu.cpu_s()
    argv, full_env, cwd = cli(checkout, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    job = root / "jobs" / job_id
    while json.loads((job / "status.json").read_text())["state"] not in ("SUCCEEDED", "FAILED"):
        time.sleep(0.05)
    settle(cpu, processes)
    cpu_s = cpu.cpu_s() - before
    events = [json.loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    marks = [e["t"] for e in events if e.get("event") == "variant" and e.get("status") in ("start", "end")]
    variants = json.loads((job / "result.json").read_text())["variants"]
    return {"cpu_s": cpu_s, "wall_ms_per_variant": (max(marks) - min(marks)) * 1000 / len(variants),
            "seconds": [v["seconds"] for v in variants]}


def shell_loop_cpu_s(login, count: int, cpu: HostCpu) -> float:
    before = cpu.cpu_s()
    login.ssh(["sh", "-c", f'for i in $(seq {count}); do sh -c "sleep 0"; done'], check=True)
    return cpu.cpu_s() - before


def crowd_of(login, count: int) -> None:
    """`count` sleeping processes more in the sshd's namespace (they end with it)."""
    if count:
        login.ssh(["sh", "-c", f"nohup sh -c 'for i in $(seq {count}); do sleep 100000 & done; wait' "
                               ">/dev/null 2>&1 </dev/null &"], check=True)
    time.sleep(2 + count / 500)


def at_crowd(args, login, root: Path, work: Path, env: dict, cpu: HostCpu, crowd: int) -> dict:
    crowd_of(login, crowd)
    seen = int(login.ssh(["sh", "-c", "ls /proc | grep -c '^[0-9]'"], check=True).stdout)
    host = {"address": login.alias, "root": str(root)}
    many, one = sweep_spec(work, host, args.variants), sweep_spec(work, host, 1)
    for checkout in (REPO, args.base):  # each side's bundle on the host before anything is measured
        sweep(checkout, env, one, root, cpu)
    per: dict[str, list] = {"a": [], "b": [], "shell": []}
    wall: dict[str, list] = {"a": [], "b": []}
    recorded: dict[str, list] = {"a": [], "b": []}
    load = [os.getloadavg()]
    for _ in range(args.runs):
        for side, checkout in (("a", REPO), ("b", args.base)):
            big, small = sweep(checkout, env, many, root, cpu), sweep(checkout, env, one, root, cpu)
            per[side].append((big["cpu_s"] - small["cpu_s"]) * 1000 / (args.variants - 1))
            wall[side].append(big["wall_ms_per_variant"])
            recorded[side] += big["seconds"]
        loop = shell_loop_cpu_s(login, args.variants, cpu) - shell_loop_cpu_s(login, 1, cpu)
        per["shell"].append(loop * 1000 / (args.variants - 1))
        load.append(os.getloadavg())
    return {"processes_seen_by_the_host": seen, "load": load,
            "cpu_ms_per_variant": {k: [round(x, 2) for x in v] for k, v in per.items()},
            "median_cpu_ms_per_variant": {k: round(statistics.median(v), 2) for k, v in per.items()},
            "ratio_a_over_b_per_pair": round(statistics.median(a / b for a, b in zip(per["a"], per["b"])), 3),
            "wall_ms_per_variant": {k: [round(x, 2) for x in v] for k, v in wall.items()},
            "recorded_s": {k: {"median": statistics.median(v), "at_or_over_0.1s": sum(s >= 0.1 for s in v),
                               "of": len(v)} for k, v in recorded.items()}}


def straced(checkout: Path, spec: Path, state: Path) -> dict:
    """The calls of each syscall of STRACED in one local sweep: the CLI, its host call, the detached supervisor
    and what it runs (strace -f ends when the last of them does)."""
    summary = state.parent / "strace.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(RUNNER_STATE_DIR=str(state), RUNNER_RESIDENT="0", PYTHONPATH=str(checkout))
    subprocess.run(["strace", "-f", "-c", "-o", str(summary), "-e", "trace=" + ",".join(STRACED), sys.executable,
                    "-m", "runner", "submit", str(spec)], env=env, cwd=checkout, capture_output=True, check=True)
    calls = {}
    for line in summary.read_text().splitlines():
        words = line.split()
        if words and words[-1] in STRACED:
            calls[words[-1]] = int(words[3])
    return calls


def syscalls(args, work: Path) -> dict:
    root = work / "local-root"
    host = {"address": "local", "root": str(root)}
    many, one = sweep_spec(work, host, args.variants), sweep_spec(work, host, 1)
    found = {"processes_in_proc": sum(name.isdigit() for name in os.listdir("/proc"))}
    for side, checkout in (("a", REPO), ("b", args.base)):
        big, small = straced(checkout, many, work / f"state-{side}"), straced(checkout, one, work / f"state-{side}")
        found[side] = {name: round((big.get(name, 0) - small.get(name, 0)) / (args.variants - 1), 2)
                       for name in STRACED}
    shutil.rmtree(root, ignore_errors=True)
    return found


if __name__ == "__main__":
    sys.exit(main())
