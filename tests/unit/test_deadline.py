"""Deadline: one clock per command; a hop's allowance never outlives it."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from runner.commands.controller import _retrying
from runner.deadline import ROUND_TRIP_ALLOWANCE_S, Deadline
from runner.errors import AuthFailed, BadAnswer, TransportError, UploadCut
from runner.remote.bundles import Bundle
from runner.remote.host import HostClient
from runner.remote.transport import SshTarget, SshTransport
from runner.remote.transport_openssh import OpenSshTransport

MAX_WAIT = 15.0


def test_left_counts_down_and_never_goes_below_zero():
    deadline = Deadline(0.05)
    assert 0 < deadline.left() <= 0.05
    time.sleep(0.06)  # the clock moves past the deadline
    assert deadline.left() == 0.0


def test_cap_and_within_take_the_earlier_end():
    command = Deadline(2.0)
    assert command.cap(30.0) <= 2.0 and command.cap(0.5) == 0.5
    assert command.within(30.0).left() <= 2.0 and command.within(0.5).left() <= 0.5


def test_a_commands_deadline_is_its_max_wait_plus_one_round_trip():
    assert MAX_WAIT + ROUND_TRIP_ALLOWANCE_S - 0.1 < Deadline.for_command(MAX_WAIT).left() <= MAX_WAIT + ROUND_TRIP_ALLOWANCE_S
    assert not Deadline(1.0).passed() and Deadline(0.0).passed()


class LostLink:
    """A transport whose link is down: each call fails at once (a refused connect)."""

    name = "down"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv, *, stdin=b"", deadline):
        self.calls += 1
        raise TransportError("ssh down: cannot connect (refused)")

    def close(self) -> None:
        pass


def test_retries_run_inside_the_commands_deadline_and_add_nothing():
    transport = LostLink()
    client = HostClient(transport, root="~/.runner", python="python3", bundle=Bundle({}), deadline=Deadline(0.3))
    t0 = time.monotonic()
    with pytest.raises(TransportError):
        _retrying(client.deadline)(client.status, ["j"])
    assert time.monotonic() - t0 < 0.3 + 0.2 and 1 <= transport.calls <= 3
    transport.calls = 0
    with pytest.raises(TransportError):
        _retrying(Deadline(0.0))(client.status, ["j"])
    assert transport.calls == 1  # the attempt itself fails at the deadline; no retry starts after it


def test_retries_are_three_attempts_a_fifth_then_two_fifths_of_a_second_apart_on_a_lost_link_only(monkeypatch):
    """tenacity's wait_exponential(0.2, max 2), stop_after_attempt(3), reraise: a lost link is tried again, a
    refused login or a bad answer is raised at once, the last failure is raised."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    outcomes: list = [TransportError("lost"), TransportError("lost"), "answer"]

    def call(*args, **kwargs):
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        return (got, args, kwargs)

    assert _retrying(Deadline(MAX_WAIT))(call, 1, wait=2) == ("answer", (1,), {"wait": 2})
    assert slept == pytest.approx([0.2, 0.4])
    for failures, calls in (([TransportError("a"), TransportError("b"), TransportError("c"), "x"], 3),
                            ([AuthFailed("refused")], 1), ([BadAnswer("garbled")], 1)):
        outcomes[:] = list(failures)
        with pytest.raises(type(failures[calls - 1])) as raised:
            _retrying(Deadline(MAX_WAIT))(call)
        assert raised.value is failures[calls - 1] and len(outcomes) == len(failures) - calls


def openssh(connect_timeout: float) -> OpenSshTransport:
    transport = OpenSshTransport(SshTarget("h", connect_timeout=connect_timeout), state=Path("/nonexistent"))
    transport._options = []  # no `ssh -G`: only the per-call options are looked at
    return transport


def option(argv: list[str], name: str) -> int:
    return int(next(a.split("=", 1)[1] for a in argv if a.startswith(name + "=")))


def test_openssh_timeouts_come_from_what_is_left():
    transport = openssh(connect_timeout=10)
    roomy = transport.command("true", Deadline(55), Deadline(55).within(10))
    assert option(roomy, "ConnectTimeout") == 10
    assert option(roomy, "ServerAliveInterval") == 15 and option(roomy, "ServerAliveCountMax") == 3
    short = transport.command("true", Deadline(4.2), Deadline(4.2).within(10))
    assert option(short, "ConnectTimeout") == 4 and option(short, "ServerAliveInterval") == 1
    assert option(transport.command("true", Deadline(0.2)), "ConnectTimeout") == 1  # ssh's least


@pytest.mark.parametrize("make", [lambda t: openssh(t), lambda t: SshTransport(SshTarget("h", connect_timeout=t))])
def test_every_connect_attempt_of_a_command_shares_one_connect_timeout(make):
    """A host that used up host.connect_timeout is not waited for again by a retry of the same command (both
    transports keep one ConnectBudget); once reset (connected), a later connect has its own again."""
    transport = make(0.05)
    deadline = Deadline(30)
    transport._connecting.take(deadline)
    time.sleep(0.06)  # the clock moves past the 0.05 s connect budget
    with pytest.raises(TransportError, match="connect_timeout"):
        transport._connecting.take(deadline)
    transport._connecting.reset()
    assert transport._connecting.take(deadline).left() > 0


class SlowLink:
    """A transport that takes an upload's first chunks, then stalls until the deadline (a link too slow for
    the bundle), as the OpenSSH transport fails there."""

    name = "slow"

    def run(self, argv, *, stdin=b"", deadline):
        chunks = iter(stdin) if not isinstance(stdin, bytes) else iter([stdin])
        for _ in range(4):
            next(chunks, None)
        time.sleep(deadline.left())
        raise TransportError("ssh slow: no answer before the deadline (link down or host overloaded?)")

    def close(self) -> None:
        pass


def test_an_upload_cut_by_the_deadline_says_how_far_it_got_and_how_to_go_on():
    payload = Bundle({"a.py": b"a" * (3 << 20), "b.py": b"b" * (3 << 20)})
    client = HostClient(SlowLink(), root="~/.runner", python="python3", bundle=Bundle({}), deadline=Deadline(0.2),
                        payload=payload)
    with pytest.raises(UploadCut, match=r"cut at 3\.0 of 6\.0 MiB") as cut:
        client.upload()
    assert "sends only the rest" in cut.value.hint and not cut.value.retry and cut.value.exit_code == 3
