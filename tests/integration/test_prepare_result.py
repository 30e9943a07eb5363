"""A job whose prepare step wrote a result and whose payload failed before writing one has no result: `runner
results` exits 1 saying why, and never shows the prepare step's file as the job's result. The prepare step has
a file of its own (prepare-result.json); a result.json it writes by a path of its own is set aside there too.

The local host (no service): the prepare step and the payload are plain commands.
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import job_dir, local_target, python_payload, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

PREPARE = """\
import json, os, sys
path = os.environ["RUNNER_RESULT"] if sys.argv[1] == "env" else "result.json"
with open(path, "w") as fh:
    json.dump({"payload": "sglang", "prepare": {"backend": "sglang", "kernels": []}}, fh)
print("prepared", flush=True)
"""
FAILING = """\
import sys
print("payload failed before timing anything", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("where", ["env", "cwd"])
def test_a_failed_job_has_no_result_even_when_its_prepare_step_wrote_one(where):
    work, target = shared_tmpdir("runner-prepres-"), local_target()
    path = write_job(work / "job.yaml", target, command=python_payload(work, "payload.py", FAILING))
    spec = yaml.safe_load(path.read_text())
    spec["payload"]["prepare_command"] = python_payload(work, "prepare.py", PREPARE) + [where]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job_id = submit(target, path)
    job = wait_terminal(target, job_id)
    assert job["state"] == "FAILED" and job["prepare"]["exit_code"] == 0, job
    done = run_cli(target, "results", job_id)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 1, (done.returncode, out, err)
    assert "without a result" in err and "code 3" in err, err
    assert "prepare-result.json" in err, err
    assert "sglang" not in out, out
    kept = json.loads((job_dir(target, job_id) / "prepare-result.json").read_text())
    assert kept["prepare"]["backend"] == "sglang"
    assert not (job_dir(target, job_id) / "result.json").exists()
