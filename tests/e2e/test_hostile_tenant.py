"""A hostile tenant, as root inside a sandbox (issue 12, "Hostile tenant suite"): an ns jail, or
with PVISOR_E2E_BACKEND=vm a microVM whose guest the probes run in (tests/kvmhost).

Each probe is refused or contained, and after each the service answers and a
bystander sandbox still works (`service_fine`). What test_isolation.py already
covers (files and processes of other sandboxes by path, symlink escapes through
the file API, memory and fork bombs, output floods) is not repeated here; this
module adds the kernel surface (bpf, perf, kexec, modules, ptrace of the agent,
keyrings, userfaultfd, namespaces), writes to /proc/sys and /sys, device nodes,
the broker's sockets and API from inside, signals to other sandboxes' processes,
and thousands of files and background commands. Deep trees are test_deep_trees.py.

The module runs twice: against the suite's root broker and against an unprivileged
one (a user with delegated cgroups, `unprivileged.start_unprivileged`). Every probe is
refused or contained by both; what differs is said where it is asserted (README,
"Unprivileged broker").
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from opensandbox.models.filesystem import SearchEntry

from conftest import SUITE_BACKEND, SandboxFactory, _make_conn
from e2e_util import BUSYBOX, PYTHON, run, sh, stdout_text, wait_until
from unprivileged import start_unprivileged


@pytest.fixture(scope="module", params=["root", "unprivileged"])
def hostile_server(request, tmp_path_factory):
    """The suite's (root) broker, then an unprivileged one."""
    if request.param == "root":
        yield request.getfixturevalue("pvisor_server")
        return
    srv, deleg = start_unprivileged(tmp_path_factory, "pvisor-hostile-user", ["busybox.tar", "python-3.11-slim.tar"],
                                    {}, ["--backend", SUITE_BACKEND], tag="hostile")
    try:
        yield srv
        srv.stop()
    finally:
        deleg.close()


@pytest.fixture(scope="module")
def hostile_sandboxes(hostile_server):
    f = SandboxFactory(_make_conn(hostile_server.addr))
    yield f
    f.cleanup()


@pytest.fixture
def sandbox(hostile_server):
    f = SandboxFactory(_make_conn(hostile_server.addr))
    yield f
    f.cleanup()


@pytest.fixture(scope="module")
def bystander(hostile_sandboxes):
    return hostile_sandboxes(BUSYBOX)


@pytest.fixture(scope="module")
def tenant(hostile_sandboxes):
    return hostile_sandboxes(PYTHON)


def service_fine(srv, bystander) -> None:
    assert srv.alive(), "the broker died"
    r = httpx.get(f"{srv.url}/health", timeout=10)
    assert r.status_code == 200 and r.json() == {"status": "healthy"}, r.text
    assert sh(bystander, "echo bystander-ok") == "bystander-ok"


# syscall number (x86-64), name, arguments: each must fail inside a sandbox.
SYSCALLS = [
    (321, "bpf", (0, 0, 0)),                      # BPF_MAP_CREATE with no attr
    (298, "perf_event_open", (0, 0, -1, -1, 0)),
    (246, "kexec_load", (0, 0, 0, 0)),
    (320, "kexec_file_load", (-1, -1, 0, 0, 0)),
    (175, "init_module", (0, 0, 0)),
    (313, "finit_module", (-1, 0, 0)),
    (304, "open_by_handle_at", (-1, 0, 0)),
    (323, "userfaultfd", (0,)),
    (248, "add_key", (0, 0, 0, 0, 0)),
    (250, "keyctl", (0, 0, 0, 0, 0)),
    (169, "reboot", (0xfee1dead, 672274793, 0x4321fedc, 0)),  # LINUX_REBOOT_CMD_RESTART
    (167, "swapon", (0, 0)),
    (163, "acct", (0,)),
    (272, "unshare", (0x10000000,)),              # CLONE_NEWUSER
    (308, "setns", (-1, 0)),
    (155, "pivot_root", (0, 0)),
]

PROBE = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for nr, name, args in %r:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, "ok" if r >= 0 else "errno=%%d" %% ctypes.get_errno())
# ptrace the agent (PID 1): PTRACE_ATTACH
r = libc.ptrace(ctypes.c_long(16), ctypes.c_long(1), None, None)
print("ptrace_attach_init", "ok" if r >= 0 else "errno=%%d" %% ctypes.get_errno())
''' % (SYSCALLS,)


def test_kernel_surface_is_refused(tenant, bystander, hostile_server):
    tenant.files.write_file("/tmp/hostile_probe.py", PROBE)
    out = sh(tenant, "python3 /tmp/hostile_probe.py")
    results = dict(line.split(" ", 1) for line in out.splitlines())
    allowed = {k: v for k, v in results.items() if v == "ok"}
    assert not allowed, f"syscalls that worked inside a sandbox: {allowed}\n{out}"
    assert len(results) == len(SYSCALLS) + 1, out
    service_fine(hostile_server, bystander)


@pytest.mark.parametrize("command", [
    "echo 1 > /proc/sys/kernel/sysrq",
    "echo 0 > /proc/sys/kernel/randomize_va_space",
    "echo c > /proc/sysrq-trigger",
    "echo 1 > /proc/sys/vm/drop_caches",
    "echo 2 > /sys/kernel/mm/ksm/run",
    "echo 1 > /sys/kernel/mm/transparent_hugepage/enabled",
    "echo x > /sys/fs/cgroup/cgroup.procs",
    "mount -o remount,rw /sys",
    "mount -o remount,rw /proc/sys",
])
def test_writes_to_proc_sys_and_sys_are_refused(tenant, bystander, hostile_server, command):
    ex = run(tenant, command)
    assert ex.exit_code != 0, f"{command!r} succeeded inside a sandbox: {stdout_text(ex)}"
    service_fine(hostile_server, bystander)


@pytest.mark.parametrize("command", [
    "mknod /tmp/mem c 1 1 && head -c 16 /tmp/mem | od -An -tx1",   # /dev/mem
    "mknod /tmp/sda b 8 0 && head -c 512 /tmp/sda | od -An -tx1 | head -1",
    "head -c 16 /dev/mem",
    "head -c 16 /dev/kmem",
    "head -c 16 /dev/port",
    "head -c 100 /dev/kmsg",
    "dmesg",
    "echo pwn > /dev/kmsg",
    "head -c 16 /proc/kcore",
    "ls /dev/sda /dev/vda /dev/nvme0n1 /dev/kvm /dev/fuse /dev/net/tun 2>/dev/null | grep .",
])
def test_device_nodes_are_refused(tenant, bystander, hostile_server, command):
    ex = run(tenant, command)
    out = stdout_text(ex).strip()
    assert ex.exit_code != 0 or not out, f"{command!r} worked inside a sandbox: {out[:200]!r}"
    service_fine(hostile_server, bystander)


def test_broker_sockets_and_api_are_out_of_reach(tenant, bystander, hostile_server):
    data = hostile_server.data_dir
    # The broker's data dir (sockets, other sandboxes' layers) is not in the sandbox's root.
    ex = run(tenant, f"ls {data} {data}/run {data}/sandboxes")
    assert ex.exit_code != 0, stdout_text(ex)
    # No Unix socket of the host is visible (abstract ones live in the host's net namespace).
    assert "pvisor" not in sh(tenant, "cat /proc/net/unix")
    # The API's port is not reachable: loopback is the sandbox's own, and the
    # gateway (the host side) refuses the broker's listen address.
    port = hostile_server.port
    probe = ("import socket,sys\n"
             "for h in sys.argv[1:]:\n"
             "    s=socket.socket(); s.settimeout(3)\n"
             "    try: s.connect((h, %d)); print(h, 'connected')\n"
             "    except OSError as e: print(h, 'refused', e.errno)\n" % port)
    tenant.files.write_file("/tmp/api_probe.py", probe)
    out = sh(tenant, "python3 /tmp/api_probe.py 127.0.0.1 10.0.2.2 10.0.2.3")
    assert "connected" not in out, out
    service_fine(hostile_server, bystander)


def test_other_sandboxes_processes_cannot_be_signalled(sandbox, tenant, bystander, hostile_server):
    victim = sandbox(BUSYBOX)
    from e2e_util import run as _run

    _run(victim, "sleep 3137", background=True)
    host_pid = wait_until(lambda: next((p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == "sleep 3137"),
                                       None), 10, what="the victim's sleep on the host")
    # Its host pid means nothing inside another sandbox's pid namespace.
    ex = run(tenant, f"kill -9 {host_pid}; kill -9 -1; true")
    assert ex.exit_code == 0
    time.sleep(0.5)
    assert _cmdline(host_pid) == "sleep 3137", "the victim's process survived"
    assert "sleep 3137" in sh(victim, "ps")
    service_fine(hostile_server, bystander)


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@pytest.mark.deadline(300)
def test_thousands_of_files(sandbox, bystander, hostile_server):
    sb = sandbox(PYTHON)
    sh(sb, "python3 -c \"import os\nos.makedirs('/root/many')\n"
           "[open('/root/many/f%d.txt' % i, 'w').close() for i in range(20000)]\"", timeout_ms=120_000)
    found = sb.files.search(SearchEntry(path="/root/many", pattern="f1999*.txt"))
    assert len(found) == 11, [f.path for f in found][:20]
    sb.files.delete_directories(["/root/many"])
    assert run(sb, "test -e /root/many").exit_code != 0
    service_fine(hostile_server, bystander)


@pytest.mark.deadline(300)
def test_hundreds_of_background_commands(sandbox, bystander, hostile_server):
    sb = sandbox(BUSYBOX)
    n = int(os.environ.get("PVISOR_E2E_BACKGROUND", "300"))
    ids = [run(sb, "sleep 600", background=True).id for _ in range(n)]
    assert len(set(ids)) == n
    running = int(sh(sb, "ps | grep -c '[s]leep 600'"))
    assert running == n, running
    service_fine(hostile_server, bystander)
    rss = hostile_server.rss_kib()
    sb.kill()
    wait_until(lambda: not any(_cmdline(p) == "sleep 600" for p in os.listdir("/proc") if p.isdigit()), 30,
               what="every background command gone with its sandbox")
    service_fine(hostile_server, bystander)
    assert rss > 0


@pytest.mark.backend("ns", why="a vm sandbox's root is its guest kernel's own: the variant below")
def test_host_identity_of_a_sandbox(tenant, bystander, hostile_server, request):
    """Root broker: sandbox root is an unprivileged host id of a range of its own (never 0).
    Unprivileged broker: one id only, the broker's own user (documented in the README:
    sandboxes are then not apart from each other or the broker by host id; the namespaces,
    the seccomp filter and no_new_privs contain them, which the probes above check)."""
    fields = sh(tenant, "cat /proc/self/uid_map").split()
    inside, outside, count = (int(x) for x in fields[:3])
    assert inside == 0 and outside != 0, fields
    broker_uid = os.stat(f"/proc/{hostile_server.proc.pid}").st_uid
    if broker_uid == 0:
        assert count > 1, fields
    else:
        assert (outside, count) == (broker_uid, 1), fields
        # Even so, no capability over the host: the host's files of that user are not in reach.
        assert run(tenant, f"ls {hostile_server.data_dir}").exit_code != 0
    service_fine(hostile_server, bystander)


HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.backend("vm", why="the ns variant is the test above")
def test_host_identity_of_a_vm_sandbox(tenant, bystander, hostile_server):
    """A vm sandbox's root is root of a kernel of its own: no user namespace maps it to any host
    id (its uid_map is the initial one), the kernel is not the host's (boot id), and no host
    path is in reach (the broker's data dir does not exist in the guest)."""
    assert sh(tenant, "cat /proc/self/uid_map").split() == ["0", "0", "4294967295"]
    assert sh(tenant, "cat /proc/sys/kernel/random/boot_id") != HOST_BOOT_ID
    assert run(tenant, f"ls {hostile_server.data_dir}").exit_code != 0
    service_fine(hostile_server, bystander)
