"""`runner watch`: a job's event lines rendered for people — a live panel on a terminal, plain lines otherwise.

The bytes come from `runner tail`'s reads, from the log's first byte, without its cursor (controller.tail with
save_cursor=False). Event lines follow remote_payload/progress.py's convention; other lines pass through, their
control characters made visible (the log is the payload's, not ours to let drive the terminal). Heartbeats are
folded: on a terminal they update the panel; in plain mode one is printed every HEARTBEAT_EVERY_S at most.
"""
from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from remote_payload.progress import describe, fold, new_summary, parse_event

from ..printable import printable

if TYPE_CHECKING:
    from rich.panel import Panel

HEARTBEAT_EVERY_S = 30.0
RECENT_LINES = 8
MAX_LINE_BYTES = 64 * 1024  # a longer line is shown cut (a person reads no more; `tail` has every byte)


class EventSink:
    """A binary sink for controller.tail: splits lines, folds each event into a summary, renders."""

    def __init__(self, render: Callable[[str], None], on_change: Callable[[dict], None] = lambda _s: None) -> None:
        self.render = render
        self.on_change = on_change
        self.partial = b""  # the line being read: at most MAX_LINE_BYTES of it
        self.cut = 0  # bytes of that line beyond the cap, left out
        self.summary = new_summary()
        self.last_heartbeat_t: float | None = None

    def write(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            room = max(0, MAX_LINE_BYTES - len(self.partial))
            self.partial += piece[:room]
            self.cut += len(piece) - len(piece[:room])
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.partial or self.cut:
            self._end_line()

    def _end_line(self) -> None:
        raw, cut = self.partial, self.cut
        self.partial, self.cut = b"", 0
        if cut:  # never parsed as an event: a person sees its start and how much is left out
            self.render(printable(raw.decode("utf-8", "replace")) + f" … ({cut} more bytes of this line not shown)")
            return
        self._line(raw)

    def _line(self, raw: bytes) -> None:
        event = parse_event(raw)
        if event is None:
            self.render(printable(raw.decode("utf-8", "replace")))
            return
        fold(self.summary, event)
        if event["event"] != "heartbeat" or self._heartbeat_due(event.get("t")):
            self.render(printable(describe(event)))
        self.on_change(self.summary)

    def _heartbeat_due(self, t: object) -> bool:
        if not isinstance(t, (int, float)):
            return False
        if self.last_heartbeat_t is None or t - self.last_heartbeat_t >= HEARTBEAT_EVERY_S:
            self.last_heartbeat_t = t
            return True
        return False


def summary_line(summary: dict) -> str:
    rows = f"{summary['rows_done']}/{summary['rows_expected']}" if summary["rows_expected"] else str(summary["rows_done"])
    t = summary["last_t"]
    phase = summary["phase"] and f"{summary['phase']} {summary['phase_status'] or ''}".strip()
    sweep = summary.get("sweep")
    variants = f" · variants {sweep['done']}/{sweep['of']} done" if sweep and sweep["of"] else ""
    whose = " (the sweep's)" if sweep and sweep["side_by_side"] else ""
    return (f"phase {phase or '-'} · rows {rows}{whose}{variants} · payload clock "
            f"{'-' if t is None else f'{t:.0f} s'}" + (f" · {summary['errors']} errors" if summary["errors"] else ""))


def plain_sink(stream: TextIO) -> EventSink:
    return EventSink(lambda line: print(line, file=stream, flush=True))


class LivePanel:
    """A rich Live panel: the summary line and the most recent lines; used only on a terminal."""

    def __init__(self, title: str) -> None:
        from rich.console import Console
        from rich.live import Live

        self.title = title
        self.recent: list[str] = []
        self.summary: dict = {}
        self.live = Live(self._view(), console=Console(stderr=False), refresh_per_second=4, transient=False)
        self.sink = EventSink(self._add, self._update)

    def __enter__(self) -> EventSink:
        self.live.__enter__()
        return self.sink

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.sink.close()
        self.live.update(self._view())
        self.live.__exit__(kind, exc, tb)

    def _add(self, line: str) -> None:
        self.recent = (self.recent + [line])[-RECENT_LINES:]
        self.live.update(self._view())

    def _update(self, summary: dict) -> None:
        self.summary = dict(summary)
        self.live.update(self._view())

    def _view(self) -> Panel:
        from rich.panel import Panel
        from rich.text import Text

        head = printable(summary_line(self.summary)) if self.summary else "waiting for the payload's first event …"
        body = Text(head, style="bold")
        for line in self.recent:
            body.append("\n" + line, style="dim" if line.startswith("{") else "")
        return Panel(body, title=self.title)
