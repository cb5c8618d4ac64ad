"""Isolation: sandbox vs sandbox, sandbox vs host (pid/mount/net namespaces, seccomp,
symlink escapes) and resource limits (memory, pids, output floods)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.filesystem import ContentReplaceEntry, MoveEntry, SetPermissionEntry

from e2e_util import (
    REPO_ROOT,
    BUSYBOX,
    DEBIAN,
    PS,
    PYTHON,
    dataplane,
    describe,
    run,
    sh,
    stdout_text,
    wait_until,
)

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def witness(module_sandbox):
    """A bystander sandbox that must keep working whatever the others do."""
    return module_sandbox(BUSYBOX)


@pytest.fixture
def host_marker():
    """A file on the host (under /tmp) that no sandbox may see."""
    p = Path(f"/tmp/pvisor-e2e-host-{uuid.uuid4().hex}")
    p.write_text("HOST-SECRET\n")
    p.chmod(0o644)
    yield p
    p.unlink(missing_ok=True)


def assert_service_healthy(base_url: str, witness) -> None:
    r = wait_until(lambda: (x := httpx.get(f"{base_url}/health", timeout=5)).status_code == 200 and x, 10,
                   what="/health to answer 200")
    assert r.json() == {"status": "healthy"}
    assert sh(witness, "echo witness-ok") == "witness-ok"


# ------------------------------------------------------------------- sandbox vs sandbox


def test_files_isolated_between_sandboxes(sandbox):
    a, b = sandbox(BUSYBOX), sandbox(BUSYBOX)
    sh(a, "echo A > /tmp/iso.txt; echo A > /root/iso.txt; echo A > /etc/iso.txt; rm /etc/group")
    a.files.write_file("/home/app/iso-api.txt", "A")
    assert sh(b, "for f in /tmp/iso.txt /root/iso.txt /etc/iso.txt /home/app/iso-api.txt; do "
                 "test -e $f && echo LEAK $f; done; test -f /etc/group && echo group-ok") == "group-ok"
    with pytest.raises(SandboxApiException) as ei:
        b.files.get_file_info(["/etc/iso.txt"])
    assert ei.value.status_code == 404
    # A fresh sandbox of the same image starts from the pristine image.
    c = sandbox(BUSYBOX)
    assert sh(c, "test -e /etc/iso.txt && echo LEAK; test -f /etc/group && echo group-ok") == "group-ok"


def test_processes_isolated_between_sandboxes(sandbox):
    a, b = sandbox(BUSYBOX), sandbox(BUSYBOX)
    run(a, "sleep 1234", background=True)
    wait_until(lambda: "sleep 1234" in sh(a, PS), 5, what="sleep 1234 to show up in A")
    ps_b = sh(b, PS)
    assert "sleep 1234" not in ps_b, ps_b
    assert sh(b, "pkill -f 'sleep 1234'; echo done") == "done"
    assert "sleep 1234" in sh(a, PS), "B must not be able to signal A's processes"


def test_hostnames(sandbox):
    a, b = sandbox(BUSYBOX), sandbox(BUSYBOX)
    ha, hb = sh(a, "hostname"), sh(b, "hostname")
    assert ha == f"sandbox-{a.id[:8]}"
    assert hb == f"sandbox-{b.id[:8]}"
    assert ha != hb
    assert ha != os.uname().nodename


# ------------------------------------------------------------------- sandbox vs host


def test_pid_namespace(sandbox, pvisor_server):
    host_proc = subprocess.Popen(["sleep", "31337"])
    try:
        sb = sandbox(BUSYBOX)
        pids = [int(p) for p in sh(sb, "ls /proc").split() if p.isdigit()]
        assert 1 in pids, "the sandbox must have its own PID 1"
        assert len(pids) < 20, f"too many processes visible: {pids}"
        assert int(sh(sb, "echo $$")) < 200, "PIDs must come from a fresh pid namespace"
        ps = sh(sb, PS)
        assert "31337" not in ps, f"a host process is visible:\n{ps}"
        assert str(pvisor_server.data_dir) not in ps and "--data-dir" not in ps, ps
        assert "pytest" not in ps, ps
        assert int(sh(sb, "ls /proc | grep -c '^[0-9]'")) < 20
    finally:
        host_proc.kill()
        host_proc.wait()


def test_host_files_invisible(sandbox, host_marker, pvisor_server):
    sb = sandbox(BUSYBOX)
    probe = " ".join(str(p) for p in (host_marker, REPO_ROOT / "Cargo.toml", pvisor_server.data_dir,
                                      pvisor_server.log_path))
    out = sh(sb, f"for f in {probe}; do test -e $f && echo VISIBLE $f; done; echo end")
    assert out == "end", out
    with pytest.raises(SandboxApiException) as ei:
        sb.files.read_bytes(str(host_marker))
    assert ei.value.status_code == 404
    assert "HOST-SECRET" not in sh(sb, "cat /tmp/* 2>/dev/null; echo")


def test_fresh_proc_and_root(sandbox):
    sb = sandbox(BUSYBOX)
    mountpoints = [line.split()[1] for line in sh(sb, "cat /proc/mounts").splitlines()]
    assert mountpoints[0] == "/", mountpoints
    leaked = [m for m in mountpoints if m.startswith(("/work", str(REPO_ROOT), "/var/cache", "/home/"))]
    assert leaked == [], f"host directories mounted into the sandbox: {leaked}"
    root_entries = set(sh(sb, "ls -A /").split())
    assert "work" not in root_entries
    assert {"bin", "etc", "proc", "tmp"} <= root_entries


def test_network_namespace_holds_only_its_own_link(sandbox, pvisor_server):
    """A sandbox sees its loopback and its own eth0 (to its netd), none of the
    host's interfaces, and cannot reach the broker's API through its gateway.
    (What its network may reach is tests/e2e/test_network.py's business.)"""
    sb = sandbox(BUSYBOX)
    ifaces = {l.split(":")[0].strip() for l in sh(sb, "cat /proc/net/dev").splitlines()[2:]}
    assert ifaces == {"lo", "eth0"}, ifaces
    t0 = time.monotonic()
    for host in ("127.0.0.1", "10.0.2.2"):
        ex = run(sb, f"wget -T 3 -q -O - http://{host}:{pvisor_server.port}/health")
        assert ex.exit_code != 0, f"the host's pvisor API is reachable from the sandbox via {host}: {describe(ex)}"
    assert time.monotonic() - t0 < 15


SECCOMP_PROBE = r"""
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def res(r):
    return "ok" if r >= 0 else "errno=%d" % ctypes.get_errno()
print("unshare_user", res(libc.unshare(0x10000000)))
os.makedirs("/tmp/mnt-probe", exist_ok=True)
print("mount", res(libc.mount(b"none", b"/tmp/mnt-probe", b"tmpfs", 0, None)))
nr = {"x86_64": 250, "aarch64": 219}[platform.machine()]
print("keyctl", res(libc.syscall(nr, 0, -3, 0)))
"""


def test_seccomp_blocks_dangerous_syscalls(sandbox):
    sb = sandbox(PYTHON)
    sb.files.write_file("/tmp/probe.py", SECCOMP_PROBE)
    out = sh(sb, "python3 /tmp/probe.py")
    assert out.split("\n") == ["unshare_user errno=1", "mount errno=1", "keyctl errno=1"], out
    assert " /tmp/mnt-probe " not in sh(sb, "cat /proc/mounts")
    status = sh(sb, "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status")
    assert "Seccomp:\t2" in status, status


def test_seccomp_cli(sandbox):
    sb = sandbox(DEBIAN)
    ex = run(sb, "unshare -U true")
    assert ex.exit_code != 0, describe(ex)
    ex = run(sb, "mkdir -p /mnt && mount -t tmpfs x /mnt")
    assert ex.exit_code != 0, describe(ex)
    assert " /mnt " not in sh(sb, "cat /proc/mounts")


def test_symlink_escapes_stay_inside(sandbox, host_marker):
    """Paths are resolved inside the sandbox: symlinks cannot reach host files."""
    sb = sandbox(BUSYBOX)
    sh(sb, f"ln -s / /root/l-root; ln -s {REPO_ROOT} /root/l-repo; ln -s /tmp /root/l-tmp; "
           "ln -s ../../../../../../../.. /root/l-rel")
    original = host_marker.read_bytes()
    original_mode = host_marker.stat().st_mode

    for path in (f"/root/l-root{host_marker}", f"/root/l-rel{host_marker}", f"/root/l-tmp/{host_marker.name}",
                 "/root/l-repo/Cargo.toml"):
        with pytest.raises(SandboxApiException) as ei:
            data = sb.files.read_bytes(path)
            pytest.fail(f"read {path} returned {data[:80]!r}")
        assert 400 <= ei.value.status_code < 500, (path, ei.value.status_code)

    tag = uuid.uuid4().hex
    up_paths = {
        f"/root/l-root/tmp/pvisor-e2e-up-{tag}": Path(f"/tmp/pvisor-e2e-up-{tag}"),
        f"/root/l-rel/tmp/pvisor-e2e-rel-{tag}": Path(f"/tmp/pvisor-e2e-rel-{tag}"),
        f"/root/l-repo/pvisor-e2e-repo-{tag}": REPO_ROOT / f"pvisor-e2e-repo-{tag}",
    }
    try:
        for sb_path, host_path in up_paths.items():
            try:
                sb.files.write_file(sb_path, "escaped?")
            except SandboxApiException as e:
                assert 400 <= e.status_code < 500, (sb_path, e.status_code)
            assert not host_path.exists(), f"upload to {sb_path} wrote the host file {host_path}"

        for op in (
            lambda p: sb.files.delete_files([p]),
            lambda p: sb.files.set_permissions([SetPermissionEntry(path=p, mode=777)]),
            lambda p: sb.files.replace_contents([ContentReplaceEntry(path=p, old_content="HOST", new_content="PWNED")]),
            lambda p: sb.files.move_files([MoveEntry(src=p, dest="/root/stolen")]),
        ):
            try:
                op(f"/root/l-root{host_marker}")
            except SandboxApiException:
                pass
            assert host_marker.exists(), "a data-plane call removed/moved a host file"
            assert host_marker.read_bytes() == original, "a data-plane call modified a host file"
            assert host_marker.stat().st_mode == original_mode, "a data-plane call chmod-ed a host file"
    finally:
        for host_path in up_paths.values():
            host_path.unlink(missing_ok=True)


# ------------------------------------------------------------------- resource limits


@pytest.mark.deadline(90)
def test_memory_limit_kills_only_the_hog(sandbox, witness, base_url):
    sb = sandbox(PYTHON, resource={"cpu": "1", "memory": "128Mi"})
    assert sh(sb, "python3 -c 'x = b\"a\" * (48 << 20); print(len(x))'") == str(48 << 20)
    t0 = time.monotonic()
    ex = run(sb, "python3 -c 'x = b\"a\" * (300 << 20); print(\"survived\", len(x))'")
    assert "survived" not in stdout_text(ex), f"300 MiB fitted in a 128Mi sandbox: {describe(ex)}"
    assert ex.exit_code != 0 and ex.error is not None, describe(ex)
    assert time.monotonic() - t0 < 30
    assert wait_until(lambda: sh(sb, "echo alive") == "alive", 10, what="the sandbox to answer after the OOM kill")
    assert sb.get_info().status.state == "Running"
    assert_service_healthy(base_url, witness)


@pytest.mark.deadline(120)
def test_fork_bomb_contained(sandbox, witness, base_url, manager):
    bomb = sandbox(DEBIAN, resource={"cpu": "1", "memory": "256Mi"})
    t0 = time.monotonic()
    try:
        ex = run(bomb, "bash -c ':(){ :|:& };:'; sleep 5", timeout_ms=3000)
        outcome = describe(ex)
    except SandboxException as e:
        outcome = repr(e)
    elapsed = time.monotonic() - t0
    assert elapsed < 60, f"fork bomb command took {elapsed:.0f}s ({outcome})"
    assert_service_healthy(base_url, witness)
    other = sandbox(BUSYBOX)
    assert sh(other, "echo new-sandbox-ok") == "new-sandbox-ok"
    t1 = time.monotonic()
    bomb.kill()
    with pytest.raises(SandboxApiException) as ei:
        manager.get_sandbox_info(bomb.id)
    assert ei.value.status_code == 404
    assert time.monotonic() - t1 < 20, "killing the fork-bombed sandbox took too long"
    assert_service_healthy(base_url, witness)


@pytest.mark.deadline(90)
def test_background_output_flood(sandbox, witness, base_url, pvisor_server):
    sb = sandbox(BUSYBOX)
    rss0 = pvisor_server.rss_kib()
    ex = run(sb, "yes", background=True)
    time.sleep(1.5)
    assert sb.commands.get_command_status(ex.id).running is True
    sb.commands.interrupt(ex.id)
    wait_until(lambda: sb.commands.get_command_status(ex.id).running is False, 10,
               what="the flooding command to stop after interrupt")
    assert_service_healthy(base_url, witness)
    assert sh(sb, "echo ok") == "ok"
    url, headers = dataplane(sb)
    with httpx.stream("GET", f"{url}/command/{ex.id}/logs", headers=headers,
                      timeout=httpx.Timeout(30)) as r:
        assert r.status_code == 200
        head = b""
        for chunk in r.iter_bytes():
            head += chunk
            if len(head) >= MiB:
                break
    assert head.startswith(b"y\ny\ny\n"), head[:50]
    grew = (pvisor_server.rss_kib() - rss0) // 1024
    assert grew < 1024, f"server tree RSS grew by {grew} MiB after an output flood"


@pytest.mark.deadline(90)
def test_foreground_output_flood_client_disconnect(sandbox, witness, base_url):
    sb = sandbox(BUSYBOX)
    url, headers = dataplane(sb)
    read = 0
    with httpx.stream("POST", f"{url}/command", json={"command": "yes | head -c 50000000"},
                      headers={**headers, "Accept": "text/event-stream"},
                      timeout=httpx.Timeout(30, read=30)) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            read += len(chunk)
            if read >= 4 * MiB:
                break
    assert read >= 4 * MiB
    assert_service_healthy(base_url, witness)
    assert wait_until(lambda: sh(sb, "echo ok") == "ok", 15, what="the flooded sandbox to answer")
