"""What following a job costs the host: `runner tail -f --max-wait 50` called again until the job ends (an agent's
loop), for the code under test (A) and a baseline checkout (B), against one `ssh HOST tail -f` of the same log.

    python bench/follow_cost.py --base /tmp/base [--seconds 120] [--every 2] [--rounds 2]
                                [--out bench/results/follow_cost.json]

A loopback sshd, a non-root login; the sshd and all it starts in a cgroup2 group of its own (interleave.HostCpu).
Each follower follows a job of its own: a payload that prints its clock every --every seconds for --seconds;
once the job runs, its processes are set aside (their CPU is the job's, not the follower's), then the group's
CPU is read before and after the follow. Sides in turn each round (A, B, tail -f). Per follower: the host CPU
over the follow and per second of it, its calls, and each line's latency (its print to its arrival here, one
clock). Each call's fixed cost: the host CPU of `runner tail ID` on an ended job (no new byte: one start, one
pass), median of --fixed-runs, the sides in turn; the waiting cost is the total less calls × that, per second. Needs root; removes
what it made.
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

from interleave import REPO, HostCpu, cli, user_host

WRITER = """
import sys, time
seconds, every = float(sys.argv[1]), float(sys.argv[2])
end = time.time() + seconds
while time.time() < end:
    print("%.6f" % time.time(), flush=True)
    time.sleep(every)
print("end", flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--fixed-runs", type=int, default=21)
    parser.add_argument("--out", default="bench/results/follow_cost.json")
    args = parser.parse_args()
    host, login, root = user_host()
    cpu = HostCpu(host)
    work = Path(subprocess.run(["mktemp", "-d", "/tmp/runner-bench-follow-XXXX"], capture_output=True, text=True,
                               check=True).stdout.strip())
    work.chmod(0o755)
    env = {"RUNNER_SSH_CONFIG": str(host.ssh_config), "RUNNER_STATE_DIR": str(work / "state"), "RUNNER_RESIDENT": "0"}
    try:
        report = measure(args, host, login, root, work, env, cpu)
    finally:
        host.stop()
        cpu.close()
        subprocess.run(["rm", "-rf", str(work), str(root)], check=False)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


def start_job(login, root: Path, work: Path, env: dict, cpu: HostCpu, args) -> str:
    """The writer job submitted (this checkout's CLI), running, its processes set aside: its id."""
    (work / "writer.py").write_text(WRITER)
    spec = work / "job.json"
    spec.write_text(json.dumps({"name": "follow", "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": ["python3", str(work / "writer.py"), str(args.seconds),
                                                        str(args.every)]},
                                "limits": {"max_runtime": "30m"}}))
    argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    status_file = root / "jobs" / job_id / "status.json"
    while True:
        status = json.loads(status_file.read_text())
        if status["state"] == "RUNNING" and status.get("guard") and status.get("payload"):
            break
        time.sleep(0.05)
    for _ in range(3):  # again: a process forked while the first pass moved the others
        cpu.set_aside([status["supervisor"]["pid"], status["guard"]["pid"], status["payload"]["pid"]])
        time.sleep(0.1)
    return job_id


def read_lines(proc: subprocess.Popen, latencies: list, since: float) -> bool:
    """The latency of each clock line printed from `since` on (those before waited for the follower, not on
    it), until the call's output ends; True once the payload's `end` was read."""
    assert proc.stdout is not None
    for line in proc.stdout:
        arrived = time.time()
        text = line.decode("ascii", "replace").strip()
        if text == "end":
            return True
        try:
            written = float(text)
        except ValueError:
            continue
        if written >= since:
            latencies.append(arrived - written)
    return False


def follow_with_runner(checkout: Path, env: dict, job_id: str) -> dict:
    latencies: list[float] = []
    calls, codes, since = 0, [], time.time()
    while True:
        argv, full_env, cwd = cli(checkout, env, "tail", job_id, "-f", "--max-wait", "50")
        proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        read_lines(proc, latencies, since)
        codes.append(proc.wait())
        calls += 1
        if codes[-1] != 75:
            return {"calls": calls, "exits": codes, "latencies": latencies}


def follow_with_tail_f(login, root: Path, job_id: str) -> dict:
    latencies: list[float] = []
    log, since = root / "jobs" / job_id / "output.log", time.time()
    proc = subprocess.Popen(["ssh", "-F", str(login.ssh_config), login.alias, "--", f"tail -n +1 -f {log}"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    read_lines(proc, latencies, since)
    proc.terminate()
    proc.wait()
    return {"calls": 1, "exits": [], "latencies": latencies}


def fixed_costs_s(checkouts: dict, env: dict, job_id: str, cpu: HostCpu, runs: int) -> dict:
    """Each side's host CPU for one `runner tail ID` with no new byte (an ended job): the median of `runs`,
    the sides in turn."""
    calls = {side: cli(checkout, env, "tail", job_id) for side, checkout in checkouts.items()}
    costs: dict[str, list] = {side: [] for side in checkouts}
    for round_ in range(runs + 1):  # round 0 moves each side's cursor to the end: not counted
        for side, (argv, full_env, cwd) in calls.items():
            before = cpu.cpu_s()
            subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True)
            if round_:
                costs[side].append(cpu.cpu_s() - before)
    return {side: round(statistics.median(values), 4) for side, values in costs.items()}


def measure(args, host, login, root: Path, work: Path, env: dict, cpu: HostCpu) -> dict:
    sides: dict[str, list] = {"a": [], "b": [], "tail_f": []}
    warm = start_job(login, root, work, env, cpu, args)
    for checkout in (REPO, args.base):  # each side's supervisor bundle uploaded before anything is measured
        argv, full_env, cwd = cli(checkout, env, "tail", warm)
        assert subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True).returncode == 75  # still running
    loads = [os.getloadavg()]
    ended = []
    for _ in range(args.rounds):
        for side in sides:
            job_id = start_job(login, root, work, env, cpu, args)
            before, began = cpu.cpu_s(), time.monotonic()
            run = follow_with_tail_f(login, root, job_id) if side == "tail_f" else \
                follow_with_runner(REPO if side == "a" else args.base, env, job_id)
            run.update(cpu_s=cpu.cpu_s() - before, seconds=time.monotonic() - began)
            sides[side].append(run)
            ended.append(job_id)
            loads.append(os.getloadavg())
    while json.loads((root / "jobs" / ended[-1] / "status.json").read_text())["state"] != "SUCCEEDED":
        time.sleep(0.2)
    fixed = fixed_costs_s({"a": REPO, "b": args.base}, env, ended[-1], cpu, args.fixed_runs)
    return {"seconds": args.seconds, "every": args.every, "rounds": args.rounds, "load": loads,
            "fixed_cost_per_call_s": fixed, "sides": {side: summary(runs, fixed.get(side, 0.0))
                                                      for side, runs in sides.items()}}


def summary(runs: list, fixed: float) -> dict:
    every = [x for run in runs for x in run["latencies"]]
    waiting = [(run["cpu_s"] - run["calls"] * fixed) / run["seconds"] * 1000 for run in runs]
    return {"host_cpu_s": [round(run["cpu_s"], 3) for run in runs],
            "host_cpu_ms_per_s": [round(run["cpu_s"] / run["seconds"] * 1000, 3) for run in runs],
            "waiting_ms_per_s": [round(x, 3) for x in waiting], "calls": [run["calls"] for run in runs],
            "exits": [run["exits"] for run in runs], "lines": len(every),
            "latency_s": {"median": round(statistics.median(every), 4),
                          "p95": round(sorted(every)[int(0.95 * (len(every) - 1))], 4), "max": round(max(every), 4)}}


if __name__ == "__main__":
    sys.exit(main())
