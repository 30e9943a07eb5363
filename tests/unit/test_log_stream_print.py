"""A streamed log's frames are printed as they come, byte for byte, and a call that ends inside a frame prints its
whole frames only: the cursor covers exactly the bytes printed (controller._print_log over remote.host.LogFrames)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile

import pytest

from runner.commands import controller
from runner.deadline import Deadline
from runner.errors import RemoteError
from runner.remote.host import LogFrames
from runner.remote.transport import Stream
from runner.state.store import JobRecord

BLOB = os.urandom(3 << 20)
RECORD = JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=0.0)


class OneCallClient:
    """What LogFrames asks of a HostClient, answering with a process that writes `wire` and exits."""

    def __init__(self, wire: bytes):
        self.wire = wire

    def _open_stream(self, sub, args):
        with tempfile.NamedTemporaryFile(delete=False) as fh:
            fh.write(self.wire)
        argv = ["sh", "-c", 'cat "$0" && rm "$0"', fh.name]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return Stream(proc, argv, Deadline(30), "test")

    def upload(self):
        raise AssertionError("no upload expected")


def frame(offset: int, data_len: int, size: int, last: bool = False) -> bytes:
    header = {"ok": True, "offset": offset, "next_offset": offset + data_len, "size": size, "state": "RUNNING",
              "terminal": False, "exit_code": None, "data_len": data_len, "last": last}
    return json.dumps(header).encode() + b"\n"


def test_a_whole_call_printed_to_a_file_is_byte_exact(tmp_path):
    step = 1 << 20
    wire = b"".join(frame(at, step, len(BLOB)) + BLOB[at:at + step] for at in range(0, len(BLOB), step)) \
        + frame(len(BLOB), 0, len(BLOB), last=True)
    target = tmp_path / "printed"
    with open(target, "wb") as out:
        out.write(b"before\n")
        outcome = controller._print_log(RECORD, 0, LogFrames(OneCallClient(wire), [], 0, step), out)
    assert target.read_bytes() == b"before\n" + BLOB
    assert (outcome.offset, outcome.printed) == (len(BLOB), len(BLOB))


def test_a_call_that_ends_inside_a_frame_prints_its_whole_frames_only():
    first, second = BLOB[:4096], BLOB[4096:8192]
    wire = frame(0, len(first), 1 << 20) + first + frame(4096, len(second), 1 << 20) + second[:1000]
    out = io.BytesIO()
    outcome = controller._print_log(RECORD, 0, LogFrames(OneCallClient(wire), [], 0, 1 << 20), out)
    assert out.getvalue() == first and (outcome.offset, outcome.printed) == (4096, 4096)
    assert not outcome.terminal  # "call again": the rest comes with the next call


def test_a_failing_call_raises_when_nothing_was_printed():
    frames = LogFrames(OneCallClient(frame(0, 4096, 1 << 20)), [], 0, 1 << 20)  # its bytes never come
    with pytest.raises(RemoteError, match="inside a frame"):
        controller._print_log(RECORD, 0, frames, io.BytesIO())
