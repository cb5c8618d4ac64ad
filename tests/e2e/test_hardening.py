"""Regression tests for escapes found in review: a hostile image must not make
the sandbox's init write host files, and sandbox processes get no host
descriptors and no controlling terminal."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

from opensandbox.sync.sandbox import SandboxSync

from conftest import _make_conn
from e2e_util import BUSYBOX, sh


def docker_archive(path: Path, tag: str, layer_entries: list[tarfile.TarInfo]) -> None:
    """A one-layer docker-archive holding `layer_entries` (no file data)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for e in layer_entries:
            t.addfile(e)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["true"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as t:
        for name, data in [(f"{diff_id}/layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)]:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))


def entry(name: str, kind: bytes, target: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = target
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o777
    return ti


def test_image_symlinks_cannot_make_init_write_host_files(pvisor_server, tmp_path):
    victim = Path(f"/var/tmp/pvisor-victim-{os.getpid()}")
    victim.write_text("untouched\n")
    os.chown(victim, 100000, 100000)  # owned like a sandbox's files: writable if reached
    victim.chmod(0o644)
    archive = tmp_path / "evil.tar"
    docker_archive(archive, "evil:latest", [
        entry("etc", tarfile.DIRTYPE),
        entry("etc/hosts", tarfile.SYMTYPE, str(victim)),
        entry("etc/hostname", tarfile.SYMTYPE, str(victim)),
        entry("proc", tarfile.SYMTYPE, "/var/tmp"),
        entry("tmp", tarfile.SYMTYPE, "/var/tmp"),
    ])
    subprocess.run([str(pvisor_server.binary), "image", "import", str(archive), "--data-dir", str(pvisor_server.data_dir)],
                   check=True, capture_output=True)
    try:
        sb = SandboxSync.create("evil:latest", connection_config=_make_conn(pvisor_server.addr), entrypoint=["/nonexistent"])
        sb.kill()
    except Exception:
        pass  # refusing the image is fine too; writing outside is not
    assert victim.read_text() == "untouched\n"
    victim.unlink()


def test_sandbox_processes_get_no_host_descriptors_or_terminal(sandbox):
    sb = sandbox(BUSYBOX)
    # The agent's control socket (fd 3) and host fds never reach commands:
    # look at a separate process (the shell and `ls` have fds of their own).
    fds = sh(sb, "sleep 2 & ls /proc/$!/fd")
    assert sorted(int(x) for x in fds.split()) == [0, 1, 2], fds
    tty_nr = sh(sb, "cut -d' ' -f7 /proc/self/stat")
    assert tty_nr == "0", f"sandbox process has a controlling terminal: tty_nr={tty_nr}"
    assert sh(sb, "cat /dev/tty 2>&1 || echo no-tty").endswith("no-tty")


def test_data_dir_is_private(pvisor_server):
    for d in [pvisor_server.data_dir, pvisor_server.data_dir / "images", pvisor_server.data_dir / "sandboxes"]:
        assert (d.stat().st_mode & 0o077) == 0, f"{d} is reachable by other users: {oct(d.stat().st_mode)}"
