"""`runner tail` throughput and a live follow, against a baseline checkout and against `ssh HOST tail -c +1`.

    python bench/tail_stream.py --base /tmp/base [--mib 100] [--runs 7] [--base-runs 2] [--follow-s 30]
        [--out bench/results/tail_stream.json]

A loopback sshd, a non-root login (OpenSSH transport, warm master). 1. A job that wrote --mib MiB and ended:
`runner tail ID --from-start --max-wait 120 > /dev/null` of the code under test (A), of the baseline (B) and
`ssh HOST tail -c +1 LOG > /dev/null` (C, its own warm master), in turn; MB/s and the ratios per pair; each
tail's peak RSS. 2. A job writing 1 MiB each 0.1 s (~10 MB/s) for --follow-s seconds, followed by a loop of
`runner tail ID -f --max-wait 5` from its submit: how far behind the loop ended, whether what it printed is
the host's log byte for byte; then the same for the baseline, on a job of its own (stopped after twice the
writer's time). Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from interleave import FAILURES, REPO, cli, pairs, on_user_host

WRITER = ("import os, sys, time\nfor _ in range(int(sys.argv[1])):\n    sys.stdout.buffer.write(os.urandom(1 << 20))\n"
          "    sys.stdout.flush()\n    time.sleep(float(sys.argv[2]))\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--base-runs", type=int, default=2, help="pairs against the baseline (~1 min each)")
    parser.add_argument("--follow-s", type=int, default=30)
    parser.add_argument("--out", default="bench/results/tail_stream.json")
    args = parser.parse_args()
    def measure(login, root, work, env) -> dict:
        # each side its own state dir and its own jobs: a release need not read the other's job records
        env_b = dict(env, RUNNER_STATE_DIR=str(work / "state-b"))
        return {"load_start": os.getloadavg(), "drain": drain(args, login, root, work, env, env_b),
                "follow": {side: follow(checkout, args, login, root, work, side_env)
                           for side, checkout, side_env in (("a", REPO, env), ("b", args.base, env_b))},
                "load_end": os.getloadavg(), "failures": FAILURES}

    return on_user_host("runner-bench-tail-", args.out, measure)


def submit(checkout: Path, env: dict, login, root: Path, work: Path, blocks: int, pause: float) -> str:
    (work / "writer.py").write_text(WRITER)
    (work / "writer.py").chmod(0o755)
    spec = work / f"w{blocks}-{pause}.json"
    spec.write_text(json.dumps({"name": "writer", "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": ["python3", str(work / "writer.py"), str(blocks), str(pause)]},
                                "limits": {"max_runtime": "20m"}}))
    argv, full_env, cwd = cli(checkout, env, "submit", str(spec))
    return subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()


def ended(root: Path, job_id: str) -> bool:
    try:
        return json.loads((root / "jobs" / job_id / "status.json").read_text())["state"] in ("SUCCEEDED", "FAILED")
    except (OSError, ValueError, KeyError):
        return False


def peak_rss_mib(argv: list[str], env: dict, cwd: Path) -> float:
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    return round(usage.ru_maxrss / 1024, 1)


def drain(args, login, root: Path, work: Path, env: dict, env_b: dict) -> dict:
    job_id = submit(REPO, env, login, root, work, args.mib, 0.0)
    job_b = submit(args.base, env_b, login, root, work, args.mib, 0.0)
    while not (ended(root, job_id) and ended(root, job_b)):
        time.sleep(0.5)
    log = root / "jobs" / job_id / "output.log"
    words = ("tail", job_id, "--from-start", "--max-wait", "120")
    words_b = ("tail", job_b, "--from-start", "--max-wait", "120")
    ssh = (["ssh", "-F", str(login.ssh_config), "-o", "ControlMaster=auto", "-o", f"ControlPath={work}/c.sock",
            "-o", "ControlPersist=300", login.alias, "tail", "-c", "+1", str(log)], None, REPO)
    mb = log.stat().st_size / 1e6
    a_vs_b = pairs(cli(REPO, env, *words), cli(args.base, env_b, *words_b), args.base_runs, warmup=0)
    a_vs_ssh = pairs(cli(REPO, env, *words), ssh, args.runs)
    return {"mb": round(mb, 1), "a_vs_b": a_vs_b, "a_vs_ssh_tail": a_vs_ssh,
            "mb_per_s": {"a": round(mb / a_vs_b["a_s"]["median"], 1), "b": round(mb / a_vs_b["b_s"]["median"], 1),
                         "ssh_tail": round(mb / a_vs_ssh["b_s"]["median"], 1)},
            "peak_rss_mib": {"a": peak_rss_mib(*cli(REPO, env, *words)), "b": peak_rss_mib(*cli(args.base, env_b, *words_b))}}


def follow(checkout: Path, args, login, root: Path, work: Path, env: dict) -> dict:
    """A tail -f loop on a ~10 MB/s writer, from its submit until a call exits 0 (or twice the writer's time)."""
    job_id = submit(checkout, env, login, root, work, args.follow_s * 10, 0.1)
    t0, printed, calls, code = time.monotonic(), bytearray(), 0, 75
    argv, full_env, cwd = cli(checkout, env, "tail", job_id, "-f", "--max-wait", "5")
    while code == 75 and time.monotonic() - t0 < 2 * args.follow_s + 10:
        done = subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True)
        printed += done.stdout
        calls, code = calls + 1, done.returncode
    took = time.monotonic() - t0
    written = (root / "jobs" / job_id / "output.log").read_bytes()
    return {"writer_mib": args.follow_s * 10, "loop_s": round(took, 1), "calls": calls, "last_exit": code,
            "printed_mib": round(len(printed) / (1 << 20), 1), "byte_exact": bytes(printed) == written[:len(printed)],
            "whole_log": len(printed) == len(written)}


if __name__ == "__main__":
    sys.exit(main())
