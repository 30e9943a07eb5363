"""A streamed log's bytes go from the call's pipe to the tail's output without passing through Python where the
output allows a splice (Stream.move_to), and read and written where it does not; a call that ends inside a frame
counts what it had delivered, so that the cursor covers exactly the bytes printed."""
from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
import threading

import pytest

from runner.commands import controller
from runner.deadline import Deadline
from runner.errors import RemoteError
from runner.remote.host import LogFrames
from runner.remote.transport import Stream
from runner.state.store import JobRecord

BLOB = os.urandom(3 << 20)


def producing(data: bytes) -> Stream:
    """A Stream over a process that writes `data` and exits."""
    with tempfile.NamedTemporaryFile(delete=False) as fh:
        fh.write(data)
    argv = ["sh", "-c", 'cat "$0" && rm "$0"', fh.name]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return Stream(proc, argv, Deadline(30), "test")


def drained_into_pipe(stream: Stream, size: int) -> tuple[int, bytes]:
    read_end, write_end = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: os.read(read_end, 1 << 16), b""))),
                              daemon=True)
    reader.start()
    try:
        moved = stream.move_to(write_end, size)
    finally:
        os.close(write_end)  # the reader's end of file, also when move_to failed
        reader.join()
    os.close(read_end)
    return moved, got[0]


def test_bytes_after_a_line_go_to_a_pipe_by_splice_exactly():
    stream = producing(b"header\n" + BLOB + b"rest")
    assert stream.readline(1 << 16) == b"header\n"
    moved, out = drained_into_pipe(stream, len(BLOB))
    assert (moved, out) == (len(BLOB), BLOB)
    assert stream._splice  # the kernel moved them
    assert stream.read(10) == b"rest"
    stream.close()


def test_an_output_that_takes_no_splice_gets_them_read_and_written(tmp_path):
    stream = producing(b"header\n" + BLOB)
    assert stream.readline(1 << 16) == b"header\n"
    target = tmp_path / "out"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # splice refuses O_APPEND: EINVAL
    try:
        assert stream.move_to(fd, len(BLOB)) == len(BLOB)
    finally:
        os.close(fd)
    assert not stream._splice
    assert target.read_bytes() == BLOB
    stream.close()


def test_an_output_that_ends_early_moves_what_there_was():
    stream = producing(b"header\n" + BLOB[:1000])
    stream.readline(1 << 16)
    moved, out = drained_into_pipe(stream, len(BLOB))
    assert (moved, out) == (1000, BLOB[:1000])
    stream.close()


class OneCallClient:
    """What LogFrames asks of a HostClient, answering with a process that writes `wire`."""

    def __init__(self, wire: bytes):
        self.wire = wire

    def _open_stream(self, sub, args):
        return producing(self.wire)

    def upload(self):
        raise AssertionError("no upload expected")


def frame(offset: int, data_len: int, size: int, last: bool = False) -> bytes:
    header = {"ok": True, "offset": offset, "next_offset": offset + data_len, "size": size, "state": "RUNNING",
              "terminal": False, "exit_code": None, "data_len": data_len, "last": last}
    return json.dumps(header).encode() + b"\n"


@pytest.mark.parametrize("out_kind", ["file", "memory"])
def test_a_call_that_ends_inside_a_frame_counts_the_bytes_it_printed(tmp_path, out_kind):
    first, second = BLOB[:4096], BLOB[4096:8192]
    wire = frame(0, len(first), 1 << 20) + first + frame(4096, len(second), 1 << 20) + second[:1000]
    frames = LogFrames(OneCallClient(wire), [], 0, 1 << 20)
    record = JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=0.0)
    if out_kind == "memory":
        out = io.BytesIO()
        outcome = controller._print_log(record, 0, frames, out)
        printed = out.getvalue()
    else:
        target = tmp_path / "printed"
        with open(target, "wb") as out:
            outcome = controller._print_log(record, 0, frames, out)
        printed = target.read_bytes()
    # memory: whole frames only (the partial one was never handed on); a file: the partial frame's bytes
    # were spliced into it, and the cursor covers them
    assert printed == (first if out_kind == "memory" else first + second[:1000])
    assert (outcome.offset, outcome.printed) == (len(printed), len(printed))


def test_a_whole_call_delivered_to_a_file_is_byte_exact(tmp_path):
    step = 1 << 20
    wire = b"".join(frame(at, step, len(BLOB)) + BLOB[at:at + step] for at in range(0, len(BLOB), step)) \
        + frame(len(BLOB), 0, len(BLOB), last=True)
    frames = LogFrames(OneCallClient(wire), [], 0, 1 << 20)
    target = tmp_path / "printed"
    with open(target, "wb") as out:
        out.write(b"before\n")  # buffered in `out`: flushed before any byte is spliced after it
        outcome = controller._print_log(
            JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=0.0),
            0, frames, out)
    assert target.read_bytes() == b"before\n" + BLOB
    assert (outcome.offset, outcome.printed) == (len(BLOB), len(BLOB))


def test_a_failing_call_raises_when_nothing_was_printed():
    frames = LogFrames(OneCallClient(frame(0, 4096, 1 << 20)), [], 0, 1 << 20)  # its bytes never come
    record = JobRecord(job_id="j1", name="j", host={"address": "local"}, spec_path="x", submitted_at=0.0)
    with pytest.raises(RemoteError, match="inside a frame"):
        controller._print_log(record, 0, frames, io.BytesIO())
