"""A submit that returns while its job runs, and a tail that follows it, measured through the real CLI (separate
processes) over a loopback sshd.

    python bench/submit_then_tail.py [--seconds 60] [--out bench/results/submit_then_tail.json]

1. `runner submit` wall time, and that the job is still running after it returned;
2. repeated `runner tail ID -f --max-wait 5` on a job that prints a line a second for --seconds: each call's
   wall time and exit code (75 while running, 0 at the end); the concatenated output equals output.log.
Needs root (the sshd runs in its own namespaces); cleans up after itself.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("RUNNER_TEST_SSHD_KEX", "default")  # OpenSSH's own key exchanges (tests/hosts/sshd.py)
from tests.hosts._proc import shared_tmpdir  # noqa: E402
from tests.hosts.sshd import start_sshd  # noqa: E402

TICKER = "import sys, time\nfor i in range(int(sys.argv[1])):\n    print('tick', i, time.time(), flush=True)\n    time.sleep(1)\n"


def cli(env: dict, *args: str) -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, env=env)
    return done.returncode, done.stdout, time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--out", default="bench/results/submit_then_tail.json")
    args = parser.parse_args()
    host = start_sshd()
    work = shared_tmpdir("runner-submit-tail-")
    try:
        return measure(host, work, args)
    finally:
        host.stop()


def measure(host, work: Path, args) -> int:
    env = {**os.environ, "RUNNER_SSH_CONFIG": str(host.ssh_config), "RUNNER_STATE_DIR": str(work / "state")}
    (work / "ticker.py").write_text(TICKER)
    job = work / "job.yaml"
    job.write_text(json.dumps({"name": "submit-then-tail", "host": {"address": host.alias, "root": str(work / "root")},
                               "payload": {"command": ["python3", str(work / "ticker.py"), str(args.seconds)]},
                               "limits": {"max_runtime": "10m"}}))
    code, out, submit_s = cli(env, "submit", str(job))
    job_id = out.decode().strip()
    _, status_out, _ = cli(env, "status", job_id, "--json")
    state_after_submit = json.loads(status_out)["state"]
    calls, printed = [], b""
    while True:
        code, out, wall = cli(env, "tail", job_id, "-f", "--max-wait", "5")
        printed += out
        calls.append({"exit": code, "wall_s": round(wall, 3), "bytes": len(out)})
        if code != 75:
            break
    log = (work / "root" / "jobs" / job_id / "output.log").read_bytes()
    report = {"submit_s": round(submit_s, 3), "state_after_submit": state_after_submit,
              "tail_calls": calls, "max_tail_wall_s_while_running": max(c["wall_s"] for c in calls if c["exit"] == 75),
              "final_exit": calls[-1]["exit"], "bytes_printed": len(printed), "bytes_in_log": len(log),
              "exactly_once": printed == log, "loadavg": os.getloadavg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "tail_calls"}, indent=1))
    return 0 if report["exactly_once"] and report["final_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
