"""The controller's edges, on this machine (`host.address: local`) and in pure functions: values an MCP client
sets are data, never code; the state dir is private whatever the umask; untrusted text is printable in every
view; the bundle digest names one set of files; a host answering no JSON is a bad answer (exit 3).
The SSH edges (answers capped while read, failed logins, the command's deadline) are in
test_controller_edges_ssh.py.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import yaml

from remote_payload import sweep
from runner.errors import BadAnswer, NotAllowed
from runner.printable import printable
from runner.remote.bundles import Bundle
from runner.remote.host import HostClient
from runner.remote.transport import Completed
from tests.cli_helpers import REPO, local_target, run_cli, wait_terminal, write_job

INJECTION = "1; touch {marker}; echo"


def sweep_job(path, root, values) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "name": "sweep", "host": {"address": "local", "root": str(root)}, "service": {"manager": "none"},
        "payload": {"command": ["sh", "-c", "echo running n={n}"]}, "sweep": {"matrix": {"n": values}},
        "limits": {"max_runtime": "1m", "grace": "2s"}}))
    return str(path)


def mcp_tools(jobs):
    from runner.mcp.mcp_policy import Policy
    from runner.mcp.mcp_server import Tools

    return Tools(Policy(jobs_dirs=(jobs,), allow_local=True))


# -- 1. an MCP client's values are data ---------------------------------------------------------------------

def test_mcp_refuses_a_sweep_value_that_is_not_data(tmp_path):
    marker = tmp_path / "marker"
    job = sweep_job(tmp_path / "jobs" / "sweep.yaml", tmp_path / "root", [1, 2])
    tools = mcp_tools(tmp_path / "jobs")
    for override in (f"sweep.matrix.n=['{INJECTION.format(marker=marker)}']",
                     f"sweep.matrix.n=['$(touch {marker})']", "sweep.include=[{n: '`id`'}]", "name='a b'",
                     "sweep.matrix.n=[--output=/etc/passwd]", "sweep.matrix.n=[../../etc]"):
        with pytest.raises(NotAllowed) as refused:
            tools.submit(job, [override])
        assert "--allow-overrides" in refused.value.hint, override
    assert not marker.exists() and not (tmp_path / "root").exists()  # nothing ran


def test_mcp_allows_numbers_plain_tokens_and_the_job_files_own_values(tmp_path):
    job = sweep_job(tmp_path / "jobs" / "sweep.yaml", tmp_path / "root", [1, "two words"])
    tools = mcp_tools(tmp_path / "jobs")
    for override in ("sweep.matrix.n=[3, 4.5, v1.2_rc-3]", "sweep.matrix.n=['two words']", "name=nightly-run_2"):
        assert tools.submit(job, [override], max_wait=20)["job_id"], override


def test_a_value_substituted_into_a_shell_script_is_quoted(tmp_path):
    filled = sweep.fill(["bash", "-lc", "echo n={n} > out", "argv0-{n}"], {"n": "1; id"})
    assert filled == ["bash", "-lc", "echo n='1; id' > out", "argv0-1; id"]
    assert sweep.fill(["sh", "-c", "echo {n}"], {"n": [1, 2]}) == ["sh", "-c", "echo 1,2"]
    assert sweep.fill(["python3", "-c", "print({n})"], {"n": "1; id"}) == ["python3", "-c", "print(1; id)"]


def test_a_sweep_value_never_runs_as_shell_code(tmp_path):
    """The CLI allows any value (its user has a shell already); the value still reaches `sh -c` as data."""
    target = local_target()
    marker = tmp_path / "marker"
    job = sweep_job(tmp_path / "sweep.yaml", target.root, [1])
    done = run_cli(target, "submit", job, "--json", "--set", f"sweep.matrix.n=['{INJECTION.format(marker=marker)}']")
    assert done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    log = run_cli(target, "tail", job_id, "--from-start").stdout.decode()
    assert f"running n={INJECTION.format(marker=marker)}" in log
    assert not marker.exists()


# -- 2. the state dir is private ----------------------------------------------------------------------------

def test_every_state_file_is_private_whatever_the_umask(tmp_path, runner_state_dir):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["sh", "-c", "echo '{\"rows\": []}' > \"$RUNNER_RESULT\""],
                    env={"HF_TOKEN": "hf_secret"})
    umask_0 = ["sh", "-c", 'umask 000 && exec "$@"', "sh", sys.executable, "-m", "runner"]
    env = {**os.environ, "RUNNER_STATE_DIR": str(runner_state_dir)}
    done = subprocess.run(umask_0 + ["submit", str(job), "--json"], capture_output=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    wait_terminal(target, job_id)
    subprocess.run(umask_0 + ["results", job_id], capture_output=True, env=env, cwd=REPO)
    assert (runner_state_dir / "bundle-files.json").is_file() and any(runner_state_dir.rglob("history.sqlite3"))
    loose = [f"{oct(path.lstat().st_mode & 0o777)} {path}" for path in [runner_state_dir, *runner_state_dir.rglob("*")]
             if stat.S_IMODE(path.lstat().st_mode) & 0o077 and not path.is_symlink()]
    assert loose == []


# -- 4. smaller edges ---------------------------------------------------------------------------------------

def test_a_payload_script_linked_to_another_name_is_bundled(tmp_path):
    target = local_target()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "real_bench.py").write_text("import helper\nhelper.go()\n")
    (tmp_path / "lib" / "helper.py").write_text("def go():\n    print('helped')\n")
    (tmp_path / "bench.py").symlink_to(tmp_path / "lib" / "real_bench.py")
    job = write_job(tmp_path / "job.yaml", target, script="bench.py")
    done = run_cli(target, "submit", str(job), "--json")
    assert b"Traceback" not in done.stderr and done.returncode == 0, done.stderr.decode()
    job_id = json.loads(done.stdout)["job_id"]
    assert wait_terminal(target, job_id)["state"] == "SUCCEEDED"
    assert "helped" in run_cli(target, "tail", job_id, "--from-start").stdout.decode()


@pytest.mark.parametrize("char", ["\u202e", "\u202c", "\u2066", "\u200f", "\u2028", "\u2029", "\x9b", "\x7f"])
def test_bidi_controls_and_line_separators_are_made_printable(char):
    assert char not in printable(f"a{char}b")
    assert char not in printable(f"a{char}b", multiline=False)


def test_mcp_text_is_printable_and_stays_the_same_json():
    from runner.mcp.mcp_server import _error, printable_json

    text = _error("bad-answer", "host said \x9b31m\u202egnp.exe\u2028", "hint \u202e", 3).content[0].text
    assert not any(char in text for char in "\x9b\u202e\u2028")
    document = {"log": "a\x9b2J\u202eb\u2028c\x7f", "n": 1}
    sent = printable_json(json.dumps(document, ensure_ascii=False, indent=2))
    assert not any(char in sent for char in "\x9b\u202e\u2028\x7f") and json.loads(sent) == document


def test_the_bundle_digest_names_one_set_of_files():
    assert Bundle({"a": b"x", "b": b"y"}).digest != Bundle({"a": b"x\0b\0y"}).digest
    assert Bundle({"a": b"x\0"}).digest != Bundle({"a\0x": b""}).digest


def test_the_host_checks_the_same_digest_on_upload(tmp_path):
    target = local_target()
    job = write_job(tmp_path / "job.yaml", target, command=["true"])
    done = run_cli(target, "submit", str(job), "--json")  # a fresh ROOT: both bundles uploaded and checked
    assert done.returncode == 0, done.stderr.decode()


class BannerTransport:
    """FAKE host, labelled: every call answers `stdout` (exit 0) instead of running the supervisor, as a host
    whose login prints a banner, or a broken python, does."""

    name = "banner"

    def __init__(self, stdout: bytes) -> None:
        self.stdout = stdout

    def run(self, argv, *, stdin=b"", deadline) -> Completed:
        return Completed(tuple(argv), 0, self.stdout, b"")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("stdout", [b"hello\n", b"Welcome to the host!\n{not json\n", b"[1, 2]\n"])
def test_a_host_answering_no_json_is_a_bad_answer_exit_3(stdout):
    from runner.deadline import Deadline

    client = HostClient(BannerTransport(stdout), root="/r", python="python3", bundle=Bundle({}),
                        deadline=Deadline.for_command(5))
    with pytest.raises(BadAnswer) as caught:
        client.status(["j1"])
    assert caught.value.exit_code == 3 and caught.value.code == "bad-answer"
