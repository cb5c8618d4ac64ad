"""Snapshots with the official SDK: create, poll, list, restore, delete.

An ns snapshot is the sandbox's image plus one layer of its writable state
(overlay upper and its tmpfs `/tmp`), captured while the sandbox is frozen,
imported into the pool. A restore is a create from that image: independent
copies that outlive the source and survive a broker restart.
"""

from __future__ import annotations

import subprocess

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SnapshotFilter
from opensandbox.sync.sandbox import SandboxSync

from conftest import SandboxFactory, _make_conn, _start_server
from e2e_util import BUSYBOX, assert_error_json, run, sh, stdout_text, wait_until

SNAPSHOT_TIMEOUT = 120
MARKER = "/tmp/opensandbox-snapshot-e2e/marker.txt"


def wait_ready(manager, sid: str):
    def ready():
        info = manager.get_snapshot(sid)
        assert info.status.state != "Failed", f"snapshot {sid} failed: {info.status.reason}: {info.status.message}"
        return info if info.status.state == "Ready" else None

    return wait_until(ready, SNAPSHOT_TIMEOUT, 0.2, what=f"snapshot {sid} Ready")


def write_state(sb) -> None:
    """Files in `/`, `/root` and `/tmp`, and a deletion of an image file."""
    sh(sb, f"mkdir -p $(dirname {MARKER}) && echo tmp-marker > {MARKER}")
    sh(sb, "echo root-file > /root/note.txt && echo top-file > /top.txt && mkdir -p /data/sub && "
           "echo deep > /data/sub/deep.txt && rm /bin/vi && test ! -e /bin/vi")


def check_state(sb) -> None:
    assert sh(sb, f"cat {MARKER}").strip() == "tmp-marker"
    assert sh(sb, "cat /root/note.txt").strip() == "root-file"
    assert sh(sb, "cat /top.txt").strip() == "top-file"
    assert sh(sb, "cat /data/sub/deep.txt").strip() == "deep"
    assert run(sb, "test -e /bin/vi").exit_code != 0, "a deletion was not carried over"
    # The image's own files are still there.
    assert sh(sb, "cat /etc/passwd").startswith("root:")


def test_snapshot_create_poll_list_restore_delete(sandbox, manager, http):
    src = sandbox(BUSYBOX, env={"SNAP_ENV": "kept"})
    write_state(src)
    info = src.create_snapshot("e2e-snap")
    assert info.status.state == "Creating"
    assert info.status.reason == "snapshot_accepted"
    assert info.status.message == "Snapshot creation accepted."
    assert info.name == "e2e-snap"
    assert info.sandbox_id == src.id
    assert info.status.last_transition_at >= info.created_at
    # The source keeps running while and after it is captured.
    assert sh(src, "echo alive").strip() == "alive"

    ready = wait_ready(manager, info.id)
    assert ready.status.reason and ready.status.message
    assert ready.created_at == info.created_at
    assert sh(src, "cat /root/note.txt").strip() == "root-file"

    for states in (None, ["Ready"]):
        page = manager.list_snapshots(SnapshotFilter(sandbox_id=src.id, states=states, page=1, page_size=50))
        assert [s.id for s in page.snapshot_infos] == [info.id]
    page = manager.list_snapshots(SnapshotFilter(sandbox_id=src.id, states=["Failed"]))
    assert page.snapshot_infos == []

    r = sandbox(None, snapshot_id=info.id)
    check_state(r)
    assert sh(r, "echo $SNAP_ENV").strip() == "kept"
    assert sh(r, "echo $OPENSANDBOX_ID").strip() == r.id
    got = http.get(f"/v1/sandboxes/{r.id}").json()
    assert got["snapshotId"] == info.id
    assert "image" not in got
    # A restore without an entrypoint runs the reference's default.
    assert got["entrypoint"] == ["tail", "-f", "/dev/null"]

    manager.delete_snapshot(info.id)
    with pytest.raises(SandboxApiException) as e:
        manager.get_snapshot(info.id)
    assert e.value.status_code == 404
    assert manager.list_snapshots(SnapshotFilter(sandbox_id=src.id)).snapshot_infos == []
    # The running restore is unharmed by the delete (its image server holds what it reads).
    check_state(r)
    assert sh(r, "cat /bin/busybox | wc -c").strip() != "0"
    resp = http.delete(f"/v1/snapshots/{info.id}")
    assert_error_json(resp, 404)


def test_restores_are_independent_and_outlive_the_source(sandbox, manager):
    src = sandbox(BUSYBOX)
    sh(src, "echo shared > /root/shared.txt")
    info = src.create_snapshot()
    wait_ready(manager, info.id)
    src.kill()
    a = sandbox(None, snapshot_id=info.id)
    b = sandbox(None, snapshot_id=info.id)
    sh(a, "echo from-a > /root/shared.txt && echo a > /tmp/only-a")
    assert sh(b, "cat /root/shared.txt").strip() == "shared"
    assert run(b, "test -e /tmp/only-a").exit_code != 0
    assert sh(a, "cat /root/shared.txt").strip() == "from-a"
    # A snapshot of a restore carries the restore's changes (its /tmp is in its root now).
    again = a.create_snapshot()
    wait_ready(manager, again.id)
    c = sandbox(None, snapshot_id=again.id)
    assert sh(c, "cat /root/shared.txt").strip() == "from-a"
    assert sh(c, "cat /tmp/only-a").strip() == "a"
    manager.delete_snapshot(again.id)
    manager.delete_snapshot(info.id)


def test_hostile_upper_content_does_not_leak_host_files(sandbox, manager):
    host_shadow = open("/etc/shadow").read()
    src = sandbox(BUSYBOX)
    sh(src, "ln -s /etc/shadow /root/shadow-link && ln -s ../../../../../etc/shadow /tmp/up-link && "
            "ln /etc/passwd /root/passwd-hardlink && mkfifo /root/fifo && mkfifo /tmp/fifo && "
            "ln -s / /tmp/rootlink")
    info = src.create_snapshot()
    wait_ready(manager, info.id)
    r = sandbox(None, snapshot_id=info.id)
    for link in ("/root/shadow-link", "/tmp/up-link"):
        assert sh(r, f"readlink {link}").strip().endswith("etc/shadow")
        content = stdout_text(run(r, f"cat {link}"))
        assert content == stdout_text(run(src, f"cat {link}")), "the link changed meaning"
        if host_shadow.strip():
            assert host_shadow.strip() not in content
    assert sh(r, "cat /root/passwd-hardlink") == sh(src, "cat /etc/passwd")
    assert sh(r, "test -p /root/fifo && test -p /tmp/fifo && echo fifos").strip() == "fifos"
    assert sh(r, "readlink /tmp/rootlink").strip() == "/"
    manager.delete_snapshot(info.id)


def test_snapshot_errors(sandbox, manager, http):
    resp = http.post("/v1/sandboxes/00000000-0000-4000-8000-000000000000/snapshots", json={})
    assert_error_json(resp, 404)
    resp = http.get("/v1/snapshots/00000000-0000-4000-8000-000000000000")
    assert assert_error_json(resp, 404)["code"] == "SNAPSHOT::NOT_FOUND"
    resp = http.post("/v1/sandboxes", json={"snapshotId": "00000000-0000-4000-8000-000000000000",
                                            "resourceLimits": {"cpu": "1", "memory": "512Mi"}})
    assert assert_error_json(resp, 404)["code"] == "SNAPSHOT::NOT_FOUND"
    sb = sandbox(BUSYBOX)
    sb.pause()
    resp = http.post(f"/v1/sandboxes/{sb.id}/snapshots", json={})
    assert assert_error_json(resp, 409)["code"] == "SNAPSHOT::INVALID_SOURCE_STATE"
    resp = http.get("/v1/snapshots?pageSize=0")
    assert_error_json(resp, 400)


def test_snapshot_routes_and_paging(sandbox, manager, http):
    sb = sandbox(BUSYBOX)
    resp = http.post(f"/v1/sandboxes/{sb.id}/snapshots", json={"name": "paged"})
    assert resp.status_code == 202, resp.text
    first = resp.json()
    assert resp.headers["location"] == f"/v1/snapshots/{first['id']}"
    # Deleting while Creating is refused (or it is already Ready, then allowed below).
    d = http.delete(f"/v1/snapshots/{first['id']}")
    if d.status_code != 204:
        assert assert_error_json(d, 409)["code"] == "SNAPSHOT::INVALID_STATE"
        wait_ready(manager, first["id"])
    second = http.post(f"/v1/sandboxes/{sb.id}/snapshots", json={}).json()
    wait_ready(manager, second["id"])
    page = http.get("/v1/snapshots", params={"sandboxId": sb.id, "pageSize": 1}).json()
    assert page["pagination"] == {"page": 1, "pageSize": 1, "totalItems": page["pagination"]["totalItems"],
                                  "totalPages": page["pagination"]["totalItems"],
                                  "hasNextPage": page["pagination"]["totalItems"] > 1}
    assert page["items"][0]["id"] == second["id"], "newest first"
    named = http.get("/v1/snapshots", params={"name": "paged"}).json()["items"]
    assert all(s["name"] == "paged" for s in named)
    for s in http.get("/v1/snapshots", params={"sandboxId": sb.id}).json()["items"]:
        assert http.delete(f"/v1/snapshots/{s['id']}").status_code == 204


def test_cli_snapshot_ls_rm(sandbox, manager, pvisor_server):
    sb = sandbox(BUSYBOX)
    info = sb.create_snapshot("cli")
    wait_ready(manager, info.id)
    env = {"PVISOR_SERVER": pvisor_server.addr, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([str(pvisor_server.binary), "snapshot", "ls", "--sandbox", sb.id], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert info.id in out.stdout and "Ready" in out.stdout
    out = subprocess.run([str(pvisor_server.binary), "snapshot", "rm", info.id], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    with pytest.raises(SandboxApiException):
        manager.get_snapshot(info.id)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "snap", ["busybox.tar"], {}, ["--backend", "ns", "--warm-workers", "1"])
    yield srv
    srv.stop()


def test_snapshot_survives_a_broker_restart(own_server):
    from opensandbox.sync import SandboxManagerSync

    conn = _make_conn(own_server.addr)
    f = SandboxFactory(conn)
    try:
        src = f(BUSYBOX)
        write_state(src)
        info = src.create_snapshot("restart")
        with SandboxManagerSync.create(connection_config=conn) as m:
            wait_ready(m, info.id)
        own_server.stop()  # the source sandbox outlives it (cleaned up below)
        own_server.start()  # on a new port
        conn = _make_conn(own_server.addr)
        f.conn = conn
        # The new broker re-adopted the source: clean it up through it.
        src.close()
        f.created = [SandboxSync.connect(src.id, connection_config=conn)]
        with SandboxManagerSync.create(connection_config=conn) as m:
            got = m.get_snapshot(info.id)
            assert got.status.state == "Ready" and got.name == "restart"
            r = f(None, snapshot_id=info.id)
            check_state(r)
            m.delete_snapshot(info.id)
            with pytest.raises(SandboxApiException):
                m.get_snapshot(info.id)
    finally:
        f.cleanup()
    # Restart again: the deleted snapshot stays deleted.
    own_server.stop()
    own_server.start()
    r = httpx.get(f"{own_server.url}/v1/snapshots/{info.id}", timeout=30)
    assert r.status_code == 404
