"""`status`: each job's state, its payload's progress and the ledger's `restored`."""
from __future__ import annotations

import os
import time

from ..contract import TERMINAL
from ..host.answer import Fail
from ..host.processes import POLL_S
from ..progress import SCAN_BYTES, summarize
from ..supervision.files import JobPaths, NotRegular, open_regular
from ..supervision.restore import owed
from ..supervision.spec import check_job_id, read_job_ids_stdin
from .reap import reap_if_dead


def status_entry(paths: JobPaths) -> dict:
    """The job's status; `restored` is the host ledger's word (no stop of the job owed), never status.json's
    alone, which the payload can write."""
    status = reap_if_dead(paths)
    owing = owed.stops_owed(paths.root, paths.job_id)  # one whose restore failed too: the unit is not back
    return dict(status, supervisor_pid=(status.get("supervisor") or {}).get("pid"),
                progress=payload_progress(paths, status), now=time.time(),
                restored=bool(status.get("restored")) and not owing)


def payload_progress(paths: JobPaths, status: dict):
    """For a job not yet ended: its progress from the event lines in the last MiB of output.log."""
    if status["state"] in TERMINAL:
        return None
    try:
        with open_regular(paths.output) as fh:
            info = os.fstat(fh.fileno())
            fh.seek(max(0, info.st_size - SCAN_BYTES))
            text = fh.read(SCAN_BYTES)
    except (FileNotFoundError, NotRegular):
        return None
    if info.st_size > SCAN_BYTES:
        text = text.split(b"\n", 1)[-1]  # the first line may be cut
    return dict(summarize(text), output_bytes=info.st_size, silent_s=round(max(0.0, time.time() - info.st_mtime), 1))


MAX_WAIT_S = 3600.0


def cmd_status(args) -> dict:
    """The jobs' entries; with --wait S (named jobs only), not before one of them changed state or ended, or
    S passed."""
    jobs_root = os.path.join(args.root, "jobs")
    named = args.job_id + (read_job_ids_stdin() if args.ids_on_stdin else [])
    ids = named or (sorted(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else [])
    if not (0.0 <= args.wait <= MAX_WAIT_S):  # NaN too
        raise Fail("bad-args", "--wait must be from 0 to %.0f seconds" % MAX_WAIT_S)
    deadline = time.monotonic() + (args.wait if named else 0.0)
    jobs = entries(args.root, ids)
    began = [job["state"] for job in jobs]
    while time.monotonic() < deadline and not any(
            job["state"] in TERMINAL or job["state"] != state for job, state in zip(jobs, began)):
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        jobs = entries(args.root, ids)
    return {"ok": True, "jobs": jobs}


def entries(root: str, ids: list) -> list:
    jobs = []
    for job_id in ids:
        paths = JobPaths(root, check_job_id(job_id))
        jobs.append(status_entry(paths) if os.path.isdir(paths.dir) else {"job_id": job_id, "state": "UNKNOWN"})
    return jobs
