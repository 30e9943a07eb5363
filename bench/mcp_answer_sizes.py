"""Bytes an agent reads from `runner mcp`'s list, status and tail, and how many tail calls a 4-row demo job
takes: for a checkout (default: this one), so a baseline checkout can be measured the same way.

    python bench/mcp_answer_sizes.py [--checkout DIR] [--jobs 10]

Jobs: the demo payload (1 s) on the local host, with a state dir and host root of their own (removed after).
Each answer is measured as the tool's JSON text (the structured content serialised as the server sends it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, sys, time
from pathlib import Path
from runner.mcp.mcp_server import Tools
from runner.mcp.mcp_policy import Policy

jobs, root = int(sys.argv[1]), sys.argv[2]
tools = Tools(Policy.for_project(Path.cwd(), allow_overrides=True, allow_local=True))
def submit(seconds):
    return tools.submit("jobs/demo.yaml", [f"payload.args.seconds={seconds}", f"host.root={root}",
                                           "host.address=local"])["job_id"]
ids = [submit(1) for _ in range(jobs)]
for job_id in ids:
    while tools.tail(job_id, max_wait=10)["call_again"]:
        pass
size = lambda answer: len(json.dumps(answer))
sizes = {"jobs": jobs, "list_bytes": size(tools.list_jobs()), "status_one_bytes": size(tools.status(ids[0])),
         "status_all_bytes": size(tools.status())}
four_rows, calls = submit(4), 0
while True:
    calls += 1
    if not tools.tail(four_rows)["call_again"]:
        break
print(json.dumps({**sizes, "tail_calls_4_rows": calls}))
"""


def measure(checkout: Path, jobs: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="runner-bench-mcp-"))
    os.chmod(work, 0o755)
    try:
        env = {**os.environ, "RUNNER_STATE_DIR": str(work / "state"), "PYTHONPATH": str(checkout)}
        done = subprocess.run([sys.executable, "-c", PROBE, str(jobs), str(work / "root")], cwd=checkout, env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        return json.loads(done.stdout.splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--jobs", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps({"checkout": str(args.checkout), **measure(args.checkout.resolve(), args.jobs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
