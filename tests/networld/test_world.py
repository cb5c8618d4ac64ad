"""The world's life cycle as root: idempotent up, recovery from a crashed run, clean down.

Takes the world down at the end: do not run it while another suite uses the world.
"""
import os
import signal
import subprocess

import pytest

from networld import addresses as A
from networld import probe, world

pytestmark = pytest.mark.skipif(world.missing_requirements() is not None,
                                reason=f"cannot build the world here: {world.missing_requirements()}")


def test_up_is_idempotent_and_recovers_from_crashes():
    world.up()
    pid = int((world.STATE / "servers.pid").read_text())
    world.up()  # healthy: left alone
    assert int((world.STATE / "servers.pid").read_text()) == pid
    os.kill(pid, signal.SIGKILL)  # a crashed server
    world.up()
    probe.quick_check()
    subprocess.run(["ip", "netns", "del", A.NETNS], check=True)  # a namespace deleted under the servers
    world.up()
    probe.quick_check()
    subprocess.run(["ip", "route", "del", A.ROUTED[0]], check=True)  # a half-torn-down world
    assert world.status() != "up"
    world.up()
    assert world.status() == "up"
    probe.udp_echo(A.WILD_BC)


def test_down_leaves_nothing():
    world.up()
    world.down()
    assert world.leftovers() == []
    world.down()  # twice is fine
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "networld.servers" not in out
