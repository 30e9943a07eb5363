"""Ctrl-C and SIGTERM during `runner submit`: held while its host call runs, then the job that call started is
cancelled before the command exits 130 saying so; before that call nothing was started, after it (following
the log) the job goes on, named. A second interrupt leaves at once, naming the job. Why: docs/design.md, "An
interrupted submit". Host calls run in a session of their own (remote/transport.py): a terminal's Ctrl-C
reaches this process alone.
"""
from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import TYPE_CHECKING

from ..errors import Interrupted, RunnerError

if TYPE_CHECKING:
    from ..remote.host import HostClient

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """Entered (in the main thread), SIGINT and SIGTERM raise Interrupted(`unheld`), or inside `held` are only
    noted. Never entered (a fleet's hosts, MCP), it catches nothing and `signal` stays None."""

    def __init__(self, unheld: str = "nothing was started") -> None:
        self.unheld = unheld  # what an interrupt outside `held` leaves behind
        self.signal: str | None = None  # the name of the first one held
        self._holding: tuple[str, str, Callable[[str], None]] | None = None
        self._saved: dict = {}

    def __enter__(self) -> Interrupts:
        self._saved = {number: signal.signal(number, self._arrived) for number in SIGNALS}
        return self

    def __exit__(self, *_exc: object) -> None:
        for number, handler in self._saved.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)

    @contextmanager
    def held(self, job_id: str, address: str, progress: Callable[[str], None]) -> Iterator[Interrupts]:
        """The submit of job_id: a first interrupt is noted (and said), a second one raises naming the job. Once
        the block ended by itself, the job is submitted: a later interrupt says it goes on."""
        self._holding = (job_id, address, progress)
        try:
            yield self
        finally:
            self._holding = None
        self.unheld = f"{job_id} goes on on {address}; `runner cancel {job_id}` stops it"

    def _arrived(self, number: int, _frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self._holding is None:
            raise Interrupted(f"interrupted ({name}): {self.unheld}")
        job_id, address, progress = self._holding
        if self.signal is not None:
            raise Interrupted(f"interrupted again ({name}): {job_id} may have started on {address}",
                              hint=f"`runner status {job_id}` tells; `runner cancel {job_id}` stops it.")
        self.signal = name
        with suppress(RuntimeError, OSError):  # stderr busy in the frame this interrupted: the note is not vital
            progress(f"[runner] {name}: cancelling {job_id} once {address} has answered ({name} again leaves "
                     "it as it is)")

    def cancel_if_interrupted(self, client: HostClient, already: bool) -> None:
        """Inside `held`, once the host answered: a held interrupt cancels the job the call started (one started
        by an earlier submit of this id is left as it is), then raises Interrupted saying which."""
        if self.signal is None or self._holding is None:
            return
        job_id, address, _ = self._holding
        interrupted, how_to = f"interrupted ({self.signal})", f"`runner cancel {job_id}` stops it"
        if already:
            raise Interrupted(f"{interrupted}: {job_id} was submitted before this call and goes on on {address}",
                              hint=how_to + ".")
        try:
            client.cancel(job_id)
        except RunnerError as exc:
            raise Interrupted(f"{interrupted}: {job_id} started on {address} and cancelling it failed: {exc}",
                              hint=f"{how_to}; `runner status {job_id}` tells.") from None
        raise Interrupted(f"{interrupted}: {job_id} was cancelled on {address} before this command ended",
                          hint=f"It starts again any service it stopped; `runner status {job_id}` shows its end.")
