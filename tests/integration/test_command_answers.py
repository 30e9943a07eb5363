"""What each command answers and exits with when a user slips (a typo, a resubmit, a job with no result, a hung
sshd), and what --dry-run, --queue and --follow say they do: through the real CLI on the local transport."""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import yaml

from tests.cli_helpers import REPO, Target, run_cli, submit, wait_terminal, write_job
from tests.harness.pace import Scale


def demo_job(work: Path, target: Target, **args) -> Path:
    spec = yaml.safe_load((REPO / "jobs" / "demo.yaml").read_text())
    spec["host"] = target.host
    spec["payload"]["args"] = {"seconds": 2, "sizes": [1, 4], **args}
    path = work / "demo.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_payload_arg_typo_is_refused_before_the_host_naming_the_key(work, target):
    done = run_cli(target, "submit", str(demo_job(work, target)), "--set", "payload.args.secnds=5")
    assert done.returncode == 2, done.stderr
    assert b"payload.args.secnds" in done.stderr and b"allowed: fail, out, seconds, sizes" in done.stderr
    assert not (target.root / "jobs").exists()  # nothing reached the host


def test_status_exit_codes_follow_the_table(work, target):
    ok = submit(target, demo_job(work, target))
    failing = submit(target, demo_job(work, target, fail=True))
    for job_id in (ok, failing):
        wait_terminal(target, job_id)
    assert run_cli(target, "status", ok).returncode == 0
    assert run_cli(target, "status", failing).returncode == 1
    running = submit(target, write_job(work / "sleep.yaml", target, command=["sleep", f"{Scale()(30):.0f}"]))
    assert run_cli(target, "status", running).returncode == 75
    assert run_cli(target, "status").returncode == 75  # all jobs: by those still running
    run_cli(target, "cancel", running)
    wait_terminal(target, running)


def test_status_shows_progress_of_a_running_payload(work, target):
    job_id = submit(target, demo_job(work, target, seconds=round(Scale()(30))))  # still running when read
    answer = {}
    for _ in range(100):
        answer = json.loads(run_cli(target, "status", job_id, "--json").stdout)
        if (answer.get("progress") or {}).get("rows_expected"):
            break
    assert answer["progress"]["rows_expected"] == 2 and answer["progress"]["phase"] == "compile"
    text = run_cli(target, "status", job_id).stdout.decode()
    assert "elapsed" in text and "rows 0 of 2" in text and "last output" in text
    run_cli(target, "cancel", job_id)
    wait_terminal(target, job_id)


def test_resubmitting_a_job_id_with_another_spec_is_refused(work, target):
    first = demo_job(work, target)
    job_id = submit(target, first, "--job-id", "fixed-id-1")
    again = run_cli(target, "submit", str(first), "--job-id", "fixed-id-1")
    assert again.returncode == 0 and b"already submitted" in again.stderr
    other = run_cli(target, "submit", str(first), "--job-id", "fixed-id-1", "--set", "payload.args.seconds=3")
    assert other.returncode == 2 and b"different spec" in other.stderr
    wait_terminal(target, job_id)


def test_every_json_error_is_a_json_object(target):
    done = run_cli(target, "status", "nope", "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 2 and answer["exit"] == 2 and "nope" in answer["message"] and answer["error"]
    usage = run_cli(target, "tail", "--json")  # missing argument: a usage error
    assert usage.returncode == 2 and json.loads(usage.stdout)["error"] == "usage"


def test_dry_run_decides_and_changes_nothing(work, target):
    done = run_cli(target, "submit", str(demo_job(work, target)), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["stop_service"] is False and plan["argv"][1:] == ["demo_payload.py", "--seconds", "2", "--sizes", "1,4"]
    assert any("checked" in note for note in plan["notes"])
    assert not (target.root / "jobs").exists() and run_cli(target, "list").stdout.count(b"\n") == 1  # header only


def test_queue_says_its_bound_and_takes_one(work, target):
    """--queue says how long it may wait; --queue-timeout sets the bound (and a bad one is exit 2)."""
    done = run_cli(target, "submit", str(demo_job(work, target)), "--dry-run", "--json", "--queue-timeout", "90s")
    assert done.returncode == 0, done.stderr
    assert any("at most 90 s" in note and "limits.queue_timeout" in note for note in json.loads(done.stdout)["notes"])
    bad = run_cli(target, "submit", str(demo_job(work, target)), "--queue-timeout", "soon")
    assert bad.returncode == 2 and b"limits.queue_timeout" in bad.stderr
    assert "limits.queue_timeout" in run_cli(target, "submit", "--help").stdout.decode()


def test_submit_follow_prints_the_log_and_the_verdict(work, target):
    done = run_cli(target, "submit", str(demo_job(work, target)), "--follow", "--max-wait", "60")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert lines[0].startswith("demo-") and '"event": "done"' in lines[-1]
    scale = Scale()  # the submit inside --max-wait, and a payload that outlasts it, at this machine's pace
    short = run_cli(target, "submit", str(demo_job(work, target, seconds=round(scale(20)))), "--follow",
                    "--max-wait", f"{scale(1):.1f}")
    assert short.returncode == 75
    run_cli(target, "cancel", short.stdout.decode().splitlines()[0])  # its payload was lengthened by the pace
    wait_terminal(target, short.stdout.decode().splitlines()[0])


def test_results_of_a_job_without_a_result_says_its_state_and_why(work, target):
    job_id = submit(target, demo_job(work, target, fail=True))
    wait_terminal(target, job_id)
    done = run_cli(target, "results", job_id)
    assert done.returncode == 1 and b"ended FAILED without a result" in done.stderr
    assert b"Errno" not in done.stderr and b"result.json:" not in done.stderr
    again = run_cli(target, "cancel", job_id)
    assert again.returncode == 0 and b"already ended FAILED" in again.stderr


def test_a_hung_sshd_gives_one_message_and_no_traceback(work):
    """A TCP listener that accepts and never sends the SSH banner stands in for a hung sshd."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)], daemon=True).start()
    port = listener.getsockname()[1]
    target = Target("ssh", {"address": "127.0.0.1", "port": port, "connect_timeout": "3s"}, work, {})
    job = write_job(work / "j.yaml", target, command=["true"])
    try:
        done = run_cli(target, "submit", str(job), timeout=120)
    finally:
        listener.close()
    assert done.returncode == 3, done.stderr
    assert b"Traceback" not in done.stderr and done.stderr.count(b"runner: error:") == 1
