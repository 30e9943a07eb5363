"""`list` and `status` (no id) read the index's last lines, not the whole history: the newest RECENT_JOBS and the
jobs not yet ended, and a count of the older ones that is exact."""
from __future__ import annotations

import os
import time

import pytest

from runner.state.store import RECENT_JOBS, JobRecord, Store


def record(job_id: str, at: float, state: str = "SUCCEEDED") -> JobRecord:
    return JobRecord(job_id=job_id, name="j", host={"address": "local"}, spec_path="x.yaml", submitted_at=at,
                     last_state=state)


def settled(store: Store) -> None:
    """The jobs dir as if last changed a while ago, so that a listing may be skipped from now on."""
    then = time.time() - 5
    os.utime(store.jobs_dir, (then, then))


def test_the_first_record_of_a_new_state_dir_is_indexed_once(tmp_path):
    store = Store(tmp_path / "state")
    store.save(record("j-000", 1000.0))
    store.save(record("j-001", 1001.0))
    assert (store.root / "index").read_text().split("\n")[:-1] == ["j-000 1000.0", "j-001 1001.0"]
    assert store.recent() == ([record("j-000", 1000.0), record("j-001", 1001.0)], [], 0)


@pytest.mark.parametrize("history", [RECENT_JOBS - 1, RECENT_JOBS, RECENT_JOBS + 1, 3000])
def test_the_newest_and_the_unfinished_with_an_exact_count_of_the_rest(tmp_path, history):
    store = Store(tmp_path / "state")
    for n in range(history):
        store.save(record(f"j-{n:05d}", 1000.0 + n, "RUNNING" if n == 1 else "SUCCEEDED"))
    records, skipped, older = store.recent()
    newest = [f"j-{n:05d}" for n in range(max(0, history - RECENT_JOBS), history)]
    assert [r.job_id for r in records] == (["j-00001"] if "j-00001" not in newest else []) + newest
    assert skipped == []
    assert older == history - len(records)


def test_a_settled_history_is_not_parsed_whole(tmp_path, monkeypatch):
    """Once a listing found every record indexed, `recent` reads the index's end: never every id."""
    store = Store(tmp_path / "state")
    for n in range(300):
        store.save(record(f"j-{n:05d}", 1000.0 + n))
    settled(store)
    store.recent()  # lists the jobs dir once and notes that it found every record indexed

    def whole_index(_self):
        raise AssertionError("the whole index was parsed")

    monkeypatch.setattr(Store, "_indexed", whole_index)
    records, _skipped, older = store.recent()
    assert [r.job_id for r in records] == [f"j-{n:05d}" for n in range(300 - RECENT_JOBS, 300)]
    assert older == 300 - RECENT_JOBS


def test_lines_longer_than_usual_are_read_back_far_enough(tmp_path):
    """Job ids longer than an index line's usual length: the end is read again, further back, until it holds
    RECENT_JOBS ids."""
    store = Store(tmp_path / "state")
    ids = [f"j{'x' * 120}-{n:04d}" for n in range(RECENT_JOBS + 20)]
    for n, job_id in enumerate(ids):
        store.save(record(job_id, 1000.0 + n))
    records, _skipped, older = store.recent()
    assert [r.job_id for r in records] == ids[-RECENT_JOBS:]
    assert older == 20
