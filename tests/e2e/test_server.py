"""The `pvisor serve` process itself: where its data directory may live.

A data dir must either work or be refused at startup with a message naming it;
it must not start fine and then fail every sandbox create."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
from opensandbox.sync import SandboxSync

from conftest import PvisorServer, _make_conn, free_port, import_images, make_data_dir, pvisor_bin
from e2e_util import BUSYBOX, PS, SMALL, run, sh, wait_healthy


def _serve_and_create(data_dir: Path, log_path: Path) -> None:
    binary = pvisor_bin()
    if not binary.is_file():
        pytest.fail(f"pvisor binary {binary} not found (set PVISOR_BIN)", pytrace=False)
    import_images(binary, data_dir, ["busybox.tar"])
    srv = PvisorServer(f"pvisor-{data_dir.parent.name}", binary, data_dir, log_path, {})
    why = srv.start(must_succeed=False)
    try:
        if why:
            log = srv.log_tail(30)
            assert str(data_dir) in log, f"server refused to start ({why}) without naming the data dir:\n{log}"
            return
        sb = SandboxSync.create(BUSYBOX, connection_config=_make_conn(srv.addr), resource=dict(SMALL))
        try:
            assert sh(sb, "echo ok") == "ok"
        finally:
            sb.kill()
            sb.close()
    finally:
        srv.stop()


@pytest.mark.deadline(120)
def test_data_dir_under_private_parent(tmp_path):
    """`mktemp -d` makes 0700 directories; a data dir inside one (short path)."""
    parent = Path(tempfile.mkdtemp(prefix="pve-"))  # 0700
    try:
        data_dir = parent / "data"
        data_dir.mkdir(mode=0o700)
        _serve_and_create(data_dir, tmp_path / "server.log")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.deadline(120)
def test_data_dir_with_long_path(tmp_path):
    """A deep but ordinary data dir path (world-traversable, ~110 characters)."""
    parent = Path(tempfile.mkdtemp(prefix="pve-long-"))
    parent.chmod(0o755)
    try:
        data_dir = parent / ("projects/" + "x" * 40 + "/pvisor-state/data")
        data_dir.mkdir(parents=True)
        for p in [data_dir, *data_dir.parents]:
            if p == parent.parent:
                break
            p.chmod(0o755)
        _serve_and_create(data_dir, tmp_path / "server.log")
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.deadline(120)
def test_second_instance_leaves_the_first_alone(sandbox, pvisor_server, base_url, tmp_path):
    """Two `pvisor serve` instances (different data dirs) on one host must not touch
    each other's sandboxes or cgroups, at startup or at shutdown."""
    sb = sandbox(BUSYBOX)
    bg = run(sb, "sleep 7777", background=True)
    data_dir = make_data_dir("pvisor-second")
    binary = pvisor_bin()
    import_images(binary, data_dir, ["busybox.tar"])
    second = PvisorServer("pvisor-second", binary, data_dir, tmp_path / "server.log", {})
    second.start()
    try:
        other = SandboxSync.create(BUSYBOX, connection_config=_make_conn(second.addr), resource=dict(SMALL))
        try:
            assert sh(other, "echo second-ok") == "second-ok"
        finally:
            other.kill()
            other.close()
        assert sh(sb, "echo first-still-ok") == "first-still-ok", "starting a second instance broke a sandbox"
        assert sb.commands.get_command_status(bg.id).running is True
    finally:
        second.stop()
    assert sh(sb, "echo after-second-stopped") == "after-second-stopped"
    assert "sleep 7777" in sh(sb, PS)
    fresh = sandbox(BUSYBOX)
    assert sh(fresh, "echo new-ok") == "new-ok"


def test_listening_beyond_loopback_needs_an_api_key(tmp_path):
    """Without PVISOR_API_KEY, a non-loopback listen address is refused at
    start-up with a message that says what to do; with a key it starts."""
    binary = pvisor_bin()
    data = make_data_dir("pvisor-wild")
    env = {k: v for k, v in os.environ.items() if k != "PVISOR_API_KEY"}
    port = free_port()
    r = subprocess.run([str(binary), "serve", "--listen", f"0.0.0.0:{port}", "--data-dir", str(data)],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "PVISOR_API_KEY" in r.stderr and "0.0.0.0" in r.stderr, r.stderr
    env["PVISOR_API_KEY"] = "k"
    p = subprocess.Popen([str(binary), "serve", "--listen", f"0.0.0.0:{port}", "--data-dir", str(data)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port, p, lambda: p.stderr.read().decode() if p.poll() is not None else "")
        assert httpx.get(f"http://127.0.0.1:{port}/v1/sandboxes", timeout=5).status_code == 401
    finally:
        p.terminate()
        p.wait(timeout=30)
