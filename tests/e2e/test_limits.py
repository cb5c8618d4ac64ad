"""Limits that protect the host (issue 12): a sandbox's disk is bounded (its
own ext4 of the bound's size under a root broker), `/tmp` and `/dev/shm` are
sized from its limits, `/proc/meminfo` shows its memory limit and
`/proc/cmdline` nothing of the host's, per-user kernel counts (inotify,
mqueues) are charged per sandbox, and bad limits or renewals are 400s.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync.sandbox import SandboxSync

from conftest import SUITE_BACKEND, _make_conn, free_port, images_dir, pvisor_bin
from e2e_util import BUSYBOX, PYTHON, SMALL, assert_error_json, run, sh, stderr_text, stdout_text, wait_healthy, wait_until
from test_nonroot import as_user, delegated  # noqa: F401 (fixture)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="disk bounds and per-sandbox owners need a root broker")

MiB = 1 << 20


def df_kib(sb: SandboxSync, path: str) -> int:
    """Total size of the file system at `path` inside the sandbox, in KiB."""
    out = sh(sb, f"df -k {path} | tail -n 1").split()
    return int(out[1])


def limits(disk: str | None = None, **kw: str) -> dict[str, str]:
    d = dict(SMALL, **kw)
    if disk:
        d["ephemeral-storage"] = disk
    return d


# ------------------------------------------------------------------------ disk


@root_only
def test_write_past_the_disk_bound_fails_with_enospc_and_nothing_else_suffers(sandbox, pvisor_server):
    small = sandbox(BUSYBOX, resource=limits("64Mi"))
    other = sandbox(BUSYBOX, resource=limits())
    ex = run(small, "dd if=/dev/zero of=/big bs=1M count=100 2>&1 >/dev/null | grep -v records >&2; ls -l /big")
    assert "No space left on device" in stderr_text(ex), stderr_text(ex)
    size = int(stdout_text(ex).splitlines()[-1].split()[4])
    assert 40 * MiB < size <= 64 * MiB, size
    # The sandbox's disk is its own: another sandbox writes as usual...
    sh(other, "dd if=/dev/zero of=/big bs=1M count=80 2>/dev/null && rm /big")
    # ...the full one can still free space and write again...
    sh(small, "rm /big && echo ok > /after")
    # ...and the host holds no more than the bound for it.
    image = pvisor_server.data_dir / "sandboxes" / small.id / "disk.ext4"
    assert image.is_file(), "the sandbox's disk image is in its state dir"
    assert image.stat().st_blocks * 512 <= 64 * MiB + 4 * MiB, image.stat().st_blocks * 512


@root_only
def test_df_shows_the_sandboxes_own_size(sandbox):
    sb = sandbox(BUSYBOX, resource=limits("256Mi"))
    total = df_kib(sb, "/")
    # ext4's own metadata (inode tables) takes a few per cent.
    assert 0.9 * 256 * 1024 <= total <= 256 * 1024, total
    # The server's default bound (--disk-limit 10Gi) when the create names none.
    default = sandbox(BUSYBOX)
    assert 0.9 * 10 * (1 << 20) <= df_kib(default, "/") <= 10 * (1 << 20)


def _disks_ahead(sandboxes: Path) -> set[str]:
    """Warm workers' disks made ahead and ready to take (`<sandboxes>/.ahead-<slot>/ready`)."""
    return {p.parent.name for p in sandboxes.glob(".ahead-*/ready")}


@root_only
@pytest.mark.backend("ns", why="warm workers make an ns sandbox's disk ahead; a vm's disk is its image")
def test_warm_workers_make_the_default_disk_ahead_and_a_create_takes_it(sandbox, pvisor_server):
    sandboxes = pvisor_server.data_dir / "sandboxes"
    # The two warm workers (--warm-workers' default) each hold one, marked ready.
    wait_until(lambda: len(_disks_ahead(sandboxes)) == 2, 15, what="two disks made ahead")
    before = _disks_ahead(sandboxes)
    sb = sandbox(BUSYBOX, resource=limits())
    # The create took one: renamed to the sandbox's state dir, where it is the sandbox's disk.
    state = sandboxes / sb.id
    assert (state / "disk.ext4").is_file() and not (state / "ready").exists()
    assert before - {p.name for p in sandboxes.glob(".ahead-*")}, "no disk made ahead was taken"
    assert 0.9 * 10 * (1 << 20) <= df_kib(sb, "/") <= 10 * (1 << 20)
    sh(sb, "dd if=/dev/zero of=/f bs=1M count=8 2>/dev/null && sync && rm /f && touch /kept")
    assert sh(sb, "ls /kept") == "/kept"
    # A create with another bound makes its own disk, and the one made ahead goes: only the
    # refilled warm workers' disks are left.
    other = sandbox(BUSYBOX, resource=limits("128Mi"))
    assert 0.9 * 128 * 1024 <= df_kib(other, "/") <= 128 * 1024
    assert "bin" in sh(other, "ls /"), "the other sandbox's root is its image"
    wait_until(lambda: len(list(sandboxes.glob(".ahead-*"))) == 2 and len(_disks_ahead(sandboxes)) == 2, 15,
               what="only the warm workers' disks left")


@root_only
def test_upload_past_the_bound_is_a_clear_error(sandbox):
    sb = sandbox(BUSYBOX, resource=limits("32Mi"))
    with pytest.raises(SandboxApiException) as ei:
        sb.files.write_file("/root/big.bin", b"\0" * (48 * MiB))
    assert ei.value.status_code == 507, (ei.value.status_code, ei.value)
    assert "space" in str(ei.value).lower()
    # Still usable afterwards.
    sh(sb, "rm -f /root/big.bin; echo ok > /root/small")


def test_tmp_and_shm_are_sized_from_the_limits(sandbox):
    sb = sandbox(BUSYBOX, resource=limits(memory="256Mi"))
    # Half and a quarter of the memory: a full tmpfs is ENOSPC, not the OOM killer.
    assert df_kib(sb, "/tmp") == 128 * 1024
    assert df_kib(sb, "/dev/shm") == 64 * 1024
    ex = run(sb, "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1 >/dev/null | grep -v records >&2")
    assert "No space left on device" in stderr_text(ex), stderr_text(ex)
    sh(sb, "rm /tmp/big")


@root_only
def test_tmp_is_no_larger_than_a_small_disk_bound(sandbox):
    sb = sandbox(BUSYBOX, resource=limits("64Mi", memory="512Mi"))
    assert df_kib(sb, "/tmp") == 64 * 1024


# ---------------------------------------------------------------- /proc views


def test_proc_meminfo_is_the_memory_limit_and_cmdline_is_not_the_hosts(sandbox):
    sb = sandbox(BUSYBOX, resource=limits(memory="384Mi"))
    meminfo = sh(sb, "cat /proc/meminfo")
    assert "MemTotal:         393216 kB" in meminfo, meminfo
    assert "SwapTotal:             0 kB" in meminfo, meminfo
    host_cmdline = Path("/proc/cmdline").read_text().strip()
    inside = sh(sb, "cat /proc/cmdline").strip()
    assert inside and inside != host_cmdline, inside
    # Neither can be changed or unmounted from inside.
    ex = run(sb, "echo x > /proc/meminfo; umount /proc/meminfo; cat /proc/meminfo | head -n 1")
    assert stdout_text(ex).splitlines()[-1] == "MemTotal:         393216 kB"
    # `free` reads it too.
    assert "393216" in sh(sb, "free -k | sed -n 2p")


# ------------------------------------------------------- per-user kernel counts

EXHAUST_INOTIFY = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), os.strerror(ctypes.get_errno()), flush=True)
open('/tmp/inotify.ready', 'w').close()
time.sleep(600)
"""

EXHAUST_MQUEUE = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Attr)]
n = 0
while True:
    a = Attr(0, 10, 8192, 0)
    if libc.mq_open(f"/q{n}".encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
        break
    n += 1
print(n, os.strerror(ctypes.get_errno()), flush=True)
open('/tmp/mq.ready', 'w').close()
time.sleep(600)
"""

CAN_INOTIFY_AND_MQ = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print("inotify", "ok" if fd >= 0 else os.strerror(ctypes.get_errno()))
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Attr)]
a = Attr(0, 10, 8192, 0)
name = f"/pvisor-e2e-{os.getpid()}".encode()
q = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
print("mqueue", "ok" if q >= 0 else os.strerror(ctypes.get_errno()))
if q >= 0:
    libc.mq_unlink(name)
"""


def exhaust(sb: SandboxSync, script: str, ready: str) -> str:
    sb.files.write_file("/root/exhaust.py", script)
    run(sb, "python3 /root/exhaust.py > /root/exhaust.out 2>&1", background=True)
    sh(sb, f"for i in $(seq 100); do [ -e {ready} ] && break; sleep 0.1; done; [ -e {ready} ]")
    return sh(sb, "cat /root/exhaust.out")


@root_only
def test_one_sandbox_exhausting_inotify_and_mqueues_leaves_others_and_host_root_alone(sandbox):
    hog = sandbox(PYTHON)
    other = sandbox(PYTHON)
    got = exhaust(hog, EXHAUST_INOTIFY, "/tmp/inotify.ready").split()
    assert int(got[0]) >= 64 and "many" in " ".join(got[1:]).lower(), got
    got = exhaust(hog, EXHAUST_MQUEUE, "/tmp/mq.ready").split()
    assert int(got[0]) >= 1, got
    # Another sandbox and host root still get both.
    assert sh(other, f"python3 -c '{CAN_INOTIFY_AND_MQ}'").splitlines() == ["inotify ok", "mqueue ok"]
    host = subprocess.run(["python3", "-c", CAN_INOTIFY_AND_MQ], capture_output=True, text=True, check=True)
    assert host.stdout.splitlines() == ["inotify ok", "mqueue ok"], host


@root_only
def test_each_sandbox_user_namespace_has_its_own_owner(sandbox):
    a, b = sandbox(BUSYBOX), sandbox(BUSYBOX)
    owners = set()
    for sb in (a, b):
        pid = next(p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_init_of(p, sb.id))
        owners.add(_userns_owner(pid))
    assert len(owners) == 2 and 0 not in owners, owners


def _is_init_of(proc: Path, sandbox_id: str) -> bool:
    try:
        status = (proc / "status").read_text()
        host = (proc / "root/etc/hostname").read_text().strip()
    except OSError:
        return False
    nspid = next((l.split()[1:] for l in status.splitlines() if l.startswith("NSpid:")), [])
    return len(nspid) >= 2 and nspid[-1] == "1" and host == f"sandbox-{sandbox_id[:8]}"


def _userns_owner(proc: Path) -> int:
    """The owner uid of a process's user namespace (ioctl NS_GET_OWNER_UID)."""
    import fcntl
    import struct
    NS_GET_OWNER_UID = 0xB704
    fd = os.open(proc / "ns/user", os.O_RDONLY)
    try:
        buf = fcntl.ioctl(fd, NS_GET_OWNER_UID, b"\0" * 4)
    finally:
        os.close(fd)
    return struct.unpack("I", buf)[0]


# ------------------------------------------------------------------ bad limits


@pytest.mark.parametrize("resource, code", [
    ({"cpu": "1", "memory": "1e30Ti"}, "RESOURCE_LIMIT_INVALID"),
    ({"cpu": "1", "memory": "99999999999999999999Ti"}, "RESOURCE_LIMIT_OUT_OF_RANGE"),
    ({"cpu": "1", "memory": "4096Gi"}, "RESOURCE_LIMIT_OUT_OF_RANGE"),
    ({"cpu": "1000000", "memory": "512Mi"}, "RESOURCE_LIMIT_OUT_OF_RANGE"),
    ({"cpu": "1", "memory": "512Mi", "pids": "1000000000"}, "RESOURCE_LIMIT_OUT_OF_RANGE"),
    ({"cpu": "1", "memory": "512Mi", "gpu": "1"}, "RESOURCE_LIMIT_UNKNOWN"),
    ({"cpu": "1", "memory": "512Mi", "ephemeral-storage": "lots"}, "RESOURCE_LIMIT_INVALID"),
    ({"cpu": "1", "memory": "512Mi", "ephemeral-storage": "1Pi"}, "RESOURCE_LIMIT_INVALID"),
    ({"cpu": "1", "memory": "512Mi", "ephemeral-storage": "1000Ti"}, "RESOURCE_LIMIT_OUT_OF_RANGE"),
])
def test_bad_limits_are_400_with_a_code(http, resource, code):
    body = {"image": {"uri": BUSYBOX}, "timeout": 60, "resourceLimits": resource,
            "entrypoint": ["tail", "-f", "/dev/null"]}
    r = http.post("/v1/sandboxes", json=body)
    if code == "RESOURCE_LIMIT_OUT_OF_RANGE" and "ephemeral-storage" in resource and os.geteuid() != 0:
        code = "DISK_LIMIT_UNSUPPORTED"
    assert assert_error_json(r, 400)["code"] == code, r.text


def test_renew_is_capped_like_create(sandbox, http):
    sb = sandbox(BUSYBOX, timeout=timedelta(minutes=5))
    far = datetime.now(timezone.utc) + timedelta(days=31)
    r = http.post(f"/v1/sandboxes/{sb.id}/renew-expiration", json={"expiresAt": far.isoformat()})
    assert assert_error_json(r, 400)["code"] == "INVALID_EXPIRATION"
    near = datetime.now(timezone.utc) + timedelta(days=29)
    r = http.post(f"/v1/sandboxes/{sb.id}/renew-expiration", json={"expiresAt": near.isoformat()})
    assert r.status_code == 200, r.text


# ----------------------------------------------------------- unprivileged broker


def test_unprivileged_broker_bounds_tmp_and_refuses_a_disk_bound(delegated, tmp_path):  # noqa: F811
    pw, groups, data = delegated
    binary = pvisor_bin()
    port = free_port()
    user_cmd = (
        f"{binary} image import {images_dir() / 'busybox.tar'} --data-dir {data} && "
        f"exec {binary} serve --backend {SUITE_BACKEND} --listen 127.0.0.1:{port} --data-dir {data}"
    )
    log_path = tmp_path / "server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        as_user(pw, groups, user_cmd),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    conn = _make_conn(f"127.0.0.1:{port}")
    try:
        wait_healthy(port, proc, log_path.read_text)
        assert "writable layers are not bounded" in log_path.read_text(), "the broker says what it cannot bound"
        with pytest.raises(SandboxApiException) as ei:
            SandboxSync.create("busybox", connection_config=conn,
                               resource={"cpu": "1", "memory": "128Mi", "ephemeral-storage": "1Gi"})
        assert ei.value.status_code == 400
        assert ei.value.error.code == "DISK_LIMIT_UNSUPPORTED", ei.value.error
        sb = SandboxSync.create("busybox", connection_config=conn, resource={"cpu": "1", "memory": "128Mi"})
        try:
            assert df_kib(sb, "/tmp") == 64 * 1024
            assert "MemTotal:         131072 kB" in sh(sb, "cat /proc/meminfo")
        finally:
            sb.kill()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()
