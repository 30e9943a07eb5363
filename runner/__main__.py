"""`python -m runner` and the `runner` command: the CLI in the caller's own process."""
from .cli.cli import main


def run() -> None:
    main()


if __name__ == "__main__":
    run()
