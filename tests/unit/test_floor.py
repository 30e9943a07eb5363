"""tests/unit is the floor `.ci/run` runs first, in seconds: no test there may start a host (sshd, the confined
systemd, Slurm, a network namespace) or run a job on one. A module there that asks for a host fixture, imports a
host starter or a job driver, fails here: move it to tests/integration."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
HOST_FIXTURES = {"ssh_host", "service_host", "service_host_session", "netns_host", "netns_host_session", "fork_path",
                 "cluster", "target"}
HOST_MODULES = ("tests.hosts.sshd", "tests.hosts.systemd_host", "tests.hosts.netns", "tests.hosts.slurm_cluster",
                "tests.harness.systemd_jobs", "tests.harness.supervisor_calls",
                "tests.harness.host_reports", "tests.harness.multi_services", "tests.harness.mcp_stdio",
                "tests.harness.slurm_jobs")
JOB_DRIVERS = {"local_target", "submit", "wait_terminal", "run_cli"}  # tests.cli_helpers: a job's whole life


def host_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            found += [f"{node.name}({arg.arg})" for arg in node.args.args if arg.arg in HOST_FIXTURES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(HOST_MODULES):
                found.append(f"from {node.module} import …")
            elif node.module == "tests.cli_helpers":
                found += [f"from tests.cli_helpers import {a.name}" for a in node.names if a.name in JOB_DRIVERS]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.startswith(HOST_MODULES)]
    return found


@pytest.mark.parametrize("path", sorted((TESTS / "unit").glob("test_*.py")), ids=lambda p: p.name)
def test_no_unit_test_starts_a_host(path):
    assert host_uses(path) == []


def test_the_floor_is_not_empty_and_the_check_sees_a_host(tmp_path):
    assert len(list((TESTS / "unit").glob("test_*.py"))) > 10
    probe = tmp_path / "test_probe.py"
    probe.write_text("from tests.hosts.sshd import start_sshd\nfrom tests.cli_helpers import REPO, submit\n\n"
                     "def test_x(ssh_host):\n    pass\n")
    assert sorted(host_uses(probe)) == ["from tests.cli_helpers import submit", "from tests.hosts.sshd import …",
                                        "test_x(ssh_host)"]
