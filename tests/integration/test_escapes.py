"""Terminal escapes from job output, result files, the local index and a host's messages never reach a person's
terminal: every human view prints them as visible text (`\\x1b`, `\\u009b`); `tail` keeps the raw bytes.

Each view runs as its own `runner` process (host `local`), as an operator would run it.
"""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from tests.cli_helpers import (REPO, Target, job_dir, python_payload, run_cli, submit, wait_for, wait_terminal,
                               write_job)

OSC52 = "\x1b]52;c;cHduZWQ=\x07"              # writes the clipboard (paste-jacking)
OSC0 = "\x1b]0;pwned title\x07"                # sets the window title
OSC8 = "\x1b]8;;https://example.invalid/\x1b\\link\x1b]8;;\x1b\\"  # a hyperlink
CSI_CLEAR = "\x1b[2J\x1b[H"                    # clears the screen, moves the cursor
DCS = "\x1bPq#0;2;0;0;0\x1b\\"                 # device control string
C1 = "\x9b2J\x9d0;c1 title\x9c\x85"            # 8-bit CSI, OSC, ST, NEL as characters
HOSTILE = OSC52 + OSC0 + OSC8 + CSI_CLEAR + DCS + C1 + "\r\x08\x7f"

PAYLOAD = """
import json, os, sys, time
H = {hostile!r}
out = sys.stdout.buffer
out.write(H.encode() + b"\\n")
out.write(b"raw 8-bit C1: \\x9b2J \\x9d0;t\\x07\\n")
for event in ({{"event": "plan", "rows": 1, "t": 0.1}},
              {{"event": "phase", "phase": H, "status": "start", "t": 0.2}},
              {{"event": "heartbeat", "phase": H, "t": 0.3}},
              {{"event": "row", "size": 1, "median_us": 2.5, "label": H, "t": 0.4}},
              {{"event": H, "detail": H, "t": 0.5}}):
    out.write(json.dumps(event).encode() + b"\\n")
out.flush()
with open(os.environ["RUNNER_RESULT"], "w") as f:
    json.dump({{"payload": H, "note": H, "environment": {{"gpu": H, "torch": H}},
               "rows": [{{"size": 1, "median_us": 2.5, "label": H}}]}}, f)
out.write(b"waiting\\n")
out.flush()
for _ in range(600):  # held RUNNING until the test has looked at its status
    if os.path.exists({release!r}):
        break
    time.sleep(0.1)
"""

# A compromised host: its supervisor answers every call with an error whose message holds escapes.
EVIL_HOST_PYTHON = """#!{python}
import json
print(json.dumps({{"ok": False, "error": "internal", "message": {hostile!r}}}))
"""


def visible_controls(text: str, *, keep: str = "\n\t") -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c not in keep) or 0x7F <= ord(c) <= 0x9F]


def assert_printable(done: subprocess.CompletedProcess, view: str) -> str:
    """No ESC, BEL, C0 (but newline/tab), DEL or C1 byte/character on stdout or stderr; returns both as text."""
    both = done.stdout + done.stderr
    assert b"\x1b" not in both and b"\x07" not in both, (view, both[:400])
    text = both.decode("utf-8")  # strict: a raw 8-bit C1 byte would fail here
    assert not visible_controls(text), (view, visible_controls(text)[:10])
    return text


@pytest.fixture
def finished(tmp_path) -> tuple[Target, str, dict]:
    """A job that printed and recorded every hostile string and ended SUCCEEDED; with `status` and
    `status` of all jobs as they printed while it ran (its progress is shown only then)."""
    root = tmp_path / "host root"
    target = Target(kind="local", host={"address": "local", "root": str(root)}, root=root,
                    env={"RUNNER_STATE_DIR": str(tmp_path / "state")})
    release = tmp_path / "release"
    command = python_payload(tmp_path, "hostile.py", PAYLOAD.format(hostile=HOSTILE, release=str(release)))
    job_id = submit(target, write_job(tmp_path / "job.yaml", target, command=command))
    log = job_dir(target, job_id) / "output.log"
    wait_for(lambda: log.exists() and b"waiting" in log.read_bytes(), 60, "the payload's output")
    running = {"status": run_cli(target, "status", job_id), "status (all)": run_cli(target, "status")}
    release.touch()
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    return target, job_id, running


def test_printable_escapes_controls_and_keeps_text():
    from runner.printable import printable

    assert printable("a\x1b]52;c;x\x07b") == "a\\x1b]52;c;x\\x07b"
    assert printable("\x9b2J\x85") == "\\u009b2J\\u0085"
    assert printable("tab\tnew\nline\r\x7f") == "tab\tnew\nline\\x0d\\x7f"
    assert printable("one\nline\t", multiline=False) == "one\\x0aline\\x09"
    assert printable("ünïcode → ok ✓ \\x1b") == "ünïcode → ok ✓ \\x1b"


def test_every_human_view_prints_escapes_as_text(finished, tmp_path):
    target, job_id, running = finished
    views = {
        "watch --plain": ("watch", job_id, "--plain", "--max-wait", "20"),
        "results": ("results", job_id),
        "history": ("history",),
    }
    outputs = {**running, **{view: run_cli(target, *args) for view, args in views.items()}}
    for view, done in outputs.items():
        assert done.returncode in (0, 75), (view, done.stderr.decode(errors="replace"))
        text = assert_printable(done, view)
        assert "\\x1b]52;c;cHduZWQ=" in text, (view, text[-800:])  # shown, as text
    assert "\\u009b2J" in assert_printable(run_cli(target, "results", job_id), "results")


def test_the_local_index_and_a_hosts_error_message_are_printed_as_text(finished, tmp_path):
    target, job_id, _ = finished
    record_path = tmp_path / "state" / "jobs" / f"{job_id}.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(dict(record, name=HOSTILE)))
    listed = run_cli(target, "list")
    assert listed.returncode == 0, listed.stderr
    assert "\\x1b]0;pwned title" in assert_printable(listed, "list")

    evil = tmp_path / "evil-python"
    evil.write_text(EVIL_HOST_PYTHON.format(python=sys.executable, hostile=HOSTILE))
    evil.chmod(0o755)
    bad_host = Target(kind="local", host={"address": "local", "root": str(target.root), "python": str(evil)},
                      root=target.root, env=target.env)
    job = write_job(tmp_path / "evil.yaml", bad_host, command=["true"])
    for args in (("submit", str(job)), ("submit", str(job), "--dry-run")):
        done = run_cli(target, *args)
        assert done.returncode not in (0, 2), done.stderr
        assert "\\x1b]52;c;cHduZWQ=" in assert_printable(done, " ".join(args))
    as_json = run_cli(target, "submit", str(job), "--json")
    assert OSC52 in json.loads(as_json.stdout)["message"]  # --json carries the text unchanged, JSON-escaped


def test_tail_keeps_the_raw_bytes(finished):
    target, job_id, _ = finished
    done = run_cli(target, "tail", job_id, "--from-start")
    assert HOSTILE.encode() in done.stdout and b"\x9b2J" in done.stdout


def test_the_live_panel_shows_escapes_as_text(finished):
    """On a terminal (a pty) rich draws the panel with its own cursor codes; none of the payload's reach it."""
    target, job_id, _ = finished
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "runner", "watch", job_id, "--max-wait", "20"], cwd=REPO,
                            stdin=secondary, stdout=secondary, stderr=secondary,
                            env={**os.environ, **target.env, "TERM": "xterm-256color", "COLUMNS": "200"})
    os.close(secondary)
    out = bytearray()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the pty closed: the process is gone
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(primary)
    assert proc.wait(timeout=30) == 0, bytes(out[-2000:])
    for sequence in (b"\x1b]", b"\x1bP", b"\x1b[2J", b"\x07"):
        assert sequence not in out, (sequence, bytes(out[-1500:]))
    assert not [c for c in out.decode("utf-8", "replace") if 0x80 <= ord(c) <= 0x9F]
    assert b"\\x1b]52;c;cHduZWQ=" in out
