"""Deadline: one clock per command; a hop's allowance never outlives it."""
from __future__ import annotations

import math
import time

from runner.deadline import Deadline


def test_left_counts_down_and_never_goes_below_zero():
    deadline = Deadline(0.05)
    assert 0 < deadline.left() <= 0.05
    time.sleep(0.06)
    assert deadline.left() == 0.0


def test_cap_and_within_take_the_earlier_end():
    command = Deadline(2.0)
    assert command.cap(30.0) <= 2.0 and command.cap(0.5) == 0.5
    assert command.within(30.0).left() <= 2.0 and command.within(0.5).left() <= 0.5


def test_an_endless_deadline_lets_each_hop_take_its_allowance():
    never = Deadline(math.inf)
    assert never.left() == math.inf and 29.9 < never.within(30.0).left() <= 30.0
    assert repr(never) == "Deadline(never)"
