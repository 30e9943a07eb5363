"""Check a script payload's `payload.args` on the controller, before any host is contacted (a typo found on the
host is found after its service was stopped), and ask the script for its memory estimate
(`gpu.min_free_mib: auto`).

A payload script is *checkable* when it defines a top-level `parse_args(argv)`
(and, for the list of allowed names, `build_parser()`); it may define `estimate_peak_bytes(args) -> int`, the
bytes of free GPU memory a run needs, given what its parse_args returned. Module-level code must import
nothing heavy (torch) and do nothing else. The script is run in a child interpreter (never imported into
the controller), its own directory first on sys.path as on the host, with `ArgumentParser.error` turned into
an answer, so both argparse's own refusals and the script's extra checks (`parser.error(...)`) are caught.
A script without parse_args, or one whose module cannot be loaded here (an import the controller lacks), is
reported as unchecked.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError

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
try:
    spec = importlib.util.spec_from_file_location("_runner_checked_payload", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
except Exception as exc:
    sys.stdout.write(json.dumps({"unloadable": "%s: %s" % (type(exc).__name__, exc)}) + "\n")
    sys.exit(0)
parser = module.build_parser() if hasattr(module, "build_parser") else None
options = sorted({o for a in (parser._actions if parser else []) for o in a.option_strings if o.startswith("--")
                  and a.help != argparse.SUPPRESS} - {"--help"})
estimator = getattr(module, "estimate_peak_bytes", None)
def estimate(parsed):
    if estimator is None:
        return {}
    try:
        value = estimator(parsed)
    except Exception as exc:
        return {"estimate_error": "%s: %s" % (type(exc).__name__, exc)}
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return {"estimate_error": "returned %.80r, not a whole number of bytes" % (value,)}
    return {"estimate": value}
def ask(argv):
    try:
        parsed = module.parse_args(argv)
    except Refused as exc:
        return {"ok": False, "message": str(exc), "options": options}
    except SystemExit as exc:
        return {"ok": False, "message": "parse_args exited (%s)" % (exc.code,), "options": options}
    return dict({"ok": True, "options": options}, **estimate(parsed))
sys.stdout.write(json.dumps({"answers": [ask(argv) for argv in argvs]}) + "\n")
"""


@dataclass(frozen=True)
class ArgsCheck:
    checked: bool
    note: str
    options: list[str] = field(default_factory=list)
    estimates: list[int | None] = field(default_factory=list)  # per run: its bytes, None without an estimate
    estimate_problem: str | None = None  # why the script's estimate_peak_bytes gave none


def is_checkable(script: Path) -> bool:
    """Defining a top-level parse_args: found by reading, not importing."""
    tree = ast.parse(script.read_bytes(), filename=str(script))
    return any(isinstance(node, ast.FunctionDef) and node.name == "parse_args" for node in tree.body)


def check_args(script: Path, args: dict, argv: list[str], spec_path: object) -> ArgsCheck:
    """Raise SpecError naming `payload.args.KEY` (and the allowed names) when the script refuses argv."""
    return check_many(script, [(args, argv, "payload.args")], spec_path)


def check_many(script: Path, runs: list, spec_path: object) -> ArgsCheck:
    """runs: (args, argv, field) each, checked in one child; the first refusal raises SpecError naming
    `field.KEY` (a sweep's variant names `sweep.matrix.KEY`)."""
    try:
        checkable = is_checkable(script)
    except SyntaxError as exc:  # payload.python may be newer than the controller's: the host's probe decides
        return ArgsCheck(False, f"payload.args unchecked: {script.name} does not parse with the controller's "
                                f"Python (line {exc.lineno}: {exc.msg})")
    if not checkable:
        return ArgsCheck(False, f"payload.args unchecked: {script.name} does not expose parse_args()")
    answer = _ask_script(script, [argv for _, argv, _ in runs])
    if "unloadable" in answer:
        return ArgsCheck(False, f"payload.args unchecked: {script.name} cannot be loaded on the controller "
                                f"({answer['unloadable'][:300]})")
    answers = answer["answers"]
    for (args, _, where), one in zip(runs, answers):
        if not one.get("ok"):
            raise SpecError(_describe_refusal(spec_path, script.name, args, one["message"],
                                              one.get("options", []), where))
    options = answers[0].get("options", []) if answers else []
    problem = next((one["estimate_error"] for one in answers if "estimate_error" in one), None)
    return ArgsCheck(True, f"payload.args checked against {script.name}'s parser", options,
                     [one.get("estimate") for one in answers], problem)


def _ask_script(script: Path, argvs: list[list[str]]) -> dict:
    try:
        done = subprocess.run([sys.executable, "-c", _CHECK, str(script), json.dumps(argvs)], capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if not isinstance(answer, dict) or not ("unloadable" in answer or isinstance(answer.get("answers"), list)):
            raise ValueError(f"answered {answer!r:.100}")
        return answer
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
