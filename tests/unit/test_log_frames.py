"""A `logs --stream` frame header from a host that is not well-formed is BadAnswer (exit 3) naming the field;
nothing of it is printed or stored (runner/remote/answers.py)."""
from __future__ import annotations

import pytest

from runner.errors import BadAnswer
from runner.remote import answers


def frame(**fields) -> dict:
    good = {"ok": True, "offset": 10, "next_offset": 14, "size": 20, "data_len": 4, "state": "RUNNING",
            "terminal": False, "exit_code": None, "last": False}
    return {**good, **fields}


def test_a_good_frame_passes():
    assert answers.log_frame(frame(), 10, 8)["data_len"] == 4
    assert answers.log_frame(frame(next_offset=10, data_len=0, last=True, state="SUCCEEDED", terminal=True,
                                   exit_code=0), 10, 8)["last"]


@pytest.mark.parametrize("fields, offset, why", [
    ({}, 11, "logs: offset: 11 asked for, 10 answered"),
    ({"data_len": 9, "next_offset": 19}, 10, "logs: data_len: more than the 8 bytes"),
    ({"last": True}, 10, "logs: data_len: more than the 8 bytes"),  # the last frame carries no bytes
    ({"next_offset": 15}, 10, "logs: next_offset: not offset plus the bytes sent"),
    ({"size": 12}, 10, "logs: next_offset: past the log's size"),
    ({"terminal": True}, 10, "logs: terminal: disagrees with state"),
    ({"data_len": -1}, 10, "logs: data_len"),
    ({"last": "no"}, 10, "logs: last"),
    ({"state": "\x1b[2J"}, 10, "logs: state"),
])
def test_a_bad_frame_is_a_bad_answer(fields, offset, why):
    with pytest.raises(BadAnswer, match=why.replace("(", r"\(")):
        answers.log_frame(frame(**fields), offset, 8)
