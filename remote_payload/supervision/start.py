"""Starting a job, both sides of it: the atomic claim of its directory, the detached launch of its supervisor
(a transient systemd unit where the host has one, else fork/setsid/fork of this very process: run.py) and the
one-line ready handshake.

    start ──claim_job_dir──▶ ROOT/jobs/<id>/ ──launch_detached──▶ _run ──answer_start──▶ one JSON line
      ◀── read_ready (at most READY_TIMEOUT_S; past it give_up_start marks the job abandoned) ──┘

`start` giving up and the supervisor answering exclude each other under ready.lock, so they never disagree
on whether the job exists.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import sys
import time
from typing import Sequence

from ..host.answer import Fail
from ..host.processes import is_alive
from .files import RESERVE_BYTES, JobPaths, fsync_dir, open_regular, read_json, write_json_atomic
from .record import Job, initial_status

READY_TIMEOUT_S = 30.0       # how long `start` waits for the detached supervisor's handshake
COMM = "runner-job"          # the forked supervisor's process name (ps -e, top; its cmdline is the host call's)


def close_fds_except(keep: Sequence[int]) -> None:
    """Close every fd above 2 but `keep`, so nothing the caller (e.g. sshd) opened stays open."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the fd listdir itself used, already closed


def detach(log_path: str, keep: Sequence[int] = ()) -> bool:
    """fork, setsid, fork: True in the detached grandchild (stdin /dev/null, stdout+stderr appended to
    log_path, every fd above 2 but `keep` closed), False in the caller once the first child is reaped."""
    sys.stdout.flush()  # nothing buffered before the fork may be written twice
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return False
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        close_fds_except(keep)
        return True
    except BaseException:
        os._exit(127)


def daemonize_exec(argv: list, log_path: str, keep: Sequence[int] = ()) -> None:
    """Run argv (a fresh interpreter) detached: see detach."""
    if not detach(log_path, keep):
        return
    try:
        for fd in keep:
            os.set_inheritable(fd, True)
        os.execv(sys.executable, argv)
    finally:
        os._exit(127)


def daemonize_call(main, argv: list, log_path: str, keep: Sequence[int] = ()) -> None:
    """Run main(argv) detached in a fork of this interpreter (no second start), ending with its exit code."""
    if not detach(log_path, keep):
        return
    code = 127
    try:
        with contextlib.suppress(OSError), open("/proc/self/comm", "w") as fh:
            fh.write(COMM)
        code = main(argv)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def read_ready(fd: int, timeout: float):
    """The supervisor's one-line handshake; None on EOF or timeout."""
    data, deadline = b"", time.monotonic() + timeout
    while b"\n" not in data:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    try:
        return json.loads(data.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError):
        return None


def tail_file(path: str, limit: int = 2000) -> str:
    try:
        with open_regular(path) as fh:  # the payload's log: never a blocking open, never a device read whole
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - limit))
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


@contextlib.contextmanager
def ready_lock(paths: JobPaths):
    """`start` giving up and the supervisor answering exclude each other (held for one pipe write at most)."""
    fd = os.open(paths.ready_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def give_up_start(paths: JobPaths, ready_r: int):
    """Past READY_TIMEOUT_S: the answer if it came meanwhile, else the job marked abandoned."""
    try:
        with ready_lock(paths):
            answer = read_ready(ready_r, 0)
            if answer is None:
                open(paths.abandoned, "w").close()
            return answer
    except FileNotFoundError:  # the supervisor refused (busy) and removed the dir: its answer is in the pipe
        return read_ready(ready_r, 0)


def claim_job_dir(paths: JobPaths, spec: dict, queue: bool) -> None:
    """Build the job dir aside, then rename it into place: the rename is the atomic claim of the id, and no
    reader ever sees a job dir without its spec.json and status.json."""
    staging = os.path.join(paths.root, "tmp")
    try:
        for path in (os.path.dirname(paths.dir), staging):
            os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise no_room(paths, staging, exc) from exc
    if os.path.exists(paths.dir):
        raise job_exists(paths, spec)
    import tempfile  # only `start` needs it: not at the top, where every call would pay for it

    tmp = None
    try:
        tmp = tempfile.mkdtemp(prefix=paths.job_id + ".", dir=staging)
        write_json_atomic(os.path.join(tmp, "spec.json"), spec)
        write_json_atomic(os.path.join(tmp, "status.json"), initial_status(spec, queue))
        with open(os.path.join(tmp, "reserve"), "wb") as fh:  # real blocks, not a sparse file
            fh.write(b"\0" * RESERVE_BYTES)
    except OSError as exc:  # a full or read-only disk: nothing was started, and nothing is left behind
        if tmp:
            _remove_tree(tmp)
        raise no_room(paths, staging, exc) from exc
    try:
        os.rename(tmp, paths.dir)  # fails when the target exists and is not empty: every job dir has files
    except OSError:
        _remove_tree(tmp)
        raise job_exists(paths, spec) from None
    fsync_dir(os.path.dirname(paths.dir))


def no_room(paths: JobPaths, staging: str, exc: OSError) -> Fail:
    return Fail("start-failed", "cannot create the job dir under %s: %s; nothing was started"
                % (staging, exc.strerror or exc), job_id=paths.job_id)


def job_exists(paths: JobPaths, spec: dict) -> Fail:
    """`exists`, saying whether the recorded spec is this one (a retried submit is idempotent)."""
    try:
        same = read_json(paths.spec) == spec
    except (OSError, ValueError):
        same = False
    return Fail("exists", "job %s exists on this host%s" % (paths.job_id, "" if same else " with a different spec"),
                job_id=paths.job_id, same_spec=same)


def start_failed(paths: JobPaths) -> dict:
    """The job abandoned before anything was stopped: its dir removed if its supervisor is dead."""
    log = tail_file(paths.supervisor_log)
    try:
        if not is_alive(Job.load(paths).status.get("supervisor")):
            _remove_tree(paths.dir)
    except Fail:
        _remove_tree(paths.dir)
    raise Fail("start-failed", "the supervisor did not report ready within %.0f s, so the job was abandoned "
               "before anything was stopped (submit it again); its log: %s" % (READY_TIMEOUT_S, log),
               job_id=paths.job_id)


def send_ready(fd: int, answer: dict) -> bool:
    """Hand `start` its answer under the ready lock; False when `start` gave up (the job must not go on)."""
    try:
        os.write(fd, (json.dumps(answer) + "\n").encode("utf-8"))
        return True
    except OSError:
        return False  # `start` is gone
    finally:
        os.close(fd)


def answer_start(paths: JobPaths, fd: int, answer: dict) -> bool:
    with ready_lock(paths):
        if os.path.exists(paths.abandoned):
            os.close(fd)
            return False
        return send_ready(fd, answer)


def _remove_tree(path: str) -> None:
    """shutil.rmtree, imported on the failure paths only."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
