"""What a job's `tail` and `status` load before they call the host: every agent's poll pays it. Each module
named here is one a job's tail or status never needs (a run's store, the rollout, pydantic and yaml, paramiko,
shutil with bz2 and lzma), or a tail never needs (tenacity with concurrent.futures and logging: it retries
nothing; OpenSSL)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NEVER = ["shutil", "runner.state.fleet_store", "runner.fleet.fleet_view", "runner.fleet.fleet", "pydantic", "yaml",
         "paramiko"]
# What a job's tail never needs besides: the retries of status (tenacity), and OpenSSL's hashing once the
# supervisor's digest and the host's ssh config are recorded in the state dir (the first command of a state dir
# records them).
TAIL_NEVER = ["tenacity", "concurrent.futures", "logging", "hashlib", "_hashlib", "tempfile", "random"]
# The children below get a bare environment: they keep their bytecode where this process does (.ci/run's floor: outside
# the checkout, PYTHONPYCACHEPREFIX), or write none when it writes none; never beside the modules on their own.
BYTECODE = ({"PYTHONPYCACHEPREFIX": sys.pycache_prefix} if sys.pycache_prefix else {}) | (
    {"PYTHONDONTWRITEBYTECODE": "1"} if sys.dont_write_bytecode else {})
# An `ssh` on PATH that answers `ssh -G` (the machine's own would read its real config).
FAKE_SSH = "#!/bin/sh\nprintf 'hostname 127.0.0.1\\nport 22\\nuserknownhostsfile {known}\\n'\n"


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
                               "PYTHONPATH": ":".join(sys.path), **BYTECODE})
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


@pytest.mark.parametrize("long_state_dir", [False, True])
def test_a_jobs_tail_loads_no_other_commands_types_nor_hashing_once_recorded(tmp_path, long_state_dir):
    # A short state dir holds its control sockets; a long one's would not fit a socket path: they go to a dir
    # of the temp dir named by a hash (remembered too).
    state = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    if long_state_dir:
        state = state / ("long-" * 12)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH.format(known=tmp_path / "known_hosts"))
    (bin_dir / "ssh").chmod(0o755)
    code = ("import json, sys\n"
            "from runner.cli import cli\n"
            "from runner.commands import controller\n"
            "from runner.deadline import Deadline\n"
            "from runner.remote.bundles import supervisor_bundle\n"
            "from runner.remote.transport_openssh import for_host\n"
            "assert supervisor_bundle().digest\n"
            "for_host({'address': 'box', 'transport': 'openssh'}).command('true', Deadline(5.0))  # ssh -G, trust\n"
            "print(json.dumps(sorted(sys.modules)))\n")

    def loaded() -> set[str]:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", "RUNNER_STATE_DIR": str(state),
                                   "HOME": str(tmp_path), "PYTHONPATH": ":".join(sys.path), **BYTECODE})
        assert done.returncode == 0, done.stderr
        return set(json.loads(done.stdout))

    try:
        assert "hashlib" in loaded()  # the state dir's first command: it hashes, and records
        again = loaded()
    finally:
        shutil.rmtree(state.parent if long_state_dir else state)
    assert sorted(name for name in NEVER + TAIL_NEVER if name in again) == []
