"""A warm ssh master is reused only by a connection with the same effective settings: an alias of the same
host, port and user with another IdentityFile (a wrong key) logs in for itself and fails, however warm the
other alias's master is. Real loopback sshd, the OpenSSH transport (paramiko keeps no master)."""
from __future__ import annotations

import subprocess

from tests.cli_helpers import Target, run_cli, write_job


def test_a_wrong_key_never_rides_on_another_aliass_warm_master(ssh_host, work):
    config = work / "ssh_config"
    good = ssh_host.ssh_config.read_text()
    block = good.split(f"Host {ssh_host.alias}\n", 1)[1].split("\nHost ", 1)[0]
    stranger = work / "stranger_key"  # a key the host does not know
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    wrong = "\n".join(line.replace(line.split()[1], str(stranger)) if line.strip().startswith("IdentityFile") else line
                      for line in block.splitlines())
    config.write_text(f"{good}\nHost wrongkey\n{wrong}\n")
    env = {"RUNNER_SSH_CONFIG": str(config)}
    root = work / "root"
    right = Target("ssh", {"address": ssh_host.alias, "root": str(root), "transport": "openssh"}, root, env)
    other = Target("ssh", {"address": "wrongkey", "root": str(root), "transport": "openssh"}, root, env)
    assert subprocess.run(["ssh", "-F", str(config), "wrongkey", "true"], capture_output=True).returncode == 255

    warm = run_cli(right, "submit", str(write_job(work / "right.yaml", right, command=["true"])), "--dry-run")
    assert warm.returncode == 0, warm.stderr.decode()  # the right alias's master is up now
    for argv in (("submit", str(write_job(work / "wrong.yaml", other, command=["true"])), "--dry-run"),
                 ("restore-service", "--host", "wrongkey", "--unit", "nothing.service", "--max-wait", "5")):
        refused = run_cli(other, *argv)
        assert refused.returncode == 3 and b"authentication failed" in refused.stderr.lower(), \
            (argv[0], refused.returncode, refused.stderr.decode())
