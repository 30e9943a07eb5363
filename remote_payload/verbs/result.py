"""`result`: the job's result.json, refused when the answer cannot carry it, and beside it the service windows
of the job (status.json's `downtime` of each service it freed), so that a result and its window are one call."""
from __future__ import annotations

import os

from ..contract import MAX_RESULT_BYTES, TERMINAL
from ..host.answer import Fail
from ..supervision.files import JobPaths, UnsafeResult, is_slurm_job, open_result, read_result, read_status
from ..supervision.spec import job_paths
from .reap import reap_if_dead


def check_result_file(paths: JobPaths) -> None:
    """Refuse a result.json the answer cannot carry or must not: over the cap, or not a regular file of the
    job dir (a FIFO would block the read until the call's deadline; a symlink may point anywhere)."""
    try:
        fd, info = open_result(paths.result, paths.dir)
    except UnsafeResult as exc:
        what = str(exc)
    except OSError:
        return  # no result (yet), or unreadable: cmd_result says which
    else:
        os.close(fd)
        if info.st_size <= MAX_RESULT_BYTES:
            return
        what = "is %.1f MB, over runner's %d MB cap" % (info.st_size / (1 << 20), MAX_RESULT_BYTES >> 20)
    raise Fail("result-too-large", "job %s: its result.json %s; copy the raw file from the host: %s"
               % (paths.job_id, what, paths.result), job_id=paths.job_id, path=paths.result)


def cmd_result(args) -> dict:
    paths = job_paths(args)
    if is_slurm_job(paths):  # a job array's combined result.json is written by the login node's refresh
        reap_if_dead(paths)
    check_result_file(paths)
    try:
        if os.path.getsize(paths.result) == 0:  # payload.user's file, made for it, left unwritten
            raise FileNotFoundError(paths.result)
        result = read_result(paths.result, paths.dir)
        return {"ok": True, "job_id": paths.job_id, "result": result, "windows": service_windows(paths)}
    except (OSError, ValueError, RecursionError) as exc:
        unreadable = "" if isinstance(exc, FileNotFoundError) else " (result.json unreadable: %s)" % exc
        status = reap_if_dead(paths)
        state, why = status.get("state"), status.get("message") or ""
        if state in TERMINAL:
            text = "job %s ended %s without a result%s%s" % (paths.job_id, state, ": " + why if why else "", unreadable)
        else:
            text = "job %s is %s: no result yet%s" % (paths.job_id, state, unreadable)
        prepared = os.path.lexists(paths.prepare_result)
        if prepared:  # said, so nobody takes the prepare step's file for the payload's
            text += " (the payload wrote none; the prepare step's own is %s)" % paths.prepare_result
        raise Fail("no-result", text, job_id=paths.job_id, state=state, prepare_result=prepared) from exc


def service_windows(paths: JobPaths) -> list:
    """`[{unit, window}]` of each service record of status.json that holds a window (`downtime`); none when
    status.json cannot be read. The payload can overwrite status.json: a record of another shape is skipped,
    and a window keeps only its scalars and objects of scalars, so that it never deepens the answer."""
    try:
        status = read_status(paths)
    except Fail:
        return []
    listed = status.get("services")
    records = listed if isinstance(listed, list) else [status.get("service")]
    return [{"unit": r.get("unit") if isinstance(r.get("unit"), str) else None, "window": _flat(r["downtime"])}
            for r in records if isinstance(r, dict) and isinstance(r.get("downtime"), dict)]


def _flat(window: dict) -> dict:
    def scalar(value) -> bool:
        return value is None or isinstance(value, (str, int, float, bool))

    return {key: value for key, value in window.items() if scalar(value) or (
        isinstance(value, dict) and all(scalar(v) for v in value.values()))}
