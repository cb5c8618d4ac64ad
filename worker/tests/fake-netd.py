#!/usr/bin/env python3
"""A stand-in for pvisor-netd in the worker's tests (PVISOR_NETD points here).

It speaks netd's process contract (netd/src/lib.rs): control socket
(SOCK_SEQPACKET) on fd 3, one pvisor.net.v1.NetdControl per message, the link's
fd as SCM_RIGHTS on `start`, one NetdReply per message, exit when the socket
closes. It records what it got, one line per event, in $PVISOR_FAKE_NETD_LOG:

    pid <pid>
    start <hex of the NetdControl> <fd count> <the tap's interface name or ->
    policy <hex of the NetdControl>
    stats
    frame <hex of the first 42 bytes of a frame read from the link>

and keeps the link's fd open (so the sandbox's eth0 stays). With
$PVISOR_FAKE_NETD_REFUSE set, it answers `start` with that error; with
$PVISOR_FAKE_NETD_DIE_ON_START set, it exits on `start` without answering.
"""
import os
import socket
import sys
import threading

LOG = os.environ.get("PVISOR_FAKE_NETD_LOG")
REFUSE = os.environ.get("PVISOR_FAKE_NETD_REFUSE", "")
DIE_ON_START = "PVISOR_FAKE_NETD_DIE_ON_START" in os.environ


def record(line):
    if LOG:
        with open(LOG, "a") as f:
            f.write(line + "\n")


def tap_name(fd):
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("iff:"):
                    return line.split()[1]
    except OSError:
        pass
    return "-"


def read_frames(fd):
    """Records the first frames the sandbox sends over its link."""
    for _ in range(64):
        try:
            frame = os.read(fd, 65536 + 14)
        except OSError:
            return
        record(f"frame {frame[:42].hex()}")


def string_field(tag, value):
    data = value.encode()
    assert len(data) < 128
    return bytes([(tag << 3) | 2, len(data)]) + data


def main():
    record(f"pid {os.getpid()}")
    ctl = socket.socket(fileno=3)
    links = []
    while True:
        msg, anc, _flags, _addr = ctl.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += [int.from_bytes(data[i:i + 4], sys.byteorder) for i in range(0, len(data) - len(data) % 4, 4)]
        if not msg and not fds:
            return  # the worker closed the control socket
        field = msg[0] >> 3
        if field == 1:
            record(f"start {msg.hex()} {len(fds)} {tap_name(fds[0]) if fds else '-'}")
            if DIE_ON_START:
                os._exit(3)
            links += fds
            for fd in fds:
                threading.Thread(target=read_frames, args=(fd,), daemon=True).start()
            ctl.send(string_field(1, REFUSE) if REFUSE else b"")
        elif field == 2:
            record(f"policy {msg.hex()}")
            ctl.send(b"")
        elif field == 3:
            record("stats")
            # NetdReply { stats: NetStats { tx_bytes: 5, flows: 7, flows_denied: 3 } }
            ctl.send(bytes([0x12, 0x06, 0x08, 0x05, 0x18, 0x07, 0x20, 0x03]))
        else:
            ctl.send(string_field(1, f"unknown message {field}"))


main()
