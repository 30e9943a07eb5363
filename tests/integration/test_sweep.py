"""Sweeps: many variants of a script payload in one downtime window, on a real (confined) systemd
over real sshd; bad sweep input refused before any host is contacted."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import Target, run_cli, submit, wait_terminal, write_job
from tests.harness.systemd_jobs import (assert_service_back, host_events, host_output, service_section,
                                        starts_and_stops, target_for)
from tests.hosts._proc import shared_tmpdir


def sweep_job(path, target: Target, sweep: dict, *, service=None, gpu=None, max_runtime="2m",
              max_downtime=None, args=None):
    write_job(path, target, script="demo_payload.py", args=args or {"seconds": 1, "sizes": [1, 4]},
              service=service, gpu=gpu, max_runtime=max_runtime)
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = sweep
    if max_downtime:
        spec["limits"]["max_downtime"] = max_downtime
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def variant_events(host, job_id: str) -> list[dict]:
    return [e for e in host_events(host, job_id) if e.get("event") == "variant"]


# -- bad input: exit 2 naming the field, nothing reaches the host ----------------------------------------------

@pytest.fixture
def local():
    root = shared_tmpdir("runner-root-")
    return Target("local", {"address": "local", "root": str(root)}, root, {})


@pytest.mark.parametrize("sweep, field", [
    ({"matrix": {"seconds": []}}, b"sweep.matrix.seconds"),
    ({"matrix": {"secnds": [1, 2]}}, b"sweep.matrix.secnds: demo_payload.py has no argument --secnds"),
    ({"matrix": {"seconds": list(range(1, 41)), "sizes": list(range(1, 31))}}, b"sweep: 1200 variants is over the cap"),
    ({"matrix": {}}, b"sweep: a sweep needs"),
    ({"include": [{"sizes": "x"}]}, b"sweep.include"),
])
def test_bad_sweep_is_refused_naming_the_field_before_the_host(work, local, sweep, field):
    done = run_cli(local, "submit", str(sweep_job(work / "bad.yaml", local, sweep)))
    assert done.returncode == 2 and field in done.stderr, done.stderr
    assert not (local.root / "jobs").exists()


def command_sweep(path, target, command, sweep):
    write_job(path, target, command=command)
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = sweep
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_command_sweep_key_used_nowhere_is_refused(work, local):
    path = command_sweep(work / "cmd.yaml", local, ["echo", "n={n}"], {"matrix": {"n": [1, 2], "m": [3]}})
    done = run_cli(local, "submit", str(path))
    assert done.returncode == 2 and b"sweep.matrix.m: no `{m}` in payload.command" in done.stderr, done.stderr
    assert not (local.root / "jobs").exists()


def test_a_command_sweep_fills_its_placeholders(work, local):
    path = command_sweep(work / "cmd.yaml", local, ["sh", "-c", "echo n={n} s={s}"],
                         {"matrix": {"n": [1, 2]}, "include": [{"n": 3, "s": "x"}]})
    job = wait_terminal(local, submit(local, path))
    assert job["state"] == "SUCCEEDED", job
    log = run_cli(local, "tail", job["job_id"], "--from-start").stdout.decode()
    assert "n=1 s={s}" in log and "n=2 s={s}" in log and "n=3 s=x" in log


def test_dry_run_lists_the_variants(work, local):
    path = sweep_job(work / "dry.yaml", local, {"matrix": {"seconds": [1, 2]}, "include": [{"fail": True}]})
    done = run_cli(local, "submit", str(path), "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    assert [v["args"] for v in json.loads(done.stdout)["variants"]] == [{"seconds": 1}, {"seconds": 2}, {"fail": True}]
    text = run_cli(local, "submit", str(path), "--dry-run").stdout.decode()
    assert "3 variants in one downtime window" in text and "3. fail=True" in text


# -- on a real service ---------------------------------------------------------------------------------------

def stopping(host) -> dict:
    return dict(service=service_section(host, "always"), gpu={"devices": [0], "min_free_mib": 1000})


@pytest.mark.systemd
def test_three_variants_one_stop_one_start_three_results(service_host, work):
    target = target_for(service_host)
    starts, stops = starts_and_stops(service_host)
    job_id = submit(target, sweep_job(work / "s.yaml", target, {"include": [{"sizes": [1]}, {"sizes": [2]},
                                                                            {"sizes": [4]}]}, **stopping(service_host)))
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "sweep of 3: one stop, one restore", "SUCCEEDED")
    assert starts_and_stops(service_host) == (starts + 1, stops + 1)  # one stop, one start for three variants
    events = variant_events(service_host, job_id)
    assert [(e["index"], e["status"]) for e in events] == [(1, "start"), (1, "end"), (2, "start"), (2, "end"),
                                                           (3, "start"), (3, "end")]
    assert all(e["of"] == 3 for e in events) and all(e.get("exit_code") == 0 for e in events if e["status"] == "end")
    assert host_output(service_host, job_id).count('"event": "variant"') == 6  # the boundaries in the log too
    done = run_cli(target, "results", job_id)
    assert done.returncode == 0, done.stderr
    table = done.stdout.decode()
    assert "3 succeeded, 0 failed, 0 skipped of 3" in table
    for size in (1, 2, 4):
        assert f"sizes={size}" in table
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["result"]["rows"][0]["size"] for v in result["variants"]] == [1, 2, 4]


@pytest.mark.systemd
def test_a_variant_that_cannot_fit_max_downtime_is_skipped_and_the_service_is_back_in_time(service_host, work):
    target = target_for(service_host)
    sweep = {"include": [{"seconds": 1}, {"seconds": 13}, {"seconds": 1, "sizes": [2]}]}
    job_id = submit(target, sweep_job(work / "d.yaml", target, sweep, max_runtime="15s", max_downtime="25s",
                                      **stopping(service_host)))
    job = wait_terminal(target, job_id, timeout=120)
    assert_service_back(service_host, job, "sweep: third variant past max_downtime is skipped", "FAILED")
    assert "2 succeeded, 0 failed, 1 skipped" in job["message"]
    skipped = [e for e in variant_events(service_host, job_id) if e["status"] == "skipped"]
    assert [e["index"] for e in skipped] == [3] and "limits.max_downtime" in skipped[0]["reason"]
    assert job["service"]["downtime_s"] < 25


@pytest.mark.systemd
def test_a_failing_middle_variant_does_not_stop_the_others(service_host, work):
    target = target_for(service_host)
    sweep = {"include": [{"seconds": 1}, {"seconds": 1, "fail": True}, {"seconds": 1, "sizes": [2]}]}
    job_id = submit(target, sweep_job(work / "f.yaml", target, sweep, **stopping(service_host)))
    job = wait_terminal(target, job_id)
    assert_service_back(service_host, job, "sweep: failing middle variant", "FAILED")
    assert "2 succeeded, 1 failed, 0 skipped of 3" in job["message"]
    ends = [(e["index"], e["exit_code"]) for e in variant_events(service_host, job_id) if e["status"] == "end"]
    assert ends == [(1, 0), (2, 3), (3, 0)]


@pytest.mark.slow(seconds=30)
@pytest.mark.systemd
def test_a_sweep_downtime_against_three_separate_jobs(service_host, work):
    """What a sweep saves: the same three variants as one sweep and as three jobs, one after the other, on
    this host; downtime is the supervisor's own (stop to healthy again). Prints the ratio (run with -s)."""
    target = target_for(service_host)
    variants = [{"sizes": [1]}, {"sizes": [2]}, {"sizes": [4]}]
    separate = []
    for k, variant in enumerate(variants):
        path = sweep_job(work / f"one-{k}.yaml", target, {"include": [variant]}, **stopping(service_host))
        spec = yaml.safe_load(path.read_text())
        del spec["sweep"]
        spec["payload"]["args"].update(variant)
        path.write_text(yaml.safe_dump(spec))
        job = wait_terminal(target, submit(target, path))
        assert job["state"] == "SUCCEEDED", job
        separate.append(job["service"]["downtime_s"])
    job = wait_terminal(target, submit(target, sweep_job(work / "all.yaml", target, {"include": variants},
                                                         **stopping(service_host))))
    assert_service_back(service_host, job, "sweep of 3 vs 3 jobs: downtime", "SUCCEEDED")
    swept = job["service"]["downtime_s"]
    print(f"\ndowntime: sweep {swept:.2f} s; 3 separate jobs {' + '.join(f'{s:.2f}' for s in separate)} = "
          f"{sum(separate):.2f} s; ratio {swept / sum(separate):.2f}")
    assert swept < sum(separate)  # one stop/drain/restore instead of three


# -- the pure parts ------------------------------------------------------------------------------------------

def test_expand_is_the_product_then_the_new_includes():
    from remote_payload.sweep import count, expand

    matrix, include = {"experts": [384, 128], "routing": ["uniform", "zipf"]}, [{"experts": 384, "routing": "zipf"},
                                                                               {"experts": 64}]
    assert expand(matrix, include) == [{"experts": 384, "routing": "uniform"}, {"experts": 384, "routing": "zipf"},
                                       {"experts": 128, "routing": "uniform"}, {"experts": 128, "routing": "zipf"},
                                       {"experts": 64}]
    assert count(matrix, include) == 6  # an upper bound, checked against the cap before anything is built


def test_progress_counts_variants_and_rows_per_variant():
    from remote_payload.progress import summarize

    lines = ['{"event": "variant", "index": 1, "of": 2, "args": {"a": 1}, "status": "start"}',
             '{"event": "plan", "rows": 3}', '{"event": "row"}', '{"event": "row"}',
             '{"event": "variant", "index": 1, "of": 2, "args": {"a": 1}, "status": "end", "exit_code": 0}',
             '{"event": "variant", "index": 2, "of": 2, "args": {"a": 2}, "status": "start"}', '{"event": "row"}']
    summary = summarize("\n".join(lines))
    assert summary["variant"] == {"index": 2, "of": 2, "args": {"a": 2}, "status": "start"}
    assert summary["rows_done"] == 1 and summary["rows_expected"] is None


def test_the_sweep_table_has_a_variant_column_and_says_why_one_was_skipped(tmp_path):
    from runner.results.results import plot, render_any

    rows = lambda k: [{"size": 1, "median_us": 10.0 * k}, {"size": 4, "median_us": 40.0 * k}]  # noqa: E731
    result = {"payload": "sweep", "sweep": {"variants": 3, "succeeded": 2, "failed": 0, "skipped": 1},
              "variants": [{"index": k, "args": {"k": k}, "status": "ended", "exit_code": 0, "result": {"rows": rows(k)},
                            "columns": ["size", "median_us"]} for k in (1, 2)]
              + [{"index": 3, "args": {"k": 3}, "status": "skipped", "reason": "needs about 9 s", "result": None}]}
    text = render_any(result)
    assert "2 succeeded, 0 failed, 1 skipped of 3" in text and "variant 3 skipped: needs about 9 s" in text
    assert text.splitlines()[3].split() == ["#", "variant", "status", "size", "median_us"]
    assert len([line for line in text.splitlines() if " k=" in line or line.strip().startswith(("1 ", "2 ", "3 "))]) == 5
    pytest.importorskip("matplotlib")
    assert plot(result, tmp_path / "p.png").stat().st_size > 0


def test_a_cancel_ends_the_sweep_and_skips_the_rest(work, local):
    from tests.cli_helpers import status, wait_for

    path = sweep_job(work / "c.yaml", local, {"include": [{"seconds": 30}, {"seconds": 1}]})
    job_id = submit(local, path)
    wait_for(lambda: (status(local, job_id).get("progress") or {}).get("variant"), what="the first variant")
    run_cli(local, "cancel", job_id)
    job = wait_terminal(local, job_id)
    assert job["state"] == "CANCELLED", job
    result = json.loads(run_cli(local, "results", job_id, "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "skipped"]
    assert result["variants"][1]["reason"].startswith("not started: cancelled")


def test_started_at_is_the_first_variant_start_not_the_last(work, local):
    """The job's started_at is when its payload phase began (the first variant), as for a single payload."""
    path = sweep_job(work / "s.yaml", local, {"matrix": {"seconds": [0.5, 0.6]}})
    job = wait_terminal(local, submit(local, path))
    assert job["state"] == "SUCCEEDED", job
    events = (local.root / "jobs" / job["job_id"] / "events.jsonl").read_text().splitlines()
    starts = [e["t"] for e in map(json.loads, events) if e.get("event") == "variant" and e["status"] == "start"]
    assert len(starts) == 2 and job["started_at"] < starts[1], (job["started_at"], starts)


# -- the warm path: one round trip, the plan cache -----------------------------------------------------------

def test_a_warm_sweep_submit_is_one_round_trip_and_carries_every_variant(ssh_host, work):
    """The sweep goes through the one-call `submit` (preflight + start) like any job: its variants travel
    expanded on the wire, and the host runs them all."""
    from runner.commands import controller
    from runner.deadline import Deadline
    from runner.state.store import Store

    root = shared_tmpdir("runner-root-sweep-one-")
    target = Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root,
                    {"RUNNER_SSH_CONFIG": str(ssh_host.ssh_config)}, ssh_host)
    path = command_sweep(work / "one.yaml", target, ["sh", "-c", "echo variant n={n}"], {"matrix": {"n": [1, 2, 3]}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNNER_SSH_CONFIG", str(ssh_host.ssh_config))
        controller.submit(str(path), [], store=Store(), progress=lambda _m: None, deadline=Deadline.for_command(50))
        warm = controller.submit(str(path), [], store=Store(), progress=lambda _m: None,
                                 deadline=Deadline.for_command(50))
    assert warm.round_trips == 1
    job = wait_terminal(target, warm.job_id)
    assert job["state"] == "SUCCEEDED", job
    log = run_cli(target, "tail", warm.job_id, "--from-start").stdout.decode()
    assert [line for line in log.splitlines() if line.startswith("variant n=")] == \
        ["variant n=1", "variant n=2", "variant n=3"]


def test_an_edited_matrix_runs_its_own_variants(work, local):
    def output(job_id: str) -> bytes:
        assert wait_terminal(local, job_id)["state"] == "SUCCEEDED"
        return run_cli(local, "tail", job_id, "--from-start").stdout

    path = command_sweep(work / "edited.yaml", local, ["sh", "-c", "echo n={n}"], {"matrix": {"n": [1, 2]}})
    first = output(submit(local, path))
    assert b"n=1\n" in first and b"n=2\n" in first
    command_sweep(path, local, ["sh", "-c", "echo n={n}"], {"matrix": {"n": [7]}, "include": [{"n": 8}]})
    out = output(submit(local, path))
    assert b"n=7\n" in out and b"n=8\n" in out and b"n=1\n" not in out
    assert b"n=7\n" in output(submit(local, path, "--set", "sweep.fail_fast=true"))
