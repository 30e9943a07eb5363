"""How the commands write besides their text: progress and messages on stderr, one JSON document on stdout.
Shared by cli.py and fleet_cli.py (which cli.py calls for a fleet run)."""
from __future__ import annotations

import json

import click


def progress(message: str) -> None:
    click.echo(message, err=True)


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))
