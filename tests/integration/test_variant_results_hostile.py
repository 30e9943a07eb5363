"""A variant's result the payload made hostile: nested 200000 deep, a FIFO, a symlink to /dev/zero or out of the
job dir, 36 MB. Each fails (or, too large to inline, sets aside) that variant alone: the others run, the
combined record is written and stays under the controller's cap, and `runner results` shows what it can.
The same reader serves the `result` verb for a plain job's result.json.

Real supervisor processes (tests/harness/supervisor_calls.Host) and the `runner` CLI on the local host."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from remote_payload.contract import MAX_RESULT_BYTES
from tests.cli_helpers import local_target, python_payload, run_cli, submit, wait_terminal, write_job
from tests.harness.pace import Scale
from tests.harness.supervisor_calls import Host, sweep_spec
from tests.hosts._proc import shared_tmpdir

WRITER = r"""
import json, os, sys
kind, path = sys.argv[1], os.environ["RUNNER_RESULT"]
outside = os.path.join(os.path.dirname(os.environ["RUNNER_JOB_DIR"]), "..", "outside.json")
if kind.startswith("object"):
    open(path, "w").write(json.dumps({"rows": [{"m": 1, "us": 2.5}]}))
elif kind == "deep":
    open(path, "w").write("[" * 200000)
elif kind == "deep-closed":
    open(path, "w").write("[" * 5000 + "]" * 5000)
elif kind == "fifo":
    os.mkfifo(path)
elif kind == "zero":
    os.symlink("/dev/zero", path)
elif kind == "outside":
    open(outside, "w").write(json.dumps({"secret": "of another user"}))
    os.symlink(os.path.abspath(outside), path)
elif kind == "big":
    row = {"m": 1, "us": 2.5, "pad": "x" * 1000}
    open(path, "w").write(json.dumps({"rows": [row] * 36000}))
print("wrote", kind, flush=True)
"""

BIG_MB = 36


@pytest.fixture
def host(tmp_path):
    host = Host(tmp_path)
    yield host
    host.cleanup()


@pytest.mark.parametrize("bad, why", [("deep", "nested deeper"), ("deep-closed", "nested deeper"),
                                      ("fifo", "not a regular file"), ("zero", "symlink"),
                                      ("outside", "symlink")])
def test_a_hostile_variant_result_fails_that_variant_alone(host, tmp_path, bad, why):
    bound = min(Scale()(40), 180)  # at this machine's pace, and still well under the guard's kill of a hung one
    started = time.monotonic()
    host.start("hostile-" + bad, sweep_spec(host, tmp_path, WRITER, ["object", bad, "object"]))
    final = host.wait("hostile-" + bad, "FAILED", "SUCCEEDED", "LOST", "TIMED_OUT", timeout=bound)
    assert time.monotonic() - started < bound  # a FIFO never blocks the read
    assert final["state"] == "FAILED" and "2 succeeded, 1 failed" in final["message"], final
    assert "supervisor error" not in final["message"] and "guard" not in final["message"], final
    combined = host.ok("result", "--job-id", "hostile-" + bad)["result"]
    assert combined["sweep"] == {"variants": 3, "succeeded": 2, "failed": 1, "skipped": 0}
    good, broken, later = combined["variants"]
    assert good["result"] == later["result"] == {"rows": [{"m": 1, "us": 2.5}]}
    assert broken["result"] is None and why in broken["error"] and "variant-2.json" in broken["error"], broken
    assert "secret" not in json.dumps(combined)


def test_a_36_mb_variant_result_stays_in_its_own_file_and_the_combined_record_under_the_cap(host, tmp_path):
    host.start("big", sweep_spec(host, tmp_path, WRITER, ["object", "big", "object"]))
    final = host.wait("big", "FAILED", "SUCCEEDED", timeout=60)
    assert final["state"] == "SUCCEEDED", final
    result_json = host.root / "jobs" / "big" / "result.json"
    assert result_json.stat().st_size < MAX_RESULT_BYTES
    combined = host.ok("result", "--job-id", "big")["result"]
    good, big, later = combined["variants"]
    assert good["result"] == later["result"] == {"rows": [{"m": 1, "us": 2.5}]}
    kept = big["result_file"]
    assert big["result"] is None and kept["name"] == "results/variant-2.json", big
    on_disk = (host.root / "jobs" / "big" / "results" / "variant-2.json").stat().st_size
    assert kept["bytes"] == on_disk > (BIG_MB - 1) << 20
    assert len(kept["sha256"]) == 64 and big["error"] is None


def plain_spec(host: Host, tmp_path, kind: str) -> dict:
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    spec = host.spec("sleep", "0", "0")
    spec["payload"]["command"] = [sys.executable, str(writer), kind]
    return spec


@pytest.mark.parametrize("bad, error", [("outside", "result-too-large"), ("zero", "result-too-large"),
                                        ("fifo", "result-too-large"), ("deep-closed", "no-result")])
def test_the_result_verb_reads_a_plain_jobs_result_json_only_as_a_bounded_regular_file(host, tmp_path, bad, error):
    host.start("plain-" + bad, plain_spec(host, tmp_path, bad))
    host.wait("plain-" + bad, "SUCCEEDED", "FAILED")
    bound = min(Scale()(30), 120)  # a read that blocked would hold the call to its timeout
    started = time.monotonic()
    rc, answer = host.call("result", "--job-id", "plain-" + bad, timeout=bound)
    assert time.monotonic() - started < bound
    assert rc == 1 and not answer["ok"] and answer["error"] == error, answer
    assert ("nested deeper" if bad == "deep-closed" else "result.json") in answer["message"], answer
    assert "secret" not in json.dumps(answer)


def test_runner_results_shows_the_other_variants_and_names_the_one_left_on_the_host():
    work, target = shared_tmpdir("runner-hostile-"), local_target()
    command = python_payload(work, "writer.py", WRITER) + ["{kind}"]
    path = write_job(work / "job.yaml", target, command=command, max_runtime="2m")
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": [{"kind": "object"}, {"kind": "big"}, {"kind": "object-again"}]}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job_id = submit(target, path)
    assert wait_terminal(target, job_id, timeout=90)["state"] == "SUCCEEDED"
    done = run_cli(target, "results", job_id)
    text = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "3 succeeded" in text and "kind=object" in text, text
    assert "variant 2" in text and "results/variant-2.json" in text and "left on the host" in text, text
    assert os.path.getsize(Path(target.root) / "jobs" / job_id / "results" / "variant-2.json") > (BIG_MB - 1) << 20
