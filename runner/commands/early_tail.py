"""A `runner tail JOB` whose host call starts before the CLI is imported.

A warm tail is two waits one after the other: the CLI's imports (click with inspect, typing and gettext,
the commands' modules: ~20-30 ms) and the host call (ssh through the warm master, the host's `python3 -S`
start and its answer: ~35 ms of wall, little of it our CPU). `begin`, called by `runner`'s entry point before
it imports the CLI, reads the simple forms of a tail's argv, takes the job's cursor turn without waiting,
reads the record and opens the `logs --stream` call (controller.open_tail); the CLI then imports while the
host answers, and hands what was opened (`take`) to `controller.tail` when its arguments are the same.

Nothing here decides anything the CLI does not: an argv it does not read exactly (another option, a run's
id, `--help`, a value click would refuse), a turn held by another tail, or any error while opening gives
None and the CLI does the tail as it would have, with its own messages. The cursor rule is the tail's: the
turn is held from before the cursor is read until the call's end, and the cursor moves only in
`controller.tail`, after everything was delivered.

May import: the controller and the state store, when it opens; never click nor the CLI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..deadline import DEFAULT_MAX_WAIT_S, MAX_WAIT_LIMIT_S

if TYPE_CHECKING:
    from .controller import OpenedTail

@dataclass(frozen=True)
class TailArgs:
    job_id: str
    follow: bool = False
    max_wait: float = DEFAULT_MAX_WAIT_S
    from_start: bool = False


@dataclass
class Opened:
    args: TailArgs
    store_root: str
    tail: OpenedTail


_opened: Opened | None = None


def read_argv(argv: Sequence[str]) -> TailArgs | None:
    """`tail JOB [-f|--follow] [--max-wait S|--max-wait=S] [--from-start] [--json]` in any order, each at
    most once (--json changes only how the CLI prints); anything else (None) is left to the CLI."""
    if len(argv) < 2 or argv[0] != "tail":
        return None
    words, job_id, seen = list(argv[1:]), None, set()
    values: dict[str, Any] = {}
    flags = {"-f": "follow", "--follow": "follow", "--from-start": "from_start", "--json": "as_json"}
    while words:
        word = words.pop(0)
        if word.startswith("--max-wait"):
            if word == "--max-wait" and words:
                text = words.pop(0)
            elif word.startswith("--max-wait="):
                text = word.split("=", 1)[1]
            else:
                return None
            try:
                value = float(text)
            except ValueError:
                return None
            if not 0.0 <= value <= MAX_WAIT_LIMIT_S or "max_wait" in seen:
                return None
            seen.add("max_wait")
            values["max_wait"] = value
        elif word in flags:
            if flags[word] in seen:
                return None
            seen.add(flags[word])
            if flags[word] != "as_json":
                values[flags[word]] = True
        elif word.startswith("-") or job_id is not None:
            return None
        else:
            job_id = word
    return TailArgs(job_id, **values) if job_id is not None else None


def begin(argv: Sequence[str]) -> None:
    """Open the tail that argv asks for, if it is a simple one and its turn is free; else leave it all to
    the CLI. Never raises: whatever fails here happens again, and is reported, on the CLI's own path."""
    global _opened
    args = read_argv(argv)
    if args is None:
        return
    try:
        from ..state.store import Store
        from .controller import open_tail

        store = Store()
        if store.is_run(args.job_id):
            return
        tail = open_tail(args.job_id, store=store, follow=args.follow, max_wait=args.max_wait,
                         from_start=args.from_start)
    except Exception:  # noqa: BLE001 - the CLI's path meets it again and says it
        return
    if tail is not None:  # else another tail holds the turn: the CLI's path waits for it up to --max-wait
        _opened = Opened(args, str(store.root), tail)


def take(args: TailArgs, store_root: str) -> OpenedTail | None:
    """What `begin` opened for exactly this tail of this state dir (then it is the caller's to close), else
    None, anything opened for another one closed first (its turn released before the caller takes one)."""
    global _opened
    opened, _opened = _opened, None
    if opened is None:
        return None
    if opened.args == args and opened.store_root == store_root:
        return opened.tail
    opened.tail.stack.close()
    return None
