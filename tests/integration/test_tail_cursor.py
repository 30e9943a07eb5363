"""The log cursor an agent can rely on, through the real CLI and real processes on a local target.

The rule under test: the cursor moves only when a `tail` call ends by itself, after its output is written,
under a per-job lock, and only forward; so the calls that ended by themselves, joined, are the log byte for
byte, whatever was killed, and whatever else (`watch`, a second `tail` loop) reads the same job meanwhile.
"""
from __future__ import annotations

import json
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path


from runner.commands import unattended
from runner.remote import host as host_module
from runner.state.store import Store
from tests.cli_helpers import REPO, Target, job_dir, python_payload, run_cli, submit, wait_for, wait_terminal, \
    write_job
from tests.harness.tail_calls import kill_loop, output_log, tail_loop, tile_the_log

STREAMER = """
import sys, time
lines, pause = int(sys.argv[1]), float(sys.argv[2])
for i in range(lines):
    sys.stdout.write("line %06d %s\\n" % (i, "x" * 87))
    sys.stdout.flush()
    time.sleep(pause)
"""


def start_streamer(target: Target, work: Path, lines: int, pause: float) -> str:
    """A job printing `lines` lines of 100 B, one every `pause` seconds."""
    job = write_job(work / "job.yaml", target,
                    command=python_payload(work, "stream.py", STREAMER) + [str(lines), str(pause)])
    return submit(target, job)


def stored_cursor(state_dir: Path, job_id: str) -> int:
    return json.loads((state_dir / "jobs" / f"{job_id}.json").read_text())["cursor"]


# -- 1. killed calls ---------------------------------------------------------------------------------------

def test_calls_that_end_by_themselves_join_to_the_log_whatever_is_killed(target, work):
    job_id = start_streamer(target, work, lines=4000, pause=0.005)  # 400 KB over ~20 s
    ended, killed = kill_loop(target, job_id, random.Random(22), 200, (0.2, 1.5))
    log = output_log(target, job_id)
    assert len(log) == 400000 and len(killed) >= 3
    assert b"".join(ended) == log, f"ended calls delivered {sum(map(len, ended))} of {len(log)} B"
    # A reader that kept the killed calls' output saw each of those bytes again in the calls after it:
    # what a killed call printed is the log from the last acknowledged byte on, nothing else.
    for start, out in killed:
        assert out == log[start:start + len(out)]


# -- 2. watch beside tail ----------------------------------------------------------------------------------

def test_watch_beside_a_tail_loop_never_moves_the_cursor(target, work):
    job_id = start_streamer(target, work, lines=300, pause=0.02)
    watcher = subprocess.Popen([sys.executable, "-m", "runner", "watch", job_id, "--plain", "--max-wait", "30"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    calls: list = []
    try:
        tail_loop(target, job_id, calls)
    finally:
        _, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0 and b"Traceback" not in err, err.decode()
    joined = b"".join(out for _c, out in calls)
    assert joined.count(b"\n") == 300 and joined == output_log(target, job_id)


# -- 3. two tail loops on one state dir ----------------------------------------------------------------------

def test_two_tail_loops_share_the_log_each_byte_once_and_the_cursor_never_moves_back(target, work,
                                                                                       runner_state_dir):
    job_id = start_streamer(target, work, lines=300, pause=0.02)
    cursors, done = [], threading.Event()

    def watch_cursor():
        while not done.is_set():
            try:
                cursors.append(stored_cursor(runner_state_dir, job_id))
            except (OSError, ValueError):
                pass
            time.sleep(0.01)

    calls: list = []
    threads = [threading.Thread(target=tail_loop, args=(target, job_id, calls)) for _ in range(2)]
    watcher = threading.Thread(target=watch_cursor)
    for thread in [watcher, *threads]:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    done.set()
    watcher.join()
    log = output_log(target, job_id)
    total = sum(len(out) for _c, out in calls)
    assert total == len(log), f"{total} B printed for a log of {len(log)} B"
    # Each call holds the job's cursor for its whole turn: each printed a slice of the log, end to end.
    assert tile_the_log(log, [out for _c, out in calls])
    assert cursors == sorted(cursors) and cursors[-1] == len(log)


# -- 4. a state dir that cannot be written --------------------------------------------------------------------

def in_private_mounts(script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell script in a mount namespace of its own: its mounts vanish with it."""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", script],
                          capture_output=True, timeout=timeout, cwd=REPO)


def test_tail_with_a_read_only_state_dir_refuses_before_the_host(target, work, runner_state_dir):
    job_id = start_streamer(target, work, lines=5, pause=0.01)
    wait_terminal(target, job_id)
    state = shlex.quote(str(runner_state_dir))
    done = in_private_mounts(f"mount --bind {state} {state}; mount -o remount,bind,ro {state}; "
                             f"RUNNER_STATE_DIR={state} exec {sys.executable} -m runner tail {job_id}")
    assert done.returncode == 2, done.stderr.decode()
    assert done.stdout == b"" and b"Traceback" not in done.stderr
    assert b"cannot be written" in done.stderr
    assert run_cli(target, "tail", job_id).stdout == output_log(target, job_id)  # nothing was lost


def test_a_state_dir_that_fills_during_tail_is_a_clean_error_and_the_bytes_come_again(target, work,
                                                                                         runner_state_dir):
    job_id = start_streamer(target, work, lines=400, pause=0.03)  # 12 s: still running when the dir fills
    state, out = shlex.quote(str(runner_state_dir)), shlex.quote(str(work / "tail.out"))
    copy = shlex.quote(str(work / "state-copy"))
    shutil.copytree(runner_state_dir, work / "state-copy")
    # The tail starts on a writable dir; once it has printed, the dir fills: the cursor cannot be saved.
    done = in_private_mounts(
        f"mount -t tmpfs -o size=64k tmpfs {state}; cp -a {copy}/. {state}/; "
        f"(RUNNER_STATE_DIR={state} {sys.executable} -m runner tail {job_id} -f --max-wait 2 > {out} || echo rc=$? >&2) & "
        f"until [ -s {out} ]; do sleep 0.02; done; "
        f"dd if=/dev/zero of={state}/fill bs=4k 2>/dev/null || true; wait")
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"rc=2" in done.stderr and b"cannot be written" in done.stderr, done.stderr.decode()
    wait_terminal(target, job_id)
    assert run_cli(target, "tail", job_id).stdout == output_log(target, job_id)  # the unsaved bytes come again


# -- 5. a log shorter than the cursor ---------------------------------------------------------------------------

def test_a_log_that_shrank_is_said_and_the_next_call_prints_it_from_the_start(target, work):
    job_id = start_streamer(target, work, lines=20, pause=0.0)
    wait_terminal(target, job_id)
    assert run_cli(target, "tail", job_id).returncode == 0
    log_path = job_dir(target, job_id) / "output.log"
    log_path.write_bytes(log_path.read_bytes()[:500])
    done = run_cli(target, "tail", job_id)
    assert done.returncode == 3 and done.stdout == b"" and b"Traceback" not in done.stderr, done.stderr
    assert b"shorter than the cursor" in done.stderr
    again = run_cli(target, "tail", job_id)
    assert again.returncode == 0 and again.stdout == log_path.read_bytes(), again.stderr
    assert run_cli(target, "tail", job_id).stdout == b""


def test_a_cursor_past_the_end_resyncs_too(target, work, runner_state_dir):
    job_id = start_streamer(target, work, lines=3, pause=0.0)
    wait_terminal(target, job_id)
    record_path = runner_state_dir / "jobs" / f"{job_id}.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "cursor": 10 ** 9}))
    assert run_cli(target, "tail", job_id).returncode == 3
    assert run_cli(target, "tail", job_id).stdout == output_log(target, job_id)


# -- 6. the MCP tail and half a character ----------------------------------------------------------------------

HALF_CHAR = """
import os, sys, time
sys.stdout.buffer.write("abc".encode() + "\\u20ac".encode()[:1])
sys.stdout.buffer.flush()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
sys.stdout.buffer.write("\\u20ac".encode()[1:] + b" done\\n")
"""


def test_mcp_tail_long_polls_on_half_a_character_and_delivers_it_whole(target, work, monkeypatch):
    go = work / "go"
    job = write_job(work / "job.yaml", target, command=python_payload(work, "half.py", HALF_CHAR) + [str(go)])
    job_id = submit(target, job)
    wait_for(lambda: output_log(target, job_id).startswith(b"abc\xe2"), what="half a character")
    calls = []
    real_logs = host_module.HostClient.logs
    monkeypatch.setattr(host_module.HostClient, "logs", lambda self, *a, **kw: calls.append(a) or real_logs(self, *a, **kw))
    store = Store()
    first = unattended.tail_text(job_id, store=store, max_wait=5, max_bytes=1024)
    assert first.text == "abc" and first.offset == 3
    threading.Timer(2.0, go.touch).start()
    texts, started = [], time.monotonic()
    while time.monotonic() - started < 20:  # an MCP client calling again while call_again is true
        answer = unattended.tail_text(job_id, store=store, max_wait=5, max_bytes=1024)
        texts.append(answer.text)
        if not answer.call_again:
            break
    assert "".join(texts) == "\u20ac done\n" and "\\x" not in "".join(texts)
    assert len(calls) <= 6, f"{len(calls)} host calls while the character was incomplete"
    assert store.load(job_id).cursor == len(output_log(target, job_id))


# -- local index records of the wrong shape ---------------------------------------------------------------------

def test_a_bad_local_record_is_skipped_by_list_and_a_clean_error_by_name(target, work, runner_state_dir):
    job_id = start_streamer(target, work, lines=1, pause=0.0)
    jobs = runner_state_dir / "jobs"
    (jobs / "as-list.json").write_text("[1, 2]")
    (jobs / "wrong-types.json").write_text(json.dumps({"job_id": 5, "name": [], "host": "x", "spec_path": 1,
                                                        "submitted_at": "now"}))
    listed = run_cli(target, "list", "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    assert [j["job_id"] for j in json.loads(listed.stdout)] == [job_id]
    assert b"as-list.json" in listed.stderr and b"wrong-types.json" in listed.stderr
    for bad in ("as-list", "wrong-types"):
        done = run_cli(target, "tail", bad)
        assert done.returncode == 1 and b"Traceback" not in done.stderr and b"unreadable" in done.stderr, done.stderr


GATED = """
import os, sys, time
for i in range(20):
    print("line %02d" % i, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
print("end", flush=True)
"""


def test_wait_follows_a_log_that_shrank_again_from_its_first_byte(target, work):
    gate = work / "gate"
    job = write_job(work / "job.yaml", target, command=python_payload(work, "gated.py", GATED) + [str(gate)])
    job_id = submit(target, job)
    log_path = job_dir(target, job_id) / "output.log"
    wait_for(lambda: log_path.read_bytes().endswith(b"line 19\n"), what="20 lines")
    assert run_cli(target, "tail", job_id).stdout == log_path.read_bytes()
    log_path.write_bytes(b"rewritten\n")
    gate.touch()
    done = run_cli(target, "wait", job_id, "--timeout", "60s")
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"shorter than the cursor" in done.stderr and done.stdout == log_path.read_bytes()


def test_tail_json_moves_the_cursor_only_after_its_document(target, work, runner_state_dir):
    job_id = start_streamer(target, work, lines=3, pause=0.0)
    wait_terminal(target, job_id)
    done = run_cli(target, "tail", job_id, "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["output"].encode() == output_log(target, job_id)
    assert (answer["terminal"], answer["busy"], answer["offset"]) == (True, False, 300)
    assert stored_cursor(runner_state_dir, job_id) == 300
    assert json.loads(run_cli(target, "tail", job_id, "--json").stdout)["output"] == ""
