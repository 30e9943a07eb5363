"""The job spec loader: the DESIGN.md example, durations, argv and wire forms, overrides, job ids, and a
table of bad inputs, each of which must be a SpecError naming the file and the field."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import SpecError
from runner.spec.spec import HostSpec, JobSpec, ServiceSpec
from runner.spec.spec_fields import parse_duration
from runner.spec.spec_load import load_spec, section_from_options
from runner.state.job_id import JOB_ID_RE, check_job_id, job_id_for

DATA = Path(__file__).parents[1] / "data" / "specs"
EXAMPLE = DATA / "k26_example.yaml"
HOSTILE = DATA / "hostile_valid.yaml"
DELETE = object()  # a table value that removes the key instead of setting it
NOW = datetime(2026, 11, 29, 8, 26, 5, tzinfo=timezone.utc)


def example_document() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def write_yaml(directory: Path, document, name: str = "job.yaml") -> Path:
    path = directory / name
    # Escaped, not raw: PyYAML writes U+0085 raw, and YAML then reads it as a line break.
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def with_changes(document: dict, changes: dict) -> dict:
    changed = copy.deepcopy(document)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        target = changed
        for key in parents:
            target = target.setdefault(key, {})
        if value is DELETE:
            target.pop(last, None)
        else:
            target[last] = value
    return changed


def spec_error_lines(path: Path, overrides=()) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides)
    return str(info.value).splitlines()


def assert_names_field(lines: list[str], path: Path, field: str) -> None:
    """Some line reads `FILE: field.path: why` — the user can find both the file and the key."""
    prefix = f"{path}: {field}: "
    assert any(line.startswith(prefix) and len(line) > len(prefix) for line in lines), lines


# -- the example and the happy paths ----------------------------------------------------------------------

def test_design_example_parses_to_the_documented_values():
    spec = load_spec(EXAMPLE)
    assert spec.spec_path == EXAMPLE
    assert (spec.name, spec.host.address, spec.host.user, spec.host.port) == ("k26-marlin-lever", "ct200", "root", 22)
    assert spec.host.host_key_policy == "strict"
    assert spec.service.unit == "sglang-k26-ddtree.service" and spec.service.stop == "if-needed"
    assert spec.service.health_timeout == 900.0 and spec.service.sudo is False
    assert spec.gpu.devices == [0] and spec.gpu.min_free_mib == "auto" and spec.gpu.drain_timeout == 120.0
    assert spec.payload.python == "/root/venv_sglang211/bin/python"
    assert spec.payload.env == {"TVM_FFI_CACHE_DIR": "/root/.cache/tvm-ffi"}
    assert (spec.limits.max_runtime, spec.limits.grace) == (1800.0, 30.0)


def test_design_example_args_become_the_documented_argv():
    assert load_spec(EXAMPLE).payload_args() == [
        "--experts", "384", "--hidden", "7168", "--intermediate", "2048", "--topk", "8", "--group-size", "32",
        "--batch-sizes", "1,2,4,8,16,32,64,128,256,512", "--backend", "sglang"]


def test_minimal_spec_gets_the_documented_defaults():
    spec = load_spec(DATA / "minimal.yaml")
    assert spec.host.root == "~/.runner" and spec.host.python == "python3" and spec.host.connect_timeout == 10
    assert spec.service.manager == "none" and spec.gpu.devices == [] and spec.gpu.min_free_mib == 0
    assert spec.payload.python == "python3" and spec.payload.command == ["sleep", "1"]
    assert (spec.limits.max_runtime, spec.limits.grace) == (3600.0, 30.0)


@pytest.mark.parametrize("text, seconds", [
    (90, 90.0), (2.5, 2.5), ("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0),
    ("1d", 86400.0), ("1m30s", 90.0), ("1.5h", 5400.0), (" 45s ", 45.0), ("7d", 604800.0), (604800, 604800.0),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [0, -1, "0s", "-5m", "8d", 604801, "forever", "5 minutes", "1h30", "m", "",
                                  "30m1h", True, None, [30], float("nan"), float("inf"), -float("inf"), 10**400,
                                  "9" * 400])
def test_bad_durations_are_value_errors(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_payload_args_flags_lists_and_order(tmp_path):
    document = with_changes(example_document(), {"payload.args": {
        "zeta_first": 1, "check": True, "skip": False, "none": None, "ratio": 0.25, "sizes": [1, "x", 2.5],
        "word": "hello world"}})
    spec = load_spec(write_yaml(tmp_path, document))
    assert spec.payload_args() == ["--zeta-first", "1", "--check", "--ratio", "0.25", "--sizes", "1,x,2.5",
                                   "--word", "hello world"]


# -- the wire form ----------------------------------------------------------------------------------------

def test_to_wire_has_the_protocol_shape():
    wire = load_spec(EXAMPLE).to_wire("k26-20261129-082605-ab12cd", 9100, "bench_marlin_moe.py")
    assert set(wire) == {"name", "job_id", "service", "gpu", "payload", "limits"}
    assert wire["service"] == {"manager": "systemd", "unit": "sglang-k26-ddtree.service", "scope": "system",
                               "stop": "if-needed", "health_url": "http://127.0.0.1:30000/health",
                               "health_timeout": 900.0, "sudo": False}
    assert wire["gpu"] == {"devices": ["0"], "required_mib": 9100, "drain_timeout": 120.0}
    assert wire["payload"]["python"] == "/root/venv_sglang211/bin/python"
    assert wire["payload"]["script"] == "bench_marlin_moe.py" and wire["payload"]["command"] is None
    assert wire["payload"]["args"][:2] == ["--experts", "384"]
    assert wire["payload"]["env"] == {"TVM_FFI_CACHE_DIR": "/root/.cache/tvm-ffi"}
    assert wire["limits"] == {"max_runtime": 1800.0, "grace": 30.0, "prepare_timeout": 1800.0,
                              "queue_timeout": 7200.0}
    assert wire["payload"]["prepare"] is None
    assert json.loads(json.dumps(wire)) == wire


def test_prepare_args_merge_over_args_and_go_with_a_script_only(tmp_path):
    spec_file = tmp_path / "p.yaml"
    spec_file.write_text(EXAMPLE.read_text())
    spec = load_spec(spec_file, ["payload.prepare_args.prepare_only=true", "payload.prepare_args.experts=8"])
    prepare = spec.to_wire("p-1", 1, "bench_marlin_moe.py")["payload"]["prepare"]
    assert prepare[:2] == ["--experts", "8"] and prepare[-1] == "--prepare-only"
    with pytest.raises(SpecError, match="prepare_command"):
        load_spec(spec_file, ["payload.prepare_command=[true]"])


def test_to_wire_uses_the_uploaded_script_name():
    wire = load_spec(EXAMPLE).to_wire("k26-1", 0, "user/bench_marlin_moe.py")
    assert wire["payload"]["script"] == "user/bench_marlin_moe.py"


def test_to_wire_with_command_and_no_service():
    wire = load_spec(DATA / "minimal.yaml").to_wire("minimal-1", 0, None)
    assert wire["service"] == {"manager": "none"}
    assert wire["payload"] == {"python": "python3", "script": None, "args": [], "command": ["sleep", "1"], "env": {},
                               "prepare": None}
    assert wire["gpu"]["devices"] == []


def test_to_wire_refuses_a_bad_job_id():
    with pytest.raises(SpecError, match="bad job id"):
        load_spec(EXAMPLE).to_wire("../etc", 0, None)


# -- overrides --------------------------------------------------------------------------------------------

def test_overrides_set_typed_values_and_create_mappings():
    spec = load_spec(EXAMPLE, ["payload.args.experts=128", "limits.max_runtime=2h", "gpu.devices=[0, 1]",
                               "payload.env.NEW_VAR=42", "gpu.min_free_mib=9000", "host.port=2222"])
    assert spec.payload.args["experts"] == 128 and spec.payload_args()[:2] == ["--experts", "128"]
    assert spec.limits.max_runtime == 7200.0 and spec.gpu.devices == [0, 1] and spec.gpu.min_free_mib == 9000
    assert spec.payload.env["NEW_VAR"] == "42" and spec.host.port == 2222


def test_overrides_create_missing_sections():
    spec = load_spec(DATA / "minimal.yaml", ["service.manager=systemd", "service.unit=sglang"])
    assert spec.service.unit == "sglang.service"


def test_later_override_wins_and_value_may_contain_equals():
    spec = load_spec(EXAMPLE, ["name=first", "name=a=b c"])
    assert spec.name == "a=b c"


def test_override_errors_still_name_the_field():
    assert_names_field(spec_error_lines(EXAMPLE, ["host.port=70000"]), EXAMPLE, "host.port")


# -- normalisation of valid inputs ------------------------------------------------------------------------

@pytest.mark.parametrize("unit, normalised", [
    ("sglang", "sglang.service"), ("sglang.service", "sglang.service"), ("getty@tty1", "getty@tty1.service"),
    ("backup.timer", "backup.timer"), ("model.v2", "model.v2.service"), ("mnt-a\\x2db.mount", "mnt-a\\x2db.mount"),
])
def test_unit_names_get_a_suffix_when_missing(unit, normalised):
    assert ServiceSpec(manager="systemd", unit=unit).unit == normalised


@pytest.mark.parametrize("address, normalised", [
    ("local", "local"), ("ct200", "ct200"), ("gpu-box.example.org", "gpu-box.example.org"),
    ("10.0.0.7", "10.0.0.7"), ("::1", "::1"), ("[fe80::1]", "fe80::1"),
])
def test_host_addresses(address, normalised):
    assert HostSpec(address=address).address == normalised


def test_gpu_uuids_are_devices(tmp_path):
    uuid = "GPU-aaaa8a08-769e-fec6-004a-c6a67ee83402"
    spec = load_spec(write_yaml(tmp_path, with_changes(example_document(), {"gpu.devices": [uuid, 1]})))
    assert spec.to_wire("x", 1, None)["gpu"]["devices"] == [uuid, "1"]


def test_hostile_but_valid_strings_round_trip_unchanged(tmp_path):
    path = tmp_path / HOSTILE.name
    shutil.copy(HOSTILE, path)
    script = tmp_path / """bench it's "quoted" v2.py"""
    script.write_text("print('hi')\n")
    spec = load_spec(path)
    assert spec.name == """it's "ok"; $(rm -rf /) & spaces"""
    assert spec.payload.env == {"QUOTES": """it's "quoted\"""", "SUBST": "$(rm -rf /)", "SEMI": "a;b && c | d",
                                "LINES": "line one\nline two\n", "BACKTICK": "`id`"}
    assert spec.payload_args() == ["--label", """a b; $(whoami) 'x' "y\"""", "--check"]
    assert spec.script_source(tmp_path / "no-such-payload-dir") == script
    wire = spec.to_wire(job_id_for(spec.name, NOW, "abcdef"), 0, None)
    assert wire["name"] == spec.name and wire["payload"]["env"] == spec.payload.env
    assert wire["payload"]["script"] == script.name
    assert json.loads(json.dumps(wire)) == wire


def test_section_from_options_validates_like_a_file():
    service = section_from_options(ServiceSpec, "--unit", manager="systemd", unit="sglang", sudo=True)
    assert service.unit == "sglang.service" and service.sudo is True
    with pytest.raises(SpecError) as info:
        section_from_options(HostSpec, "--host", address="ct200; id", colour="red")
    assert str(info.value).splitlines() == [
        "--host: address: address must be `local`, a host name, an ssh_config alias or an IP address; got 'ct200; id'",
        "--host: colour: unknown key (allowed: address, user, port, host_key_policy, root, python, connect_timeout, transport)"]


# -- script_source ----------------------------------------------------------------------------------------

def test_script_source_prefers_the_payload_dir(tmp_path):
    payload_root, spec_dir = tmp_path / "remote_payload", tmp_path / "jobs"
    payload_root.mkdir(), spec_dir.mkdir()
    (payload_root / "bench_marlin_moe.py").write_text("")
    (spec_dir / "bench_marlin_moe.py").write_text("")
    spec = load_spec(write_yaml(spec_dir, example_document()))
    assert spec.script_source(payload_root) == payload_root / "bench_marlin_moe.py"
    (payload_root / "bench_marlin_moe.py").unlink()
    assert spec.script_source(payload_root) == spec_dir / "bench_marlin_moe.py"


def test_script_source_missing_everywhere_is_a_spec_error(tmp_path):
    path = write_yaml(tmp_path, example_document())
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: payload.script: 'bench_marlin_moe.py'"):
        load_spec(path).script_source(tmp_path / "empty")


def test_script_source_is_none_for_a_command():
    assert load_spec(DATA / "minimal.yaml").script_source(DATA) is None


# -- job ids ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("k26-marlin-lever", "k26-marlin-lever-20261129-082605-abcdef"),
    ("""it's "ok"; $(rm -rf /) & spaces""", "it-s-ok-rm-rf-spaces-20261129-082605-abcdef"),
    ("Kimi K2.6 über", "Kimi-K2.6-uber-20261129-082605-abcdef"),
    ("..", "job-20261129-082605-abcdef"),
    ("---", "job-20261129-082605-abcdef"),
    ("日本語", "job-20261129-082605-abcdef"),
    ("x" * 100, "x" * 40 + "-20261129-082605-abcdef"),
])
def test_job_id_for(name, expected):
    assert job_id_for(name, NOW, "abcdef") == expected


@given(st.text(min_size=1, max_size=100))
def test_job_id_for_any_name_is_a_valid_id(name):
    job_id = job_id_for(name, NOW, "0a1b2c")
    assert JOB_ID_RE.fullmatch(job_id) and check_job_id(job_id) == job_id and not job_id.startswith(("-", "."))


@pytest.mark.parametrize("job_id", ["", ".", "..", "a/b", "a b", "-rf", "x" * 129, "ü", "a\nb", None, 5])
def test_check_job_id_refuses(job_id):
    with pytest.raises(SpecError, match="bad job id"):
        check_job_id(job_id)


def test_job_id_for_refuses_a_bad_rand():
    with pytest.raises(ValueError):
        job_id_for("x", NOW, "ABCDEF")


# -- bad inputs: each a SpecError naming the file and the field -------------------------------------------

BAD_FIELDS = [
    # unknown keys, at every level
    ("unknown-top", {"colour": "red"}, "colour"),
    ("unknown-host", {"host.colour": "red"}, "host.colour"),
    ("unknown-service", {"service.restart": True}, "service.restart"),
    ("unknown-gpu", {"gpu.count": 2}, "gpu.count"),
    ("unknown-payload", {"payload.argv": ["x"]}, "payload.argv"),
    ("unknown-limits", {"limits.timeout": 5}, "limits.timeout"),
    # wrong types and missing sections
    ("name-int", {"name": 5}, "name"),
    ("host-string", {"host": "ct200"}, "host"),
    ("host-missing", {"host": DELETE}, "host"),
    ("payload-missing", {"payload": DELETE}, "payload"),
    ("port-string", {"host.port": "22"}, "host.port"),
    ("policy-autoadd", {"host.host_key_policy": "auto-add"}, "host.host_key_policy"),
    ("sudo-string", {"service.sudo": "yes"}, "service.sudo"),
    ("stop-bad", {"service.stop": "sometimes"}, "service.stop"),
    ("devices-scalar", {"gpu.devices": 0}, "gpu.devices"),
    ("args-list", {"payload.args": [1, 2]}, "payload.args"),
    ("args-nested", {"payload.args.experts": {"n": 1}}, "payload.args.experts"),
    ("args-key-space", {"payload.args": {"a b": 1}}, 'payload.args."a b"'),
    ("env-string", {"payload.env": "A=B"}, "payload.env"),
    ("env-value-bool", {"payload.env.FLAG": True}, "payload.env.FLAG"),
    ("command-string", {"payload.script": DELETE, "payload.args": DELETE, "payload.command": "ls -l"},
     "payload.command"),
    # durations
    ("runtime-negative", {"limits.max_runtime": -5}, "limits.max_runtime"),
    ("runtime-zero", {"limits.max_runtime": 0}, "limits.max_runtime"),
    ("runtime-zero-text", {"limits.max_runtime": "0s"}, "limits.max_runtime"),
    ("runtime-absurd", {"limits.max_runtime": "8d"}, "limits.max_runtime"),
    ("runtime-word", {"limits.max_runtime": "forever"}, "limits.max_runtime"),
    ("runtime-overflow", {"limits.max_runtime": 10**400}, "limits.max_runtime"),
    ("runtime-inf", {"limits.max_runtime": float("inf")}, "limits.max_runtime"),
    ("grace-bool", {"limits.grace": True}, "limits.grace"),
    ("health-timeout-negative", {"service.health_timeout": -1}, "service.health_timeout"),
    ("drain-zero", {"gpu.drain_timeout": 0}, "gpu.drain_timeout"),
    ("connect-timeout-text", {"host.connect_timeout": "soon"}, "host.connect_timeout"),
    # host
    ("port-zero", {"host.port": 0}, "host.port"),
    ("port-huge", {"host.port": 70000}, "host.port"),
    ("address-option", {"host.address": "-oProxyCommand=sh"}, "host.address"),
    ("address-space", {"host.address": "ct200 ; id"}, "host.address"),
    ("address-ipv6-scope", {"host.address": "fe80::1%;id"}, "host.address"),
    ("user-semicolon", {"host.user": "root;id"}, "host.user"),
    ("root-relative", {"host.root": "runner"}, "host.root"),
    ("root-dollar", {"host.root": "/srv/${HOME}/runner"}, "host.root"),
    ("root-percent", {"host.root": "/srv/%h/runner"}, "host.root"),
    ("host-python-shell", {"host.python": "python3 -c 'import os'"}, "host.python"),
    # service
    ("unit-semicolon", {"service.unit": "sglang;reboot"}, "service.unit"),
    ("unit-subst", {"service.unit": "$(reboot).service"}, "service.unit"),
    ("unit-space", {"service.unit": "sglang server"}, "service.unit"),
    ("unit-slash", {"service.unit": "../sglang.service"}, "service.unit"),
    ("unit-slash-inner", {"service.unit": "a/b.service"}, "service.unit"),
    ("unit-dotdot", {"service.unit": "a..service"}, "service.unit"),
    ("unit-newline", {"service.unit": "sglang\nreboot"}, "service.unit"),
    ("unit-empty", {"service.unit": ""}, "service.unit"),
    ("unit-dash", {"service.unit": "--now"}, "service.unit"),
    ("unit-two-at", {"service.unit": "a@b@c.service"}, "service.unit"),
    ("unit-missing", {"service.unit": DELETE}, "service"),
    ("unit-without-systemd", {"service.manager": "none"}, "service"),
    ("health-ftp", {"service.health_url": "ftp://127.0.0.1/health"}, "service.health_url"),
    ("health-no-host", {"service.health_url": "http://"}, "service.health_url"),
    # payload.env keys
    ("env-digit", {"payload.env": {"1A": "x"}}, "payload.env.1A"),
    ("env-dash", {"payload.env": {"A-B": "x"}}, "payload.env.A-B"),
    ("env-space", {"payload.env": {"A B": "x"}}, 'payload.env."A B"'),
    ("env-empty", {"payload.env": {"": "x"}}, 'payload.env.""'),
    ("env-runner", {"payload.env": {"RUNNER_X": "x"}}, "payload.env.RUNNER_X"),
    ("env-nul", {"payload.env": {"A": "a\0b"}}, "payload.env.A"),
    # payload.python and script
    ("python-shell", {"payload.python": "python3; rm"}, "payload.python"),
    ("python-parent", {"payload.python": "../bin/python"}, "payload.python"),
    ("python-relative", {"payload.python": "venv/bin/python"}, "payload.python"),
    ("python-abs-dotdot", {"payload.python": "/root/../bin/python"}, "payload.python"),
    ("script-dotdot", {"payload.script": "../secret.py"}, "payload.script"),
    ("script-inner-dotdot", {"payload.script": "a/../../x.py"}, "payload.script"),
    ("script-absolute", {"payload.script": "/etc/passwd"}, "payload.script"),
    ("script-dot-part", {"payload.script": "./x.py"}, "payload.script"),
    ("script-empty-part", {"payload.script": "a//x.py"}, "payload.script"),
    ("script-empty", {"payload.script": ""}, "payload.script"),
    ("script-and-command", {"payload.command": ["ls"]}, "payload"),
    ("neither-script-nor-command", {"payload.script": DELETE}, "payload"),
    ("empty-command", {"payload.script": DELETE, "payload.args": DELETE, "payload.command": []}, "payload"),
    ("args-with-command", {"payload.script": DELETE, "payload.command": ["ls"]}, "payload"),
    # name
    ("name-newline", {"name": "two\nlines"}, "name"),
    ("name-empty", {"name": ""}, "name"),
    ("name-long", {"name": "x" * 101}, "name"),
    ("name-escape", {"name": "bell\x07"}, "name"),
    # gpu
    ("device-negative", {"gpu.devices": [-1]}, "gpu.devices.0"),
    ("device-duplicate", {"gpu.devices": [0, 1, 0]}, "gpu.devices"),
    ("device-bad-string", {"gpu.devices": ["gpu0"]}, "gpu.devices.0"),
    ("device-bool", {"gpu.devices": [0, True]}, "gpu.devices.1"),
    ("min-free-negative", {"gpu.min_free_mib": -1}, "gpu.min_free_mib"),
    ("min-free-lots", {"gpu.min_free_mib": "lots"}, "gpu.min_free_mib"),
]


@pytest.mark.parametrize("changes, field", [case[1:] for case in BAD_FIELDS], ids=[case[0] for case in BAD_FIELDS])
def test_bad_field_is_a_spec_error_naming_file_and_field(tmp_path, changes, field):
    path = write_yaml(tmp_path, with_changes(example_document(), changes))
    assert_names_field(spec_error_lines(path), path, field)


def test_every_error_is_reported_once_per_line(tmp_path):
    path = write_yaml(tmp_path, with_changes(example_document(), {"host.port": 0, "name": "", "gpu.colour": 1}))
    lines = spec_error_lines(path)
    for field in ("host.port", "name", "gpu.colour"):
        assert_names_field(lines, path, field)
    assert len(lines) == 3


@pytest.mark.parametrize("name, pattern", [
    ("unclosed_flow.yaml", r":\d+:\d+: "),
    ("tab_indent.yaml", r":3:1: found character '\\t'"),
    ("top_level_list.yaml", r": the top level must be a mapping"),
    ("latin1.yaml", r": not UTF-8 text \(byte 0xe9 at offset 9\)"),
])
def test_bad_files(name, pattern):
    path = DATA / "bad" / name
    lines = spec_error_lines(path)
    assert len(lines) == 1 and re.match(re.escape(str(path)) + pattern, lines[0]), lines


@pytest.mark.parametrize("content, pattern", [
    ("", r": the top level must be a mapping.*got nothing"),
    ("just text", r": the top level must be a mapping.*got str"),
    ("a: [1, 2\n", r":2:1: "),
    ("a: b: c\n", r":1:5: "),
    ("date: 2026-02-30\n", r": invalid YAML"),
    ("[" * 2000, r": "),
])
def test_bad_yaml_text(tmp_path, content, pattern):
    path = tmp_path / "job.yaml"
    path.write_text(content)
    assert re.match(re.escape(str(path)) + pattern, spec_error_lines(path)[0])


def test_duplicate_keys_are_refused_with_their_position(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nhost: {address: local}\npayload: {script: x.py}\nname: b\n")
    assert spec_error_lines(path) == [f"{path}:4:1: duplicate key 'name'"]


def test_merge_keys_may_override_what_they_merge(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: m\nhost: {address: local}\npayload:\n  script: x.py\n"
                    "  env: &base {A: '1', B: '2'}\n  args: {<<: *base, A: 3}\n")
    assert load_spec(path).payload.args == {"A": 3, "B": "2"}


def test_a_fifo_is_refused_without_blocking(tmp_path):
    path = tmp_path / "job.yaml"
    os.mkfifo(path)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(spec_error_lines, path)
        try:
            lines = loading.result(timeout=10)
        except FutureTimeout:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # gives the blocked reader its EOF
            raise AssertionError("load_spec blocked reading a FIFO") from None
    assert lines == [f"{path}: not a regular file"]


def test_many_errors_are_capped(tmp_path):
    path = write_yaml(tmp_path, with_changes(example_document(), {"gpu.devices": [-1] * 50}))
    lines = spec_error_lines(path)
    assert len(lines) == 21 and lines[-1] == f"{path}: … and 30 more errors"


def test_path_with_nul_is_a_spec_error():
    assert spec_error_lines("job\0.yaml")[0].startswith("'job\\x00.yaml': not a usable path")


def test_huge_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: x\n" + "# padding\n" * 110_000)
    assert spec_error_lines(path) == [f"{path}: larger than 1048576 bytes; a job spec is a small YAML file"]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    assert spec_error_lines(path) == [f"{path}: no such file"]


def test_unreadable_path(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "job.yaml"
    assert spec_error_lines(path) == [f"{path}: cannot read: Not a directory"]


def test_directory(tmp_path):
    assert spec_error_lines(tmp_path) == [f"{tmp_path}: is a directory, not a job spec file"]


@pytest.mark.parametrize("override, why", [
    ("noequals", "expected KEY=VALUE"),
    ("=x", "expected KEY=VALUE"),
    ("a..b=1", "expected KEY=VALUE"),
    ("payload.=1", "expected KEY=VALUE"),
    (" name=x", "expected KEY=VALUE"),
    ("payload.args.x=[1,", "the value is not valid YAML"),
    ("name.first=x", "name is not a mapping"),
])
def test_bad_override_is_named(override, why):
    lines = spec_error_lines(EXAMPLE, [override])
    assert lines == [lines[0]] and lines[0].startswith(f"{EXAMPLE}: --set {override!r}: ") and why in lines[0]


# -- properties -------------------------------------------------------------------------------------------

FIELD_NAMES = ["name", "host", "address", "service", "manager", "unit", "gpu", "devices", "payload", "script",
               "command", "args", "env", "limits", "max_runtime", "python", "port"]
SCALARS = (st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -10**400]) | st.floats()
           | st.text(max_size=20) | st.sampled_from(["local", "systemd", "x.py", "auto", "30s", "GPU-1"]))
KEYS = st.sampled_from(FIELD_NAMES) | st.text(max_size=10)
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
                         max_leaves=30)


def load_or_spec_error(path: Path) -> JobSpec | None:
    try:
        return load_spec(path)
    except SpecError:
        return None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300, deadline=None)
@given(DOCUMENTS)
def test_any_document_is_a_spec_or_a_spec_error(tmp_path, document):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    load_or_spec_error(path)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_any_text_is_a_spec_or_a_spec_error(tmp_path, content):
    path = tmp_path / "job.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    load_or_spec_error(path)


FIELD_PATHS = ["name", "host", "host.address", "host.port", "host.user", "host.root", "service", "service.manager",
               "service.unit", "service.health_url", "gpu.devices", "gpu.min_free_mib", "payload", "payload.python",
               "payload.script", "payload.args", "payload.args.experts", "payload.env", "payload.env.X",
               "payload.command", "limits.max_runtime", "limits.grace"]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300, deadline=None)
@given(st.sampled_from(FIELD_PATHS), DOCUMENTS)
def test_any_value_in_any_field_is_a_spec_or_a_spec_error(tmp_path, field, value):
    """The example with one field replaced: reaches every validator, unlike documents built from nothing."""
    path = write_yaml(tmp_path, with_changes(example_document(), {field: value}))
    load_or_spec_error(path)


PRINTABLE = st.text(st.characters(blacklist_categories=["Cc", "Cs", "Zl", "Zp"]), min_size=1, max_size=100)
ANY_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=40)
VALID_SPECS = st.fixed_dictionaries({
    "name": PRINTABLE.filter(str.isprintable),
    "host": st.just({"address": "local"}),
    "payload": st.fixed_dictionaries({
        "script": st.sampled_from(["x.py", "dir/with space/it's.py"]),
        "args": st.dictionaries(st.from_regex(r"[A-Za-z0-9_-]{1,8}", fullmatch=True),
                                st.none() | st.booleans() | st.integers() | ANY_TEXT
                                | st.lists(st.integers() | ANY_TEXT, min_size=1, max_size=3), max_size=4),
        "env": st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
            lambda k: not k.startswith("RUNNER_")), ANY_TEXT, max_size=4),
    }),
    "limits": st.fixed_dictionaries({"max_runtime": st.integers(1, 7 * 86400)}),
})


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200, deadline=None)
@given(VALID_SPECS)
def test_valid_specs_round_trip_through_the_wire_json(tmp_path, document):
    path = write_yaml(tmp_path, document)
    spec = load_spec(path)
    wire = spec.to_wire(job_id_for(spec.name, NOW, "abcdef"), 0, None)
    assert json.loads(json.dumps(wire)) == wire
    assert wire["name"] == document["name"] and wire["payload"]["env"] == document["payload"]["env"]
    assert wire["payload"]["args"] == spec.payload_args()


# -- files that are not job specs: their content never comes back in a message ----------------------------

SECRETS = ["hunter2-SECRET", "ghp_SECRETtoken0123", "sk-live-SECRET-4f3c9a", "AKIASECRETKEYID", "s3cr3t SECRET pass"]


@pytest.mark.parametrize("text", [
    "root:$6$SECRETsalt$hunter2-SECRET:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n",  # /etc/shadow
    "DB_PASSWORD: hunter2-SECRET\nGITHUB_TOKEN: ghp_SECRETtoken0123\n",  # a .env read as YAML
    '{"private_key": "sk-live-SECRET-4f3c9a", "client_email": "AKIASECRETKEYID"}\n',  # a JSON credentials file
    "sk-live-SECRET-4f3c9a: 1\nghp_SECRETtoken0123/x+y: 2\n",  # secrets as keys
    "[default]\naws_secret_access_key = AKIASECRETKEYID\n",  # an INI file
    "password: a\npassword: hunter2-SECRET\n",  # written twice
    "s3cr3t SECRET pass: 1\ns3cr3t SECRET pass: 2\n",
    "token: *ghp_SECRETtoken0123\n",  # an alias never defined
    "a: &sk-live-SECRET-4f3c9a 1\nb: &sk-live-SECRET-4f3c9a 2\n",  # an anchor twice
    "key: !hunter2-SECRET x\n",  # a tag
])
def test_a_file_that_is_not_a_job_spec_is_refused_without_its_content(tmp_path, text):
    path = tmp_path / "secrets"
    path.write_text(text)
    message = "\n".join(spec_error_lines(path))
    assert message.startswith(str(path)) and not any(secret in message for secret in SECRETS), message
    assert "SECRET" not in message, message


def test_an_unknown_key_that_does_not_look_like_one_is_named_by_its_line(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nhost: {address: local}\npayload: {command: ['true']}\n"
                    "ghp_SECRET token/0123: x\ncolour: red\n")
    assert sorted(spec_error_lines(path)) == sorted([
        f"{path}: the top-level key at line 4: unknown key (allowed: {', '.join(JobSpec.model_fields)})",
        f"{path}: colour: unknown key (allowed: {', '.join(JobSpec.model_fields)})"])


def test_a_mapping_with_no_spec_key_says_it_is_not_a_job_spec(tmp_path):
    path = tmp_path / "compose.yaml"
    path.write_text("services: {}\nvolumes: {}\n")
    assert spec_error_lines(path) == [
        f"{path}: not a job spec: none of its 2 top-level keys is a job spec key "
        f"({', '.join(JobSpec.model_fields)}); its content is not shown"]


# -- `--set KEY=` and the bounds of numbers -----------------------------------------------------------------

def test_an_empty_set_value_is_refused_saying_how_to_write_null():
    lines = spec_error_lines(EXAMPLE, ["payload.args.experts="])
    assert len(lines) == 1 and "an empty value; write payload.args.experts=null" in lines[0], lines


def test_an_explicit_null_leaves_an_argument_out():
    spec = load_spec(EXAMPLE, ["payload.args.experts=null"])
    assert spec.payload.args["experts"] is None and "--experts" not in spec.payload_args()


@pytest.mark.parametrize("mib", [99999999999999999999, (16 << 20) + 1])
def test_min_free_mib_past_16_tib_is_refused(tmp_path, mib):
    path = write_yaml(tmp_path, with_changes(example_document(), {"gpu.min_free_mib": mib}))
    lines = spec_error_lines(path)
    assert_names_field(lines, path, "gpu.min_free_mib")
    assert "at most 16777216 MiB" in lines[0]


def test_min_free_mib_of_16_tib_is_accepted(tmp_path):
    path = write_yaml(tmp_path, with_changes(example_document(), {"gpu.min_free_mib": 16 << 20}))
    assert load_spec(path).gpu.min_free_mib == 16 << 20
