"""The controller side's CPU of `runner tail ID` over ssh (the CLI and its ssh client, from wait4; the host's is
host_call_cpu.py's), against a baseline checkout and `python -c pass`.

    python bench/tail_ssh_cpu.py --base /tmp/base [--runs 21] [--out bench/results/tail_ssh_cpu.json]

A loopback sshd, a non-root login; one ended job (the master warm, the state dir's records made by the warm-up
round: tail finds no new byte). A, B and `python -c pass` in turn; medians, and the median of each round's A
minus B. Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from host_call_cpu import cpu_ms
from interleave import REPO, cli, on_user_host, submit_one


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", default="bench/results/tail_ssh_cpu.json")
    args = parser.parse_args()
    return on_user_host("runner-bench-tailcpu-", args.out, lambda login, root, work, env: measure(args, login, root,
                                                                                                  work, env))


def measure(args, login, root: Path, work: Path, env: dict) -> dict:
    job_id = submit_one(login, root, work, env)
    runs: dict[str, list[float]] = {"a": [], "b": [], "python_pass": []}
    for round_ in range(args.runs + 1):  # round 0 warms the master and each side's records: not counted
        sample = {}
        for side, checkout in (("a", REPO), ("b", args.base)):
            argv, full_env, cwd = cli(checkout, env, "tail", job_id)
            sample[side] = cpu_ms(argv, b"", full_env, cwd)
        sample["python_pass"] = cpu_ms([sys.executable, "-c", "pass"], b"", full_env, cwd)
        if round_:
            for key, value in sample.items():
                runs[key].append(value)
    return {"load": os.getloadavg(), "runs": args.runs, "job_id": job_id,
            "median_cpu_ms": {key: round(statistics.median(values), 1) for key, values in runs.items()},
            "median_a_minus_b_ms": round(statistics.median([a - b for a, b in zip(runs["a"], runs["b"])]), 1)}


if __name__ == "__main__":
    sys.exit(main())
