"""What the README and the guide tell a new user to do holds: command 1 makes its own venv (Debian's python3 refuses a
pip install outside one, PEP 668), `runner mcp` names the extra it needs, a `payload.script` outside the job
file's directory is refused with the same rule the README gives, and ~/.ssh/config is read where `ssh` reads it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from runner.errors import SpecError
from runner.spec.spec_load import load_spec

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
GUIDE = (REPO / "docs" / "guide.md").read_text()


def command_one() -> str:
    section = README.split("## Set-up on a fresh machine", 1)[1].split("\n2. ", 1)[0]
    return section.split("```", 2)[1].strip()


def test_command_one_installs_into_a_venv_it_makes_and_runs_the_demo():
    line = command_one()
    assert "\n" not in line, line
    steps = [step.strip() for step in re.split(r"&&|;", line)]
    assert steps[0].startswith("python3 -m venv "), steps
    venv = steps[0].split()[-1]
    install = next(step for step in steps if " install " in f" {step} ")
    assert install.startswith(("pip ", f"{venv}/bin/pip ", f"{venv}/bin/python -m pip ")) or \
        any(s in (f". {venv}/bin/activate", f"source {venv}/bin/activate") for s in steps[:steps.index(install)]), steps
    assert "python3 -m pip" not in line  # the system interpreter's pip: PEP 668 refuses it
    assert "runner submit jobs/demo.yaml" in line and "runner results" in line


def test_where_runner_mcp_is_introduced_it_says_it_needs_the_mcp_extra():
    first = README.index("`runner mcp`")
    assert "[mcp]" in README[first:first + 200] or "mcp" in command_one().split("install", 1)[1].split("&&")[0]


def test_a_script_above_the_job_file_is_refused_saying_where_a_script_may_live(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: x\nhost: {address: local}\nservice: {manager: none}\npayload: {script: ../bench.py}\n")
    with pytest.raises(SpecError, match=r"payload\.script: .*at or below the job file's directory"):
        load_spec(str(job), [])
    assert "`../bench.py`" in GUIDE and "at or below it" in GUIDE


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_ssh_reads_the_config_of_the_passwd_home_not_of_HOME(tmp_path):
    """What the README says of the default transport, which resolves a host with `ssh -G` (no connection)."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host readme-home-probe\n  HostName 127.0.0.9\n")
    resolved = subprocess.run(["ssh", "-G", "readme-home-probe"], capture_output=True, text=True, timeout=10,
                              env={**os.environ, "HOME": str(tmp_path)}).stdout
    assert "hostname readme-home-probe" in resolved.splitlines(), resolved  # $HOME's config was not read
    assert "passwd database, not in `$HOME`" in " ".join(GUIDE.split())
