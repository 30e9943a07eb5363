"""host/listener.py's pure parts on captured /proc output: which sockets listen on which port (and whose), a
cgroup line, whether a health URL is this machine's, and whose socket answered between two looks."""
from pathlib import Path

import os
import socket

from remote_payload.host.listener import judge, listeners, local_port, unit_cgroup, unit_part
from remote_payload.host.parsers import parse_cgroup, parse_listeners, parse_mount_points

DATA = Path(__file__).resolve().parents[1] / "data" / "proc"


def test_listeners_of_the_ipv4_table_and_no_time_wait_row():
    found = parse_listeners((DATA / "net-tcp.txt").read_text())
    assert found == {0x8C01: {389681: 0}, 0x8CAB: {382014: 0}, 0x82EF: {433533: 0}}
    assert 0xA0DF not in found  # the TIME_WAIT rows (state 06, inode 0) are no listener


def test_listeners_of_the_ipv6_table():
    assert parse_listeners((DATA / "net-tcp6.txt").read_text()) == {0xA0E9: {442452: 0}, 0xB031: {442453: 0}}


def test_a_table_cut_short_or_garbled_gives_what_it_can():
    text = (DATA / "net-tcp.txt").read_text().splitlines()
    assert parse_listeners("\n".join(text[:2] + ["   9: garbage 0A", "   3: 0100007F:ZZZZ 00000000:0000 0A 0 0 0 0 0 1"]))\
        == {0x8C01: {389681: 0}}
    assert parse_listeners("") == {}


def test_the_cgroup_v2_line():
    assert parse_cgroup("12:pids:/x\n0::/system.slice/sglang.service\n") == "/system.slice/sglang.service"
    assert parse_cgroup("1:name=systemd:/\n") is None


def test_only_a_health_url_on_this_machines_loopback_or_wildcard_is_checked():
    assert local_port("http://127.0.0.1:30000/health") == 30000
    assert local_port("http://localhost/health") == 80
    assert local_port("http://[::1]:8000/health") == 8000
    assert local_port("http://10.231.0.2:30000/health") is None  # another host: its listener is not ours to see
    assert local_port("http://127.0.0.1:99999/health") is None   # not a port


def test_the_units_cgroup_is_its_main_pids_up_to_the_units_own_component():
    assert unit_part("/system.slice/sglang.service", "sglang.service") == "/system.slice/sglang.service"
    assert unit_part("/system.slice/sglang.service/payload/sub", "sglang.service") == "/system.slice/sglang.service"
    assert unit_part("/user.slice/user-1000.slice/session-4.scope", "sglang.service") \
        == "/user.slice/user-1000.slice/session-4.scope"  # not the unit's name: the process's own
    assert unit_part(None, "sglang.service") is None
    assert unit_cgroup(2 ** 22 + 1, "sglang.service") is None  # no such process (above pid_max's ceiling)


def test_an_answer_counts_only_between_two_looks_at_the_same_sockets_of_the_unit():
    """This process stands for the unit (its main pid); its own listening socket is the unit's."""
    me = socket.socket()
    me.bind(("127.0.0.1", 0))
    me.listen()
    port = me.getsockname()[1]
    try:
        ours = listeners(port)
        assert len(ours) == 1 and list(ours.values()) == [os.geteuid()]
        assert judge(port, ours, ours, os.getpid(), "x.service") is None
        assert judge(port, {}, ours, os.getpid(), "x.service") == (None,)  # it bound meanwhile: ask again
        gone = judge(port, ours, {}, os.getpid(), "x.service")
        assert "nothing listens on port %d after its answer" % port in gone[0]
        other = judge(port, ours, ours, 2 ** 22 + 1, "x.service")  # a main pid that is not this process
        assert other is not None and "outside the unit" in other[0], other
    finally:
        me.close()


def test_the_mount_points_of_a_mountinfo_text():
    text = ("22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
            "35 22 252:0 /tmp/precious /tmp/runner-root/jobs/j1/mnt rw,relatime - ext4 /dev/vda rw\n"
            "36 22 0:41 / /tmp/a\\040dir\\134x rw - tmpfs tmpfs rw\n")
    assert parse_mount_points(text) == ["/", "/tmp/runner-root/jobs/j1/mnt", "/tmp/a dir\\x"]
    assert parse_mount_points("") == []
