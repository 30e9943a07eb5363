"""Session fixtures that start real test hosts (tests/hosts); a missing prerequisite skips, or fails in CI."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.cli_helpers import local_target
from tests.hosts import prereqs
from tests.hosts._proc import shared_tmpdir
from tests.hosts.netns import start_netns_host
from tests.hosts.prereqs import require
from tests.hosts.sshd import start_sshd
from tests.hosts.systemd_host import start_service_host

from tests.hosts.slurm_cluster import missing_prerequisites as missing_for_slurm  # noqa: E402

PREREQUISITES_BY_MARKER = {
    "systemd": prereqs.missing_for_systemd_host,
    "netns": prereqs.missing_for_netns_host,
    "slurm": missing_for_slurm,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the tests marked `slow(seconds=S)` (25 s to 2 min each on a 2-core CI machine: a guard's
    hard deadline, a cut link's timeout, a trickling engine) run first, the longest of them first; the rest
    after, in their order. With `-n` workers the longest start at once, not last, where one would run alone while
    the others sit idle (~1 min of `.ci/run`)."""
    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("slow")
        return marker.kwargs.get("seconds", 30) if marker is not None else 0

    items.sort(key=seconds, reverse=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker, missing in PREREQUISITES_BY_MARKER.items():
        if item.get_closest_marker(marker) is not None:
            require(missing())


@pytest.fixture(autouse=True)
def runner_state_dir(tmp_path, monkeypatch):
    """The controller's local state (job index, cursors) goes to a per-test dir, never the user's."""
    path = tmp_path / "runner-state"
    monkeypatch.setenv("RUNNER_STATE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def host_lock_place(tmp_path, monkeypatch):
    """A supervisor run on this machine (`address: local`, tests/harness/supervisor_calls) keeps its host-wide
    locks and ledger in a per-test dir, not this machine's /run/lock, which every test and test run shares. The
    test hosts (ssh) have their own /run/lock: sshd does not pass this on."""
    path = tmp_path / "host-locks"
    path.mkdir()
    monkeypatch.setenv("RUNNER_LOCK_DIR", str(path))
    return path


@pytest.fixture
def tmpfs_state_dir(runner_state_dir):
    """RUNNER_STATE_DIR on a small tmpfs of its own, so the test can make it read-only or full (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    runner_state_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(runner_state_dir)], check=True)
    yield runner_state_dir
    subprocess.run(["umount", "-l", str(runner_state_dir)], check=False)


@pytest.fixture(scope="session")
def ssh_host():
    """A loopback sshd (root login; `.as_user(host.non_root_user)` for the non-root one), shared by the session."""
    require(prereqs.missing_for_sshd())
    host = start_sshd()
    yield host
    host.stop()


@pytest.fixture(scope="session")
def service_host_session():
    """The confined systemd test host, started once per session; tests use `service_host`."""
    require(prereqs.missing_for_systemd_host())
    host = start_service_host()
    yield host
    host.stop()


@pytest.fixture
def service_host(service_host_session):
    """The systemd test host, reset first: default dummy unit active and healthy, default GPU, no locks."""
    service_host_session.reset()
    return service_host_session


@pytest.fixture
def fork_path(service_host):
    """These cases are about the fork + guard path (hosts without systemd): pin it on the systemd host, where
    the supervisor would otherwise run in a unit whose ExecStopPost= restores first (tests/integration/test_pid1.py)."""
    service_host.ssh(["sh", "-c", "mkdir -p /root/.runner && touch /root/.runner/launch-fork"], check=True)
    yield
    service_host.ssh(["rm", "-f", "/root/.runner/launch-fork"], check=True)


@pytest.fixture(scope="session")
def netns_host_session():
    """A systemd test host in its own network namespace, started once per session; tests use `netns_host`."""
    require(prereqs.missing_for_netns_host())
    host = start_netns_host()
    yield host
    host.stop()


@pytest.fixture
def netns_host(netns_host_session):
    """The network-namespace host with its link up (a previous test may have cut it), then reset."""
    netns_host_session.restore()
    netns_host_session.reset()
    return netns_host_session


@pytest.fixture
def work():
    """A fresh dir under /tmp that the hosts' other users can read: job files, payload scripts, logs of a test."""
    path = shared_tmpdir("runner-work-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def target():
    """The local host (`host.address: local`) with a host.root of its own; a module that drives another host
    (ssh, Slurm) defines its own `target`."""
    return local_target()
