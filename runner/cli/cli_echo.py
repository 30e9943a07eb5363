"""How the commands write besides their text: progress and messages on stderr, one JSON document on stdout.
Shared by cli.py and fleet_cli.py (which cli.py calls for a fleet run).

Human text goes through `say`/`progress`, which make untrusted strings printable (runner/printable.py);
JSON is escaped by the encoder. Raw log bytes (`tail`, `wait`) are written by their commands directly.
"""
from __future__ import annotations

import json
from typing import Any

import click

from ..printable import printable


def say(text: str, *, nl: bool = True) -> None:
    """Human output on stdout."""
    click.echo(printable(text), nl=nl)


def progress(message: str) -> None:
    click.echo(printable(message), err=True)


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))
