"""The host side's subcommands, argv parsing and the one JSON answer per call (docs/protocol.md is binding).

supervisor.py, the entry script, calls `main` (BOOT imports it from ROOT/payload/<digest>/; the guard, the
guard timer, ExecStopPost= and a Slurm batch step run it by path). The rest lives in the package's rooms,
each importing only the layers below it (tests/test_import_layers.py HOST_LAYERS):

    contract.py, admission.py, progress.py, sweep.py, slurm/batch.py, slurm/states.py
                   the shared rules: pure, stdlib only; the controller imports them too
    host/          host primitives (Fail, bounded commands, systemd, nvidia-smi, /proc) and the engine's API
    supervision/   one job on one host: spec, files, record, ledger, trust, startable, payload, stage, variants,
                   budget, settle and the guard, the unit, start, job (the choreography), submit
    slurm/         launch, array, calls, allocation: `launcher: slurm` (imported on first use, below)
    commands.py    this file: the subcommands; nothing below imports it

Public subcommands: preflight, start, submit (preflight, verdict and start in one call), status, logs, cancel, restore,
restore-service, result, gc (the retention rule by hand).
Internal ones: _run (the detached supervisor of one job) and _guard (watches the supervisor; settles the job
if the supervisor dies without doing it).
`slurm-run` is what a Slurm batch script execs in its allocation (launcher slurm: slurm/launch.py, which
also submits, follows and cancels such jobs for start/status/logs/cancel).

    start ──systemd-run──▶ runner-job-<id>.service: _run (supervision/unit.py), or where systemd is not:
          ──fork/setsid/fork──▶ _run, this interpreter's own fork calling main (supervision/start.py)
      ◀── one JSON line: through ready.fifo (unit), over a pipe (fork) ──┘
    _run ──fork/setsid/exec supervisor.py _guard──▶ the guard (supervision/settle.py): holds the read end of
          the "life" pipe and the lock fds; EOF = the supervisor is gone

Process ids are trusted only together with their start time (/proc/PID/stat field 22), so a reused pid is
never taken for the job. Runs on Python >= 3.8 and never imports the controller.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .contract import DEFAULTS, SERVICE_SCOPES
from .host.primitives import Fail, HERE
from .supervision import retention
from .supervision.files import JobPaths
from .supervision.guard import cmd_guard
from .supervision.restore import cmd_restore, cmd_restore_service
from .supervision.run import cmd_run
from .supervision.spec import check_job_id, check_root, check_root_safe, read_spec_stdin
from .supervision.start import claim_job_dir, launch_detached
from .supervision.submit import submit
from .verbs.cancel import cmd_cancel
from .verbs.gc import cmd_gc
from .verbs.launcher import cmd_slurm_run, slurm_launch
from .verbs.logs import cmd_logs
from .verbs.preflight import cmd_preflight, preflight_report
from .verbs.result import cmd_result
from .verbs.status import cmd_status


# ── commands ──────────────────────────────────────────────────────────────────────────────────────────


def cmd_start(args) -> dict:
    return start_job(args, read_spec_stdin(args.root, check_job_id(args.job_id)))


def start_job(args, spec: dict) -> dict:
    """Claim the job id, then hand the job to Slurm or to its own detached supervisor (supervision/start.py)."""
    paths = JobPaths(args.root, check_job_id(args.job_id))
    claim_job_dir(paths, spec, args.queue)
    if spec.get("launcher") == "slurm":  # Slurm queues it: no lock, no --queue, no detached supervisor here
        return slurm_launch().submit(paths, spec)
    return launch_detached(paths, spec, args.queue, main)


def cmd_submit(args) -> dict:
    """Preflight, the admission verdict and the start in one call (one round trip): supervisor_submit.submit;
    then the host's retention rule, bounded (supervision/retention.py)."""
    spec = read_spec_stdin(args.root, check_job_id(args.job_id))
    answer = submit(args, spec, preflight_report, start_job)
    retention.at_submit(args.root, spec)
    return answer


# ── main ──────────────────────────────────────────────────────────────────────────────────────────────

class ArgParser(argparse.ArgumentParser):
    """argparse that raises `bad-args` instead of printing usage and exiting 2."""

    def error(self, message):
        raise Fail("bad-args", message)


def build_parser(sub: str) -> ArgParser:
    parser = ArgParser(prog="supervisor.py " + sub, add_help=False)
    parser.add_argument("--root", required=True)
    if sub == "status":
        parser.add_argument("--job-id", action="append", default=[])
        parser.add_argument("--ids-on-stdin", action="store_true")
    elif sub == "preflight":
        parser.add_argument("--job-id")
    elif sub not in ("restore-service", "gc"):
        parser.add_argument("--job-id", required=True)
    options = {
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
        "gc": [("--keep-jobs", dict(type=int, default=retention.KEEP_JOBS)),
               ("--keep-days", dict(type=float, default=retention.KEEP_DAYS)), ("--dry-run", dict(action="store_true"))],
    }
    for flag, kwargs in options.get(sub, []):
        parser.add_argument(flag, **kwargs)
    return parser


COMMANDS = {"preflight": cmd_preflight, "start": cmd_start, "submit": cmd_submit, "status": cmd_status,
            "logs": cmd_logs, "cancel": cmd_cancel, "restore": cmd_restore, "restore-service": cmd_restore_service,
            "result": cmd_result, "gc": cmd_gc, "_run": cmd_run, "_guard": cmd_guard, "slurm-run": cmd_slurm_run}


def dispatch(argv: list) -> dict:
    if not argv or argv[0] not in COMMANDS:
        raise Fail("bad-args", "usage: supervisor.py {%s} … --root ROOT" % ",".join(sorted(COMMANDS)))
    args = build_parser(argv[0]).parse_args(argv[1:])
    args.root = os.path.abspath(os.path.expanduser(check_root(args.root)))
    check_root_safe(args.root, HERE)
    return COMMANDS[argv[0]](args)


def main(argv: list) -> int:
    try:
        answer = dispatch(argv)
    except Fail as exc:
        answer = exc.answer()
    except Exception as exc:  # the one place an unexpected error becomes an answer
        import traceback

        answer = {"ok": False, "error": "internal", "message": "%s: %s" % (type(exc).__name__, exc),
                  "traceback": traceback.format_exc()[-2000:]}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    return answer.pop("exit_status", 0 if answer.get("ok") else 1)  # slurm-run: the payload's exit code

