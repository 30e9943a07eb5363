"""The host's `submit`: preflight, the admission verdict (admission.admit) and the start, in one round trip.

A refusal is answered as an error (`busy` with the holder, or `preflight-refused`; both with the report and
the verdict's hint); otherwise the job starts in the same call (the supervisor decides the service's stop again
when it holds the locks).
"""
from __future__ import annotations

import os

from ..admission import admit
from ..host.answer import Fail
from ..supervision import retention
from ..supervision.files import JobPaths
from ..supervision.spec import check_job_id, read_spec_stdin
from .preflight import preflight_report
from .start import start_job

# A retried submit of a job this id already names: its own locks and memory are no refusal; start answers
# `exists` and the controller adopts the job (or refuses a different spec).
RETRY: dict = {"start": True, "stop_service": False, "notes": []}


def cmd_submit(args) -> dict:
    """submit, then the host's retention rule. The job id is argv's, else the spec's own: a call opened before
    the controller had checked its spec (and so before it named the job) carries none."""
    spec = read_spec_stdin(args.root, check_job_id(args.job_id) if args.job_id is not None else None, need_job_id=True)
    args.job_id = check_job_id(spec["job_id"])
    answer = submit(args, spec)
    retention.at_submit(args.root, spec)
    return answer


def submit(args, spec: dict) -> dict:
    """Start's answer plus `report`, `started`: true and the verdict's `stop_service` and `notes`; or the
    refusal as a Fail (`preflight` and `start` without reading stdin)."""
    try:
        report = preflight_report(args, spec)
    except Fail as exc:
        raise Fail(exc.code, str(exc), stage="preflight", **exc.extra) from exc
    claimed = os.path.isdir(JobPaths(args.root, args.job_id).dir)
    verdict = RETRY if claimed else admit(dict(spec, job_id=args.job_id), report, args.queue)
    refusal = verdict.get("refuse")
    if refusal:
        extra = {key: refusal[key] for key in ("hint", "holder") if key in refusal}
        raise Fail(refusal["code"], refusal["message"], stage="admit", report=report, **extra)
    try:
        answer = start_job(args, spec)
    except Fail as exc:  # e.g. `exists`: the controller adopts the job its retry finds
        raise Fail(exc.code, str(exc), report=report, **exc.extra) from exc
    return dict(answer, started=answer.get("ok", False), report=report, stop_service=verdict["stop_service"],
                notes=verdict["notes"])
