"""A sweep's variants side by side over the window's GPUs (`sweep.gpus_per_variant`): the devices cut into
slots, each variant on its own slot's CUDA_VISIBLE_DEVICES, all inside one window. Stand-in nvidia-smi
(tests/hosts/bin/nvidia-smi, a test fake: these machines have no GPU) of 2 and 8 cards; a real confined
systemd unit for the one-stop-one-restore check."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.cli_helpers import Target, python_payload, run_cli, submit, wait_terminal, write_job
from tests.harness.pace import Scale
from tests.harness.systemd_jobs import assert_service_back, host_events, service_section, starts_and_stops, target_for
from tests.hosts import gpu_state
from tests.hosts._proc import shared_tmpdir

RECORDER = """\
import json, os, sys, time
out, name, seconds, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
began = time.time()
time.sleep(seconds)
with open(os.path.join(out, name + ".json"), "w") as fh:
    json.dump({"name": name, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "slot": os.environ.get("RUNNER_GPU_SLOT"),
               "began": began, "ended": time.time()}, fh)
sys.exit(code)
"""


def local_gpus(count: int) -> Target:
    """The local host with a stand-in nvidia-smi of `count` cards first on PATH."""
    root, gpus = shared_tmpdir("runner-root-"), gpu_state.make_state_dir(shared_tmpdir("runner-gpu-"))
    gpu_state.write_gpus(gpus, count=count)
    env = {"RUNNER_FAKE_GPU_DIR": str(gpus), "PATH": f"{gpu_state.STANDIN.parent}:{os.environ['PATH']}"}
    return Target("local", {"address": "local", "root": str(root)}, root, env)


def parallel_job(work: Path, target: Target, variants: list[dict], *, devices: list, per_variant=None,
                 fail_fast: bool = False, service=None, max_downtime=None, max_runtime="1m",
                 name: str = "par.yaml") -> Path:
    """A command sweep of the recorder: each variant {n: name, s: seconds, code: exit code}."""
    out = work / "records"
    out.mkdir(exist_ok=True)
    out.chmod(0o777)
    command = python_payload(work, "record.py", RECORDER) + [str(out), "{n}", "{s}", "{code}"]
    path = write_job(work / name, target, command=command, service=service,
                     gpu={"devices": devices, "min_free_mib": 1000}, max_runtime=max_runtime)
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": variants, "fail_fast": fail_fast,
                     **({"gpus_per_variant": per_variant} if per_variant is not None else {})}
    if max_downtime:
        spec["limits"]["max_downtime"] = max_downtime
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def records(work: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (work / "records").glob("*.json")}


def most_at_once(runs) -> int:
    """The most recorded runs whose [began, ended] overlap at one moment."""
    edges = sorted([(r["began"], 1) for r in runs] + [(r["ended"], -1) for r in runs], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def assert_slots_disjoint_while_overlapping(runs) -> None:
    for a in runs:
        for b in runs:
            if a is not b and a["began"] < b["ended"] and b["began"] < a["ended"]:
                assert not set(a["cuda"].split(",")) & set(b["cuda"].split(",")), (a, b)


def variants(n: int, seconds: float, **extra) -> list[dict]:
    return [{"n": f"v{k}", "s": seconds, "code": 0, **extra} for k in range(1, n + 1)]


def local_events(target: Target, job_id: str) -> list[dict]:
    lines = (target.root / "jobs" / job_id / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "variant"]


# -- the stand-in host: slots, overlap, fail_fast ------------------------------------------------------------

def test_four_variants_over_two_gpus_run_two_at_a_time_each_on_its_own_gpu(work):
    target = local_gpus(2)
    job_id = submit(target, parallel_job(work, target, variants(4, 2), devices=[0, 1], per_variant=1))
    job = wait_terminal(target, job_id)
    assert job["state"] == "SUCCEEDED", job
    runs = list(records(work).values())
    assert len(runs) == 4 and most_at_once(runs) == 2
    assert sorted(r["cuda"] for r in runs) == ["0", "0", "1", "1"]
    assert all(r["slot"] == str(["0", "1"].index(r["cuda"])) for r in runs)
    assert_slots_disjoint_while_overlapping(runs)
    span = max(r["ended"] for r in runs) - min(r["began"] for r in runs)
    assert span < 0.8 * sum(r["ended"] - r["began"] for r in runs), span  # side by side, not in turn
    starts = [e for e in local_events(target, job_id) if e["status"] == "start"]
    assert sorted((e["slot"], tuple(e["devices"])) for e in starts) == [(0, ("0",)), (0, ("0",)), (1, ("1",)),
                                                                       (1, ("1",))]
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert result["sweep"]["succeeded"] == 4 and result["sweep"]["slots"] == [["0"], ["1"]]
    assert [v["devices"] for v in result["variants"]] == [[records(work)[f"v{k}"]["cuda"]] for k in range(1, 5)]
    table = run_cli(target, "results", job_id).stdout.decode()
    assert "GPU" in table and "4 succeeded, 0 failed, 0 skipped of 4" in table


def test_status_shows_which_variant_runs_on_which_gpus(work):
    from tests.cli_helpers import status, wait_for

    target, scale = local_gpus(2), Scale()  # variants long enough to be seen side by side at this machine's pace
    job_id = submit(target, parallel_job(work, target, variants(2, round(scale(4))), devices=[0, 1], per_variant=1,
                                         max_runtime=f"{scale(60):.0f}s"))
    wait_for(lambda: len([s for s in status(target, job_id).get("slots") or [] if s["variant"]]) == 2,
             timeout=scale(30), what="both slots busy")
    text = run_cli(target, "status", job_id).stdout.decode()
    assert "slots       GPU 0: variant 1 · GPU 1: variant 2" in text, text
    assert wait_terminal(target, job_id, timeout=scale(90))["state"] == "SUCCEEDED"


def test_eight_gpus_two_per_variant_make_four_slots_and_a_fifth_variant_waits_for_one(work):
    target = local_gpus(8)
    job_id = submit(target, parallel_job(work, target, variants(5, 2), devices=list(range(8)), per_variant=2))
    job = wait_terminal(target, job_id)
    assert job["state"] == "SUCCEEDED", job
    runs = list(records(work).values())
    assert len(runs) == 5 and most_at_once(runs) == 4
    assert {r["cuda"] for r in runs} == {"0,1", "2,3", "4,5", "6,7"}
    assert_slots_disjoint_while_overlapping(runs)
    fifth = records(work)["v5"]
    assert fifth["began"] >= min(r["ended"] for r in runs if r is not fifth) - 0.5  # it waited for a free slot


def test_fail_fast_in_parallel_lets_the_running_variant_finish_and_starts_no_new_one(work):
    target = local_gpus(2)
    sweep = [{"n": "fails", "s": 0.2, "code": 3}, {"n": "long", "s": 3, "code": 0},
             {"n": "never1", "s": 1, "code": 0}, {"n": "never2", "s": 1, "code": 0}]
    job_id = submit(target, parallel_job(work, target, sweep, devices=[0, 1], per_variant=1, fail_fast=True))
    job = wait_terminal(target, job_id)
    assert job["state"] == "FAILED" and "1 succeeded, 1 failed, 2 skipped of 4" in job["message"], job
    assert set(records(work)) == {"fails", "long"}  # the running one finished, nothing new started
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "ended", "skipped", "skipped"]
    assert result["variants"][2]["reason"] == "not started: variant 1 failed and sweep.fail_fast is set"


def test_a_cancel_stops_every_running_variant_at_once_and_skips_the_rest(work):
    import time

    from tests.cli_helpers import status, wait_for

    target = local_gpus(2)
    job_id = submit(target, parallel_job(work, target, variants(3, 60), devices=[0, 1], per_variant=1))
    wait_for(lambda: len([s for s in status(target, job_id).get("slots") or [] if s["variant"]]) == 2,
             what="both slots busy")
    asked = time.monotonic()
    run_cli(target, "cancel", job_id)
    job = wait_terminal(target, job_id)
    assert job["state"] == "CANCELLED", job
    assert time.monotonic() - asked < 30  # both stopped together, far from their 60 s
    result = json.loads(run_cli(target, "results", job_id, "--json").stdout)
    assert [v["status"] for v in result["variants"]] == ["ended", "ended", "skipped"]
    assert all(v["reason"].startswith("cancelled") for v in result["variants"][:2]), result["variants"]
    assert result["variants"][2]["reason"].startswith("not started: cancelled")


def test_a_variant_slow_to_stop_holds_only_its_own_slot(work):
    """Variant 1 exits at once but leaves a child that ignores TERM (killed only after the grace); meanwhile
    variant 2 ends on the other slot, which takes variant 3 at once instead of waiting for that stop."""
    target = local_gpus(2)
    # a sweep value is data (shell-quoted into the script), so the script chooses what each kind of variant does
    script = ("case {kind} in leave) (trap '' TERM; exec sleep 30) & exit 0;; slow) sleep 1;; "
              "quick) sleep 0.2;; esac")
    path = write_job(work / "slow.yaml", target, command=["sh", "-c", script], grace="6s",
                     gpu={"devices": [0, 1], "min_free_mib": 1000})
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": [{"kind": "leave"}, {"kind": "slow"}, {"kind": "quick"}], "gpus_per_variant": 1}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job = wait_terminal(target, submit(target, path))
    assert job["state"] == "SUCCEEDED", job
    events = {(e["index"], e["status"]): e for e in local_events(target, job["job_id"])}
    assert events[(3, "start")]["slot"] == 1
    assert events[(3, "start")]["t"] < events[(1, "end")]["t"], (events[(3, "start")], events[(1, "end")])


def test_a_variant_past_max_runtime_that_ignores_term_is_killed_after_its_grace(work):
    target = local_gpus(2)
    script = "case {kind} in stubborn) trap '' TERM; sleep 30;; quick) sleep 0.2;; esac"
    path = write_job(work / "stubborn.yaml", target, command=["sh", "-c", script], max_runtime="2s", grace="1s",
                     gpu={"devices": [0, 1], "min_free_mib": 1000})
    spec = yaml.safe_load(path.read_text())
    spec["sweep"] = {"include": [{"kind": "stubborn"}, {"kind": "quick"}], "gpus_per_variant": 1}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    job = wait_terminal(target, submit(target, path))
    assert job["state"] == "FAILED" and "1 succeeded, 1 failed, 0 skipped of 2" in job["message"], job
    first = json.loads(run_cli(target, "results", job["job_id"], "--json").stdout)["variants"][0]
    assert first["exit_code"] == 137 and "limits.max_runtime (2s)" in first["reason"], first


def test_max_downtime_holds_per_slot(work):
    """A slot starts no variant that could not end inside the window: with two slots, the third variant
    (needing as long as the longest so far) would end past limits.max_downtime and is skipped."""
    target = local_gpus(2)
    sweep = [{"n": "a", "s": 3, "code": 0}, {"n": "b", "s": 3, "code": 0}, {"n": "c", "s": 3, "code": 0}]
    job_id = submit(target, parallel_job(work, target, sweep, devices=[0, 1], per_variant=1, max_runtime="4s",
                                         max_downtime="5s"))
    job = wait_terminal(target, job_id)
    assert job["state"] == "FAILED" and "2 succeeded, 0 failed, 1 skipped of 3" in job["message"], job
    skipped = [e for e in local_events(target, job_id) if e["status"] == "skipped"]
    assert [e["index"] for e in skipped] == [3] and "limits.max_downtime" in skipped[0]["reason"]


@pytest.mark.parametrize("devices, per_variant, reason", [
    ([0, 1, 2], 2, b"gpu.devices holds 3 devices, not a multiple of sweep.gpus_per_variant (2)"),
    ([], 1, b"sweep.gpus_per_variant needs gpu.devices"),
    ([0, 1], 0, b"sweep.gpus_per_variant"),
])
def test_a_device_count_that_does_not_split_into_slots_exits_2(work, devices, per_variant, reason):
    target = local_gpus(4)
    path = parallel_job(work, target, variants(2, 1), devices=devices, per_variant=per_variant)
    done = run_cli(target, "submit", str(path))
    assert done.returncode == 2 and reason in done.stderr, done.stderr
    assert not (target.root / "jobs").exists()


def test_the_host_refuses_a_bad_slot_cut_too():
    from remote_payload.host.answer import Fail
    from remote_payload.supervision.spec import check_spec

    raw = {"job_id": "j1", "gpu": {"devices": ["0", "1", "2"]}, "payload": {"command": ["true"]},
           "sweep": {"variants": [{"args": {}, "argv": ["true"]}], "gpus_per_variant": 2}}
    with pytest.raises(Fail, match="not a multiple of sweep.gpus_per_variant"):
        check_spec(raw)
    raw["gpu"]["devices"] = ["0", "1", "2", "3"]
    assert check_spec(raw)["sweep"]["slots"] == [["0", "1"], ["2", "3"]]


def test_dry_run_shows_the_slots(work):
    target = local_gpus(8)
    path = parallel_job(work, target, variants(5, 1), devices=list(range(8)), per_variant=2)
    text = run_cli(target, "submit", str(path), "--dry-run").stdout.decode()
    assert "5 variants side by side on 4 slots of 2 GPUs (GPU 0,1 · 2,3 · 4,5 · 6,7)" in text, text
    plan = json.loads(run_cli(target, "submit", str(path), "--dry-run", "--json").stdout)
    assert plan["slots"] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]


# -- the time bounds: rounds of variants, not variants -------------------------------------------------------

def test_variant_rounds_count_the_rounds_of_slots():
    from remote_payload.supervision.budget import budget
    from remote_payload.supervision.spec import check_spec, variant_rounds

    def spec(n, devices, k=None):
        sweep = {"variants": [{"args": {}, "argv": ["true"]}] * n, **({"gpus_per_variant": k} if k else {})}
        return check_spec({"job_id": "j1", "gpu": {"devices": devices}, "payload": {"command": ["true"]},
                           "sweep": sweep})

    plain = check_spec({"job_id": "j1", "payload": {"command": ["true"]}})
    assert variant_rounds(plain) == 1
    assert variant_rounds(spec(5, ["0", "1"])) == 5
    assert variant_rounds(spec(5, ["0", "1"], 1)) == 3
    assert variant_rounds(spec(4, [str(d) for d in range(8)], 2)) == 1
    run = plain["limits"]["max_runtime"] + plain["limits"]["grace"]
    def guard_timer(spec):
        return budget(spec, claimed_at=0.0)["guard_timer_s"]

    assert guard_timer(spec(5, ["0", "1"])) - guard_timer(spec(5, ["0", "1"], 1)) == 2 * run


# -- a real (confined) systemd unit: one stop, one restore for the whole parallel sweep -----------------------

@pytest.mark.slow(seconds=40)
@pytest.mark.systemd
def test_a_parallel_sweep_stops_the_unit_once_and_halves_the_window(service_host, work):
    target = target_for(service_host)
    service_host.set_gpu(count=2)
    service = service_section(service_host, "always")
    windows = {}
    for per_variant in (None, 1):
        starts, stops = starts_and_stops(service_host)
        path = parallel_job(work, target, variants(4, 3), devices=[0, 1], per_variant=per_variant, service=service,
                            name=f"par-{per_variant}.yaml")
        job_id = submit(target, path)
        job = wait_terminal(target, job_id, timeout=120)
        assert_service_back(service_host, job, f"sweep of 4 over {per_variant or 'all'} GPU(s) each", "SUCCEEDED")
        assert starts_and_stops(service_host) == (starts + 1, stops + 1)  # one stop, one start for four
        windows[per_variant] = job["service"]["downtime_s"]
        slots = {tuple(e["devices"]) for e in host_events(service_host, job_id)
                 if e.get("event") == "variant" and e["status"] == "start"}
        assert slots == ({("0", "1")} if per_variant is None else {("0",), ("1",)})
    print(f"\nwindow: in sequence {windows[None]:.2f} s, over 2 GPUs {windows[1]:.2f} s")
    assert windows[1] < 0.8 * windows[None], windows


# -- a restorer stops every variant running side by side -----------------------------------------------------

def test_a_sigkilled_supervisor_leaves_no_variant_running_on_any_slot(tmp_path):
    """The guard (the fork path's restorer) kills the group of each busy slot, not only the variant that
    status.json's `payload` names (the one launched last)."""
    import signal
    import sys
    import time

    from remote_payload.host.processes import is_alive
    from tests.harness.supervisor_calls import Host, pid_gone

    host = Host(tmp_path)
    gpu_state.write_gpus(host.gpu_dir, count=2)
    sleeper = {"args": {}, "argv": [sys.executable, "-c", "import time; time.sleep(120)"]}
    spec = {"name": "t", "service": {"manager": "none"}, "gpu": {"devices": ["0", "1"]},
            "payload": {"command": ["true"], "env": {}}, "limits": {"max_runtime": 300, "grace": 0.5},
            "sweep": {"variants": [sleeper, sleeper, sleeper], "gpus_per_variant": 1}}
    try:
        answer = host.start("p", spec)
        deadline = time.monotonic() + 20
        while len([s for s in host.status("p").get("slots") or [] if s.get("pid")]) < 2:
            assert time.monotonic() < deadline, host.status("p")
            time.sleep(0.1)
        busy = [s for s in host.status("p")["slots"] if s.get("pid")]
        os.kill(answer["supervisor_pid"], signal.SIGKILL)
        status = host.wait("p", "FAILED")
        assert status["restored"] is True
        assert all(pid_gone(s["pid"]) for s in busy), busy
        assert not any(is_alive(s) for s in busy)
    finally:
        host.cleanup()


def test_a_restorer_that_cannot_trust_status_json_still_kills_every_busy_slot(tmp_path):
    """The ledger names the processes of the busy slots too: a payload that overwrote status.json cannot hide
    its side-by-side siblings from the restore."""
    from remote_payload.supervision import ledger
    from remote_payload.supervision.restore import owed
    from tests.harness.ledger_records import UNIT, job, stopped_by

    paths, spec, _ = job(tmp_path)
    stopped_by(tmp_path, paths, spec, pid=4243, pgid=4243, start_time=99)
    ledger.note(str(tmp_path), UNIT, paths.job_id, slots=[{"pid": 4242, "pgid": 4242, "start_time": 98},
                                                          {"pid": 4243, "pgid": 4243, "start_time": 99}])
    (tmp_path / "jobs" / "j1" / "status.json").write_text("\0 garbage")
    rebuilt = owed.load_for_restore(paths)
    assert [s["pgid"] for s in rebuilt.status["slots"]] == [4242, 4243]
    assert rebuilt.status["payload"]["pgid"] == 4243


def test_a_variant_that_cannot_start_leaves_none_of_its_siblings_running(tmp_path):
    """The third slot's variant cannot even be launched (its command does not exist): the job fails, and the
    settle kills the two variants already running on the other slots."""
    import time

    from tests.harness.supervisor_calls import Host, pid_gone

    host = Host(tmp_path)
    gpu_state.write_gpus(host.gpu_dir, count=3)
    pidfiles = [tmp_path / "v1.pid", tmp_path / "v2.pid"]
    sleepers = [{"args": {}, "argv": ["/bin/sh", "-c", 'echo $$ > "$0"; exec sleep 120', str(path)]}
                for path in pidfiles]
    broken = tmp_path / "broken-interpreter"  # an executable file whose exec fails: its interpreter is missing
    broken.write_text(f"#!{tmp_path / 'no-such-interpreter'}\n")
    broken.chmod(0o755)
    missing = {"args": {}, "argv": [str(broken)]}
    spec = {"name": "t", "service": {"manager": "none"}, "gpu": {"devices": ["0", "1", "2"]},
            "payload": {"command": ["true"], "env": {}}, "limits": {"max_runtime": 300, "grace": 0.5},
            "sweep": {"variants": [*sleepers, missing], "gpus_per_variant": 1}}
    try:
        host.start("m", spec)
        status = host.wait("m", "FAILED")
        assert "cannot start the payload" in status["message"], status
        time.sleep(1.0)  # a sibling left running has written its pid by now (one killed at once may not have)
        pids = [int(p.read_text()) for p in pidfiles if p.exists() and p.read_text().strip()]
        assert pids and all(pid_gone(pid, timeout=2) for pid in pids), pids
    finally:
        host.cleanup()
