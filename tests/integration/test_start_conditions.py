"""A job that cannot start its payload is refused before anything is touched (exit 4 naming the field).

Each case runs on the confined systemd host with a GPU so short that the job would stop the service: the
refusal must come from the host's preflight, for `submit` and `submit --dry-run` alike, with the unit's
MainPID unchanged, no ledger entry and no job dir left behind.
"""
from __future__ import annotations

import json

import pytest
import yaml

from tests.cli_helpers import REPO, Target, run_cli
from tests.harness.systemd_jobs import SMALL_GPU, main_pid, service_section, target_for

DEMO_ARGS = {"seconds": 1, "sizes": [1]}


def job_file(work, host, *, payload: dict, host_extra: dict | None = None):
    spec = {"name": "cannot start", "host": dict(target_for(host).host, **(host_extra or {})),
            "service": service_section(host, "if-needed"),
            "gpu": {"devices": [0], "min_free_mib": 8000, "drain_timeout": "20s"},
            "payload": payload, "limits": {"max_runtime": "1m", "grace": "2s"}}
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def user_script(work, text: str) -> str:
    (work / "user_payload.py").write_text(text)
    return "user_payload.py"  # beside the job file


def assert_refused_untouched(host, path, field: str, job_id: str) -> None:
    """submit --dry-run and submit both exit 4 naming the field; the service was never stopped."""
    target = target_for(host)
    before = main_pid(host)
    for extra in (["--dry-run"], []):
        done = run_cli(target, "submit", str(path), "--job-id", job_id, *extra)
        stderr = done.stderr.decode()
        assert done.returncode == 4, (extra, done.returncode, stderr)
        assert field in stderr, stderr
        assert "Traceback" not in stderr, stderr
    assert host.service_state() == "active" and main_pid(host) == before
    assert host.ssh(["test", "-e", f"/root/.runner/jobs/{job_id}"]).returncode == 1
    ledger = host.ssh(["sh", "-c", "cat /run/lock/runner-ledger-*.json 2>/dev/null; true"]).stdout
    assert ledger.strip() == "", ledger


CASES = {
    "missing payload.python": ({"python": "/opt/no-such-venv/bin/python", "script": "demo_payload.py",
                                "args": DEMO_ARGS}, "payload.python"),
    "payload.python not a python": ({"python": "/bin/false", "script": "demo_payload.py", "args": DEMO_ARGS},
                                    "payload.python"),
    "missing command program": ({"command": ["/opt/no-such-tool/bin/bench", "--x"]}, "payload.command"),
    "cache dir not creatable": ({"script": "demo_payload.py", "args": DEMO_ARGS,
                                 "env": {"TRITON_CACHE_DIR": "/etc/passwd/triton"}}, "payload.env.TRITON_CACHE_DIR"),
    "known cache dir under a file": ({"command": ["python3", "-c", "pass"],
                                      "env": {"TVM_FFI_CACHE_DIR": "/etc/hostname/tvm"}},
                                     "payload.env.TVM_FFI_CACHE_DIR"),
}


@pytest.mark.systemd
@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_the_service_is_touched(service_host, work, case):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)  # the job would stop the service
    payload, field = CASES[case]
    assert_refused_untouched(service_host, job_file(work, service_host, payload=payload), field,
                             "startc-" + case.replace(" ", "-").replace(".", "-"))


@pytest.mark.systemd
def test_script_whose_import_is_missing_is_refused(service_host, work):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)
    script = user_script(work, "import json\nimport no_such_module_for_runner\nprint(json.dumps({}))\n")
    path = job_file(work, service_host, payload={"script": script})
    assert_refused_untouched(service_host, path, "no_such_module_for_runner", "startc-import")


@pytest.mark.systemd
def test_script_that_does_not_compile_is_refused(service_host, work):
    service_host.set_gpu(total_mib=SMALL_GPU, baseline_used=10000)
    script = user_script(work, "def broken(:\n    pass\n")
    path = job_file(work, service_host, payload={"script": script})
    assert_refused_untouched(service_host, path, "payload.script", "startc-syntax")


@pytest.mark.systemd
def test_missing_host_python_is_a_refusal_naming_it(service_host, work):
    path = job_file(work, service_host, payload={"script": "demo_payload.py", "args": DEMO_ARGS},
                    host_extra={"python": "/opt/no-such-python/bin/python3"})
    assert_refused_untouched(service_host, path, "host.python", "startc-host-python")


@pytest.mark.systemd
def test_startable_job_still_starts(service_host, work):
    """The checks refuse nothing that runs: a script with only stdlib and sibling imports, a creatable cache dir."""
    path = job_file(work, service_host, payload={"script": "demo_payload.py", "args": DEMO_ARGS,
                                                 "env": {"TRITON_CACHE_DIR": "/root/.cache/runner-test/triton"}})
    done = run_cli(target_for(service_host), "submit", str(path), "--json", "--dry-run")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["job_id"]


@pytest.mark.parametrize("python", ["/opt/no-such-python/bin/python3", "/etc/hostname"])
def test_local_host_python_that_cannot_run_is_a_refusal_naming_it(tmp_path, python):
    """`address: local` runs host.python without a shell: a missing or non-executable one is exit 4 too."""
    target = Target("local", {"address": "local"}, tmp_path / "root", {})
    for extra in (["--dry-run"], []):
        done = run_cli(target, "submit", str(REPO / "jobs" / "demo.yaml"), "--set", f"host.root={tmp_path / 'root'}",
                       "--set", f"host.python={python}", *extra)
        assert done.returncode == 4 and b"host.python" in done.stderr, (done.returncode, done.stderr)


@pytest.fixture
def host(tmp_path):
    from tests.harness.supervisor_calls import Host

    host = Host(tmp_path)
    yield host
    host.cleanup()


def test_supervisor_checks_again_before_its_prepare_step(host, tmp_path):
    """`start` without a preflight (or a queued job whose program vanished meanwhile): FAILED naming the field,
    before the prepare step runs."""
    marker = tmp_path / "prepared"
    spec = host.spec("sleep", "0", "0")
    spec["payload"].update(command=["/opt/no-such-tool/bench"], prepare=["sh", "-c", f"touch {marker}"])
    host.start("vanished", spec)
    job = host.wait("vanished", "FAILED")
    assert job["message"].startswith("payload.command: /opt/no-such-tool/bench is not an executable file"), job
    assert not marker.exists() and job["payload"] is None


@pytest.mark.parametrize("env, field", [
    ({"TRITON_CACHE_DIR": "/etc/hostname/x"}, "payload.env.TRITON_CACHE_DIR"),
    ({"MY_TOOL_CACHE_DIR": "/dev/null/deeper"}, "payload.env.MY_TOOL_CACHE_DIR"),
])
def test_preflight_names_the_cache_dir(host, env, field):
    spec = host.spec("sleep", "0", "0")
    spec["payload"]["env"] = env
    rc, answer = host.call("preflight", spec=spec)
    assert rc == 1 and answer["error"] == "cannot-start" and answer["field"] == field, answer


def test_cache_dirs_that_can_be_made_pass(host, tmp_path):
    spec = host.spec("sleep", "0", "0")
    spec["payload"]["env"] = {"TRITON_CACHE_DIR": str(tmp_path / "new" / "deeper"), "XDG_CACHE_HOME": "rel/dir",
                              "NOT_A_CACHE": "/etc/hostname/x"}
    assert host.ok("preflight", spec=spec)["ok"]
    assert not (tmp_path / "new").exists()  # only looked at, never made


def test_a_probe_that_hangs_is_bounded(tmp_path):
    """A payload.python that never answers is a refusal after START_PROBE_TIMEOUT_S, not a hang."""
    import time

    from remote_payload.supervision import startable as supervisor_startable
    from remote_payload.contract import START_PROBE_TIMEOUT_S
    from remote_payload.host.answer import Fail

    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    began = time.monotonic()
    with pytest.raises(Fail) as refused:
        supervisor_startable.check_startable({"payload": {"command": None, "script": "demo_payload.py",
                                                          "path": str(REPO / "remote_payload" / "payloads" / "demo"
                                                                      / "demo_payload.py"),
                                                          "python": str(slow), "env": {}, "args": []}},
                                             str(tmp_path))
    assert refused.value.extra["field"] == "payload.python" and "within" in str(refused.value)
    assert time.monotonic() - began < START_PROBE_TIMEOUT_S + 10


def test_its_error_code_is_a_contract_code():
    import inspect
    import re

    from remote_payload import contract
    from remote_payload.supervision import startable as supervisor_startable

    codes = set(re.findall(r'Fail\(\s*"([a-z-]+)"', inspect.getsource(supervisor_startable)))
    assert codes == {"cannot-start"} and codes <= set(contract.ERRORS)
