"""`list` and `status` find a record the index does not hold (written by something other than the store: an older
runner, a copy) by listing the jobs dir; that listing is skipped only while the dir and the index are as they were
when one last found every record indexed, and a dir changed within LISTED_SETTLE_S is listed again (coarse file
system timestamps)."""
from __future__ import annotations

import json
import os
import time

from runner.state import store as store_module
from runner.state.store import JobRecord, Store


def record(job_id: str, at: float) -> JobRecord:
    return JobRecord(job_id=job_id, name="j", host={"address": "local"}, spec_path="x.yaml", submitted_at=at,
                     last_state="SUCCEEDED")


def stray(store: Store, job_id: str) -> None:
    """A record file the store did not write (so no index line)."""
    (store.jobs_dir / f"{job_id}.json").write_text(json.dumps(record(job_id, time.time()).__dict__))


def age(store: Store, seconds: float = 5.0) -> None:
    """The jobs dir as if last changed `seconds` ago (past the settling time)."""
    then = time.time() - seconds
    os.utime(store.jobs_dir, (then, then))


def listed_ids(store: Store) -> list[str]:
    return [r.job_id for r in store.recent()[0]]


def test_a_stray_record_is_found_whenever_the_jobs_dir_changed(tmp_path, monkeypatch):
    store = Store(tmp_path)
    store.save(record("a", 1.0))
    age(store)
    assert listed_ids(store) == ["a"]
    assert (tmp_path / "index.listed").exists()  # every record indexed, the dir settled: not listed next time
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(store_module.os, "listdir",
                        lambda path: listings.append(str(path)) or real_listdir(path))
    assert listed_ids(store) == ["a"]
    assert str(store.jobs_dir) not in listings
    stray(store, "b")  # a new entry changes the dir: listed, found, indexed
    assert listed_ids(store) == ["a", "b"]
    assert str(store.jobs_dir) in listings


def test_a_dir_changed_within_the_settling_time_is_listed_at_every_read(tmp_path, monkeypatch):
    store = Store(tmp_path)
    store.save(record("a", 1.0))  # the dir changed just now
    assert listed_ids(store) == ["a"]
    assert not (tmp_path / "index.listed").exists()
    # A stray written in the same timestamp tick as the dir's last change leaves its mtime as it was.
    stamp = os.stat(store.jobs_dir)
    stray(store, "b")
    os.utime(store.jobs_dir, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert listed_ids(store) == ["a", "b"]


def test_a_stamp_for_another_dir_or_index_is_no_reason_to_skip(tmp_path):
    store = Store(tmp_path)
    store.save(record("a", 1.0))
    age(store)
    listed_ids(store)
    stamp = (tmp_path / "index.listed").read_text()
    stray(store, "b")
    age(store)  # the stray's entry aged past the settling time: the mtime alone now differs from the stamp
    assert listed_ids(store) == ["a", "b"]
    (tmp_path / "index.listed").write_text(stamp)  # a stale stamp: the index grew since
    stray(store, "c")
    mtime = int(stamp.split()[1])
    os.utime(store.jobs_dir, ns=(mtime, mtime))  # even with the dir's mtime put back
    assert listed_ids(store) == ["a", "b", "c"]


def test_an_unreadable_stray_is_said_at_every_read(tmp_path):
    store = Store(tmp_path)
    store.save(record("a", 1.0))
    (store.jobs_dir / "bad.json").write_text("{torn")
    age(store)
    for _ in range(2):
        records, skipped, _older = store.recent()
        assert [r.job_id for r in records] == ["a"] and len(skipped) == 1
    assert not (tmp_path / "index.listed").exists()
