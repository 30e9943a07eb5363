"""A user's first hour, round three: what a newcomer still tripped on (sweep progress side by side, `None` in a
queued job's status, a submit that never connected left QUEUED, a silent end of `runner watch`, ...)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from remote_payload.progress import summarize
from runner.remote.job_answers import JobStatus
from tests.cli_helpers import Target, run_cli, write_job
from tests.typed_answers import status_text as _status_text


def _variant(index: int, status: str, slot: int, of: int = 4) -> str:
    return json.dumps({"index": index, "of": of, "args": {"seconds": index}, "status": status, "slot": slot,
                       "devices": [str(slot)], "event": "variant"})


PLAN, ROW = '{"event": "plan", "rows": 2}', '{"event": "row", "m": 1}'
# 4 variants over 2 slots, each planning 2 rows, their lines interleaved in the one log as the host writes them
SIDE_BY_SIDE = [_variant(1, "start", 0), _variant(2, "start", 1), PLAN, PLAN, ROW, ROW, ROW,
                _variant(1, "end", 0), _variant(3, "start", 0), PLAN, ROW, _variant(2, "end", 1),
                _variant(4, "start", 1), PLAN, ROW]


def _running(progress: dict) -> dict:
    return {"job_id": "j1", "state": "RUNNING", "created_at": 100.0, "now": 160.0,
            "progress": dict(progress, silent_s=1.0)}


def test_side_by_side_rows_count_for_the_sweep_and_never_pass_its_plan():
    for upto in range(1, len(SIDE_BY_SIDE) + 1):
        summary = summarize("\n".join(SIDE_BY_SIDE[:upto]))
        if summary["rows_expected"] is not None:
            assert summary["rows_done"] <= summary["rows_expected"], (upto, summary)
    summary = summarize("\n".join(SIDE_BY_SIDE))
    assert (summary["rows_done"], summary["rows_expected"]) == (5, 8)
    sweep = summary["sweep"]
    assert (sweep["done"], sweep["of"], sweep["running"], sweep["side_by_side"]) == (2, 4, [3, 4], True)


def test_status_of_a_side_by_side_sweep_says_the_sweeps_rows_and_its_variants():
    text = _status_text(_running(summarize("\n".join(SIDE_BY_SIDE))))
    assert "rows 5 of 8 (the sweep's: its variants run side by side)" in text, text
    assert "2 of 4 variants done, running 3, 4, rows 5 of 8 in all" in text, text


def test_a_sequential_sweep_shows_the_variants_rows_and_the_sweeps_total():
    lines = [_variant(1, "start", 0, of=2), PLAN, ROW, ROW, _variant(1, "end", 0, of=2),
             _variant(2, "start", 0, of=2), PLAN, ROW]
    summary = summarize("\n".join(lines))
    assert (summary["rows_done"], summary["rows_expected"]) == (1, 2)
    text = _status_text(_running(summary))
    assert "rows 1 of 2," in text and "variant 2 of 2: seconds=2; the sweep: 1 of 2 variants done, running 2, " \
                                       "rows 3 of 4 in all" in text, text


def test_watch_line_of_a_side_by_side_sweep():
    from runner.cli.watch import summary_line

    line = summary_line(summarize("\n".join(SIDE_BY_SIDE)))
    assert "rows 5/8 (the sweep's) · variants 2/4 done" in line, line


def test_status_of_a_queued_job_never_prints_none():
    job = {"job_id": "j1", "state": "QUEUED", "phase": "waiting for the host lock", "created_at": 100.0, "now": 160.0,
           "service": {"manager": "systemd", "unit": "fake-llm.service", "was": None, "now": None, "stopped": False}}
    text = _status_text(job)
    assert "None" not in text, text
    assert "service     fake-llm.service not touched yet" in text, text
    half = dict(job, state="RUNNING", service=dict(job["service"], was="active", now=None))
    assert "None" not in _status_text(half) and "was active now ?" in _status_text(half)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_submit_that_never_connected_ends_not_started_and_says_why(work, transport):
    state = work / "state"
    host = {"address": "127.0.0.1", "port": _closed_port(), "transport": transport, "connect_timeout": "5s"}
    target = Target("ssh", host, work, {"RUNNER_STATE_DIR": str(state)})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert b"Nothing was started" in done.stderr, done.stderr
    [record] = json.loads(run_cli(target, "list", "--json").stdout)
    assert record["last_state"] == "NOT_STARTED" and "cannot connect" in record["note"], record
    shown = run_cli(target, "status", record["job_id"])
    assert shown.returncode == 1, shown
    assert b"NOT_STARTED" in shown.stdout and b"never started: ssh 127.0.0.1" in shown.stdout, shown.stdout
    again = run_cli(target, "submit", str(work / "j.yaml"), "--job-id", record["job_id"])
    assert again.returncode == 3 and b"Nothing was started" in again.stderr, again.stderr


def test_paramiko_on_a_closed_port_names_the_port_and_what_to_check(work):
    host = {"address": "127.0.0.1", "port": _closed_port(), "transport": "paramiko", "connect_timeout": "5s"}
    target = Target("ssh", host, work, {"RUNNER_STATE_DIR": str(work / "state")})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert b"[Errno None]" not in done.stderr, done.stderr
    assert f"127.0.0.1 port {host['port']}: Connection refused".encode() in done.stderr, done.stderr
    assert b"runner: hint: Check that `ssh` itself reaches the host" in done.stderr, done.stderr


def test_watch_that_runs_out_of_time_says_the_job_is_still_running(work):
    from tests.cli_helpers import local_target, submit

    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    job_id = submit(target, write_job(work / "sleep.yaml", target, command=["sleep", "30"]))
    try:
        done = run_cli(target, "watch", job_id, "--plain", "--max-wait", "1")
        assert done.returncode == 75, done
        assert f"{job_id} still running; `runner watch {job_id}` again to go on".encode() in done.stderr, done.stderr
    finally:
        run_cli(target, "cancel", job_id)


def test_watch_on_a_terminal_follows_until_the_job_ends_unless_told_otherwise():
    from runner.cli.cli import DEFAULT_MAX_WAIT, WATCH_UNTIL_END, watch_bound

    assert watch_bound(None, on_terminal=True) == WATCH_UNTIL_END >= 86400
    assert watch_bound(None, on_terminal=False) == DEFAULT_MAX_WAIT
    assert watch_bound(20.0, on_terminal=True) == 20.0


def test_shipped_job_files_leave_the_user_and_the_port_to_ssh_config():
    import yaml

    from tests.cli_helpers import REPO

    for path in sorted((REPO / "jobs").glob("*.yaml")):
        host = yaml.safe_load(path.read_text())["host"]
        assert not {"user", "port"} & set(host), (path.name, host)


@pytest.mark.parametrize("transport", ["paramiko", "openssh"])
def test_a_refused_connect_says_which_spec_field_decided_the_port(work, transport):
    port = _closed_port()
    target = Target("ssh", {"address": "127.0.0.1", "port": port, "transport": transport, "connect_timeout": "5s"},
                    work, {"RUNNER_STATE_DIR": str(work / "state")})
    done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    assert done.returncode == 3, done.stderr
    assert f"the port {port} is host.port in the job spec".encode() in done.stderr, done.stderr


def test_dry_run_shows_what_runs_before_the_stop_in_the_window_and_what_is_freed(work):
    import yaml

    from tests.cli_helpers import local_target

    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    path = write_job(work / "j.yaml", target, command=["sleep", "1"])
    spec = yaml.safe_load(path.read_text())
    spec["payload"].update(prepare_command=["echo", "warm up"], staged=True)
    path.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    steps = json.loads(done.stdout)["steps"]
    assert steps["before_stop"][0].startswith("prepare: echo 'warm up'"), steps
    assert "staged: sleep 1 starts and does its GPU-free setup" in steps["before_stop"][1], steps
    assert steps["window"] == ["payload: sleep 1 (gets the GPU with `go`; limits.max_runtime 300 s)"], steps
    assert steps["freed"] == ["nothing: no service to free (service.manager none)"], steps
    text = run_cli(target, "submit", str(path), "--dry-run").stdout.decode()
    assert "before the stop prepare: echo 'warm up'" in text and "in the window   payload: sleep 1" in text, text


def test_dry_run_says_how_each_freeing_method_frees():
    from runner.commands.render import dry_run_steps

    wire = {"payload": {"command": ["x"], "prepare": None}, "limits": {"max_runtime": 60.0},
            "service": {"manager": "systemd", "unit": "llm.service", "free": "sglang"}}
    assert dry_run_steps(wire, ["x"], stop=True)["freed"] == [
        "llm.service: free: sglang — pause generation and release its GPU memory; resume after (the unit keeps running)"]
    assert dry_run_steps(wire, ["x"], stop=False)["freed"] == ["llm.service: left serving (not freed)"]
    stop = dict(wire, service={"manager": "systemd", "unit": "llm.service"})
    assert dry_run_steps(stop, ["x"], stop=True)["freed"] == ["llm.service: free: stop — stopped; started again after"]
    assert dry_run_steps(stop, ["x"], stop=True)["before_stop"] == []


def test_restore_service_help_names_exit_4_for_a_host_without_systemd():
    from tests.cli_helpers import local_target

    shown = run_cli(local_target(), "restore-service", "--help").stdout.decode()
    assert "4 the host cannot manage the unit (no systemd there" in " ".join(shown.split()), shown


def test_restore_service_says_whether_it_started_the_unit_takes_set_and_a_job_file_with_host(service_host, work):
    from tests.harness.systemd_jobs import service_section, target_for

    target = target_for(service_host)
    elsewhere = Target("ssh", {"address": "127.0.0.1", "port": _closed_port()}, work, {})
    job = write_job(work / "job.yaml", elsewhere, command=["true"], service=service_section(service_host))
    service_host.systemctl("stop", service_host.unit).check_returncode()
    first = run_cli(target, "restore-service", str(job), "--host", service_host.alias,
                    "--set", "service.health_timeout=40s", "--max-wait", "40")
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    assert b"healthy" in first.stdout and b"started it (it was inactive)" in first.stdout, first.stdout
    again = run_cli(target, "restore-service", str(job), "--host", service_host.alias, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["started"] is False, again.stdout
    shown = run_cli(target, "restore-service", str(job), "--host", service_host.alias)
    assert b"it was up already (not started)" in shown.stdout, shown.stdout
    bad = run_cli(target, "restore-service", str(job), "--host", service_host.alias, "--set", "service.nope=1")
    assert bad.returncode == 2 and b"service.nope" in bad.stderr, bad.stderr


def _history_runs(state: Path) -> None:
    """Two jobs on two hosts, the demo payload with seconds 20 and 5; the older job's result recorded last."""
    from runner.results import history
    from runner.state.store import JobRecord, Store

    store = Store(state)
    for job_id, host, seconds, submitted in (("j-new", "box-b", 5, 2000.0), ("j-old", "box-a", 20, 1000.0)):
        wire = {"job_id": job_id, "payload": {"args": ["--seconds", str(seconds)]}}
        store.save(JobRecord(job_id=job_id, name="demo", host={"address": host}, spec_path="demo.yaml",
                             submitted_at=submitted, wire=wire))
        assert history.record_job(store, job_id, {"payload": "demo", "rows": [{"size": 1, "median_us": 5.0}]}) is None


def test_history_lists_the_oldest_job_first_whenever_its_result_was_recorded(work):
    from tests.cli_helpers import local_target

    _history_runs(work / "state")
    every = run_cli(local_target({"RUNNER_STATE_DIR": str(work / "state")}), "history").stdout.decode().splitlines()
    assert [line.split()[2] for line in every[1:]] == ["j-old", "j-new"], every


def test_history_labels_a_variant_the_same_whichever_rows_are_shown(work):
    from tests.cli_helpers import local_target

    _history_runs(work / "state")
    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    every = run_cli(target, "history").stdout.decode().splitlines()
    labels = {line.split()[2]: line.split()[-2] for line in every[1:]}
    assert len(set(labels.values())) == 2, every
    for job_id, host in (("j-old", "box-a"), ("j-new", "box-b")):
        one = run_cli(target, "history", "--host", host).stdout.decode().splitlines()
        assert len(one) == 2 and one[1].split()[-2] == labels[job_id], (one, labels)


def test_a_whole_spec_rule_names_its_fields_without_a_top_level_prefix(work):
    import yaml

    from tests.cli_helpers import local_target

    target = local_target({"RUNNER_STATE_DIR": str(work / "state")})
    path = write_job(work / "j.yaml", target, command=["true"], gpu={"devices": [0, 1, 2]})
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": [{"a": 1}, {"a": 2}], "gpus_per_variant": 2}
    path.write_text(yaml.safe_dump(spec))
    done = run_cli(target, "submit", str(path), "--dry-run")
    assert done.returncode == 2, done.stderr
    assert b"(top level)" not in done.stderr, done.stderr
    assert f"{path}: gpu.devices holds 3 devices, not a multiple of sweep.gpus_per_variant".encode() in done.stderr


def test_a_read_only_state_dir_is_not_told_to_free_space(work):
    """Read-only for root too: the immutable attribute (chattr +i), else a 0500 mode for a plain user."""
    import os
    import subprocess

    from tests.cli_helpers import local_target

    state = work / "read-only state"
    state.mkdir(mode=0o500)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(state)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute, and root writes a 0500 directory anyway")
    target = local_target({"RUNNER_STATE_DIR": str(state)})
    try:
        done = run_cli(target, "submit", str(write_job(work / "j.yaml", target, command=["true"])))
    finally:
        subprocess.run(["chattr", "-i", str(state)], capture_output=True)
        state.chmod(0o700)
    assert done.returncode == 2, done.stderr
    assert b"free space" not in done.stderr and b"make it writable" in done.stderr, done.stderr


def test_fleet_status_of_a_queued_host_never_prints_none():
    from runner.fleet.fleet_view import HostRow, _host_line

    job = {"job_id": "r.1", "state": "QUEUED", "service": {"unit": "fake-llm.service", "was": None, "now": None}}
    line = _host_line(HostRow("box-a", "r.1", "started", "", None, 75, JobStatus.from_json(job)))
    assert "None" not in line and "service not touched yet" in line, line
