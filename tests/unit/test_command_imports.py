"""What a job's `tail` and `status` load before they call the host: every agent's poll pays it. Each module
named here is one a job's tail or status never needs (a run's store, the rollout, preflight's rules, tenacity
with concurrent.futures and logging, shutil with bz2 and lzma)."""
from __future__ import annotations

import json
import subprocess
import sys

NEVER = ["tenacity", "concurrent.futures", "logging", "shutil", "runner.state.fleet_store", "runner.remote.preflight",
         "runner.fleet.fleet_view", "runner.fleet.fleet", "pydantic", "yaml", "paramiko"]


def test_a_jobs_tail_and_status_load_none_of_the_modules_they_do_not_need(tmp_path):
    code = ("import json, sys\n"
            "from runner.cli import cli\n"
            "from runner.commands import controller\n"
            "from runner.fleet import targets\n"
            "from runner.remote.transport_openssh import for_host\n"
            "from runner.deadline import Deadline\n"
            "for_host({'address': 'box', 'transport': 'openssh'})\n"
            "assert controller._retrying(Deadline(5.0))(lambda x: x, 1) == 1  # status's idempotent call\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RUNNER_STATE_DIR": str(tmp_path),
                               "PYTHONPATH": ":".join(sys.path)})
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert sorted(name for name in NEVER if name in loaded) == []


def test_a_run_is_still_told_from_a_job_by_its_record(tmp_path):
    from runner.state.fleet_store import RunStore
    from runner.state.store import Store

    store = Store(tmp_path)
    run_id = "fleet-20261202-000000-abcdef"
    assert not RunStore(store).exists(run_id) and not store.is_run(run_id)
    store.runs_dir.mkdir(parents=True, exist_ok=True)
    (store.runs_dir / f"{run_id}.json").write_text("{}")
    assert RunStore(store).exists(run_id) and store.is_run(run_id)
    assert not store.is_run("not a job id/..")
