"""What a host keeps under ROOT, and `gc`: old job dirs and unused bundles deleted, nothing a job still needs.

The rule (docs/protocol.md, "Retention"): a job dir is kept while it is among the newest `keep_jobs` job dirs,
younger than `keep_days` (its mtime: the last write of its status.json), not ended (any state outside
TERMINAL, or a status.json that cannot be read), while its supervisor or guard lives, while the host ledger
names it (a stop it owes) or while it holds a lock (in the host lock place, or its own restore.lock). A payload
bundle (ROOT/payloads/<hash>) is kept while a kept job's spec names it or it was used in the last day;
a supervisor bundle (ROOT/payload/<hash>) while it is the one running, was used in the last day, or any job
is not ended or owes a stop (a guard timer and ExecStopPost= run that job's bundle by path). A deletion is
a rename into ROOT/tmp, then the removal, so a reader never sees half a job dir; at most `most` per call.
"""
from __future__ import annotations

import os
import stat
import time

from ..contract import TERMINAL
from ..host.answer import Fail
from ..host.bundle import HERE
from ..host.parsers import parse_mount_points
from ..host.processes import is_alive
from . import ledger
from .files import JobPaths, read_json, read_status
from .locks import file_locked, held_keys, lock_held, read_holder

KEEP_JOBS = 200          # the newest job dirs kept whatever their age
KEEP_DAYS = 14.0         # a job dir younger than this is kept
BUNDLE_DAYS = 1.0        # a bundle used within this is kept (a submit may be on its way to it)
SUBMIT_MOST = 10         # deletions per submit: the submit's own work stays small
DAY_S = 86400.0


def plan(root: str, keep_jobs: int = KEEP_JOBS, keep_days: float = KEEP_DAYS, most: int | None = None,
         only=None) -> dict:
    """{jobs: [ids to delete, oldest first], payloads, supervisors, kept: {id: why}, others: [ids not in
    `only`, kept], complete}; nothing is touched. With `most`, the scan stops at that many deletions, and
    bundles are looked at only once every job dir was (complete)."""
    now = time.time()
    dirs = sorted(entries(os.path.join(root, "jobs")), key=lambda e: e[1])  # oldest first
    owed = [e for e in ledger.entries(root) if e.get("root", root) == root]  # stops owed (or entries unreadable)
    held = lock_holders(root) | {e.get("job_id") for e in owed}
    doomed: list[str] = []
    kept: dict[str, str] = {}
    others: list[str] = []
    for position, (job_id, mtime) in enumerate(dirs):
        if most is not None and len(doomed) >= most:
            return {"jobs": doomed, "payloads": [], "supervisors": [], "kept": kept, "others": others,
                    "complete": False}
        why = keep_reason(root, job_id, len(dirs) - 1 - position, mtime, now, keep_jobs, keep_days, held)
        if why is None and only is not None and job_id not in only:
            others.append(job_id)
            kept[job_id] = "another controller's job"
        elif why is None:
            doomed.append(job_id)
        else:
            kept[job_id] = why
    payloads = unused(root, "payloads", now)
    if payloads:
        needed = {bundle_of(root, job_id) for job_id in kept}
        payloads = [name for name in payloads if name not in needed]
    supervisors = [name for name in unused(root, "payload", now) if name != os.path.basename(HERE)]
    if supervisors and (owed or any(not ended(root, job_id) for job_id in kept)):
        supervisors = []  # a job still running or owing a stop may run its own bundle by path
    return {"jobs": doomed, "payloads": payloads, "supervisors": supervisors, "kept": kept, "others": others,
            "complete": True}


def unused(root: str, folder: str, now: float) -> list:
    """The bundles under ROOT/folder unused (mtime) for BUNDLE_DAYS, and cut uploads' stages as old (.part-)."""
    return [name for name, mtime in sorted(entries(os.path.join(root, folder)))
            if now - mtime > BUNDLE_DAYS * DAY_S and (not name.startswith(".") or name.startswith(".part-"))]


def ended(root: str, job_id: str) -> bool:
    try:
        return read_status(JobPaths(root, job_id)).get("state") in TERMINAL
    except Fail:
        return False


def entries(folder: str) -> list:
    """[(name, mtime)] of the folders directly in `folder` (no symlinks); [] when there is none."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        try:
            info = os.lstat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            found.append((name, info.st_mtime))
    return found


def keep_reason(root: str, job_id: str, rank: int, mtime: float, now: float, keep_jobs: int, keep_days: float,
                held: set):
    """Why the job dir stays, or None. rank: 0 for the newest; held: jobs holding a lock or owing a stop."""
    if rank < keep_jobs:
        return "among the newest %d" % keep_jobs
    if now - mtime < keep_days * DAY_S:
        return "younger than %g days" % keep_days
    paths = JobPaths(root, job_id)
    try:
        status = read_status(paths)
    except Fail:
        return "not ended"  # an unreadable status.json is never taken for an ended job
    if status["state"] not in TERMINAL:
        return "not ended"
    if is_alive(status.get("supervisor")) or is_alive(status.get("guard")):
        return "its supervisor or guard lives"
    if job_id in held or file_locked(paths.restore_lock):  # a restorer settles it now
        return "it holds a lock or owes a stop"
    if mounts_under(paths.dir):
        return "a mount point inside it (%s): gc stays on host.root's filesystem" % mounts_under(paths.dir)[0]
    return None


def mounts_under(top: str) -> list:
    """The mount points under `top` (a bind mount a root payload left), by /proc/self/mountinfo: a mount of
    the same filesystem has the same st_dev. Deepest last."""
    try:
        with open("/proc/self/mountinfo") as fh:
            points = parse_mount_points(fh.read())
    except OSError:
        return []
    inside = os.path.realpath(top) + os.sep
    return sorted(p for p in points if p.startswith(inside))


def lock_holders(root: str) -> set:
    """The jobs of this host.root named by the holder record of a lock held now in the host lock place."""
    records = [read_holder(key) or {} for key in held_keys() if lock_held(key)]
    return {r.get("job_id") for r in records if r.get("root") == root}


def bundle_of(root: str, job_id: str):
    """The payload bundle a job's spec names (None for a command payload or an unreadable spec)."""
    try:
        return read_json(JobPaths(root, job_id).spec)["payload"].get("bundle")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def collect(root: str, keep_jobs: int = KEEP_JOBS, keep_days: float = KEEP_DAYS, most: int | None = None,
            dry_run: bool = False, only=None) -> dict:
    """`gc`: plan's deletions made (unless dry_run), at most `most`, job dirs first, oldest first; the answer
    lists what went (or would), `others`, how many job dirs stay and whether the rule was applied in full."""
    found = plan(root, keep_jobs, keep_days, most, only)
    todo = [(kind, folder, name) for kind, folder in (("jobs", "jobs"), ("payloads", "payloads"),
                                                      ("supervisors", "payload")) for name in found[kind]]
    deleted: dict[str, list[str]] = {"jobs": [], "payloads": [], "supervisors": []}
    for kind, folder, name in todo[:most]:
        if dry_run or remove(root, folder, name):
            deleted[kind].append(name)
    complete = found["complete"] and (most is None or len(todo) <= most)
    return dict(deleted, others=found["others"], dry_run=dry_run, kept=len(found["kept"]), complete=complete,
                keep_jobs=keep_jobs, keep_days=keep_days)


def remove(root: str, folder: str, name: str) -> bool:
    """ROOT/folder/name renamed into ROOT/tmp, then removed; False when it went meanwhile."""
    trash = os.path.join(root, "tmp", "gc-%d-%s-%s" % (os.getpid(), folder, name))
    os.makedirs(os.path.dirname(trash), exist_ok=True)
    try:
        os.rename(os.path.join(root, folder, name), trash)
    except FileNotFoundError:
        return False
    remove_outside(trash, set(mounts_under(trash)))
    return True


def remove_outside(path: str, mounts: set) -> None:
    """shutil.rmtree that never enters a mount point (one made since the plan)."""
    for entry in os.scandir(path):
        try:
            if entry.is_dir(follow_symlinks=False):
                if os.path.realpath(entry.path) not in mounts:
                    remove_outside(entry.path, mounts)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
    try:
        os.rmdir(path)
    except OSError:
        pass


def at_submit(root: str, spec: dict) -> None:
    """After a submit started its job: its bundles marked used (mtime), then at most SUBMIT_MOST deletions."""
    bundle = spec["payload"].get("bundle")
    used = [os.path.join(root, "payloads", bundle)] if bundle else []
    if os.path.dirname(HERE) == os.path.join(root, "payload"):  # run from its bundle (not a source tree)
        used.append(HERE)
    try:
        for path in used:
            os.utime(path)
        collect(root, most=SUBMIT_MOST)
    except Exception:  # the job runs already: nothing here may turn its submit into a failure
        pass
