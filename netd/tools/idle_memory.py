#!/usr/bin/env python3
"""What idle pvisor-netds cost: starts N of them at once as the worker does
(control socket on fd 3, a NetdStart with a SOCK_SEQPACKET link and an empty
config), lets them settle, and prints the mean Rss, Pss and Private_Dirty of
/proc/PID/smaps_rollup per netd, in kB. Run as root (netd is non-dumpable).

    python3 netd/tools/idle_memory.py target/dist/pvisor-netd 10

Private_Dirty is what each sandbox really pays; Rss counts the file pages of
the binary and of a dynamic netd's libc, shared between all netds (Pss
divides them). A freshly written binary shows as dirty until written back:
`sync` first.
"""
import os, socket, subprocess, sys, time, array
exe, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
procs = []
for _ in range(n):
    ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    p = subprocess.Popen([exe], preexec_fn=lambda t=theirs: os.dup2(t.fileno(), 3), pass_fds=(3,), stdin=subprocess.DEVNULL)
    theirs.close()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    start = bytes([0x0a, 0x01, ord("m"), 0x10, 0x01, 0x1a, 0x00])
    ctl.sendmsg([bytes([0x0a, len(start)]) + start], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [a.fileno()]))])
    assert ctl.recv(65536) == b""
    procs.append((p, ctl, a, b))
time.sleep(0.5)
tot = {"Rss": 0, "Pss": 0, "Private_Dirty": 0}
for p, *_ in procs:
    for l in open(f"/proc/{p.pid}/smaps_rollup"):
        k = l.split(":")[0]
        if k in tot:
            tot[k] += int(l.split()[1])
print(f"{n} netds, per netd: " + "  ".join(f"{k} {v // n} kB" for k, v in tot.items()))
for p, ctl, *_ in procs:
    ctl.close(); p.wait()
