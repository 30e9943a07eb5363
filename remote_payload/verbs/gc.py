"""`gc`: the retention rule by hand (supervision/retention.py)."""
from __future__ import annotations

from ..host.answer import Fail
from ..supervision import retention


def cmd_gc(args) -> dict:
    """`gc`: the retention rule by hand (supervision/retention.py); --dry-run lists without deleting."""
    if not (args.keep_jobs >= 0 and args.keep_days >= 0):
        raise Fail("bad-args", "--keep-jobs and --keep-days must be >= 0")
    return dict(retention.collect(args.root, args.keep_jobs, args.keep_days, dry_run=args.dry_run), ok=True)
