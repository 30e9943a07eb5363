"""The detached launch of a supervisor without systemd (remote_payload/supervision/start.py): a fork of the host
call's own interpreter runs `_run`, so it must behave like the exec'd process it replaced — detached from the
caller's stdin/stdout (the SSH channel), its output in the log, never back in the caller's frames."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CALLER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from remote_payload.supervision.start import daemonize_call
log, marks = sys.argv[2], sys.argv[3]

def main(argv):
    with open(marks, "a") as fh:
        fh.write("main %s pid=%d sid=%d comm=%s\n" % (" ".join(argv), os.getpid(), os.getsid(0),
                                                     open("/proc/self/comm").read().strip()))
    print("to the log")
    if argv[0] == "raise":
        raise RuntimeError("boom in main")
    time.sleep(float(argv[1]))
    with open(marks, "a") as fh:
        fh.write("main done\n")
    return 3

print("before", flush=True)
daemonize_call(main, sys.argv[4:], log)
with open(marks, "a") as fh:
    fh.write("caller after pid=%d sid=%d\n" % (os.getpid(), os.getsid(0)))
print("caller answer")
"""


def run_caller(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, float, Path, Path]:
    log, marks = tmp_path / "supervisor.log", tmp_path / "marks"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-S", "-c", CALLER, str(REPO), str(log), str(marks),
                           *argv], capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - t0, log, marks


def wait_for(path: Path, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} within {timeout} s: {content!r}")


def test_the_caller_returns_at_once_and_its_stdout_is_not_held_by_the_detached_fork(tmp_path):
    done, elapsed, log, marks = run_caller(tmp_path, "sleep", "5")
    # capture_output reads the caller's stdout to EOF: a fork still holding it would make this take 5 s
    assert elapsed < 4, f"the caller's stdout stayed open {elapsed:.1f} s: the fork kept it"
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before\ncaller answer\n"  # nothing buffered before the fork is written twice
    content = wait_for(marks, "main done", timeout=30)
    lines = content.splitlines()
    caller = [line for line in lines if line.startswith("caller after")]
    assert len(caller) == 1, f"the fork went back into the caller's frames: {lines}"
    main_line = next(line for line in lines if line.startswith("main "))
    assert "main sleep 5" in main_line and "comm=runner-job" in main_line
    pid = int(main_line.split("pid=")[1].split()[0])
    caller_pid, caller_sid = (int(caller[0].split(key)[1].split()[0]) for key in ("pid=", "sid="))
    assert pid != caller_pid
    assert int(main_line.split("sid=")[1].split()[0]) != caller_sid  # a session of its own: no SIGHUP from ssh's
    assert "to the log" in log.read_text()


def test_an_exception_in_the_detached_main_goes_to_the_log_and_ends_the_fork_there(tmp_path):
    done, _, log, marks = run_caller(tmp_path, "raise", "0")
    assert done.returncode == 0 and done.stdout == "before\ncaller answer\n", done
    text = wait_for(log, "RuntimeError: boom in main")
    assert "to the log" in text
    time.sleep(0.5)  # a window: a fork that went on into the caller's code would have marked it by now
    assert sum(line.startswith("caller after") for line in marks.read_text().splitlines()) == 1
