"""A worker that dies is noticed: its sandbox is reported Failed with a
reason, its resources are released, and the service and other sandboxes
keep working."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync.sandbox import SandboxSync

from conftest import _make_conn, _start_server
from e2e_util import BUSYBOX


def worker_children(server_pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,ppid=", "-C", "pvisor-worker"], capture_output=True, text=True).stdout
    return [int(p) for p, pp in (l.split() for l in out.splitlines() if l.strip()) if int(pp) == server_pid]


@pytest.fixture(scope="module")
def crash_server(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "pvisor-crash", ["busybox.tar"], {})
    yield srv
    srv.stop()


def test_killed_worker_is_reported_failed_and_cleaned_up(crash_server):
    conn = _make_conn(crash_server.addr)
    victim = SandboxSync.create(BUSYBOX, connection_config=conn, resource={"cpu": "1", "memory": "128Mi"})
    sandbox_dir = crash_server.data_dir / "sandboxes" / victim.id
    assert sandbox_dir.is_dir()
    assert victim.commands.run("echo before").exit_code == 0

    # SIGKILL every worker of this server (the warm ones too).
    pids = worker_children(crash_server.proc.pid)
    assert pids, "the server has workers"
    for p in pids:
        os.kill(p, signal.SIGKILL)

    url = f"{crash_server.url}/v1/sandboxes/{victim.id}"
    deadline = time.monotonic() + 10
    while True:
        info = httpx.get(url, timeout=5).json()
        if info["status"]["state"] == "Failed":
            break
        assert time.monotonic() < deadline, f"never reported Failed: {info}"
        time.sleep(0.05)
    assert info["status"]["reason"] == "WORKER_EXITED"
    assert "SIGKILL" in info["status"]["message"] or "signal" in info["status"]["message"], info
    # Released: no sandbox directory, no process left in its cgroups.
    deadline = time.monotonic() + 10
    while sandbox_dir.exists():
        assert time.monotonic() < deadline, "sandbox directory not removed"
        time.sleep(0.05)
    with pytest.raises(SandboxApiException) as ei:
        victim.commands.run("echo after")
    assert ei.value.status_code == 409

    # The service still creates and runs sandboxes (dead warm workers are skipped).
    other = SandboxSync.create(BUSYBOX, connection_config=conn, resource={"cpu": "1", "memory": "128Mi"})
    try:
        ex = other.commands.run("echo alive")
        assert [m.text for m in ex.logs.stdout] == ["alive"]
    finally:
        other.kill()

    # A failed sandbox is deleted like any other.
    assert httpx.delete(url, timeout=5).status_code == 204
    assert httpx.get(url, timeout=5).status_code == 404
