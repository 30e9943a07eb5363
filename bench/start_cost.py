"""What a command costs from a fresh process, the code under test (A) against a baseline checkout (B, run with
RUNNER_RESIDENT=0: each command in its own process), in turn (A B A B …), medians and per-pair ratios:

1. `runner tail ID` of an ended job, its ssh master warm (nothing new to print), against `python -c pass`;
2. `runner submit JOB` of a spec edited before every run (its name, so its bytes), against the line a user
   would type instead, `ssh HOST 'nohup … & echo $!'` (a fresh connection);
3. `runner submit JOB` of the same spec again and again (B's plan cache answers it; A validates every time).

    python bench/start_cost.py --base /tmp/base [--runs 15] [--out bench/results/start_cost.json]

A loopback sshd, a non-root login (OpenSSH transport). Needs root (the sshd's namespaces); removes what it made.
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

from interleave import FAILURES, REPO, cli, on_user_host, pairs, submit_one, summary, timed

NOHUP = "nohup sleep 1 >/dev/null 2>&1 </dev/null & echo $!"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default="bench/results/start_cost.json")
    args = parser.parse_args()

    def measure(login, root, work, env) -> dict:
        base_env = dict(env, RUNNER_RESIDENT="0", RUNNER_STATE_DIR=str(work / "state-b"))  # B's records are B's
        tail_a = ("tail", submit_one(login, root, work, env))
        tail_b = ("tail", submitted(args.base, base_env, write_spec(work / "one-b.json", login, root, "one-b")))
        pass_ = ([sys.executable, "-c", "pass"], None, REPO)
        return {"load_start": os.getloadavg(),
                "tail_ended_job": {"a_vs_python_pass": pairs(cli(REPO, env, *tail_a), pass_, args.runs),
                                   "b_vs_python_pass": pairs(cli(args.base, base_env, *tail_b), pass_, args.runs),
                                   "a_vs_b": pairs(cli(REPO, env, *tail_a), cli(args.base, base_env, *tail_b),
                                                   args.runs)},
                "edited_submit": edited(args, login, root, work, env, base_env),
                "same_spec_submit": same(args, login, root, work, env, base_env),
                "load_end": os.getloadavg(), "failures": FAILURES}

    return on_user_host("runner-bench-start-", args.out, measure)


def submitted(checkout: Path, env: dict, spec: Path) -> str:
    """A job of `true` submitted with `checkout`'s CLI and given 3 s to end: its id."""
    argv, full_env, cwd = cli(checkout, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    time.sleep(3)
    return job_id


def write_spec(path: Path, login, root: Path, name: str) -> Path:
    path.write_text(json.dumps({"name": name, "host": {"address": login.alias, "root": str(root),
                                                       "transport": "openssh"},
                                "payload": {"command": ["true"]}, "limits": {"max_runtime": "20m"}}))
    return path


def edited(args, login, root: Path, work: Path, env: dict, base_env: dict) -> dict:
    """A, B and the nohup line in turn; each submit's spec renamed first."""
    sides = {"a": (REPO, env), "b": (args.base, base_env)}
    nohup = (["ssh", "-F", str(login.ssh_config), login.alias, NOHUP], None, REPO)
    walls: dict[str, list[float]] = {"a": [], "b": [], "nohup": []}
    for i in range(-1, args.runs):  # -1: the masters and the bundles' upload, untimed
        for side, (checkout, side_env) in sides.items():
            spec = write_spec(work / f"edited-{side}.json", login, root, f"edited-{side}-{i}")
            wall, _ = timed(*cli(checkout, side_env, "submit", str(spec)))
            if i >= 0:
                walls[side].append(wall)
        wall, _ = timed(*nohup)
        if i >= 0:
            walls["nohup"].append(wall)
    return {"s": {k: summary(v) for k, v in walls.items()},
            **{f"ratio_{side}_over_nohup": round(statistics.median(x / n for x, n in zip(walls[side], walls["nohup"])), 3)
               for side in sides},
            "ratio_a_over_b": round(statistics.median(a / b for a, b in zip(walls["a"], walls["b"])), 3),
            "load": os.getloadavg()}


def same(args, login, root: Path, work: Path, env: dict, base_env: dict) -> dict:
    """The same spec submitted again and again: what B's plan cache saved it, against A's validation."""
    spec_a = write_spec(work / "same-a.json", login, root, "same-a")
    spec_b = write_spec(work / "same-b.json", login, root, "same-b")
    return pairs(cli(REPO, env, "submit", str(spec_a)), cli(args.base, base_env, "submit", str(spec_b)), args.runs)


if __name__ == "__main__":
    sys.exit(main())
