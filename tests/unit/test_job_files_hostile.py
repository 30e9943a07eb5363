"""A job's files are its payload's to replace: reading them never blocks (a FIFO), never reads a device or a
huge file whole, and a status.json the payload rewrites in place (empty for a moment) is read again, not
answered as `bad-status` at once."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from remote_payload.host.answer import Fail
from remote_payload.supervision import files
from remote_payload.supervision.files import NotRegular, open_regular, read_json, read_status
from remote_payload.verbs.logs import read_log_chunk
from tests.harness.ledger_records import job


def returns_within(seconds: float, call):
    """call()'s outcome (value or exception), or a failure if it is still blocked after `seconds`."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("value", call()))
        except BaseException as exc:  # noqa: B036 - handed to the test
            outcome.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still blocked after {seconds} s"
    return outcome[0]


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "status.json"
    os.mkfifo(fifo)
    kind, value = returns_within(5, lambda: read_json(str(fifo)))
    assert kind == "raised" and isinstance(value, NotRegular), value
    kind, value = returns_within(5, lambda: read_log_chunk(str(fifo), 0, 1024))
    assert (kind, value) == ("value", (b"", 0))


def test_a_device_is_refused_before_a_byte_is_read(tmp_path):
    link = tmp_path / "spec.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(NotRegular):
        open_regular(str(link))


def test_a_record_larger_than_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "MAX_RECORD_BYTES", 64)
    big = tmp_path / "status.json"
    big.write_text(json.dumps({"state": "RUNNING", "pad": "x" * 100}))
    with pytest.raises(ValueError, match="larger than 64 bytes"):
        read_json(str(big))


def test_a_status_json_rewritten_in_place_is_read_again(tmp_path):
    paths, _spec, status = job(tmp_path)
    with open(paths.status, "w"):
        pass  # truncated, as `open(path, "w")` leaves it before the payload's write lands

    def write_later() -> None:
        time.sleep(0.04)
        with open(paths.status, "w") as fh:
            json.dump(status, fh)

    threading.Thread(target=write_later, daemon=True).start()
    assert read_status(paths)["state"] == status["state"]


def test_a_status_json_that_stays_unreadable_is_bad_status(tmp_path):
    paths, _spec, _status = job(tmp_path)
    with open(paths.status, "w") as fh:
        fh.write("{")
    began = time.monotonic()
    with pytest.raises(Fail) as caught:
        read_status(paths)
    assert caught.value.code == "bad-status" and time.monotonic() - began < 5
