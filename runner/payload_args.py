"""Check a script payload's `payload.args` on the controller, before any host is contacted.

A typo in `payload.args` used to be found on the host — for the motivating job, after the production
service had been stopped. A payload script is *checkable* when it lives in remote_payload/ and defines a
top-level `parse_args(argv)` (and, for the list of allowed names, `build_parser()`); both must import
nothing heavy at module level. The script is run in a child interpreter (never imported into the
controller) with `ArgumentParser.error` turned into an answer, so both argparse's own refusals and the
script's extra checks (`parser.error(...)`) are caught. Any other script is reported as unchecked.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError

CHECK_TIMEOUT_S = 30.0

# Runs in a child interpreter: argv = [script path, JSON list of argument lists]; prints one JSON line
# (one answer per argument list: a sweep's variants are checked in one child).
_CHECK = r"""
import argparse, importlib.util, json, os, sys
path, argvs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
class Refused(Exception):
    pass
def refuse(self, message):
    raise Refused(message)
argparse.ArgumentParser.error = refuse
spec = importlib.util.spec_from_file_location("_runner_checked_payload", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
parser = module.build_parser() if hasattr(module, "build_parser") else None
options = sorted({o for a in (parser._actions if parser else []) for o in a.option_strings if o.startswith("--")
                  and a.help != argparse.SUPPRESS} - {"--help"})
def ask(argv):
    try:
        module.parse_args(argv)
        return {"ok": True, "options": options}
    except Refused as exc:
        return {"ok": False, "message": str(exc), "options": options}
sys.stdout.write(json.dumps([ask(argv) for argv in argvs]) + "\n")
"""


@dataclass(frozen=True)
class ArgsCheck:
    checked: bool
    note: str
    options: list[str] = field(default_factory=list)


def is_checkable(script: Path, payload_root: Path) -> bool:
    """Ours (in remote_payload/) and defining a top-level parse_args: found by reading, not importing."""
    if script.resolve().parent != payload_root.resolve():
        return False
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    return any(isinstance(node, ast.FunctionDef) and node.name == "parse_args" for node in tree.body)


def check_args(script: Path, payload_root: Path, args: dict, argv: list[str], spec_path: object) -> ArgsCheck:
    """Raise SpecError naming `payload.args.KEY` (and the allowed names) when the script refuses argv."""
    return check_many(script, payload_root, [(args, argv, "payload.args")], spec_path)


def check_many(script: Path, payload_root: Path, runs: list, spec_path: object) -> ArgsCheck:
    """runs: (args, argv, field) each, checked in one child; the first refusal raises SpecError naming
    `field.KEY` (a sweep's variant names `sweep.matrix.KEY`)."""
    if not is_checkable(script, payload_root):
        return ArgsCheck(False, f"payload.args unchecked: {script.name} does not expose parse_args() in "
                                f"{payload_root.name}/")
    answers = _ask_script(script, [argv for _, argv, _ in runs])
    for (args, _, where), answer in zip(runs, answers):
        if not answer.get("ok"):
            raise SpecError(_describe_refusal(spec_path, script.name, args, answer["message"],
                                              answer.get("options", []), where))
    options = answers[0].get("options", []) if answers else []
    return ArgsCheck(True, f"payload.args checked against {script.name}'s parser", options)


def _ask_script(script: Path, argvs: list[list[str]]) -> list[dict]:
    try:
        done = subprocess.run([sys.executable, "-c", _CHECK, str(script), json.dumps(argvs)], capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        raise SpecError(f"payload.args: could not check them against {script.name}: {str(detail).strip()[-300:]}") \
            from None


def _describe_refusal(spec_path: object, script: str, args: dict, message: str, options: list[str],
                      field: str = "payload.args") -> str:
    allowed = ", ".join(o[2:].replace("-", "_") for o in options) or "none"
    unknown = [key for key in args if _flag(key) not in options] if options else []
    if unknown:
        return "\n".join(f"{spec_path}: {field}.{key}: {script} has no argument {_flag(key)}; allowed: {allowed}"
                         for key in unknown)
    named = re.search(r"argument (--[A-Za-z0-9_-]+)", message)
    key = next((k for k in args if named and _flag(k) == named.group(1)), None)
    where = f"{field}.{key}" if key else field
    return f"{spec_path}: {where}: {script} refuses it: {message}"


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")
