"""Submits through the real CLI in a child that reports whether it validated (imported pydantic): what the plan
cache saves a warm submit."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_helpers import REPO, Target, run_cli, wait_terminal

# The CLI in a child that reports, as it exits, whether pydantic (the validation) was imported.
REPORTING = ("import atexit, sys\n"
             "atexit.register(lambda: print('pydantic imported:', 'pydantic' in sys.modules, file=sys.stderr))\n"
             "from runner.cli.cli import main\n"
             "main(sys.argv[1:])\n")


def submit_reporting(job, *extra: str) -> tuple[str, bool]:
    done = subprocess.run([sys.executable, "-c", REPORTING, "submit", str(job), "--json", *extra], cwd=REPO,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)["job_id"], b"pydantic imported: True" in done.stderr


def output_of(target: Target, job_id: str) -> bytes:
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    return run_cli(target, "tail", job_id, "--from-start").stdout
