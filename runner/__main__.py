"""`python -m runner` and the `runner` command: the CLI in the caller's own process."""
import signal
import sys


def run() -> None:
    # Ctrl-C or SIGTERM while the CLI loads (a good part of a second): said, not a traceback or a silent death;
    # after it, each command decides (submit: runner/commands/interrupts.py).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        from .cli.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("runner: error: interrupted while starting: nothing was done\n")
        sys.exit(130)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    main()


if __name__ == "__main__":
    run()
