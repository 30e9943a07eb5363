"""service.free: sglang / vllm end to end, through `runner submit`, on the confined real systemd + sshd test
host whose unit is the engine stand-in (tests/hosts/engine_standin.py): the GPU freed through the engine's
API with the unit left running (MainPID unchanged), resumed by every restorer, the unit restarted when the API
does not resume it, and an engine without the API refused (exit 4) before anything is touched.

An H200 stand-in with 60 GB weights + 60 GB KV cache + 500 MiB context held: 22656 MiB free before.
"""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli, status, submit, wait_for, wait_terminal
from tests.harness.systemd_jobs import (HANG, assert_service_back, calls, gpu_job, hold, host_events, host_status,
                                        main_pid, outcome, restored_within, standin_state, target_for)

pytestmark = pytest.mark.systemd
PROBE = ["GET /server_info", "GET /hicache/storage-backend"]  # the release's own probe


def test_kv_cache_alone_when_enough_and_the_same_process_serves_after(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--weights-cpu-backup")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang")))
    assert_service_back(service_host, job, "free: sglang, kv cache enough", "SUCCEEDED")
    assert calls(log) == [*PROBE,  # preflight
                          *PROBE, "GET /get_load", "POST /flush_cache",  # the drain: idle already
                          'POST /pause_generation {"mode": "in_place"}', "POST /flush_cache",
                          'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                          'POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                          "POST /continue_generation {}", "GET /health_generate"]
    assert main_pid(service_host) == pid
    service = job["service"]
    assert [s["step"] for s in service["released"]["steps"]] == ["pause", "kv_cache"]
    assert service["resumed"]["how"] == "api"
    parts = service["downtime"]
    assert parts["method"] == "sglang" and parts["not_serving_s"] == pytest.approx(service["downtime_s"], abs=0.01)
    assert all(parts[k] is not None and parts[k] >= 0 for k in ("release_s", "drain_s", "payload_s", "resume_s",
                                                                "health_s"))
    assert parts["payload_s"] >= 1.0  # the payload held its memory for 1 s
    assert service_host.ssh(["ls", "/run/lock"]).stdout.count("ledger-") == 0


def test_weights_too_when_not_enough_resumed_weights_first(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--weights-cpu-backup")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=100000, command=hold(100000),
                                                       free="sglang", pause_mode="abort")))
    assert_service_back(service_host, job, "free: sglang, weights too", "SUCCEEDED")
    assert calls(log)[4:] == ["GET /get_load", 'POST /pause_generation {"mode": "abort"}',
                              'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                              'POST /release_memory_occupation {"tags": ["weights"]}',
                              'POST /resume_memory_occupation {"tags": ["weights"]}',
                              'POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                              "POST /continue_generation {}", "GET /health_generate"]
    assert main_pid(service_host) == pid


def test_the_default_drain_under_load_aborts_nothing_and_counts_what_the_clients_saw(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--clients", "3", "--request-s", "3")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang")))
    assert_service_back(service_host, job, "free: sglang, default drain under load", "SUCCEEDED")
    assert outcome(standin_state(service_host)["load"]) == {"running": 0, "held": 0, "completed": 3, "aborted": 0}
    released, parts = job["service"]["released"], job["service"]["downtime"]
    assert released["mode"] == "drain" and released["drain"]["outcome"] == "drained"
    # the 3 finished while SGLang served; the pause that held came once it was idle
    assert released["drain"]["in_flight"] == 3
    assert parts["pause_mode"] == "drain" and parts["clients"] == dict(parts["clients"], at_pause=0, aborted=0)
    assert parts["clients"]["drained_s"] >= 1.0
    # the window starts at the pause that held, after the drain: the clients were served until then
    assert job["service"]["stopped_at"] == released["paused_at"]
    assert calls(log).index("GET /get_load") < calls(log).index('POST /pause_generation {"mode": "in_place"}')
    assert main_pid(service_host) == pid
    shown = run_cli(target, "status", job["job_id"]).stdout.decode()
    assert "clients (drain): 0 in flight at the pause: 0 held, 0 aborted, 0 truncated, 0 refused (drained in " \
        in shown, shown


def test_past_service_drain_timeout_the_job_ends_with_nothing_released(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--clients", "2", "--request-s", "0.5",
                                           "--loop")  # a saturating load: SGLang is never idle
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang", drain_timeout="3s")))
    assert job["state"] == "FAILED" and "nothing was released and it kept serving" in job["message"], job
    assert "service.drain_fallback: abort" in job["message"] and "service.pause_mode: abort" in job["message"]
    assert not any("release_memory_occupation" in c for c in calls(log))
    state = standin_state(service_host)
    assert not state["paused"] and state["load"]["aborted"] == 0 and state["load"]["completed"] > 0
    assert job["service"]["stopped"] is False and job["service"]["released"]["drain"]["outcome"] == "timeout"
    assert main_pid(service_host) == pid and service_host.service_state() == "active"
    assert service_host.ssh(["ls", "/run/lock"]).stdout.count("ledger-") == 0


def test_past_drain_timeout_drain_fallback_abort_aborts_the_rest_and_the_job_runs(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--clients", "2", "--request-s", "0.5",
                                           "--loop")  # a saturating load: SGLang is never idle
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang", drain_timeout="3s", drain_fallback="abort")))
    assert_service_back(service_host, job, "free: sglang, drain past its bound, fallback abort", "SUCCEEDED")
    assert 'POST /pause_generation {"mode": "in_place"}' not in calls(log)
    assert calls(log)[-5:] == ['POST /pause_generation {"mode": "abort"}',
                               'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                               'POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                               "POST /continue_generation {}", "GET /health_generate"]
    released, parts = job["service"]["released"], job["service"]["downtime"]
    assert released["drain"]["outcome"] == "timeout" and released["drain"]["fallback"] == "abort"
    assert parts["clients"]["aborted"] == parts["clients"]["at_pause"] == 2
    assert parts["clients"]["drain_timed_out_s"] >= 3.0
    assert main_pid(service_host) == pid
    shown = run_cli(target, "status", job["job_id"]).stdout.decode()
    assert "2 in flight at the pause: 0 held, 2 aborted, 2 truncated, 0 refused (not idle after a 3." in shown, shown
    assert "drain_fallback abort" in shown


def test_retract_on_a_release_that_cannot_release_after_it_is_refused_in_preflight(service_host, work):
    log = service_host.install_engine_unit("sglang", "--version", "0.5.20", "--memory-saver")
    pid = main_pid(service_host)
    target = target_for(service_host)
    done = run_cli(target, "submit", str(gpu_job(work, service_host, need=30000, command=hold(30000),
                                                 free="sglang", pause_mode="retract")))
    assert done.returncode == 4, done.stderr.decode()
    assert "service.pause_mode retract: this release's release_memory_occupation asserts" in done.stderr.decode()
    assert "retract needs SGLang 0.5.21 or later (SGLang 0.5.20 can release after: drain, abort)" in \
        done.stderr.decode()
    assert calls(log) == ["GET /server_info"]  # the preflight's probe; nothing paused or released
    assert main_pid(service_host) == pid and service_host.service_state() == "active"


def test_supervisor_and_guard_sigkilled_during_the_drain_serving_with_no_call_and_no_request_lost(service_host,
                                                                                                  work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--clients", "2", "--request-s", "6")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, need=30000, command=HANG, free="sglang"))
    wait_for(lambda: "GET /get_load" in calls(log), what="the drain to begin")
    job = host_status(service_host, job_id)
    assert job["state"] == "STOPPING_SERVICE", job
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    restored_within(service_host, job_id, timeout=90)
    assert service_host.health_status() == 200 and main_pid(service_host) == pid
    assert not any("release_memory_occupation" in c for c in calls(log))
    wait_for(lambda: standin_state(service_host)["load"]["completed"] == 2, timeout=30, what="the 2 requests done")
    state = standin_state(service_host)
    assert state["load"]["aborted"] == 0 and not state["paused"] and state["on_gpu"]["kv_cache"]


def test_supervisor_and_guard_sigkilled_while_released_serving_again_with_no_controller_call(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, need=30000, command=HANG, free="sglang"))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    job = host_status(service_host, job_id)
    assert 'POST /release_memory_occupation {"tags": ["kv_cache"]}' in calls(log)
    service_host.ssh(["kill", "-KILL", str(job["supervisor"]["pid"]), str(job["guard"]["pid"])], check=True)
    seconds = restored_within(service_host, job_id, timeout=90)
    job = host_status(service_host, job_id)
    assert_service_back(service_host, job, f"free: sglang, supervisor+guard SIGKILLed while released: resumed by "
                        f"ExecStopPost ({seconds:.0f} s)", job["state"])
    assert calls(log)[-3:] == ['POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                               "POST /continue_generation {}", "GET /health_generate"]
    assert main_pid(service_host) == pid and job["service"]["resumed"]["how"] == "api"


@pytest.mark.slow(seconds=30)
def test_an_api_that_does_not_resume_gets_the_unit_restarted(service_host, work):
    log = service_host.install_engine_unit("sglang", "--memory-saver", "--hang", "/resume_memory_occupation")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=30000, command=hold(30000),
                                                       free="sglang")), timeout=120)
    assert_service_back(service_host, job, "free: sglang, resume never answers: unit restarted", "SUCCEEDED")
    assert main_pid(service_host) != pid and job["service"]["resumed"]["how"] == "restart"
    assert job["service"]["downtime"]["resume_s"] is not None
    restore_log = service_host.ssh(["cat", f"/root/.runner/jobs/{job['job_id']}/restore.log"]).stdout
    assert "did not bring" in restore_log and "restarting the unit" in restore_log
    assert 'POST /resume_memory_occupation {"tags": ["kv_cache"]}' in calls(log)


def test_an_engine_without_the_memory_api_is_refused_before_anything_is_touched(service_host, work):
    log = service_host.install_engine_unit("sglang")  # no --enable-memory-saver
    pid = main_pid(service_host)
    target = target_for(service_host)
    done = run_cli(target, "submit", str(gpu_job(work, service_host, need=30000, command=hold(30000),
                                                 free="sglang")))
    assert done.returncode == 4, done.stderr.decode()
    assert "without --enable-memory-saver" in done.stderr.decode()
    assert calls(log) == ["GET /server_info"]
    assert main_pid(service_host) == pid and service_host.service_state() == "active"


def test_vllm_sleeps_and_wakes_the_same_process(service_host, work):
    log = service_host.install_engine_unit("vllm", "--dev-mode", "--sleep-mode")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, need=100000, command=hold(100000),
                                                       free="vllm")))
    assert_service_back(service_host, job, "free: vllm", "SUCCEEDED")
    assert [c for c in calls(log) if c.startswith("POST")] == ["POST /sleep", "POST /wake_up"]
    assert main_pid(service_host) == pid


def test_a_stop_reports_the_same_downtime_parts(service_host, work):
    target = target_for(service_host)
    job = wait_terminal(target, submit(target, gpu_job(work, service_host, stop="always", command=hold(8000))))
    assert_service_back(service_host, job, "free: stop, downtime parts", "SUCCEEDED")
    parts = job["service"]["downtime"]
    assert parts["method"] == "stop" and job["service"]["resumed"]["how"] == "start"
    assert all(parts[k] is not None and parts[k] >= 0 for k in ("not_serving_s", "release_s", "drain_s", "payload_s",
                                                                "resume_s", "health_s"))
    assert parts["health_s"] >= 1.0  # the dummy unit answers /health 2 s after its start
    shown = run_cli(target, "status", job["job_id"]).stdout.decode()
    assert "(stop: release " in shown and ", health " in shown, shown


def test_a_dead_jobs_release_is_adopted_by_the_next_job_and_resumed_after_its_run(service_host, work, fork_path):
    """Fork path (no ExecStopPost first): A's supervisor and guard SIGKILLed with the engine released; B takes
    the lock, finds A's ledger entry, runs in the memory A freed (no second release), and resumes after."""
    log = service_host.install_engine_unit("sglang", "--memory-saver")
    pid = main_pid(service_host)
    target = target_for(service_host)
    a = submit(target, gpu_job(work, service_host, need=30000, command=HANG, free="sglang"))
    wait_for(lambda: status(target, a)["state"] == "RUNNING", what="A running")
    job_a = host_status(service_host, a)
    service_host.ssh(["kill", "-KILL", str(job_a["supervisor"]["pid"]), str(job_a["guard"]["pid"])], check=True)
    (work / "b").mkdir()
    b = submit(target, gpu_job(work / "b", service_host, need=30000, command=hold(30000), free="sglang"))
    job = wait_terminal(target, b)
    assert_service_back(service_host, job, "free: sglang, A's release adopted by B", "SUCCEEDED")
    assert job["service"]["adopted_from"] == a and job["service"]["resumed"]["how"] == "api"
    assert any(e.get("event") == "ledger" and e.get("adopted_from") == a for e in host_events(service_host, b))
    posts = [c for c in calls(log) if c.startswith("POST") and c != "POST /flush_cache"]
    assert posts == ['POST /pause_generation {"mode": "in_place"}',
                     'POST /release_memory_occupation {"tags": ["kv_cache"]}',
                     'POST /resume_memory_occupation {"tags": ["kv_cache"]}', "POST /continue_generation {}"]
    assert main_pid(service_host) == pid
    assert host_status(service_host, a).get("restored") is True
    assert host_status(service_host, a)["service"].get("handed_to") == b


def test_restore_service_resumes_what_a_dead_job_released_and_defers_to_a_live_one(service_host, work,
                                                                                  fork_path):
    log = service_host.install_engine_unit("sglang", "--memory-saver")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job_file = gpu_job(work, service_host, need=30000, command=HANG, free="sglang")
    a = submit(target, job_file)
    wait_for(lambda: status(target, a)["state"] == "RUNNING", what="A running")
    done = run_cli(target, "restore-service", str(job_file), "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 75 and answer["state"] == "starting", answer  # A lives: A resumes it
    assert answer["released"]["job_id"] == a and answer["released"]["deferred"] is True
    assert not any("resume" in c for c in calls(log))
    job_a = host_status(service_host, a)
    service_host.ssh(["kill", "-KILL", str(job_a["supervisor"]["pid"]), str(job_a["guard"]["pid"])], check=True)
    done = run_cli(target, "restore-service", str(job_file), "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["state"] == "healthy", answer
    assert answer["released"] == dict(answer["released"], job_id=a, deferred=False)
    assert calls(log)[-3:] == ['POST /resume_memory_occupation {"tags": ["kv_cache"]}',
                               "POST /continue_generation {}", "GET /health_generate"]
    job_a = host_status(service_host, a)
    assert job_a["restored"] is True and job_a["service"]["healthy"] is True and main_pid(service_host) == pid
    assert service_host.ssh(["ls", "/run/lock"]).stdout.count("ledger-") == 0


def test_the_guard_resumes_when_the_supervisor_dies(service_host, work, fork_path):
    log = service_host.install_engine_unit("sglang", "--memory-saver")
    pid = main_pid(service_host)
    target = target_for(service_host)
    job_id = submit(target, gpu_job(work, service_host, need=30000, command=HANG, free="sglang"))
    wait_for(lambda: status(target, job_id)["state"] == "RUNNING", what="running")
    service_host.ssh(["kill", "-KILL", str(host_status(service_host, job_id)["supervisor"]["pid"])], check=True)
    restored_within(service_host, job_id, timeout=60)
    job = host_status(service_host, job_id)
    assert_service_back(service_host, job, "free: sglang, supervisor SIGKILLed: the guard resumes", "FAILED")
    assert "guard restored the service" in job["message"] and job["service"]["resumed"]["how"] == "api"
    assert calls(log)[-2:] == ["POST /continue_generation {}", "GET /health_generate"]
    assert main_pid(service_host) == pid
