"""A host with thousands of jobs: `runner status --all` answers every one (no job id list in argv: the kernel
bounds each argv string to 128 KiB), and `list`/`status` without --all read the recent and unfinished jobs only."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from runner.deadline import Deadline
from runner.remote.bundles import supervisor_bundle
from runner.remote.host import HostClient
from runner.remote.transport import LocalTransport
from runner.state.store import RECENT_JOBS, JobRecord, Store
from tests.cli_helpers import Target, run_cli, submit, wait_terminal, write_job
from tests.hosts._proc import shared_tmpdir

JOBS = 5000


class RecordingTransport(LocalTransport):
    """The local transport, keeping the length of every argv it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.argv_bytes: list[int] = []

    def run(self, argv, *, stdin=b"", deadline):
        self.argv_bytes.append(sum(len(word.encode()) + 1 for word in argv))
        return super().run(argv, stdin=stdin, deadline=deadline)


def copy_job(root: Path, model: str, job_ids: list[str]) -> None:
    """Job dirs on the host made from one real ended job's, each status.json naming its own id."""
    status = json.loads((root / "jobs" / model / "status.json").read_text())
    for job_id in job_ids:
        (root / "jobs" / job_id).mkdir()
        (root / "jobs" / job_id / "status.json").write_text(json.dumps(dict(status, job_id=job_id)))


def write_records(state: Path, records: list[JobRecord]) -> None:
    """Records as a state dir from before the index holds them: files only (the first reader indexes them)."""
    (state / "jobs").mkdir(parents=True, exist_ok=True)
    for record in records:
        (state / "jobs" / f"{record.job_id}.json").write_text(json.dumps(record.__dict__))


@pytest.fixture
def user_target(ssh_host):
    user_host = ssh_host.as_user(ssh_host.non_root_user)
    root = shared_tmpdir("runner-root-many-")
    subprocess.run(["chown", user_host.user, str(root)], check=True)
    yield Target("ssh", {"address": user_host.alias, "root": str(root)}, root,
                 {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, user_host)
    subprocess.run(["rm", "-rf", str(root)], check=False)


@pytest.mark.slow(seconds=25)
def test_status_of_5000_jobs_on_one_host(user_target, runner_state_dir, tmp_path):
    ids = [f"many-{n:05d}" for n in range(JOBS)]
    now = time.time()
    write_records(runner_state_dir, [JobRecord(job_id=j, name="many", host=user_target.host, spec_path="x.yaml",
                                               submitted_at=now - JOBS + n,
                                               last_state="RUNNING" if n % 1000 == 0 else "SUCCEEDED")
                                     for n, j in enumerate(ids)])
    model = submit(user_target, write_job(tmp_path / "job.yaml", user_target, command=["true"]))
    assert wait_terminal(user_target, model)["state"] == "SUCCEEDED"
    copy_job(user_target.root, model, ids)
    subprocess.run(["chown", "-R", user_target.ssh_host.user, str(user_target.root / "jobs")], check=True)
    every = run_cli(user_target, "status", "--all", "--json", timeout=300)
    rows = json.loads(every.stdout) if every.stdout.startswith(b"[") else []
    assert every.returncode == 0, every.stderr.decode()[-2000:]
    assert sorted(row["job_id"] for row in rows) == sorted([model, *ids])
    assert {row["state"] for row in rows} == {"SUCCEEDED"}
    listed = run_cli(user_target, "list", "--json")  # every record's last state is SUCCEEDED now: the window only
    assert len(json.loads(listed.stdout)) == RECENT_JOBS and b"older ended jobs not shown" in listed.stderr
    assert len(json.loads(run_cli(user_target, "list", "--all", "--json").stdout)) == JOBS + 1


def test_status_ids_never_go_through_argv(tmp_path):
    """The same host call for 10 and for 5,000 ids: argv does not grow with them; every id is answered."""
    root = tmp_path / "root"
    with HostClient(LocalTransport(), root=str(root), python="python3", bundle=supervisor_bundle(),
                    deadline=Deadline(120)) as client:
        client.status([])  # uploads the supervisor's bundle: the calls below are status calls only
    lengths = {}
    for count in (10, JOBS):
        transport = RecordingTransport()
        with HostClient(transport, root=str(root), python="python3", bundle=supervisor_bundle(),
                        deadline=Deadline(120)) as client:
            ids = [f"absent-{n:05d}" for n in range(count)]
            jobs = client.status(ids)
        assert [job.job_id for job in jobs] == ids and {job.state for job in jobs} == {"UNKNOWN"}
        lengths[count] = max(transport.argv_bytes)
    assert lengths[JOBS] == lengths[10], lengths


def test_list_and_status_read_the_recent_and_the_unfinished(tmp_path):
    """Without --all: the newest RECENT_JOBS records, and an old one still running, in submission order."""
    store = Store(tmp_path / "state")
    host = {"address": "local", "root": str(tmp_path / "root")}
    for n in range(RECENT_JOBS + 30):
        store.save(JobRecord(job_id=f"j-{n:03d}", name="j", host=host, spec_path="x.yaml", submitted_at=1000.0 + n,
                             last_state="RUNNING" if n == 3 else "SUCCEEDED"))
    records, skipped, older = store.recent()
    assert [r.job_id for r in records] == ["j-003", *(f"j-{n:03d}" for n in range(30, RECENT_JOBS + 30))]
    assert (skipped, older) == ([], 29)
    store.update_state("j-003", "FAILED")
    assert [r.job_id for r in store.recent()[0]][0] == "j-030"
    store.forget("j-079")
    assert "j-079" not in [r.job_id for r in store.recent()[0]]
