"""The host side's entry: argv -> one verb's function -> the one JSON answer line (docs/protocol.md is binding).

supervisor.py calls `main`; nothing else imports this module. Each verb is imported only when called
(COMMANDS), so a call loads its own verb's modules and no other's; the rooms and what each may import are in
docs/design.md and tests/lint/import_layers.py. Verbs starting with `_` are the supervisor's own (its detached
run, its guard); `slurm-run` is what a Slurm batch script execs in its allocation.
"""
from __future__ import annotations

import os
import types

from .contract import DEFAULTS, SERVICE_SCOPES
from .host.answer import Fail, error_answer, write_answer
from .host.bundle import HERE
from .supervision.spec import check_root, check_root_safe

COMMANDS = {
    "preflight": ("verbs.preflight", "cmd_preflight"), "start": ("verbs.start", "cmd_start"),
    "submit": ("verbs.submit", "cmd_submit"), "status": ("verbs.status", "cmd_status"),
    "logs": ("verbs.logs", "cmd_logs"), "cancel": ("verbs.cancel", "cmd_cancel"),
    "restore": ("supervision.restore.restorers", "cmd_restore"),
    "restore-service": ("supervision.restore.restorers", "cmd_restore_service"), "result": ("verbs.result", "cmd_result"),
    "gc": ("verbs.gc", "cmd_gc"), "_run": ("supervision.run", "cmd_run"),
    "_guard": ("supervision.restore.guard", "cmd_guard"),
    "slurm-run": ("verbs.launcher", "cmd_slurm_run"),
}


Namespace = types.SimpleNamespace  # the parsed flags as attributes, as argparse's


class ArgParser:
    """The verbs' flags parsed as argparse parses the forms the controller sends (`--flag VALUE`, `--flag=VALUE`,
    a flag alone; the last of a repeated flag wins, `append` collects), with argparse's messages, each a
    `bad-args`. Not argparse: what it loads (shutil, locale, gettext) would slow every `status` or `logs` poll."""

    def __init__(self) -> None:
        self.options: dict = {}  # flag: (action, type, default, required, choices)

    def add_argument(self, flag: str, action=None, type=str, default=None, required=False, choices=None) -> None:
        self.options[flag] = (action, type, False if action == "store_true" else default, required, choices)

    def parse_args(self, argv: list) -> Namespace:
        given: dict = {}
        words = list(argv)
        while words:
            word = words.pop(0)
            flag, has_value, value = word.partition("=") if word.startswith("--") else (word, "", "")
            if flag not in self.options:
                raise Fail("bad-args", "unrecognized arguments: %s" % " ".join([word] + words))
            action, kind, _, _, choices = self.options[flag]
            if action == "store_true":
                if has_value:
                    raise Fail("bad-args", "argument %s: ignored explicit argument %r" % (flag, value))
                given[flag] = True
                continue
            if not has_value:
                if not words or words[0].startswith("--"):
                    raise Fail("bad-args", "argument %s: expected one argument" % flag)
                value = words.pop(0)
            try:
                converted = kind(value)
            except ValueError:
                raise Fail("bad-args", "argument %s: invalid %s value: %r" % (flag, kind.__name__, value)) from None
            if choices is not None and converted not in choices:
                raise Fail("bad-args", "argument %s: invalid choice: %r (choose from %s)"
                           % (flag, converted, ", ".join(repr(c) for c in choices)))
            given[flag] = given.get(flag, []) + [converted] if action == "append" else converted
        missing = [flag for flag, (_, _, _, required, _) in self.options.items() if required and flag not in given]
        if missing:
            raise Fail("bad-args", "the following arguments are required: %s" % ", ".join(missing))
        return Namespace(**{flag[2:].replace("-", "_"): given[flag] if flag in given else
                            (list(default or []) if action == "append" else default)
                            for flag, (action, _, default, _, _) in self.options.items()})


def build_parser(sub: str) -> ArgParser:
    parser = ArgParser()
    parser.add_argument("--root", required=True)
    if sub == "status":
        parser.add_argument("--job-id", action="append", default=[])
        parser.add_argument("--ids-on-stdin", action="store_true")
        parser.add_argument("--wait", type=float, default=0.0)
    elif sub in ("preflight", "submit"):  # submit without one: the spec's own (a call opened before its spec)
        parser.add_argument("--job-id")
    elif sub not in ("restore-service", "gc"):
        parser.add_argument("--job-id", required=True)
    options: dict[str, list[tuple[str, dict]]] = {  # the subcommand's own flags: (flag, add_argument's keywords)
        "start": [("--queue", dict(action="store_true"))],
        "submit": [("--queue", dict(action="store_true"))],
        "_run": [("--queue", dict(action="store_true")), ("--ready-fd", dict(type=int)), ("--ready-fifo", dict())],
        "_guard": [("--life-fd", dict(type=int, required=True))],
        "logs": [("--offset", dict(type=int, required=True)), ("--max", dict(type=int, default=1 << 20)),
                 ("--wait", dict(type=float, default=0.0)), ("--stream", dict(action="store_true")),
                 ("--follow", dict(action="store_true"))],
        "restore-service": [("--unit", dict(required=True)), ("--scope", dict(choices=SERVICE_SCOPES,
                            default=DEFAULTS["service.scope"])), ("--sudo", dict(action="store_true")),
                            ("--health-url", dict(default=None)), ("--max-wait", dict(type=float, default=50.0))],
        "gc": gc_options() if sub == "gc" else [],
    }
    for flag, kwargs in options.get(sub, []):
        parser.add_argument(flag, **kwargs)
    return parser


def gc_options() -> list:
    """gc's flags: their defaults are the retention rule's own, its room imported for gc alone."""
    from .supervision.retention import KEEP_DAYS, KEEP_JOBS

    return [("--keep-jobs", dict(type=int, default=KEEP_JOBS)), ("--keep-days", dict(type=float, default=KEEP_DAYS)),
            ("--dry-run", dict(action="store_true")), ("--ids-on-stdin", dict(action="store_true"))]


def dispatch(argv: list) -> dict:
    if not argv or argv[0] not in COMMANDS:
        raise Fail("bad-args", "usage: supervisor.py {%s} … --root ROOT" % ",".join(sorted(COMMANDS)))
    args = build_parser(argv[0]).parse_args(argv[1:])
    args.root = os.path.abspath(os.path.expanduser(check_root(args.root)))
    check_root_safe(args.root, HERE)
    return verb(argv[0])(args)


def verb(name: str):
    """The verb's function, its room imported now."""
    room, function = COMMANDS[name]
    # __import__, not importlib.import_module: importlib (and warnings) would be loaded on every call
    return getattr(__import__("%s.%s" % (__package__, room), fromlist=[function]), function)


def main(argv: list) -> int:
    try:
        answer = dispatch(argv)
    except Exception as exc:  # every error becomes the answer (a Fail its own, any other `internal`)
        answer = error_answer(exc)
    return write_answer(answer)

