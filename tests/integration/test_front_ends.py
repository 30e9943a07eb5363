"""The two front ends give the same answer: one table of cases (an unknown id, a job, a fleet run's status,
results and cancel) walked through the CLI (a separate `runner` process) and the MCP server (a real stdio
session), each case comparing the exit code (MCP: cli_exit_code, or a tool error's exit) or the error code, and
the same facts (the states per host); then a run's tail, each byte once across both. The fleet is two logins of
the loopback sshd (two addresses, two homes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mcp")
import anyio  # noqa: E402

from tests.cli_helpers import Target, run_cli  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from tests.harness.mcp_stdio import mcp_session  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def session(env: dict, flags: tuple[str, ...]):
    """A real `runner mcp` process over stdio, sharing the CLI's state dir and ssh_config."""
    return mcp_session(Path(env["RUNNER_STATE_DIR"]), *flags, env=env)


async def call_raw(client: ClientSession, tool: str, **arguments) -> dict:
    """The tool's structured answer, or its error's {error, message, hint, exit}."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None, result.content
    return result.structured_content


def fleet_file(directory: Path, addresses: list[str], script: str) -> Path:
    spec = {"name": "front ends", "host": {"address": addresses}, "service": {"manager": "none"},
            "payload": {"command": ["sh", "-c", script]}, "limits": {"max_runtime": "1m", "grace": "1s"},
            "rollout": {"max_unavailable": 2}}
    path = directory / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def host_states(document: dict) -> dict:
    """A run's `status`: per host its phase and its job's state."""
    return {row["address"]: (row["phase"], (row.get("job") or {}).get("state")) for row in document["hosts"]}


def job_states(document) -> list:
    jobs = document["jobs"] if "jobs" in document else [document]  # MCP lists them, the CLI prints one
    return [(job["job_id"], job["state"]) for job in jobs]


def cancel_states(document: dict) -> dict:
    answers = document.get("hosts", document)
    return {address: (a.get("state"), bool(a.get("already"))) for address, a in answers.items()}


def result_hosts(document: dict) -> tuple:
    return sorted(document["results"]), sorted(document["missing"])




# (case, CLI args, MCP tool, MCP arguments, the facts of an answer, None: an error); RUN and JOB are filled in.
CASES = [
    ("unknown job id", ["status", "no-such-job", "--json"], "status", {"job_id": "no-such-job"}, None),
    ("a job's status", ["status", "JOB", "--json"], "status", {"job_id": "JOB"}, job_states),
    ("a fleet run's status", ["status", "RUN", "--json"], "status", {"job_id": "RUN"}, host_states),
    ("results of a run", ["results", "RUN", "--json"], "results", {"job_id": "RUN"}, result_hosts),
    ("a job that wrote no result", ["results", "JOB", "--json"], "results", {"job_id": "JOB"}, None),
    ("cancel of a run", ["cancel", "RUN", "--json"], "cancel", {"job_id": "RUN"}, cancel_states),
    ("unknown run's cancel", ["cancel", "no-such-run", "--json"], "cancel", {"job_id": "no-such-run"}, None),
]


@pytest.fixture
def fleet(ssh_host, tmp_path, runner_state_dir):
    """(the CLI's target, the server's env, the jobs dir, the two addresses)."""
    config = ssh_host.ssh_config
    addresses = [ssh_host.alias, ssh_host.as_user(ssh_host.non_root_user).alias]
    env = {"RUNNER_SSH_CONFIG": str(config), "RUNNER_STATE_DIR": str(runner_state_dir)}
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    return Target("ssh", {}, tmp_path, env), env, jobs, addresses


def fill(args, run_id: str):
    """RUN is the run's id, JOB its first host's job."""
    ids = {"RUN": run_id, "JOB": f"{run_id}.1"}
    if isinstance(args, dict):
        return {k: ids.get(v, v) for k, v in args.items()}
    return [ids.get(a, a) for a in args]


def test_the_same_cases_give_the_same_answer_from_both_front_ends(fleet):
    target, env, jobs, addresses = fleet
    spec = fleet_file(jobs, addresses, "echo hello from $RUNNER_JOB_ID")
    done = run_cli(target, "submit", str(spec), "--json", "--max-wait", "30")
    assert done.returncode == 0, done.stderr.decode()
    run_id = json.loads(done.stdout)["run_id"]

    async def go():
        async with session(env, ("--jobs-dir", str(jobs))) as client:
            for name, cli_args, tool, arguments, facts in CASES:
                shown = run_cli(target, *fill(cli_args, run_id))
                cli_doc = json.loads(shown.stdout)
                answer = await call_raw(client, tool, **fill(arguments, run_id))
                if facts is None:  # an error: the same code and exit from both
                    assert shown.returncode == answer["exit"] == cli_doc["exit"], name
                    assert cli_doc["error"] == answer["error"], (name, answer)
                    continue
                assert "error" not in answer, (name, answer)
                assert shown.returncode == answer["cli_exit_code"], (name, shown.stderr.decode(), answer)
                assert facts(cli_doc) == facts(answer), name
            status = await call_raw(client, "status", job_id=run_id)
            assert host_states(status) == {a: ("done", "SUCCEEDED") for a in addresses}
            # tail of a run: one cursor per host, shared: what the CLI printed, MCP does not give again
            tailed = run_cli(target, "tail", run_id)
            assert tailed.returncode == 0, tailed.stderr.decode()
            assert all(f"[{a}] hello from {run_id}.{i + 1}".encode() in tailed.stdout
                       for i, a in enumerate(addresses)), tailed.stdout
            again = await call_raw(client, "tail", job_id=run_id, max_wait=1)
            assert (again["text"], again["cli_exit_code"], again["call_again"]) == ("", 0, False), again
            assert again["hosts"] == {a: 0 for a in addresses}
    anyio.run(go)


def test_a_fleet_submitted_by_mcp_is_driven_within_max_wait_and_cancelled_like_the_cli(fleet):
    target, env, jobs, addresses = fleet
    spec = fleet_file(jobs, addresses, "echo started; sleep 30")

    async def go():
        async with session(env, ("--jobs-dir", str(jobs))) as client:
            run = await call_raw(client, "submit", job_file=str(spec), max_wait=5)
            assert "error" not in run, run
            assert run["cli_exit_code"] == 75 and not run["finished"]
            assert {h["address"]: h["phase"] for h in run["hosts"]} == {a: "started" for a in addresses}
            tailed = await call_raw(client, "tail", job_id=run["run_id"], max_wait=3)
            assert all(f"[{a}] started" in tailed["text"] for a in addresses), tailed
            assert tailed["cli_exit_code"] == 75 and tailed["call_again"]
            cancelled = await call_raw(client, "cancel", job_id=run["run_id"])
            assert set(cancelled["hosts"]) == set(addresses) and cancelled["cli_exit_code"] == 0
            return run["run_id"]

    run_id = anyio.run(go)
    ended = run_cli(target, "wait", run_id, "--timeout", "30s", "--json", timeout=60)
    assert ended.returncode == 1, ended.stderr.decode()  # cancelled: ended other than SUCCEEDED
    shown = json.loads(run_cli(target, "status", run_id, "--json").stdout)
    assert {state for _, state in host_states(shown).values()} == {"CANCELLED"}


def test_the_servers_policy_holds_for_fleet_files(tmp_path, runner_state_dir):
    """A fleet file obeys the trust model as a one-host file does: `local` in its list, an override of where it
    runs, a file outside the jobs dirs: each refused (not-allowed, exit 2) before any host is contacted."""
    jobs, elsewhere = tmp_path / "jobs", tmp_path / "elsewhere"
    jobs.mkdir(), elsewhere.mkdir()
    with_local = fleet_file(jobs, ["local", "127.0.0.1"], "echo hi")
    outside = fleet_file(elsewhere, ["a-host", "b-host"], "echo hi")
    env = {"RUNNER_STATE_DIR": str(runner_state_dir)}

    async def go():
        async with session(env, ("--jobs-dir", str(jobs))) as client:
            refused = [await call_raw(client, "submit", job_file=str(with_local)),
                       await call_raw(client, "submit", job_file=str(with_local),
                                      overrides=["host.address=[a-host, b-host]"]),
                       await call_raw(client, "submit", job_file=str(outside))]
            assert [(r.get("error"), r.get("exit")) for r in refused] == [("not-allowed", 2)] * 3, refused
            assert "local" in refused[0]["message"] and "host.address" in refused[1]["message"]
            assert (await call_raw(client, "list"))["jobs"] == []
    anyio.run(go)
