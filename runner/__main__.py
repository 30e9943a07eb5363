"""`python -m runner` and the `runner` command: cli.main in a process set up to be short-lived.

A command lives well under a second, most of it importing (pydantic's models for a spec that is validated):
the collector's passes during those imports find almost nothing to free, and the interpreter's last pass at
exit walks every object the command made. Collections are made rarer (a long `tail -f` still collects) and
what exists when the command ends is frozen, so the exit skips it: ~25 ms of an edited spec's submit
(docs/performance.md). A `tail` opens its host call before the CLI imports (commands/early_tail.py). A warm
server that imported all of it runs the command instead where one answers (resident.py; RUNNER_RESIDENT=0: never).
"""
import gc
import os
import sys

FIRST_GENERATION_THRESHOLD = 50_000  # allocations between passes (Python's default: 700)


def run() -> None:
    from . import resident

    serving = os.environ.pop(resident.SERVE_ENV, None)  # started as a resident server (resident.start_server)
    code = None if serving else resident.handed_over()  # a warm server ran it (not with RUNNER_RESIDENT=0)
    if code is not None:
        sys.exit(code)
    gc.set_threshold(FIRST_GENERATION_THRESHOLD)
    if serving:
        resident.serve(serving, run_here)
        return
    try:
        run_here()
    finally:
        resident.after_here()  # none answered: one for the next command


def run_here() -> None:
    """The command in sys.argv, in this process (a resident server's child calls it too)."""
    if sys.argv[1:2] == ["tail"]:  # its host call answers while the CLI imports (commands/early_tail.py)
        from .commands import early_tail

        early_tail.begin(sys.argv[1:])
    from .cli.cli import main

    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
