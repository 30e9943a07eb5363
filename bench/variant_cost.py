"""What a sweep's variant costs on the host, against a baseline checkout and a shell loop of the same commands.

    python bench/variant_cost.py --base /tmp/base [--variants 50] [--runs 5] [--out bench/results/variant_cost.json]

A loopback sshd, a non-root login. A sweep of --variants variants of `sh -c 'sleep 0'`, submitted by the code
under test (A) and by the baseline (B) in turn, each waited for to its end: per variant, the host's time from
the first variant's `start` event to the last one's `end` event over the count, and the seconds each variant
recorded (its duration as the supervisor saw it). Beside them, the same commands as a shell loop on the host
(`ssh HOST sh -c 'for …; do sh -c "sleep 0"; done'`, timed on the host). Needs root; removes what it made.
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

from interleave import REPO, cli, on_user_host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--variants", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="bench/results/variant_cost.json")
    args = parser.parse_args()
    return on_user_host("runner-bench-variants-", args.out, lambda login, root, work, env: measure(args, login, root, work, env))


def sweep(checkout: Path, env: dict, spec: Path, root: Path) -> dict:
    """One sweep submitted and waited for: host ms per variant, the variants' recorded seconds."""
    argv, full_env, cwd = cli(checkout, env, "submit", str(spec))
    job_id = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()
    status = root / "jobs" / job_id / "status.json"
    while json.loads(status.read_text())["state"] not in ("SUCCEEDED", "FAILED"):
        time.sleep(0.2)
    events = [json.loads(line) for line in (root / "jobs" / job_id / "events.jsonl").read_text().splitlines()]
    marks = [e["t"] for e in events if e.get("event") == "variant" and e.get("status") in ("start", "end")]
    variants = json.loads((root / "jobs" / job_id / "result.json").read_text())["variants"]
    seconds = [v["seconds"] for v in variants]
    return {"ms_per_variant": (max(marks) - min(marks)) * 1000 / len(variants), "seconds": seconds}


def shell_loop_ms(login, count: int) -> float:
    loop = f't0=$(date +%s%N); for i in $(seq {count}); do sh -c "sleep 0"; done; echo $(( ($(date +%s%N) - t0) / {count} ))'
    done = login.ssh(["sh", "-c", loop], check=True)
    return int(done.stdout.strip()) / 1e6


def measure(args, login, root: Path, work: Path, env: dict) -> dict:
    spec = work / "sweep.json"
    spec.write_text(json.dumps({"name": "sweep", "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": ["sh", "-c", "sleep 0 # {n}"]},
                                "sweep": {"matrix": {"n": list(range(args.variants))}},
                                "limits": {"max_runtime": "10m"}}))
    sides = {"a": [], "b": [], "shell": []}
    load = [os.getloadavg()]
    for _ in range(args.runs):
        sides["a"].append(sweep(REPO, env, spec, root))
        sides["b"].append(sweep(args.base, env, spec, root))
        sides["shell"].append(shell_loop_ms(login, args.variants))
        load.append(os.getloadavg())
    a = [r["ms_per_variant"] for r in sides["a"]]
    b = [r["ms_per_variant"] for r in sides["b"]]
    def recorded(side):
        every = [s for r in sides[side] for s in r["seconds"]]
        return {"median_s": statistics.median(every), "at_or_over_0.1s": sum(s >= 0.1 for s in every), "of": len(every)}
    return {"variants": args.variants, "runs": args.runs, "load": load,
            "ms_per_variant": {"a": [round(x, 1) for x in a], "b": [round(x, 1) for x in b],
                               "shell": [round(x, 2) for x in sides["shell"]]},
            "median_ms_per_variant": {"a": round(statistics.median(a), 1), "b": round(statistics.median(b), 1),
                                      "shell": round(statistics.median(sides["shell"]), 2)},
            "ratio_a_over_b_per_pair": round(statistics.median(x / y for x, y in zip(a, b)), 3),
            "recorded": {"a": recorded("a"), "b": recorded("b")}}


if __name__ == "__main__":
    sys.exit(main())
