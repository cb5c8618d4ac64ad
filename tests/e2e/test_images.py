"""The image pool as sandboxes see it: images served read-only through one
FUSE server per image, shared by all sandboxes of that image; the pool CLI
(import progress as JSON, du, rm + gc while sandboxes run, refusals that
leave the pool unchanged); pulls from a registry on create."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from opensandbox.sync.sandbox import SandboxSync

from conftest import _make_conn, _start_server, images_dir, pvisor_bin
from e2e_util import BUSYBOX, PYTHON, SMALL, TOOLS


def run(sb, cmd: str) -> str:
    ex = sb.commands.run(cmd)
    out = "\n".join(m.text.rstrip("\n") for m in ex.logs.stdout)
    assert ex.exit_code == 0, f"{cmd!r}: exit {ex.exit_code}, stdout {out!r}, stderr {ex.logs.stderr!r}"
    return out


def children(pid: int, exe: str) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=,ppid=", "-C", exe], capture_output=True, text=True).stdout
    return [int(p) for p, pp in (l.split() for l in out.splitlines() if l.strip()) if int(pp) == pid]


def image_mounts(data_dir: Path) -> list[str]:
    return [l.split()[1] for l in Path("/proc/mounts").read_text().splitlines()
            if l.split()[1].startswith(str(data_dir / "mnt")) and l.split()[2] == "fuse.pvisor"]


def pool(srv, *args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([str(pvisor_bin()), "image", *args, "--data-dir", str(srv.data_dir)], capture_output=True,
                          text=True, check=check, timeout=300)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = _start_server(tmp_path_factory, "pvisor-images", ["busybox.tar", "python-3.11-slim.tar",
                                                          "python-3.11-tools.tar"], {})
    yield s
    s.stop()
    assert image_mounts(s.data_dir) == [], "image mounts left after the broker stopped"


def test_sandboxes_of_an_image_share_one_read_only_server(srv):
    conn = _make_conn(srv.addr)
    a = SandboxSync.create(PYTHON, connection_config=conn, resource=SMALL)
    b = SandboxSync.create(PYTHON, connection_config=conn, resource=SMALL)
    c = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    try:
        assert len(children(srv.proc.pid, "pvisor-imaged")) == 2, "one server per image in use"
        assert len(image_mounts(srv.data_dir)) == 2
        # The image as the sandbox sees it, through FUSE and the overlay.
        assert run(a, "python3 -c 'import json, email, http.client; print(6*7)'") == "42"
        path = "/usr/lib/python3.11/json/__init__.py"
        assert run(a, f"sha256sum {path}") == run(b, f"sha256sum {path}")
        # Each sandbox writes to its own upper layer; the image never changes.
        run(a, f"echo changed >> {path} && echo new > /usr/new-file && rm /etc/debian_version")
        assert run(a, f"tail -1 {path}") == "changed"
        assert run(b, f"tail -1 {path}") != "changed"
        assert run(b, "test ! -e /usr/new-file && test -e /etc/debian_version && echo ok") == "ok"
        mount = image_mounts(srv.data_dir)[0]
        with pytest.raises(OSError):
            (Path(mount) / "etc" / "x").write_text("no")
        assert run(c, "busybox echo hi") == "hi"
    finally:
        for sb in (a, b, c):
            sb.kill()


def test_a_dead_image_server_is_replaced_and_other_images_keep_working(srv):
    conn = _make_conn(srv.addr)
    py = SandboxSync.create(PYTHON, connection_config=conn, resource=SMALL)
    bb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    try:
        bb_mount = [m for m in image_mounts(srv.data_dir) if Path(m, "bin", "busybox").exists()
                    and not Path(m, "usr", "bin", "python3").exists()]
        assert len(bb_mount) == 1
        victims = [p for p in children(srv.proc.pid, "pvisor-imaged")
                   if bb_mount[0] in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")]
        assert len(victims) == 1
        os.kill(victims[0], 9)
        time.sleep(0.2)
        # Other images are untouched.
        assert run(py, "python3 -c 'print(1)'") == "1"
        # The next create of the image starts a new server.
        bb2 = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        try:
            assert run(bb2, "busybox echo again") == "again"
        finally:
            bb2.kill()
    finally:
        py.kill()
        bb.kill()


def test_import_progress_json_and_refusals_leave_the_pool_unchanged(srv, tmp_path):
    out = pool(srv, "import", images_dir() / "busybox.tar", "--json").stdout
    events = [json.loads(l) for l in out.splitlines()]
    assert events[-1]["event"] == "done" and events[-1]["reused"] is True, events
    listed = json.loads(pool(srv, "ls", "--json").stdout)
    assert sorted(n for i in listed for n in i["names"]) == sorted([BUSYBOX, PYTHON, TOOLS]), listed
    assert all(i["size_bytes"] > 0 and i["id"].startswith("sha256:") for i in listed)
    before = json.loads(pool(srv, "du", "--json").stdout)
    bad = tmp_path / "truncated.tar"
    data = (images_dir() / "python-3.11-slim.tar").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    r = pool(srv, "import", bad, check=False)
    assert r.returncode != 0 and "truncated.tar" in r.stderr and r.stderr.strip(), r.stderr
    after = json.loads(pool(srv, "du", "--json").stdout)
    assert after["images"] == before["images"]
    assert after["chunks"] == before["chunks"]
    assert after["allocated_bytes"] <= before["allocated_bytes"] + 64 * 1024


def test_rm_and_gc_while_a_sandbox_of_the_image_runs(srv):
    conn = _make_conn(srv.addr)
    sb = SandboxSync.create(TOOLS, connection_config=conn, resource=SMALL)
    try:
        before = json.loads(pool(srv, "du", "--json").stdout)
        r = pool(srv, "rm", TOOLS)
        assert "removed" in r.stdout
        after = json.loads(pool(srv, "du", "--json").stdout)
        assert TOOLS not in [n for i in after["images"] for n in i["names"]]
        assert after["allocated_bytes"] < before["allocated_bytes"], "gc freed the image's own chunks"
        assert after["unreferenced_bytes"] == 0
        # The running sandbox still reads every file of its image (its server
        # holds the packs it reads open), including content gc just deleted.
        run(sb, "find / -xdev -type f -exec cat {} + > /dev/null && echo read-all")
        run(sb, "python3 -c 'import json, email, http.client'")
        # New sandboxes of the removed image are refused.
        r = httpx.post(f"{srv.url}/v1/sandboxes", json={"image": {"uri": TOOLS}, "timeout": 60,
                                                         "entrypoint": ["sleep", "1"]}, timeout=30)
        assert r.status_code == 404 and r.json()["code"] == "IMAGE_NOT_FOUND", r.text
    finally:
        sb.kill()
        pool(srv, "import", images_dir() / "python-3.11-tools.tar")


# ---------------------------------------------------------------- pulls


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry():
    if not shutil.which("docker-registry") or not shutil.which("skopeo") or not shutil.which("htpasswd"):
        pytest.skip("docker-registry, skopeo and htpasswd are needed (apt-get install docker-registry skopeo "
                    "apache2-utils)")
    d = Path(tempfile.mkdtemp(prefix="pvisor-e2e-registry-"))
    port = free_port()
    htpasswd = subprocess.run(["htpasswd", "-Bbn", "alice", "s3cret"], capture_output=True, text=True,
                              check=True).stdout
    (d / "htpasswd").write_text(htpasswd)
    (d / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {d}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: e2e\n"
        f"auth:\n  htpasswd:\n    realm: e2e\n    path: {d}/htpasswd\n")
    proc = subprocess.Popen(["docker-registry", "serve", d / "config.yml"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code in (200, 401):
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "docker-registry did not start"
        time.sleep(0.1)
    addr = f"127.0.0.1:{port}"
    subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false",
                    "--dest-creds", "alice:s3cret", f"docker-archive:{images_dir() / 'busybox.tar'}",
                    f"docker://{addr}/e2e/busybox:v1"], check=True, capture_output=True)
    yield addr
    proc.kill()
    proc.wait()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pull_srv(tmp_path_factory):
    s = _start_server(tmp_path_factory, "pvisor-pull", [], {}, ["--allow-pull"])
    yield s
    s.stop()


def create(url: str, uri: str, auth: dict | None = None) -> httpx.Response:
    image = {"uri": uri, **({"auth": auth} if auth else {})}
    return httpx.post(f"{url}/v1/sandboxes", json={"image": image, "timeout": 120, "entrypoint": ["sleep", "60"]},
                      timeout=60)


def test_create_pulls_a_missing_image_when_allowed(registry, pull_srv, srv):
    uri = f"{registry}/e2e/busybox:v1"
    # Without credentials the registry refuses (a 502: a 401 would blame this
    # server's API key), and nothing is pulled.
    r = create(pull_srv.url, uri)
    assert r.status_code == 502 and r.json()["code"] == "IMAGE_PULL_UNAUTHORIZED", r.text
    r = create(pull_srv.url, uri, {"username": "alice", "password": "wrong"})
    assert r.status_code == 502 and r.json()["code"] == "IMAGE_PULL_UNAUTHORIZED", r.text
    r = create(pull_srv.url, uri, {"username": "alice", "password": "s3cret"})
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    try:
        sb = SandboxSync.connect(sid, connection_config=_make_conn(pull_srv.addr))
        assert run(sb, "busybox echo pulled") == "pulled"
    finally:
        httpx.delete(f"{pull_srv.url}/v1/sandboxes/{sid}", timeout=30)
    listed = [n for i in json.loads(pool(pull_srv, "du", "--json").stdout)["images"] for n in i["names"]]
    assert uri in listed, listed
    # A tag the registry lacks is a 404, as is any missing image on a server
    # that does not pull.
    r = create(pull_srv.url, f"{registry}/e2e/busybox:nope", {"username": "alice", "password": "s3cret"})
    assert r.status_code == 404 and r.json()["code"] == "IMAGE_NOT_FOUND", r.text
    r = create(srv.url, uri, {"username": "alice", "password": "s3cret"})
    assert r.status_code == 404 and r.json()["code"] == "IMAGE_NOT_FOUND", r.text


def test_an_idle_image_server_is_stopped_and_started_again(tmp_path_factory):
    s = _start_server(tmp_path_factory, "pvisor-idle", ["busybox.tar"], {}, ["--image-idle-secs", "1"])
    try:
        conn = _make_conn(s.addr)
        sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        assert run(sb, "busybox echo one") == "one"
        time.sleep(1.5)
        assert len(children(s.proc.pid, "pvisor-imaged")) == 1, "in use: kept however long"
        sb.kill()
        deadline = time.monotonic() + 10
        while children(s.proc.pid, "pvisor-imaged") or image_mounts(s.data_dir):
            assert time.monotonic() < deadline, "the idle image server was not stopped"
            time.sleep(0.1)
        # Its packs are closed now, and the next create starts a new server.
        sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        try:
            assert run(sb, "busybox echo two") == "two"
            assert len(children(s.proc.pid, "pvisor-imaged")) == 1
        finally:
            sb.kill()
    finally:
        s.stop()
