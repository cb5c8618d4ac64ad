"""Trees a tenant can build and nothing recursive or path-based survives (issue 12, items 1-2).

`python3 -c "...[(os.mkdir('d'),os.chdir('d')) for i in range(25000)]"` inside a sandbox
once crashed the broker at teardown (`remove_dir_all` overflowed its stack) and with it
every sandbox; at 100,000 levels the agent died in a files-API search or delete. Here a
tree PVISOR_E2E_DEEP levels deep (default 100,000; paths of 200 KB, far past PATH_MAX) is
searched, listed, deleted through the files API, snapshotted, torn down and left over for
a restart's cleanup; the broker, the agent and a second sandbox stay up throughout.

The module's server keeps its data dir on tmpfs (/dev/shm) where there is one: on this
host's ext4 the kernel's cost per mkdir grows with depth (100,000 levels take minutes),
on tmpfs a few seconds.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from opensandbox.models.filesystem import DirectoryListEntry, SearchEntry

from conftest import SandboxFactory, PvisorServer, _DATA_DIRS, _make_conn, import_images, pvisor_bin
from e2e_util import BUSYBOX, run, sh, wait_until

PYTHON = "python:3.11-slim"
DEPTH = int(os.environ.get("PVISOR_E2E_DEEP", "100000"))
BUILD = (
    "python3 -c \"import os;os.makedirs('{dir}',exist_ok=True);os.chdir('{dir}');"
    "[(os.mkdir('d'),os.chdir('d')) for i in range({depth})];open('leaf.txt','w').write('bottom')\""
)


def build_deep(sb, where: str = "/root/deep") -> None:
    sh(sb, BUILD.format(dir=where, depth=DEPTH), timeout_ms=600_000)


@pytest.fixture(scope="module")
def deep_server(tmp_path_factory):
    base = tmp_path_factory.mktemp("deep")
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    data_dir = Path(tempfile.mkdtemp(prefix="deep-e2e-data-", dir=parent))
    data_dir.chmod(0o755)
    _DATA_DIRS.append(data_dir)
    binary = pvisor_bin()
    import_images(binary, data_dir, ["busybox.tar", "python-3.11-slim.tar"])
    # No disk bound: with one, a sandbox's upper is its own ext4 image and
    # teardown removes one file; the deep tree on the host's file system is
    # what an unprivileged broker (or --disk-limit 0) has, and what this tests.
    srv = PvisorServer("deep", binary, data_dir, base / "server.log", {}, ["--backend", "ns", "--disk-limit", "0"])
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def factory(deep_server):
    f = SandboxFactory(_make_conn(deep_server.addr))
    yield f
    f.cleanup()


def healthy(srv: PvisorServer) -> None:
    assert srv.alive(), f"the broker died:\n{srv.log_tail(40)}"
    r = httpx.get(f"{srv.url}/health", timeout=10)
    assert r.status_code == 200, r.text


def still_fine(srv: PvisorServer, other) -> None:
    """The service answers and an unrelated sandbox still runs commands."""
    healthy(srv)
    assert sh(other, "echo alive").strip() == "alive"


@pytest.mark.deadline(900)
def test_files_api_searches_lists_and_deletes_a_deep_tree(factory, deep_server):
    other = factory(BUSYBOX)
    sb = factory(PYTHON)
    build_deep(sb)
    found = sb.files.search(SearchEntry(path="/root/deep", pattern="leaf.txt"))
    assert len(found) == 1
    assert found[0].path.endswith("/d/d/leaf.txt")
    assert len(found[0].path) == len("/root/deep/") + 2 * DEPTH + len("leaf.txt")
    listed = sb.files.list_directory(DirectoryListEntry(path="/root/deep", depth=3))
    assert [e.path for e in listed] == ["/root/deep/d", "/root/deep/d/d", "/root/deep/d/d/d"]
    sb.files.delete_directories(["/root/deep"])
    assert run(sb, "test -e /root/deep").exit_code != 0, "the deep tree was deleted"
    assert sh(sb, "echo agent-alive").strip() == "agent-alive"
    still_fine(deep_server, other)


@pytest.mark.deadline(900)
def test_teardown_of_a_deep_tree_keeps_the_broker_and_other_sandboxes(factory, deep_server):
    other = factory(BUSYBOX)
    sb = factory(PYTHON)
    build_deep(sb)
    state_dir = deep_server.data_dir / "sandboxes" / sb.id
    assert state_dir.is_dir()
    since = deep_server.log_size()
    sb.kill()
    wait_until(lambda: not state_dir.exists(), 300, 0.5, what=f"{state_dir} removed")
    still_fine(deep_server, other)
    assert "removed a deep sandbox tree" in deep_server.log_tail(200, since=since)


@pytest.mark.deadline(900)
def test_snapshot_of_a_deep_tree_fails_cleanly(factory, deep_server):
    other = factory(BUSYBOX)
    sb = factory(PYTHON)
    build_deep(sb)
    info = sb.create_snapshot("deep")
    from opensandbox.sync import SandboxManagerSync

    with SandboxManagerSync.create(connection_config=_make_conn(deep_server.addr)) as m:
        def settled():
            s = m.get_snapshot(info.id)
            return s if s.status.state in ("Ready", "Failed") else None

        got = wait_until(settled, 600, 0.5, what="snapshot settled")
        assert got.status.state == "Failed", "a layer cannot hold a 100,000-level tree"
        assert "deeper than a layer can hold" in (got.status.message or ""), got.status
    assert sh(sb, "echo thawed").strip() == "thawed", "the sandbox runs again after the failed capture"
    still_fine(deep_server, other)


def make_chain(top: Path, depth: int) -> None:
    """A chain `depth` levels deep under `top`, made fd-relative on the host."""
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.mark.deadline(900)
def test_restart_removes_deep_leftovers_and_logs_what_it_cannot(deep_server):
    if os.geteuid() != 0:
        pytest.skip("needs root (mounts a tmpfs inside a leftover to make its removal fail)")
    sandboxes = deep_server.data_dir / "sandboxes"
    deep_server.stop()
    leftover = sandboxes / "00000000-dead-4000-8000-leftover0001"
    make_chain(leftover / "upper", DEPTH)
    stuck = sandboxes / "00000000-dead-4000-8000-leftover0002"
    (stuck / "mnt").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(stuck / "mnt")], check=True)
    try:
        (stuck / "mnt" / "precious").write_text("x")
        since = deep_server.log_size()
        deep_server.start()
        healthy(deep_server)
        assert not leftover.exists(), "a deep leftover is really removed at start-up"
        log = deep_server.log_tail(400, since=since)
        assert "cannot remove" in log and "leftover0002" in log and "mount point" in log, log[-3000:]
        assert (stuck / "mnt" / "precious").exists(), "a mounted file system is not emptied"
    finally:
        subprocess.run(["umount", "-l", str(stuck / "mnt")], check=False)
    deep_server.stop()
    deep_server.start()
    assert not stuck.exists(), "once removable, the next start removes it"
