"""The answer of a host call: `Fail`, the error any room raises (its code one of contract.ERRORS), and the one JSON
answer line on stdout: what the verb returned, or its error (a Fail as itself, any other exception `internal`).
"""
from __future__ import annotations

import json
import sys


class Fail(Exception):
    """An answer `{"ok": false, "error": code, "message": …}`; extra fields ride along."""

    def __init__(self, code: str, message: str, **extra) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra

    def answer(self) -> dict:
        return dict({"ok": False, "error": self.code, "message": str(self)}, **self.extra)


def error_answer(exc: Exception) -> dict:
    if isinstance(exc, Fail):
        return exc.answer()
    import traceback

    return {"ok": False, "error": "internal", "message": "%s: %s" % (type(exc).__name__, exc),
            "traceback": traceback.format_exc()[-2000:]}


def write_answer(answer: dict) -> int:
    """Write the answer line; the exit status (`exit_status` when the answer carries one: slurm-run's payload's)."""
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return answer.pop("exit_status", 0 if answer.get("ok") else 1)
