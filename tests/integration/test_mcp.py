"""`runner mcp` through the MCP SDK's own client over stdio: a real session with a real server process.

Jobs go to the local host (the demo payload, 3 s) with the host root and the state dir in tmp_path; the server
is started trusting the caller (--allow-overrides --allow-local) unless a test says otherwise; what it refuses
by default is tests/integration/test_mcp_trust.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")
import anyio  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from tests.harness.mcp_stdio import mcp_session  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOOLS = {"submit", "tail", "status", "list", "cancel", "results", "restore_service"}


TRUSTING = ("--allow-overrides", "--allow-local")


def session(state: Path, env: dict | None = None, flags: tuple[str, ...] = TRUSTING):
    return mcp_session(state, *flags, env=env)


async def call(client: ClientSession, tool: str, **arguments):
    """The tool's JSON answer (its structured content, the same as its text); asserts it was not an error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    assert result.structured_content == json.loads(result.content[0].text)
    return result.structured_content


async def error_of(client: ClientSession, tool: str, **arguments) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    return result.content[0].text


async def structured_error(client: ClientSession, tool: str, **arguments) -> dict:
    """A tool error's {error, message, hint, exit}: one line of text that says the same."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content
    text, error = result.content[0].text, result.structured_content
    assert "\n" not in text and text.startswith(f"{error['error']}: {error['message']}"), text
    assert f"[exit code {error['exit']}]" in text
    return error


def demo_overrides(root: Path, seconds: int, address: str = "local") -> list[str]:
    return [f"payload.args.seconds={seconds}", f"host.root={root}", f"host.address={address}"]


@pytest.fixture(params=["local", "ssh"])
def host(request) -> tuple[str, Path, dict]:
    """(host.address, host root as seen from here, server env): this machine, or the loopback sshd."""
    from tests.hosts._proc import shared_tmpdir

    root = shared_tmpdir("runner-mcp-root-") / "host root"
    if request.param == "local":
        return "local", root, {}
    sshd = request.getfixturevalue("ssh_host")
    return sshd.alias, root, {"RUNNER_SSH_CONFIG": str(sshd.ssh_config)}


async def tail_until_done(client: ClientSession, job_id: str, **kw) -> tuple[str, dict, int]:
    text, calls = "", 0
    while True:
        started = time.monotonic()
        answer = await call(client, "tail", job_id=job_id, **kw)
        assert time.monotonic() - started < kw.get("max_wait", 50) + 10  # max_wait + one round trip
        text, calls = text + answer["text"], calls + 1
        if not answer["call_again"]:
            return text, answer, calls


def test_tools_are_listed_with_bounded_waits(tmp_path):
    async def go():
        async with session(tmp_path / "state") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            assert tools["tail"].input_schema["properties"]["max_wait"]["maximum"] == 100
            assert tools["restore_service"].input_schema["properties"]["max_wait"]["maximum"] == 100
            assert tools["submit"].input_schema["required"] == ["job_file"]
    anyio.run(go)


def test_submit_tail_every_byte_once_then_results(tmp_path, host):
    address, root, env = host
    async def go():
        async with session(tmp_path / "state", env) as client:
            # Eight rows: a log past max_bytes, so it takes more than one call even when the first comes after the
            # job's end (four rows made ~0.9 KB: one call on a loaded machine).
            sizes = [1, 2, 4, 8, 16, 32, 64, 128]
            done = await call(client, "submit", job_file="jobs/demo.yaml",
                              overrides=[*demo_overrides(root, 3, address), f"payload.args.sizes={sizes}"])
            job_id = done["job_id"]
            assert done["host"] == address
            text, last, calls = await tail_until_done(client, job_id, max_wait=5, max_bytes=1024)
            log = (root / "jobs" / job_id / "output.log").read_bytes()
            assert len(log) > 1024 and text.encode() == log and calls > 1
            assert (last["state"], last["cli_exit_code"], last["call_again"]) == ("SUCCEEDED", 0, False)
            again = await call(client, "tail", job_id=job_id, max_wait=1)
            assert again["text"] == "" and again["call_again"] is False  # nothing twice
            res = await call(client, "results", job_id=job_id)
            assert "payload: demo" in res["table"] and [r["size"] for r in res["result"]["rows"]] == sizes
            assert res["history_warning"] is None
            (job,) = (await call(client, "status", job_id=job_id))["jobs"]
            assert job["state"] == "SUCCEEDED"
            assert [j["job_id"] for j in (await call(client, "list"))["jobs"]] == [job_id]
    anyio.run(go)


def test_a_bad_job_file_is_a_tool_error_naming_the_field(tmp_path):
    bad = tmp_path / "bad job.yaml"
    bad.write_text((REPO / "jobs" / "demo.yaml").read_text().replace("max_runtime: 5m", "max_runtime: soon"))
    async def go():
        async with session(tmp_path / "state", flags=(*TRUSTING, "--jobs-dir", str(tmp_path))) as client:
            message = await error_of(client, "submit", job_file=str(bad))
            assert "limits.max_runtime" in message and "not a duration" in message and "[exit code 2]" in message
            message = await error_of(client, "tail", job_id="no-such-job", max_wait=1)
            assert "unknown job id 'no-such-job'" in message and "[exit code 2]" in message
            message = await error_of(client, "tail", job_id="x", max_wait=101)
            assert "max_wait" in message  # refused before any host call: bounded by contract
    anyio.run(go)


def test_cancel_ends_the_job_cancelled(tmp_path):
    async def go():
        async with session(tmp_path / "state") as client:
            job_id = (await call(client, "submit", job_file="jobs/demo.yaml",
                                 overrides=demo_overrides(tmp_path / "host root", 60)))["job_id"]
            first = await call(client, "tail", job_id=job_id, max_wait=10)
            assert first["call_again"] is True and first["text"]
            await call(client, "cancel", job_id=job_id)
            _, last, _ = await tail_until_done(client, job_id, max_wait=10)
            assert (last["state"], last["cli_exit_code"]) == ("CANCELLED", 1)
    anyio.run(go)


def test_argument_errors_are_one_line_and_unknown_arguments_are_refused(tmp_path):
    async def go():
        async with session(tmp_path / "state") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert all(t.input_schema["additionalProperties"] is False for t in tools.values())
            error = await structured_error(client, "tail", job_id="x", bogus=1, max_wait=1)
            assert (error["error"], error["exit"]) == ("bad-args", 2) and "'bogus'" in error["message"]
            assert "max_bytes" in error["message"]  # says what the tool takes
            error = await structured_error(client, "tail", job_id="x", max_wait="soon")
            assert error["error"] == "bad-args" and error["message"].startswith("tail: max_wait: ")
            assert "pydantic" not in error["message"] and "validation error" not in error["message"]
            error = await structured_error(client, "submit")
            assert error["message"] == "submit: job_file: Field required"
            error = await structured_error(client, "list", everything=True)
            assert "list takes detail" in error["message"]
    anyio.run(go)


def test_status_of_a_job_its_host_does_not_know_is_unknown_job_as_in_the_cli(tmp_path):
    """The CLI says unknown job (exit 2, error unknown-job) for a job whose directory is gone: MCP the same."""
    root = tmp_path / "host root"
    state = tmp_path / "state"
    async def go():
        async with session(state) as client:
            done = await call(client, "submit", job_file="jobs/demo.yaml", overrides=demo_overrides(root, 1))
            job_id = done["job_id"]
            await tail_until_done(client, job_id, max_wait=10)
            shutil.rmtree(root / "jobs" / job_id)
            cli = subprocess.run([sys.executable, "-m", "runner", "status", job_id, "--json"], capture_output=True,
                                 cwd=REPO, env={**os.environ, "RUNNER_STATE_DIR": str(state)})
            assert cli.returncode == 2 and json.loads(cli.stdout)["error"] == "unknown-job", cli.stdout
            error = await structured_error(client, "status", job_id=job_id)
            assert error == json.loads(cli.stdout)
            cli_tail = subprocess.run([sys.executable, "-m", "runner", "tail", "no-such-job", "--json"],
                                      capture_output=True, cwd=REPO, env={**os.environ, "RUNNER_STATE_DIR": str(state)})
            error = await structured_error(client, "tail", job_id="no-such-job", max_wait=1)
            assert error == json.loads(cli_tail.stdout) and error["error"] == "unknown-job"
    anyio.run(go)


def test_error_codes_are_stable_kebab_case_and_match_the_wire():
    import re

    from remote_payload.contract import ERRORS
    from runner import errors

    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.RunnerError)]
    codes = {c.__name__: c.code for c in classes}
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", code) for code in codes.values()), codes
    own = {name: code for name, code in codes.items() if name != "RemoteError"}
    assert len(set(own.values())) == len(own), own  # one code, one class
    for name, wire in (("UnknownJob", "unknown-job"), ("NoResult", "no-result"), ("HostBusy", "busy"),
                       ("SchedulerUnavailable", "slurm-unavailable"), ("SpecError", "bad-spec"),
                       ("RunnerError", "internal")):
        assert codes[name] == wire and wire in ERRORS
    assert errors.RemoteError("x", code="drain-timeout").code == "drain-timeout"
    assert errors.RemoteError("x", code="\x1b]0;made up").code == "internal"  # a host cannot add codes


def test_answers_are_compact_by_default_and_whole_with_detail(tmp_path):
    """An agent pays for every byte: list names each job in one short entry (not its spec), status opens with
    the state and the CLI's text (not the supervisor's budget); detail gives what the CLI's --json gives."""
    async def go():
        async with session(tmp_path / "state") as client:
            ids = [(await call(client, "submit", job_file="jobs/demo.yaml",
                               overrides=demo_overrides(tmp_path / "host root", 1)))["job_id"] for _ in range(3)]
            for job_id in ids:
                await tail_until_done(client, job_id, max_wait=20)
            listed = await call(client, "list")
            assert [j["job_id"] for j in listed["jobs"]] == ids
            assert set(listed["jobs"][0]) == {"job_id", "state", "host", "submitted", "name"}
            assert len(json.dumps(listed)) < 150 * len(ids) + 100, listed
            whole = await call(client, "list", detail=True)
            assert "wire" in whole["jobs"][0] and len(json.dumps(whole)) > 4 * len(json.dumps(listed))
            (job,) = (await call(client, "status", job_id=ids[0]))["jobs"]
            assert list(job)[:2] == ["job_id", "state"] and job["state"] == "SUCCEEDED" and "budget" not in job
            assert job["text"].startswith(f"{ids[0]}: SUCCEEDED") and "elapsed" in job["text"]
            (raw,) = (await call(client, "status", job_id=ids[0], detail=True))["jobs"]
            assert "budget" in raw and raw["state"] == "SUCCEEDED"
            everyone = await call(client, "status")
            assert [j["job_id"] for j in everyone["jobs"]] == ids and all("budget" not in j for j in everyone["jobs"])
    anyio.run(go)


def test_tail_follows_until_the_job_ends_within_max_wait(tmp_path):
    """Like `runner tail -f --max-wait`: one call returns the whole log of a job that ends within max_wait;
    follow=false returns at the first bytes, as before."""
    root = tmp_path / "host root"
    async def go():
        async with session(tmp_path / "state") as client:
            job_id = (await call(client, "submit", job_file="jobs/demo.yaml",
                                 overrides=demo_overrides(root, 3)))["job_id"]
            started = time.monotonic()
            answer = await call(client, "tail", job_id=job_id, max_wait=60)
            assert (answer["state"], answer["call_again"]) == ("SUCCEEDED", False), answer
            assert answer["text"].encode() == (root / "jobs" / job_id / "output.log").read_bytes()
            assert time.monotonic() - started < 60 + 10
            job_id = (await call(client, "submit", job_file="jobs/demo.yaml",
                                 overrides=demo_overrides(root, 30)))["job_id"]
            first = await call(client, "tail", job_id=job_id, max_wait=60, follow=False)
            assert first["call_again"] is True and first["text"] and first["state"] != "SUCCEEDED"
            bounded = time.monotonic()
            more = await call(client, "tail", job_id=job_id, max_wait=2)
            assert more["call_again"] is True and time.monotonic() - bounded < 2 + 10  # bounded by max_wait
            await call(client, "cancel", job_id=job_id)
    anyio.run(go)
