"""`runner mcp` gives an agent less than a shell: job files only from the configured dirs, no overrides of what
runs or where, results by job id only, `local` and any other unit only when the server was started allowing
them. Each refusal is a tool error naming the flag that would allow it; nothing is run, read or started.

The tool functions are called directly (runner.mcp.mcp_server.Tools) and through the MCP SDK's own stdio client.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mcp")
import anyio  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from tests.harness.mcp_stdio import mcp_session  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ATTACK = ["host.address=local", "payload.script=null", "payload.args={}", "payload.command=[sh, -c, 'id > {marker}']"]
RUNS_OR_WHERE = ["payload.command=[true]", "payload.script=other.py", "payload.python=/bin/sh",
                 "payload.env.LD_PRELOAD=/tmp/x.so", "payload.prepare_command=[true]", "payload.prepare_args={a: 1}",
                 "host.address=local", "host.root=/tmp/elsewhere", "host.python=/bin/sh", "host.user=root",
                 "service.unit=sshd", "service.stop=always", "launcher=slurm"]


def write_spec(path: Path, *, address: str = "local", root: Path, unit: str | None = None) -> Path:
    service = {"manager": "systemd", "unit": unit} if unit else {"manager": "none"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": "trusted", "host": {"address": address, "root": str(root)}, "service": service,
                                    "payload": {"script": "demo_payload.py", "args": {"seconds": 1, "sizes": [1]}},
                                    "limits": {"max_runtime": "1m", "grace": "2s"}}))
    return path


@pytest.fixture
def project(tmp_path) -> dict:
    """A project dir: jobs/ with a local job and a remote one (a systemd unit), a secret file outside jobs/."""
    root = tmp_path / "host root"
    jobs = tmp_path / "project" / "jobs"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"password": "hunter2", "rows": [{"size": 1, "median_us": 1}]}))
    (jobs / "escape.yaml").parent.mkdir(parents=True)
    (jobs / "escape.yaml").symlink_to(write_spec(tmp_path / "outside.yaml", root=root))
    return {"root": root, "jobs": jobs, "secret": secret, "marker": tmp_path / "marker",
            "local": write_spec(jobs / "local.yaml", root=root),
            "remote": write_spec(jobs / "remote.yaml", address="gpu-box", root=root, unit="vllm")}


def tools(project: dict, **allow):
    from runner.mcp.mcp_policy import Policy
    from runner.mcp.mcp_server import Tools

    return Tools(Policy(jobs_dirs=(project["jobs"],), **allow))


def refusal(call, *args, **kwargs) -> str:
    from runner.errors import NotAllowed

    with pytest.raises(NotAllowed) as caught:
        call(*args, **kwargs)
    assert caught.value.exit_code == 2 and caught.value.code == "not-allowed"
    return f"{caught.value} {caught.value.hint}"


def test_job_files_only_from_the_jobs_dirs(project, tmp_path):
    t = tools(project, allow_local=True)
    for job_file in ("/etc/shadow", "/etc/passwd", str(tmp_path / "outside.yaml"), str(project["jobs"] / "escape.yaml"),
                     str(project["jobs"] / ".." / ".." / "outside.yaml"), str(project["jobs"] / "missing.yaml"),
                     str(project["secret"])):
        message = refusal(t.submit, job_file)
        assert "--jobs-dir" in message and "root:" not in message and "hunter2" not in message
    assert not project["root"].exists()  # no host was contacted


def test_overrides_of_what_runs_or_where_are_refused(project):
    t = tools(project, allow_local=True)
    for override in RUNS_OR_WHERE:
        assert "--allow-overrides" in refusal(t.submit, str(project["local"]), [override]), override
    attack = [a.replace("{marker}", str(project["marker"])) for a in ATTACK]
    assert "--allow-overrides" in refusal(t.submit, str(project["remote"]), attack)
    for new_argument in ("payload.args.out=/root/.ssh/authorized_keys", "payload.args={out: /etc/x}",
                         "sweep.matrix.out=[/etc/x]", "sweep.include=[{out: /etc/x}]"):
        assert "--allow-overrides" in refusal(t.submit, str(project["local"]), [new_argument]), new_argument
    assert not project["marker"].exists() and not project["root"].exists()


def test_local_only_when_allowed(project):
    message = refusal(tools(project).submit, str(project["local"]))
    assert "--allow-local" in message
    message = refusal(tools(project, allow_overrides=True).submit, str(project["remote"]), ["host.address=local"])
    assert "--allow-local" in message
    assert not project["root"].exists()


def test_results_by_job_id_only(project, tmp_path, monkeypatch):
    from runner.errors import SpecError, UnknownJob

    monkeypatch.chdir(tmp_path)
    t = tools(project)
    with pytest.raises(UnknownJob):
        t.results("secret.json")  # a file of that name in the cwd is never read
    with pytest.raises(SpecError):
        t.results(str(project["secret"]))
    (tmp_path / "baselines").mkdir()
    assert "--baselines-dir" in refusal(t.results, "any-job", baseline=str(project["secret"]))


def test_restore_service_only_for_units_of_known_job_files(project, tmp_path):
    t = tools(project)
    assert "--jobs-dir" in refusal(t.restore_service, job_file=str(tmp_path / "outside.yaml"))
    assert "--jobs-dir" in refusal(t.restore_service, host="gpu-box", unit="sshd")
    assert "--jobs-dir" in refusal(t.restore_service, host="other-box", unit="vllm")
    assert "--allow-local" in refusal(t.restore_service, host="local", unit="vllm")
    # a unit a job file names is found (its host and service sections are then used; no host is contacted here)
    for unit in ("vllm", "vllm.service"):
        assert t.policy.known_service("gpu-box", unit) == str(project["remote"].resolve())


def session(cwd: Path, state: Path, *flags: str):
    return mcp_session(state, *flags, cwd=cwd)


async def refused(client: ClientSession, tool: str, **arguments) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.content[0].text
    assert result.structured_content["error"] == "not-allowed", result.structured_content
    assert result.structured_content["exit"] == 2
    return result.content[0].text


def test_each_refusal_is_a_tool_error_over_stdio(project, tmp_path):
    (tmp_path / "project" / "x.json").write_text(project["secret"].read_text())
    attack = [a.replace("{marker}", str(project["marker"])) for a in ATTACK]

    async def go():
        async with session(tmp_path / "project", tmp_path / "state") as client:
            assert "--allow-overrides" in await refused(client, "submit", job_file="jobs/remote.yaml", overrides=attack)
            assert "--allow-local" in await refused(client, "submit", job_file="jobs/local.yaml")
            assert "--jobs-dir" in await refused(client, "submit", job_file="/etc/shadow")
            assert "--jobs-dir" in await refused(client, "restore_service", host="gpu-box", unit="sshd")
            answer = await client.call_tool("results", {"job_id": "x.json"})
            assert answer.is_error and "hunter2" not in answer.content[0].text
            assert answer.structured_content["error"] == "unknown-job"
    anyio.run(go)
    assert not project["marker"].exists() and not project["root"].exists()


def test_the_default_jobs_dir_is_the_cwds_and_allowed_flags_open_it(project, tmp_path):
    async def go():
        async with session(REPO, tmp_path / "state") as client:  # the repository's own jobs/demo.yaml is local
            assert "--allow-local" in await refused(client, "submit", job_file="jobs/demo.yaml")
            assert "--jobs-dir" in await refused(client, "submit", job_file=str(project["local"]))
        async with session(REPO, tmp_path / "state", "--jobs-dir", str(project["jobs"]), "--allow-local") as client:
            result = await client.call_tool("submit", {"job_file": "local.yaml",
                                                       "overrides": ["payload.args.seconds=1"]})
            assert not result.is_error, result.content[0].text
            assert result.structured_content["host"] == "local"
    anyio.run(go)
