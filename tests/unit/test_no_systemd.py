"""A host whose services are not run by systemd (a container, PID 1 something else): asking it to manage a unit
is a refusal that says so (exit 4 with a hint), not "the service failed to come back" (exit 1).

The systemctl here is a stand-in on PATH printing what the real one prints on such a host (captured on this
machine: Debian 12, PID 1 not systemd), so the test never reaches a real service manager."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.cli_helpers import REPO

REAL_OUTPUT = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
               "Failed to connect to bus: Host is down\n")


def test_restore_service_on_a_host_without_systemd_is_a_refusal(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "systemctl"
    stand_in.write_text("#!/bin/sh\nprintf '%s' \"$REAL\" >&2\nexit 1\n")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REAL": REAL_OUTPUT,
           "RUNNER_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "runner", "restore-service", "--host", "local", "--unit",
                           "sglang.service", "--max-wait", "5"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60)
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "not run by systemd" in done.stderr and "service.manager" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
