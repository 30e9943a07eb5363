"""Every record the host writes says which code wrote it (the wire protocol and the supervisor's bundle), and a
status.json written by a newer protocol is refused, never half understood."""
from __future__ import annotations

import json

import pytest

from remote_payload.contract import PROTOCOL
from remote_payload.host.answer import Fail
from remote_payload.supervision import ledger
from remote_payload.supervision.files import read_status
from tests.harness.ledger_records import UNIT, job, stopped_by


def test_status_json_and_the_ledger_entry_carry_protocol_and_bundle(tmp_path):
    paths, spec, status = job(tmp_path)
    assert status["protocol"] == PROTOCOL and isinstance(status["bundle"], str) and status["bundle"]
    stopped_by(tmp_path, paths, spec)
    entry = ledger.read_entry(str(tmp_path), UNIT)
    assert entry["protocol"] == PROTOCOL and entry["bundle"] == status["bundle"]


def test_a_status_written_by_a_newer_protocol_is_refused_by_name(tmp_path):
    paths, _spec, status = job(tmp_path)
    (tmp_path / "jobs" / "j1" / "status.json").write_text(json.dumps(dict(status, protocol=PROTOCOL + 1,
                                                                          bundle="f00d")))
    with pytest.raises(Fail) as caught:
        read_status(paths)
    assert caught.value.code == "newer-protocol"
    assert f"protocol {PROTOCOL + 1}" in str(caught.value) and "'f00d'" in str(caught.value)


@pytest.mark.parametrize("written", [None, PROTOCOL])
def test_an_older_or_unstamped_status_is_read(tmp_path, written):
    paths, _spec, status = job(tmp_path)
    record = {k: v for k, v in status.items() if k not in ("protocol", "bundle")}
    if written is not None:
        record["protocol"] = written
    (tmp_path / "jobs" / "j1" / "status.json").write_text(json.dumps(record))
    assert read_status(paths)["state"] == "QUEUED"
