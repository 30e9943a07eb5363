"""The test hosts themselves work: each fixture does what the other tests rely on."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.pace import Scale
from tests.hosts._proc import free_port, wait_until
from tests.hosts.netns import (BLACKHOLE_MARKER, addresses_in_test_range, namespaces_of_test_runs, net_lock,
                              start_netns_host)
from tests.hosts.prereqs import missing_for_sshd, require
from tests.hosts.sshd import start_sshd
from tests.hosts.systemd_host import start_service_host


def test_root_login_runs_a_command(ssh_host):
    result = ssh_host.ssh(["id", "-un"])
    assert (result.returncode, result.stdout) == (0, "root\n"), result.stderr


def test_non_root_login_runs_a_command(ssh_host):
    result = ssh_host.as_user(ssh_host.non_root_user).ssh(["id", "-un"])
    assert (result.returncode, result.stdout) == (0, f"{ssh_host.non_root_user}\n"), result.stderr


def test_logins_have_plain_shells_and_homes_of_their_own(ssh_host):
    """No rc file of this machine runs on a test host (root's here runs `pyenv init` on every command)."""
    for host in (ssh_host, ssh_host.as_user(ssh_host.non_root_user)):
        result = host.ssh(["sh", "-c", 'echo "$HOME"; ls -A "$HOME"; env'], check=True)
        home, *rest = result.stdout.splitlines()
        assert home == ("/root" if host.user == "root" else str(ssh_host.workdir / "home" / host.user))
        assert not {".bashrc", ".profile", ".bash_profile", ".ssh"} & set(rest), result.stdout
        assert "PYENV" not in result.stdout


def test_argv_with_hostile_characters_arrives_unchanged(ssh_host):
    word = "a b;'c\"$(no)`no`\\"
    result = ssh_host.ssh(["printf", "%s", word])
    assert result.stdout == word


def test_ssh_config_alias_reaches_the_host_with_plain_ssh(ssh_host):
    result = subprocess.run(["ssh", "-F", str(ssh_host.ssh_config), "testhost", "echo", "via-alias"],
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout) == (0, "via-alias\n"), result.stderr


def test_known_hosts_holds_the_server_key(ssh_host):
    assert ssh_host.known_hosts.read_text() == f"[127.0.0.1]:{ssh_host.port} {ssh_host.host_key}\n"


@pytest.mark.parametrize("known_hosts", ["wrong_known_hosts", "empty_known_hosts"])
def test_strict_client_refuses_an_unverified_host_key(ssh_host, known_hosts):
    path = getattr(ssh_host, known_hosts)()
    result = subprocess.run(
        ["ssh", "-F", str(ssh_host.ssh_config), "-o", f"UserKnownHostsFile={path}", "testhost", "true"],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_nvidia_smi_stand_in_is_on_path_for_root_and_non_root(ssh_host):
    query = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free",
             "--format=csv,noheader,nounits"]
    for host in (ssh_host, ssh_host.as_user(ssh_host.non_root_user)):
        result = host.ssh(query)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "0, GPU-00000000-0000-4000-8000-000000000000, NVIDIA H200, 143771, 0, 143156\n"
    assert not Path("/usr/local/sbin/nvidia-smi").exists()  # only inside the host's mount namespace


def test_nvidia_smi_stand_in_refuses_other_queries(ssh_host):
    result = ssh_host.ssh(["nvidia-smi"])
    assert result.returncode == 2
    assert "stand-in" in result.stderr


HOLD_GPU = str(Path(__file__).parents[1] / "hosts" / "hold_gpu.py")


def start_detached(host, argv: list[str]) -> int:
    result = host.ssh(["sh", "-c", 'nohup "$@" >/dev/null 2>&1 </dev/null & echo $!', "sh", *argv], check=True)
    return int(result.stdout)


def test_hold_gpu_payload_shows_in_the_stand_in_until_it_ends(ssh_host):
    user_host = ssh_host.as_user(ssh_host.non_root_user)
    pid = start_detached(user_host, ["python3", HOLD_GPU, "2048", "60"])
    wait_until(lambda: ssh_host.gpu_used_mib() == 2048, timeout=10, what="the payload's 2048 MiB")
    apps = ssh_host.ssh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    assert apps.stdout == f"{pid}, 2048\n"
    user_host.ssh(["kill", str(pid)], check=True)
    wait_until(lambda: ssh_host.gpu_used_mib() == 0, timeout=10, what="the memory to be released")


def test_set_gpu_changes_what_the_stand_in_reports(ssh_host):
    ssh_host.set_gpu(total_mib=81559, baseline_used=1000)
    try:
        assert ssh_host.gpu_used_mib() == 1000
    finally:
        ssh_host.set_gpu()


def processes_with_argument(word: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if word.encode() in cmdline.read_bytes().split(b"\0"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def test_stopping_sshd_ends_its_detached_jobs_and_removes_its_files():
    require(missing_for_sshd())
    host = start_sshd()
    marker = f"{time.time() % 1000 + 2000:.6f}"  # a sleep length no other process uses
    start_detached(host, ["sleep", marker])
    wait_until(lambda: processes_with_argument(marker), timeout=5, what="the detached sleep")
    host.stop()
    assert processes_with_argument(marker) == []
    assert host.process.returncode is not None
    assert not host.workdir.exists()


@pytest.mark.systemd
def test_service_host_starts_and_stops_the_dummy_unit_over_ssh(service_host):
    assert service_host.systemctl("is-active", service_host.unit).returncode == 0
    assert service_host.systemctl("stop", service_host.unit).returncode == 0
    assert service_host.systemctl("is-active", service_host.unit).returncode == 3
    assert service_host.service_state() == "inactive"
    assert service_host.systemctl("start", service_host.unit).returncode == 0
    assert service_host.service_state() == "active"


@pytest.mark.systemd
def test_health_goes_from_503_to_200_after_a_restart(service_host):
    scale = Scale()
    service_host.systemctl("restart", service_host.unit).check_returncode()
    wait_until(lambda: service_host.health_status() == 503, timeout=scale(5), what="the restarted unit to answer 503")
    wait_until(lambda: service_host.health_status() == 200, timeout=scale(10), what="health 200")


@pytest.mark.systemd
def test_stand_in_shows_the_unit_memory_only_while_it_runs(service_host):
    assert service_host.gpu_used_mib() == 4096
    main_pid = service_host.systemctl("show", "-P", "MainPID", service_host.unit).stdout.strip()
    apps = service_host.ssh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    assert apps.stdout == f"{main_pid}, 4096\n"
    service_host.systemctl("stop", service_host.unit).check_returncode()
    assert service_host.gpu_used_mib() == 0


@pytest.mark.systemd
def test_unit_variants_fail_to_start_or_start_slowly(service_host):
    service_host.install_unit(fail_on_start=True)
    service_host.systemctl("restart", service_host.unit)
    wait_until(lambda: service_host.service_state() == "failed", timeout=10, what="the unit to fail")
    assert "failing on start" in service_host.service_log.read_text()
    service_host.install_unit(start_delay=3)
    service_host.systemctl("reset-failed")
    service_host.systemctl("start", "--no-block", service_host.unit).check_returncode()
    assert service_host.service_state() == "activating"


@pytest.mark.systemd
def test_reset_removes_extra_units_and_foreign_gpu_holders(service_host):
    service_host.install_unit("extra-infer.service", port=free_port(), hold_mib=100)
    service_host.systemctl("start", "extra-infer.service").check_returncode()
    wait_until(lambda: service_host.gpu_used_mib() == 4196, timeout=10, what="both units' memory")
    service_host.reset()
    assert service_host.service_state("extra-infer.service") == "inactive"
    assert not (service_host.units_dir / "extra-infer.service").exists()
    assert service_host.gpu_used_mib() == 4096


@pytest.mark.systemd
def test_sudo_rule_lets_the_sudo_login_drive_the_manager(service_host):
    user_host = service_host.as_user(service_host.sudo_user)
    assert user_host.ssh(["sudo", "-n", "systemctl", "stop", service_host.unit]).returncode == 0
    assert service_host.service_state() == "inactive"
    assert user_host.ssh(["sudo", "-n", "systemctl", "start", service_host.unit]).returncode == 0
    assert service_host.service_state() == "active"


@pytest.mark.systemd
def test_user_without_sudo_rule_is_asked_for_a_password(service_host):
    result = service_host.as_user(service_host.nosudo_user).ssh(["sudo", "-n", "systemctl", "stop", service_host.unit])
    assert result.returncode == 1
    assert "a password is required" in result.stderr
    assert service_host.service_state() == "active"


@pytest.mark.systemd
def test_runner_state_in_the_host_home_stays_inside_the_host(service_host):
    service_host.ssh(["sh", "-c", "mkdir -p ~/.runner && touch ~/.runner/smoke /run/lock/runner-smoke.lock"],
                     check=True)
    assert not Path("/root/.runner/smoke").exists() and not Path("/run/lock/runner-smoke.lock").exists()
    service_host.reset()
    assert service_host.ssh(["ls", "/run/lock"]).stdout == ""


def cgroup_pids(cgroup: Path) -> list[str]:
    return [pid for procs in cgroup.rglob("cgroup.procs") for pid in procs.read_text().split()]


@pytest.mark.systemd
def test_service_host_teardown_leaves_nothing_behind():
    init_cgroup = Path("/proc/1/cgroup").read_text()
    host = start_service_host()
    assert cgroup_pids(host.cgroup)
    real_sudoers = sorted(path.name for path in Path("/etc/sudoers.d").iterdir())
    assert "runner-test" not in real_sudoers
    host.stop()
    assert not host.cgroup.exists()
    assert not host.workdir.exists()
    assert host.process.returncode is not None
    assert Path("/proc/1/cgroup").read_text() == init_cgroup  # systemd did not escape its subtree


def connect_error(address: str, port: int, timeout: float) -> str | None:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError as exc:
        return type(exc).__name__
    return None


@pytest.mark.netns
def test_netns_host_is_a_separate_machine_on_the_test_range(netns_host):
    assert ipaddress.ip_address(netns_host.address) in ipaddress.ip_network("10.231.0.0/16")
    assert netns_host.address == str(netns_host.link.subnet[2])  # the host's end of its own /30
    result = netns_host.ssh(["ip", "-o", "-4", "addr", "show"])
    assert f"inet {netns_host.address}/30" in result.stdout
    assert netns_host.service_state() == "active"
    assert netns_host.health_status() == 200


@pytest.mark.netns
def test_cut_makes_connects_time_out_and_restore_recovers(netns_host):
    netns_host.cut()
    assert connect_error(netns_host.address, netns_host.port, timeout=1) == "TimeoutError"
    netns_host.restore()
    wait_until(lambda: connect_error(netns_host.address, netns_host.port, timeout=1) is None, timeout=10,
               what="the link to come back")
    assert netns_host.ssh(["echo", "back"]).stdout == "back\n"


@pytest.mark.netns
def test_netns_host_teardown_leaves_nothing_behind():
    host = start_netns_host()
    route_added_by_a_test_run = BLACKHOLE_MARKER.exists()  # kept while any test run's link exists
    host.cut()
    host.stop()
    assert host.link.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert host.link.outer_veth not in links
    assert not host.cgroup.exists()
    with net_lock():  # another test run may still use the range and its blackhole
        if not addresses_in_test_range() and not namespaces_of_test_runs():
            assert not BLACKHOLE_MARKER.exists()
            routes = subprocess.run(["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True)
            if route_added_by_a_test_run:  # a route that was there before the tests is left alone
                assert "10.231.0.0/16" not in routes.stdout
