"""`runner list` and `runner status` (no id) as a host's job history grows, against a baseline checkout.

    python bench/status_many_jobs.py --base /tmp/base [--sizes 10,1000,10000,20000] [--runs 7]
        [--out bench/results/status_many_jobs.json]

A loopback sshd, a non-root login; two jobs running (`sleep`, submitted first, so the oldest), then ended jobs
added until the controller knows each size: their records written as files (a state dir from before the
index: the code under test indexes it once, in the warm-up run) and their host dirs holding a copy of a real
ended job's status.json. At each size: `runner list` and `runner status` of the code under test (A) and of the
baseline (B), in turn; a warm-master `ssh HOST true` (one round trip) beside them; the code under test's
`status --all` once (every job answered?). Needs root (the sshd's namespaces); removes what it made.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from interleave import REPO, cli, pairs, shared_tmpdir, timed, on_user_host

SLEEP_S = 900


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--sizes", default="10,1000,10000,20000")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default="bench/results/status_many_jobs.json")
    args = parser.parse_args()
    return on_user_host("runner-bench-state-", args.out, lambda login, root, work, env: measure(args, login, root, work / "state", env))


def submit(env: dict, root: Path, login, work: Path, name: str, command: list[str]) -> str:
    spec = work / f"{name}.json"
    spec.write_text(json.dumps({"name": name, "host": {"address": login.alias, "root": str(root)},
                                "payload": {"command": command}, "limits": {"max_runtime": "20m"}}))
    argv, full_env, cwd = cli(REPO, env, "submit", str(spec))
    return subprocess.run(argv, env=full_env, cwd=cwd, capture_output=True, check=True).stdout.decode().strip()


def add_ended_jobs(state: Path, root: Path, model: dict, login, first: int, last: int) -> None:
    """Ended jobs first..last-1: a record here (submitted after every job before it), a status.json there."""
    for n in range(first, last):
        job_id = f"old-{n:05d}"
        record = {"job_id": job_id, "name": "old", "host": {"address": login.alias, "root": str(root)},
                  "spec_path": "x.json", "submitted_at": time.time(), "last_state": "SUCCEEDED"}
        (state / "jobs" / f"{job_id}.json").write_text(json.dumps(record))
        (root / "jobs" / job_id).mkdir()
        (root / "jobs" / job_id / "status.json").write_text(json.dumps(dict(model, job_id=job_id)))
    subprocess.run(["chown", "-R", login.user, str(root / "jobs")], check=True)
    (state / "index").unlink(missing_ok=True)  # as a state dir from before the index: indexed by a first reader


def measure(args, login, root: Path, state: Path, env: dict) -> dict:
    work = shared_tmpdir("runner-bench-work-")
    running = [submit(env, root, login, work, f"running-{n}", ["sleep", str(SLEEP_S)]) for n in range(2)]
    ended = submit(env, root, login, work, "ended", ["true"])
    time.sleep(3)
    model = json.loads((root / "jobs" / ended / "status.json").read_text())
    rtt = (["ssh", "-F", str(login.ssh_config), "-o", "ControlMaster=auto", "-o", f"ControlPath={work}/rtt.sock",
            "-o", "ControlPersist=300", login.alias, "true"], None, REPO)
    report = {"running": running, "sizes": {}}
    known = 3
    for size in [int(s) for s in args.sizes.split(",")]:
        add_ended_jobs(state, root, model, login, known, size)
        known = max(known, size)
        row = {}
        for name, words in (("list", ["list"]), ("status", ["status"])):
            row[name] = pairs(cli(REPO, env, *words), cli(args.base, env, *words), args.runs)
        row["ssh_true_warm_master_s"] = pairs(rtt, rtt, 3)["a_s"]
        wall, code = timed(*cli(REPO, env, "status", "--all"))
        row["status_all_once"] = {"s": round(wall, 2), "exit": code}
        report["sizes"][size] = row
        print(size, json.dumps(row), file=sys.stderr)
    for job_id in running:
        timed(*cli(REPO, env, "cancel", job_id))
    shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    sys.exit(main())
