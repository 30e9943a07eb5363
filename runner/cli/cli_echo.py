"""How cli.py and fleet_cli.py write: human text (`say`, on stdout; `progress`, on stderr) made printable
(runner/printable.py), one JSON document (`emit_json`). Raw log bytes (`tail`, `wait`) are their commands'.
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
