"""remote_payload/supervision/restore/owed.py: what a restorer believes when status.json or spec.json was overwritten by the payload.
Pure file-level cases on a real ROOT layout (no service; the systemd cases are tests/integration/test_forged_status.py)."""
from __future__ import annotations

import json

import pytest

from remote_payload.supervision import ledger
from remote_payload.supervision.restore import owed
from remote_payload.host.answer import Fail
from tests.harness.ledger_records import UNIT, job, stopped_by


def test_garbage_status_with_a_ledger_stop_is_settled_from_the_ledger(tmp_path):
    paths, spec, _ = job(tmp_path)
    stopped_by(tmp_path, paths, spec, pid=4242, pgid=4242, start_time=99)
    (tmp_path / "jobs" / "j1" / "status.json").write_text("\0 garbage")
    rebuilt = owed.load_for_restore(paths)
    assert rebuilt.status["state"] == "LOST" and rebuilt.status["restored"] is False
    assert rebuilt.status["service"]["stopped"] is True and rebuilt.status["service"]["was"] == "active"
    assert rebuilt.status["payload"]["pgid"] == 4242 and "cannot be read" in rebuilt.status["message"]
    assert rebuilt.spec["service"]["health_url"] == "http://127.0.0.1:9/health"


def test_forged_success_is_not_believed_while_the_ledger_names_the_job(tmp_path):
    paths, spec, status = job(tmp_path)
    stopped_by(tmp_path, paths, spec)
    forged = dict(status, state="SUCCEEDED", restored=True, service=dict(status["service"], stopped=False))
    (tmp_path / "jobs" / "j1" / "status.json").write_text(json.dumps(forged))
    assert "SUCCEEDED and restored" in owed.contradiction(forged, owed.stops_owed(str(tmp_path), "j1"))
    rebuilt = owed.load_for_restore(paths)
    assert rebuilt.status["state"] == "LOST" and rebuilt.status["service"]["stopped"] is True


def test_a_forged_spec_cannot_point_the_restore_at_another_unit(tmp_path):
    paths, spec, _ = job(tmp_path)
    stopped_by(tmp_path, paths, spec)
    (tmp_path / "jobs" / "j1" / "spec.json").write_text(json.dumps(dict(spec, service=dict(spec["service"],
                                                                                            unit="other.service"))))
    assert owed.load_for_restore(paths).spec["service"]["unit"] == UNIT


def test_an_honest_status_is_taken_as_is(tmp_path):
    paths, spec, status = job(tmp_path)
    assert owed.load_for_restore(paths).status == status  # no ledger entry: nothing owed
    stopped_by(tmp_path, paths, spec)
    lost = dict(status, state="LOST", restored=False)  # a reap's LOST, its restore to come: what the ledger says
    (tmp_path / "jobs" / "j1" / "status.json").write_text(json.dumps(lost))
    assert owed.contradiction(lost, owed.stops_owed(str(tmp_path), "j1")) is None


def test_garbage_everywhere_and_no_ledger_entry_is_bad_status(tmp_path):
    paths, _, _ = job(tmp_path)
    (tmp_path / "jobs" / "j1" / "status.json").write_text("[]")
    (tmp_path / "jobs" / "j1" / "spec.json").write_text("nope")
    with pytest.raises(Fail) as failed:
        owed.load_for_restore(paths)
    assert failed.value.code == "bad-status"


def test_entries_of_another_job_or_a_bad_unit_are_not_owed(tmp_path):
    paths, spec, _ = job(tmp_path)
    ledger.record_stop(str(tmp_path), UNIT, "someone-else", dict(spec["service"], was="active"), [])
    assert owed.stops_owed(str(tmp_path), "j1") == []
    with open(ledger.ledger_path("x.service"), "w") as fh:
        fh.write(json.dumps({"unit": "../x", "job_id": "j1"}))
    assert owed.stops_owed(str(tmp_path), "j1") == []


def test_a_forged_payload_process_cannot_point_a_restorers_kill_elsewhere(tmp_path):
    """The payload's process group a restorer kills is the one the supervisor noted in the ledger, not one a
    forged status.json names (with a live process's start time, read from /proc, it would pass the check)."""
    paths, spec, status = job(tmp_path)
    stopped_by(tmp_path, paths, spec, pid=4242, pgid=4242, start_time=99)
    forged = dict(status, state="RUNNING", payload={"pid": 1, "pgid": 1, "start_time": 1, "exit_code": None},
                  slots=[{"pid": 1, "pgid": 1, "start_time": 1}])
    (tmp_path / "jobs" / "j1" / "status.json").write_text(json.dumps(forged))
    believed = owed.load_for_restore(paths).status
    assert {k: believed["payload"][k] for k in ("pid", "pgid", "start_time")} == {"pid": 4242, "pgid": 4242,
                                                                                  "start_time": 99}
    assert believed["slots"] == []


@pytest.mark.parametrize("back", [True, False])
def test_only_a_restorer_that_saw_the_unit_back_clears_the_ledger_entry(tmp_path, monkeypatch, back):
    """A record saying nothing was stopped does not skip the restore (the ledger says it is owed); the entry
    goes only once the unit is active and healthy; a failed restore leaves it, marked as tried, and the job's
    recorded end then stands (not contradicted)."""
    from remote_payload.supervision.record import Job
    from remote_payload.supervision.restore import settle

    paths, spec, status = job(tmp_path)
    stopped_by(tmp_path, paths, spec)
    forged = dict(status, state="RUNNING", service=dict(status["service"], stopped=False, was=None))
    restored = []

    def bring_back(view, since=None):
        restored.append(view.status["service"]["was"])
        view.save(service=dict(view.status["service"], now="active" if back else "failed", healthy=back))

    monkeypatch.setattr(settle, "bring_back", bring_back)
    monkeypatch.setattr(settle, "stop_guard_timer", lambda job: None)
    settle.settle(Job(paths, spec, forged), ("FAILED", "t"))
    assert restored == ["active"]
    entry = ledger.read_entry(str(tmp_path), UNIT)
    if back:
        assert entry is None
    else:
        assert entry["job_id"] == "j1" and entry["restore_failed_at"]
        final = json.loads((tmp_path / "jobs" / "j1" / "status.json").read_text())
        assert owed.contradiction(final, owed.stops_owed(str(tmp_path), "j1")) is None and final["state"] == "FAILED"
