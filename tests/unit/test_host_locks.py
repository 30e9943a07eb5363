"""remote_payload/supervision/locks.py on a real dir (RUNNER_LOCK_DIR, tests/conftest.py): a lock file is its
taker's alone, its name goes with its release, and what another user left there is never shared."""
from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys

import pytest

from remote_payload.supervision.locks import Locks, holder_of, lock_path, probe_lock

NOBODY = 65534


def test_a_taken_lock_is_0600_and_its_name_goes_with_its_release(host_lock_place):
    locks = Locks("/r", ["gpu-0", "service-x.service"], "j1")
    assert locks.try_acquire() is None
    locks.write_holders()
    info = os.lstat(lock_path("gpu-0"))
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    held = probe_lock("gpu-0")
    assert held["held"] and held["holder"]["job_id"] == "j1" and held["holder"]["root"] == "/r", held
    other = Locks("/r2", ["gpu-0"], "j2")
    assert other.try_acquire()["job_id"] == "j1"
    locks.release()
    assert sorted(os.listdir(host_lock_place)) == []
    assert other.try_acquire() is None


@pytest.mark.skipif(os.geteuid() != 0, reason="root replaces another user's file")
def test_root_replaces_a_file_another_user_left_or_a_link_but_not_one_held(host_lock_place):
    path = lock_path("gpu-0")
    with open(path, "w"):
        pass
    os.chown(path, NOBODY, NOBODY)
    locks = Locks("/r", ["gpu-0"], "j1")
    assert locks.try_acquire() is None and os.lstat(path).st_uid == 0  # left by nobody: replaced
    locks.release()
    os.symlink("/etc/passwd", path)
    assert locks.try_acquire() is None and not os.path.islink(path)
    locks.release()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path, str(NOBODY)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = locks.try_acquire()
        assert busy["pid"] == holder.pid and busy["user"] == "nobody" and "-c" in busy["command"], busy
        assert holder_of("gpu-0")["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()


# argv[1]: the lock file to make and hold as uid argv[2] (opened first: that user cannot reach pytest's tmp dir)
HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.fchown(fd, int(sys.argv[2]), int(sys.argv[2]))
os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2]))
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_the_host_lock_place_must_not_be_writable_by_others_unless_sticky(host_lock_place):
    host_lock_place.chmod(0o777)
    with pytest.raises(Exception) as refused:
        Locks("/r", ["gpu-0"], "j1").try_acquire()
    assert "host lock place" in str(refused.value)
    host_lock_place.chmod(0o1777)
    locks = Locks("/r", ["gpu-0"], "j1")
    assert locks.try_acquire() is None
    locks.release()


def test_a_waiter_on_a_released_name_takes_the_next_file(host_lock_place):
    """A taker that opened the name before the holder let go must not hold the removed file."""
    first = Locks("/r", ["gpu-0"], "j1")
    assert first.try_acquire() is None
    stale = os.open(lock_path("gpu-0"), os.O_RDWR)
    first.release()
    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the old file: nobody's lock any more
    second = Locks("/r", ["gpu-0"], "j2")
    assert second.try_acquire() is None
    assert os.fstat(second.fds["gpu-0"]).st_ino != os.fstat(stale).st_ino
    os.close(stale)
    second.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="entries of several users")
def test_a_ledger_entry_is_acted_on_by_its_own_login_and_by_root_for_that_logins_root(tmp_path):
    """A sudo login's guard timer runs its restore as root for the login's host.root: root then acts on that
    login's entries (and writes them back as the login's), never on a third user's."""
    from remote_payload.supervision import ledger

    theirs = tmp_path / "their-root"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    ledger.record_stop(str(theirs), "a.service", "j1", {"was": "active"}, [])
    assert os.lstat(ledger.ledger_path("a.service")).st_uid == NOBODY  # given back to the login
    assert ledger.read_entry(str(theirs), "a.service")["job_id"] == "j1"
    ledger.note(str(theirs), "a.service", "j1", restore_failed_at=1.0)
    assert os.lstat(ledger.ledger_path("a.service")).st_uid == NOBODY
    mine = tmp_path / "root"
    mine.mkdir()
    assert ledger.read_entry(str(mine), "a.service") is None  # root's own host.root: another login's entry
    assert ledger.foreign_entry(str(mine), "a.service")["user"] == "nobody"
    os.chown(ledger.ledger_path("a.service"), 1, 1)  # a third user's
    assert ledger.read_entry(str(theirs), "a.service") is None
