"""Pure parts of the supervisor (remote_payload/supervisor_*.py): parsers on captured output, validation, command construction."""
from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from remote_payload.supervision import locks
from remote_payload.host.answer import Fail
from remote_payload.host.gpu import select_gpus, short_gpus
from remote_payload.host.parsers import parse_apps_csv, parse_gpu_csv, parse_systemctl_show, sudo_wants_password
from remote_payload.host.processes import CMD_TIMEOUT_S, run_command
from remote_payload.host.systemd import Systemd
from remote_payload.supervision import job
from remote_payload.supervision import payload
from remote_payload.supervision.restore import guard, settle
from remote_payload.supervision import spec as checks
from remote_payload.supervision.budget import budget

DATA = Path(__file__).parents[1] / "data"


def data(name: str) -> str:
    return (DATA / name).read_text()


# ── nvidia-smi ───────────────────────────────────────────────────────────────────────────────────────

def test_real_h200_line_parses():
    assert parse_gpu_csv(data("nvidia-smi/h200-gpus.csv")) == [
        {"index": "0", "uuid": "GPU-aaaa8a08-769e-fec6-004a-c6a67ee83402", "name": "NVIDIA H200",
         "total_mib": 143771, "used_mib": 0, "free_mib": 143156}]


def test_empty_apps_output_means_no_apps():
    assert parse_apps_csv(data("nvidia-smi/apps-empty.csv")) == []


def test_multi_gpu_output_parses_every_card_in_order():
    gpus = parse_gpu_csv(data("nvidia-smi/h200x8-busy-gpus.csv"))
    assert [g["index"] for g in gpus] == [str(i) for i in range(8)]
    assert [g["free_mib"] for g in gpus[:3]] == [12084, 12084, 143156]
    apps = parse_apps_csv(data("nvidia-smi/h200x8-busy-apps.csv"))
    assert apps == [{"pid": 41230, "used_mib": 130456}, {"pid": 41231, "used_mib": 130456}]


def test_na_and_not_supported_cells_become_none():
    gpus = parse_gpu_csv(data("nvidia-smi/na-values-gpus.csv"))
    assert (gpus[0]["total_mib"], gpus[0]["used_mib"], gpus[0]["free_mib"]) == (97871, None, None)
    assert (gpus[1]["total_mib"], gpus[1]["free_mib"]) == (None, None)
    assert gpus[2]["free_mib"] == 81920 - 1024  # free derived when total and used are known
    apps = parse_apps_csv(data("nvidia-smi/na-values-apps.csv"))
    assert [a["used_mib"] for a in apps] == [None, None, 1024]


def test_unknown_free_memory_counts_as_short():
    gpus = parse_gpu_csv(data("nvidia-smi/na-values-gpus.csv"))
    assert [g["index"] for g in short_gpus(gpus, 1000)] == ["0", "1"]


def test_gpu_name_with_a_comma_keeps_the_numbers_right():
    gpus = parse_gpu_csv("3, GPU-x, Some Board, Rev 2, 1000, 10, 990\n")
    assert gpus[0]["name"] == "Some Board, Rev 2" and gpus[0]["free_mib"] == 990


def test_short_line_is_an_error():
    with pytest.raises(ValueError):
        parse_gpu_csv("0, GPU-x, 1000\n")


def test_select_by_index_and_uuid_in_spec_order():
    gpus = parse_gpu_csv(data("nvidia-smi/h200x8-busy-gpus.csv"))
    chosen = select_gpus(gpus, ["GPU-cccc2d3e-2222-4f30-8b4c-1d2e3f4a5b6c", "0"])
    assert [g["index"] for g in chosen] == ["2", "0"]


def test_missing_device_is_a_clear_error_listing_what_exists():
    gpus = parse_gpu_csv(data("nvidia-smi/h200-gpus.csv"))
    with pytest.raises(Fail) as err:
        select_gpus(gpus, ["0", "5"])
    assert "GPU 5 not found" in str(err.value) and "GPU-aaaa8a08" in str(err.value)


def test_drain_message_names_the_holders():
    short = [{"index": "0", "free_mib": 12084}]
    apps = parse_apps_csv(data("nvidia-smi/h200x8-busy-apps.csv"))
    text = job.drain_message(short, 9100 * 2, 120, apps)
    assert "GPU 0: 12084 MiB free < 18200 MiB needed" in text and "pid 41230" in text and "pid 41231" in text
    assert "no compute process" in job.drain_message(short, 20000, 1, [])


# ── systemctl / sudo ─────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("name, active, sub, pid", [
    ("show-active.txt", "active", "running", 2481),
    ("show-inactive.txt", "inactive", "dead", 0),
    ("show-failed.txt", "failed", "failed", 0),
    ("show-activating.txt", "activating", "auto-restart", 90211),
])
def test_systemctl_show_parses_in_any_order(name, active, sub, pid):
    text = data("systemctl/" + name)
    expected = {"active_state": active, "sub_state": sub, "main_pid": pid}
    assert parse_systemctl_show(text) == expected
    assert parse_systemctl_show("\n".join(reversed(text.splitlines()))) == expected


def test_systemctl_show_of_an_unknown_unit_is_not_active():
    assert parse_systemctl_show("")["active_state"] == "unknown"


def test_sudo_password_prompt_is_recognised():
    assert sudo_wants_password(1, data("systemctl/sudo-password-stderr.txt"))
    assert sudo_wants_password(1, "sudo: a terminal is required to read the password\n")
    assert not sudo_wants_password(5, "Failed to stop x.service: Unit x.service not loaded.\n")


def test_systemctl_argv_for_scope_and_sudo():
    user = Systemd("user", sudo=False)
    assert user.argv("systemctl", "show", "u.service") == ["systemctl", "--user", "show", "u.service"]
    sudo = Systemd("system", sudo=True)
    assert sudo.argv("systemctl", "stop", "u.service") == ["sudo", "-n", "systemctl", "stop", "u.service"]


def test_guard_timer_argv():
    argv = Systemd("user").timer_argv("runner-guard-j1", 1990.5, ["/py", "/s.py", "restore"], 302.0)
    assert argv == ["systemd-run", "--user", "--on-active=1990s", "--timer-property=AccuracySec=1s",
                    "--property=RuntimeMaxSec=302", "--unit=runner-guard-j1", "/py", "/s.py", "restore"]
    assert settle.timer_unit("a.b_c-1") == "runner-guard-a.b_c-1"


def test_sudo_password_becomes_its_own_error(tmp_path, monkeypatch):
    fake = tmp_path / "sudo"
    fake.write_text("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(Fail) as err:
        run_command(["sudo", "-n", "systemctl", "stop", "x.service"])
    assert err.value.code == "sudo-password" and "NOPASSWD" in str(err.value)


# ── validation ───────────────────────────────────────────────────────────────────────────────────────

@pytest.mark.parametrize("job_id", ["", ".", "..", "a/b", "a b", "x;y", "$(id)", "a\nb", "x" * 129])
def test_bad_job_ids_are_refused(job_id):
    with pytest.raises(Fail) as err:
        checks.check_job_id(job_id)
    assert err.value.code == "bad-args"


@pytest.mark.parametrize("unit, expected", [
    ("sglang", "sglang.service"), ("sglang-k26.service", "sglang-k26.service"),
    ("getty@tty1.service", "getty@tty1.service"), ("x.socket", "x.socket"), ("a\\x2d.service", "a\\x2d.service"),
])
def test_unit_names_get_a_suffix(unit, expected):
    assert checks.check_unit(unit) == expected


@pytest.mark.parametrize("unit", ["", "-H", "--user", "a b", "a;b", "a/b", "$(id)", None, 5])
def test_bad_unit_names_are_refused(unit):
    with pytest.raises(Fail):
        checks.check_unit(unit)


def spec(**payload):
    return {"name": "n", "payload": dict({"command": ["/bin/true"]}, **payload)}


@pytest.mark.parametrize("key", ["A B", "1X", "X;Y", "X=Y", "", "X-Y"])
def test_bad_env_keys_are_refused(key):
    with pytest.raises(Fail) as err:
        checks.check_spec(spec(env={key: "v"}), "j")
    assert err.value.code == "bad-spec"


@pytest.mark.parametrize("script", ["../x.py", "/etc/passwd", "a/../b.py", "./x.py", "a//b.py", ""])
def test_scripts_outside_the_payload_dir_are_refused(script):
    with pytest.raises(Fail):
        checks.check_spec({"payload": {"python": "python3", "script": script}}, "j")


BUNDLE = "0123456789abcdef"


def test_a_script_resolves_in_its_own_payload_bundle_under_root(tmp_path):
    (tmp_path / "payloads" / BUNDLE).mkdir(parents=True)
    (tmp_path / "payloads" / BUNDLE / "demo_payload.py").write_text("")
    raw = {"payload": {"python": "/py", "script": "demo_payload.py", "bundle": BUNDLE, "args": ["--x", "1"]}}
    checked = checks.locate_payload(checks.check_spec(raw, "j"), str(tmp_path))
    script = os.path.join(str(tmp_path), "payloads", BUNDLE, "demo_payload.py")
    assert payload.payload_argv(checked) == ["/py", script, "--x", "1"]
    assert job.prepare_argv(dict(checked, payload=dict(checked["payload"], prepare=["--p"]))) == ["/py", script, "--p"]


def test_a_payload_bundle_not_on_the_host_asks_for_the_upload(tmp_path):
    checked = checks.check_spec({"payload": {"script": "x.py", "bundle": BUNDLE}}, "j")
    with pytest.raises(Fail) as err:
        checks.locate_payload(checked, str(tmp_path))
    assert err.value.code == "payload-missing" and err.value.answer()["exit_status"] == 42
    (tmp_path / "payloads" / BUNDLE).mkdir(parents=True)
    with pytest.raises(Fail, match="not in the uploaded payload bundle"):
        checks.locate_payload(checked, str(tmp_path))
    (tmp_path / "payloads" / BUNDLE).chmod(0o777)
    with pytest.raises(Fail) as err:
        checks.locate_payload(checked, str(tmp_path))
    assert err.value.code == "unsafe-root"


@pytest.mark.parametrize("bundle", [None, "", "../../etc", "0123456789ABCDEF", "0" * 15, 7])
def test_a_script_payload_names_its_bundle_by_digest(bundle):
    with pytest.raises(Fail, match="payload.bundle"):
        checks.check_spec({"payload": {"script": "x.py", "bundle": bundle}}, "j")


def test_a_command_payload_needs_no_bundle(tmp_path):
    checked = checks.check_spec({"payload": {"command": ["/bin/true"]}}, "j")
    assert checks.locate_payload(checked, str(tmp_path)) == checked


def test_exactly_one_of_script_and_command():
    with pytest.raises(Fail):
        checks.check_spec({"payload": {"script": "demo_payload.py", "bundle": BUNDLE, "command": ["/bin/true"]}}, "j")
    with pytest.raises(Fail):
        checks.check_spec({"payload": {}}, "j")


def test_spec_job_id_must_match_argv():
    with pytest.raises(Fail):
        checks.check_spec(dict(spec(), job_id="other"), "j")


def test_hostile_env_values_and_names_are_kept_verbatim():
    hostile = "a b 'q' \"d\" ; $(rm -rf /) `x`\nline2"
    checked = checks.check_spec(dict(spec(env={"X": hostile}), name=hostile), "j")
    assert checked["payload"]["env"] == {"X": hostile} and checked["name"] == hostile


def test_lock_keys():
    cpu = checks.check_spec(spec(), "j")
    assert locks.lock_keys(cpu) == []
    gpu = checks.check_spec(dict(spec(), gpu={"devices": [1, "0"]}, service={"manager": "systemd", "unit": "sg"}), "j")
    assert locks.lock_keys(gpu) == ["gpu-0", "gpu-1", "service-sg.service"]


def test_service_spec_defaults_and_checks():
    checked = checks.check_service({"manager": "systemd", "unit": "sg", "scope": "user"})
    assert checked["unit"] == "sg.service" and checked["stop"] == "if-needed" and checked["sudo"] is False
    for bad in ({"manager": "upstart"}, {"manager": "systemd", "unit": "sg", "stop": "maybe"},
                {"manager": "systemd", "unit": "sg", "health_url": "file:///etc/passwd"}):
        with pytest.raises(Fail):
            checks.check_service(bad)


def test_unknown_bracketed_memory_cells_are_unknown_not_a_crash():
    from_apps = parse_apps_csv("1234, [Insufficient Permissions]\n")
    assert from_apps == [{"pid": 1234, "used_mib": None}]


def test_guard_timer_fires_after_the_slowest_legitimate_end():
    spec = {"limits": {"max_runtime": 1800, "grace": 30}, "gpu": {"drain_timeout": 120},
            "service": {"health_timeout": 900}}
    # run + grace + both drains + the stop at its own 600 s bound + the start command + the health wait + a minute
    assert budget(spec, 0.0)["guard_timer_s"] == 1800 + 30 + 240 + 600 + CMD_TIMEOUT_S + 900 + 60


def test_the_hard_deadline_counts_a_sweeps_run_from_the_running_variant_and_a_prepare_step_gets_none():
    spec = {"limits": {"max_runtime": 100.0, "grace": 5.0}, "gpu": {"drain_timeout": 20.0}, "service": {}}
    first, third = 1000.0, 1250.0  # the job started with variant 1; variant 3 started 250 s later
    running = {"state": "RUNNING", "started_at": first, "payload": {"started_at": third}}
    assert guard.hard_deadline(spec, running) == guard.hard_deadline(spec, dict(running, started_at=third)) > third + 100
    single = {"state": "RUNNING", "started_at": first, "payload": {}}  # a record written before payload.started_at
    assert guard.hard_deadline(spec, single) > first + 100
    preparing = {"state": "PREPARING", "started_at": None, "payload": {"started_at": first}}
    assert guard.hard_deadline(spec, preparing) is None


@pytest.mark.parametrize("stdin, code", [
    (b"", "bad-spec"),  # an early call closed unsent: nothing read, nothing started
    (json.dumps({"payload": {"command": ["/bin/true"]}}).encode(), "bad-args"),  # no id anywhere
    (json.dumps({"job_id": "../x", "payload": {"command": ["/bin/true"]}}).encode(), "bad-args"),
])
def test_a_submit_without_job_id_takes_the_specs_own_checked(tmp_path, monkeypatch, stdin, code):
    from remote_payload import commands

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    with pytest.raises(Fail) as err:
        commands.dispatch(["submit", "--root", str(tmp_path)])
    assert err.value.code == code and not (tmp_path / "jobs").exists()


def test_the_verbs_flags_parse_as_argparse_parsed_them():
    from remote_payload import commands

    args = commands.build_parser("logs").parse_args(
        ["--root", "/r", "--job-id", "j", "--offset", "5", "--wait=1.5", "--stream", "--offset", "7"])
    assert (args.root, args.job_id, args.offset, args.max, args.wait, args.stream, args.follow) == \
        ("/r", "j", 7, 1 << 20, 1.5, True, False)  # the last of a repeated flag wins; defaults filled in
    status = commands.build_parser("status").parse_args(["--root", "/r", "--job-id", "a", "--job-id", "b"])
    assert (status.job_id, status.ids_on_stdin, status.wait) == (["a", "b"], False, 0.0)
    assert commands.build_parser("status").parse_args(["--root", "/r"]).job_id == []
    service = commands.build_parser("restore-service").parse_args(["--root", "/r", "--unit", "u"])
    assert (service.scope, service.sudo, service.health_url, service.max_wait) == ("system", False, None, 50.0)


@pytest.mark.parametrize("argv, words", [
    (["--root", "/r", "--job-id", "j"], "required: --offset"),
    (["--root", "/r", "--job-id", "j", "--offset", "x"], "invalid int value: 'x'"),
    (["--root", "/r", "--job-id", "j", "--offset", "1", "--nope"], "unrecognized arguments: --nope"),
    (["--root", "/r", "--job-id", "j", "--offset"], "--offset: expected one argument"),
    (["--root", "/r", "--job-id", "--offset", "1"], "--job-id: expected one argument"),
    (["--root", "/r", "--job-id", "j", "--offset", "1", "--stream=yes"], "ignored explicit argument"),
    (["--root", "/r", "--job-id", "j", "--offset", "1", "extra"], "unrecognized arguments: extra"),
])
def test_a_bad_flag_is_bad_args_with_argparses_words(argv, words):
    from remote_payload import commands

    with pytest.raises(Fail) as err:
        commands.build_parser("logs").parse_args(argv)
    assert err.value.code == "bad-args" and words in str(err.value)


def test_a_choice_outside_its_set_is_bad_args():
    from remote_payload import commands

    with pytest.raises(Fail) as err:
        commands.build_parser("restore-service").parse_args(["--root", "/r", "--unit", "u", "--scope", "all"])
    assert err.value.code == "bad-args" and "invalid choice: 'all'" in str(err.value)
