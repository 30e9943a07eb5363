"""The controller side's CPU of `runner tail ID` over ssh (the CLI and its ssh client, from wait4; the host's is
host_call_cpu.py's), against a baseline checkout and `python -c pass`.

    python bench/tail_ssh_cpu.py --base /tmp/base [--runs 21] [--out bench/results/tail_ssh_cpu.json]

A loopback sshd, a non-root login; one ended job (the master warm, the state dir's records made by the warm-up
round: tail finds no new byte). A, B and `python -c pass` in turn; medians, and the median of each round's A
minus B. Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from interleave import REPO, cli, on_user_host


def cpu_ms(argv: list[str], env: dict, cwd: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", default="bench/results/tail_ssh_cpu.json")
    args = parser.parse_args()
    return on_user_host("runner-bench-tailcpu-", args.out, lambda login, root, work, env: measure(args, login, root,
                                                                                                  work, env))


def measure(args, login, root: Path, work: Path, env: dict) -> dict:
    spec = work / "job.json"
    spec.write_text(json.dumps({"name": "one", "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": ["true"]}}))
    argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    time.sleep(3)
    runs: dict[str, list[float]] = {"a": [], "b": [], "python_pass": []}
    for round_ in range(args.runs + 1):  # round 0 warms the master and each side's records: not counted
        sample = {side: cpu_ms(*cli(checkout, env, "tail", job_id)) for side, checkout in (("a", REPO), ("b", args.base))}
        sample["python_pass"] = cpu_ms([sys.executable, "-c", "pass"], full_env, cwd)
        if round_:
            for key, value in sample.items():
                runs[key].append(value)
    return {"load": os.getloadavg(), "runs": args.runs, "job_id": job_id,
            "median_cpu_ms": {key: round(statistics.median(values), 1) for key, values in runs.items()},
            "median_a_minus_b_ms": round(statistics.median([a - b for a, b in zip(runs["a"], runs["b"])]), 1)}


if __name__ == "__main__":
    sys.exit(main())
