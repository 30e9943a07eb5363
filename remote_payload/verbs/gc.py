"""`gc`: the retention rule by hand (supervision/retention.py)."""
from __future__ import annotations

from ..host.answer import Fail
from ..supervision import retention
from ..supervision.spec import read_job_ids_stdin


def cmd_gc(args) -> dict:
    """--dry-run lists without deleting; --ids-on-stdin: only the jobs of that list may go (a controller's own,
    where several share the login)."""
    if not (args.keep_jobs >= 0 and args.keep_days >= 0):
        raise Fail("bad-args", "--keep-jobs and --keep-days must be >= 0")
    only = set(read_job_ids_stdin()) if args.ids_on_stdin else None
    return dict(retention.collect(args.root, args.keep_jobs, args.keep_days, dry_run=args.dry_run, only=only), ok=True)
