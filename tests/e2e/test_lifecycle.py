"""Lifecycle API: create/get/list/delete, metadata, renew, expiry, endpoints, pause/resume."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync import SandboxSync

from conftest import SUITE_BACKEND
from e2e_util import (
    PS,
    BUSYBOX,
    BUSYBOX_OCI,
    DEBIAN,
    EGRESS_PORT,
    EXECD_PORT,
    PYTHON,
    RAW_CREATE,
    SMALL,
    TOOLS,
    assert_error_json,
    dataplane,
    find_nulls,
    run,
    sh,
    wait_until,
)


def now() -> datetime:
    return datetime.now(timezone.utc)


def test_health(http):
    r = http.get("/health")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "healthy"}


def test_create_and_get_info(sandbox):
    t0 = now()
    sb = sandbox(BUSYBOX, metadata={"suite": "e2e", "case": "get-info"})
    info = sb.get_info()
    assert info.id == sb.id
    assert info.status.state == "Running"
    assert info.image is not None and info.image.image == BUSYBOX
    assert info.entrypoint == ["tail", "-f", "/dev/null"]
    assert info.metadata == {"suite": "e2e", "case": "get-info"}
    assert info.created_at.tzinfo is not None, "createdAt must carry a timezone"
    assert t0 - timedelta(seconds=5) <= info.created_at <= now() + timedelta(seconds=5)
    assert info.expires_at is not None
    lifetime = (info.expires_at - info.created_at).total_seconds()
    assert 590 <= lifetime <= 610, f"timeout=600s but expiresAt-createdAt={lifetime}s"
    assert sh(sb, "echo ready") == "ready"


def test_raw_create_get_delete_wire_format(http):
    r = http.post("/v1/sandboxes", json=RAW_CREATE)
    assert r.status_code == 202, f"create must answer 202: {r.status_code} {r.text}"
    body = r.json()
    sid = body["id"]
    try:
        assert find_nulls(body) == [], f"nulls in create response: {body}"
        assert isinstance(body["status"]["state"], str)
        assert body["entrypoint"] == RAW_CREATE["entrypoint"]
        assert "createdAt" in body and "expiresAt" in body

        r = http.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200, r.text
        got = r.json()
        assert find_nulls(got) == [], f"nulls in get response: {got}"
        assert got["id"] == sid
        assert got["image"]["uri"] == BUSYBOX
        for field in ("status", "entrypoint", "createdAt"):
            assert field in got, f"{field} missing in {got}"
    finally:
        r = http.delete(f"/v1/sandboxes/{sid}")
    assert r.status_code == 204, f"delete must answer 204: {r.status_code} {r.text}"
    assert r.content == b""
    r = http.get(f"/v1/sandboxes/{sid}")
    assert_error_json(r, 404)


def test_kill_then_404(sandbox, manager):
    sb = sandbox(BUSYBOX)
    sid = sb.id
    sb.kill()
    with pytest.raises(SandboxApiException) as ei:
        manager.get_sandbox_info(sid)
    assert ei.value.status_code == 404
    assert ei.value.error.code and ei.value.error.code != "INTERNAL_UNKNOWN_ERROR", ei.value.error.code
    with pytest.raises(SandboxApiException) as ei:
        sb.get_info()
    assert ei.value.status_code == 404
    with pytest.raises(SandboxApiException) as ei:
        manager.kill_sandbox(sid)
    assert ei.value.status_code == 404


def test_env_at_create(sandbox):
    sb = sandbox(BUSYBOX, env={"E2E_SB_ENV": "from-create", "E2E_SPACES": "a b  c"})
    assert sh(sb, 'echo "$E2E_SB_ENV|$E2E_SPACES"') == "from-create|a b  c"


def test_custom_entrypoint_runs(sandbox):
    sb = sandbox(BUSYBOX, entrypoint=["sh", "-c", "echo started > /tmp/entry.txt; exec sleep 100000"])
    assert wait_until(lambda: sh(sb, "cat /tmp/entry.txt 2>/dev/null || true") == "started", 5,
                      what="entrypoint to write /tmp/entry.txt")
    assert sb.get_info().entrypoint == ["sh", "-c", "echo started > /tmp/entry.txt; exec sleep 100000"]


def test_image_config_python_tools(sandbox):
    """WorkingDir, Env and the layered site-packages of pvisor/python-tools:latest."""
    sb = sandbox(TOOLS)
    assert sh(sb, "pwd") == "/home/app"
    assert sh(sb, 'echo "$PVISOR_IMAGE"') == "python-tools"
    out = sh(sb, "python3 -c 'import requests, urllib3; print(requests.__version__, urllib3.__version__)'")
    assert out == "2.32.3 2.2.3"
    assert sh(sb, "test -f /etc/pvisor-release && echo yes") == "yes"


def test_debian_image_layers(sandbox):
    """Whiteouts and opaque directories of the debian archive were applied."""
    sb = sandbox(DEBIAN)
    assert sh(sb, "ls -A /usr/share/doc | wc -l") == "0"
    assert sh(sb, "ls -A /usr/share/locale | wc -l") == "0"
    assert sh(sb, "id -u app") == "1000"
    assert sh(sb, "bash -c 'echo $BASH_VERSION' | cut -d. -f1") == "5"


def test_python_image(sandbox):
    sb = sandbox(PYTHON)
    assert sh(sb, "python3 -c 'import sys; print(sys.version_info[:2])'") == "(3, 11)"


def test_oci_layout_image(sandbox):
    sb = sandbox(BUSYBOX_OCI)
    assert sh(sb, "echo oci-ok; test -x /bin/sh && echo sh-ok") == "oci-ok\nsh-ok"


def test_concurrent_creates(sandbox):
    with ThreadPoolExecutor(max_workers=3) as pool:
        sbs = list(pool.map(lambda i: sandbox(BUSYBOX, env={"N": str(i)}), range(3)))
    assert len({sb.id for sb in sbs}) == 3
    for i, sb in enumerate(sbs):
        assert sh(sb, 'echo "$N"') == str(i)


# ------------------------------------------------------------------- list / filters


@pytest.fixture(scope="module")
def group(module_sandbox):
    """Three sandboxes sharing a unique metadata group (roles a, b, c)."""
    gid = f"g-{uuid.uuid4().hex[:10]}"
    sbs = [
        module_sandbox(BUSYBOX, metadata={"e2e-group": gid, "role": role},
                       skip_health_check=True)
        for role in ("a", "b", "c")
    ]
    return gid, sbs


def test_list_metadata_filter_exact(manager, group):
    gid, sbs = group
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}))
    assert {i.id for i in res.sandbox_infos} == {sb.id for sb in sbs}
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid, "role": "b"}))
    assert [i.id for i in res.sandbox_infos] == [sbs[1].id]
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid, "role": "zzz"}))
    assert res.sandbox_infos == []
    assert res.pagination.total_items == 0


def test_list_metadata_filter_special_chars(sandbox, manager):
    value = f"a b&c=d/é%{uuid.uuid4().hex[:6]}"
    sb = sandbox(BUSYBOX, metadata={"e2e-note": value}, skip_health_check=True)
    sandbox(BUSYBOX, metadata={"e2e-note": value + "x"}, skip_health_check=True)
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-note": value}))
    assert [i.id for i in res.sandbox_infos] == [sb.id]
    assert res.sandbox_infos[0].metadata == {"e2e-note": value}


def test_list_state_filter(manager, group):
    gid, sbs = group
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}, states=["Running"]))
    assert {i.id for i in res.sandbox_infos} == {sb.id for sb in sbs}
    assert all(i.status.state == "Running" for i in res.sandbox_infos)
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}, states=["Paused"]))
    assert res.sandbox_infos == []
    res = manager.list_sandbox_infos(
        SandboxFilter(metadata={"e2e-group": gid}, states=["Paused", "Running"])
    )
    assert len(res.sandbox_infos) == 3


def test_list_pagination(manager, group):
    gid, sbs = group
    p1 = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}, page_size=2, page=1))
    p2 = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}, page_size=2, page=2))
    assert len(p1.sandbox_infos) == 2 and len(p2.sandbox_infos) == 1
    assert (p1.pagination.page, p1.pagination.page_size) == (1, 2)
    assert (p1.pagination.total_items, p1.pagination.total_pages) == (3, 2)
    assert p1.pagination.has_next_page is True
    assert (p2.pagination.page, p2.pagination.total_items) == (2, 3)
    assert p2.pagination.has_next_page is False
    ids = [i.id for i in p1.sandbox_infos + p2.sandbox_infos]
    assert sorted(ids) == sorted(sb.id for sb in sbs)
    p3 = manager.list_sandbox_infos(SandboxFilter(metadata={"e2e-group": gid}, page_size=2, page=3))
    assert p3.sandbox_infos == [] and p3.pagination.has_next_page is False


def test_list_raw_wire_format(http, group):
    gid, sbs = group
    r = http.get("/v1/sandboxes", params={"metadata": f"e2e-group={gid}", "pageSize": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert find_nulls(body) == [], body
    assert set(body["pagination"]) >= {"page", "pageSize", "totalItems", "totalPages", "hasNextPage"}
    assert body["pagination"]["pageSize"] == 2 and body["pagination"]["totalItems"] == 3
    assert len(body["items"]) == 2
    r = http.get("/v1/sandboxes", params=[("state", "Running"), ("state", "Paused"),
                                          ("metadata", f"e2e-group={gid}&role=c")])
    assert r.status_code == 200, r.text
    assert [i["id"] for i in r.json()["items"]] == [sbs[2].id]


# ------------------------------------------------------------------- metadata / renew / expiry


def test_patch_metadata(sandbox, manager):
    sb = sandbox(BUSYBOX, metadata={"a": "1", "b": "2"}, skip_health_check=True)
    info = sb.patch_metadata({"b": None, "c": "3", "a": "1x"})
    assert info.id == sb.id
    assert info.metadata == {"a": "1x", "c": "3"}
    assert manager.get_sandbox_info(sb.id).metadata == {"a": "1x", "c": "3"}
    res = manager.list_sandbox_infos(SandboxFilter(metadata={"c": "3", "a": "1x"}))
    assert sb.id in {i.id for i in res.sandbox_infos}


def test_renew_moves_expiry(sandbox):
    sb = sandbox(BUSYBOX, timeout=timedelta(minutes=5), skip_health_check=True)
    before = sb.get_info().expires_at
    assert before is not None
    resp = sb.renew(timedelta(minutes=30))
    expected = now() + timedelta(minutes=30)
    assert abs((resp.expires_at - expected).total_seconds()) < 30, (resp.expires_at, expected)
    assert resp.expires_at - before > timedelta(minutes=20)
    after = sb.get_info().expires_at
    assert abs((after - resp.expires_at).total_seconds()) < 1.5, (after, resp.expires_at)
    # Renewal may also shorten the lifetime.
    resp2 = sb.renew(timedelta(minutes=2))
    assert resp2.expires_at < resp.expires_at


def test_renew_without_timeout_is_conflict(sandbox):
    sb = sandbox(BUSYBOX, timeout=None, skip_health_check=True)
    assert sb.get_info().expires_at is None
    with pytest.raises(SandboxApiException) as ei:
        sb.renew(timedelta(minutes=5))
    assert ei.value.status_code == 409
    assert sb.get_info().expires_at is None


# A lifetime the sandbox outlives its boot by: an ns sandbox is ready in milliseconds; a vm one
# takes seconds where it runs in CI (nested under TCG, tests/kvmhost), and one that expires
# while it boots fails its create.
EXPIRY_S = 2 if SUITE_BACKEND == "ns" else 30


def test_expiry_deletes_sandbox(sandbox, manager, http):
    t0 = time.monotonic()
    sb = sandbox(BUSYBOX, timeout=timedelta(seconds=EXPIRY_S), skip_health_check=True)
    info = manager.get_sandbox_info(sb.id)
    lifetime = (info.expires_at - info.created_at).total_seconds()
    assert EXPIRY_S - 1 <= lifetime <= EXPIRY_S + 1, lifetime

    def gone():
        try:
            manager.get_sandbox_info(sb.id)
            return False
        except SandboxApiException as e:
            assert e.status_code == 404, f"expected 404 after expiry, got {e.status_code}"
            return True

    wait_until(gone, EXPIRY_S + 8, interval=0.25, what="expired sandbox to be deleted")
    assert time.monotonic() - t0 >= EXPIRY_S - 0.5, "sandbox vanished before its timeout"
    assert sb.id not in {i["id"] for i in http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]}


# ------------------------------------------------------------------- endpoints


def test_endpoints_any_port(sandbox, server):
    sb = sandbox(BUSYBOX)
    for port in (EXECD_PORT, EGRESS_PORT, 8080, 5000, 65535):
        ep = sb.get_endpoint(port)
        assert ep.endpoint and "://" not in ep.endpoint, (port, ep.endpoint)
        assert ep.endpoint.startswith(server) or ep.endpoint.startswith("127.0.0.1"), ep.endpoint
    execd = sb.get_endpoint(EXECD_PORT)
    assert execd.headers, "the execd endpoint must hand out the data-plane token in headers"


def test_endpoints_raw(http, sandbox):
    sb = sandbox(BUSYBOX, skip_health_check=True)
    for port in (EXECD_PORT, EGRESS_PORT, 31337):
        for proxy in ("false", "true"):
            r = http.get(f"/v1/sandboxes/{sb.id}/endpoints/{port}", params={"use_server_proxy": proxy})
            assert r.status_code == 200, f"port {port} proxy={proxy}: {r.status_code} {r.text}"
            body = r.json()
            assert find_nulls(body) == [], body
            assert isinstance(body["endpoint"], str) and "://" not in body["endpoint"]
            if proxy == "true":
                assert f"/v1/sandboxes/{sb.id}/proxy/{port}" in body["endpoint"], body
            assert "OPEN-SANDBOX-ORIGIN" not in r.headers
    r = http.get(f"/v1/sandboxes/{sb.id}/endpoints/notaport")
    assert_error_json(r, 400)
    r = http.get(f"/v1/sandboxes/{sb.id}/endpoints/70000")
    assert_error_json(r, 400)


def test_connect_to_existing(sandbox, conn, proxy_conn):
    sb = sandbox(BUSYBOX)
    sh(sb, "echo shared > /tmp/connect.txt")
    direct = sandbox.track(SandboxSync.connect(sb.id, connection_config=conn))
    assert sh(direct, "cat /tmp/connect.txt") == "shared"
    via_proxy = sandbox.track(SandboxSync.connect(sb.id, connection_config=proxy_conn))
    assert sh(via_proxy, "cat /tmp/connect.txt") == "shared"


@pytest.mark.deadline(60)
def test_port_forwarding_to_sandbox_service(sandbox, proxy_conn):
    """An endpoint for an arbitrary port reaches a server listening inside the sandbox."""
    sb = sandbox(PYTHON)
    sb.files.write_file("/tmp/www/index.html", "hello from inside\n")
    srv = run(sb, "python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www", background=True)
    assert srv.id
    wait_until(lambda: "200" in sh(
        sb, "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/').status)\" 2>&1 || true"),
        10, interval=0.2, what="http.server inside the sandbox")
    for label, s in (("direct", sb), ("proxy", sandbox.track(SandboxSync.connect(sb.id, connection_config=proxy_conn)))):
        url, headers = dataplane(s, 8000)
        r = httpx.get(f"{url}/index.html", headers=headers, timeout=10)
        assert r.status_code == 200, f"{label}: GET {url}/index.html -> {r.status_code} {r.text[:300]}"
        assert r.text == "hello from inside\n", label
        # The service's root, as a browser opens it: with the slash and without it.
        for root in (f"{url}/", url):
            r = httpx.get(root, headers=headers, timeout=10)
            assert (r.status_code, r.text) == (200, "hello from inside\n"), f"{label}: GET {root} -> {r.status_code}"


# ------------------------------------------------------------------- pause / resume


def _wait_state(manager, sid, state, timeout=10):
    return wait_until(lambda: manager.get_sandbox_info(sid).status.state == state, timeout,
                      what=f"sandbox {sid} to reach state {state}")


@pytest.mark.deadline(60)
def test_pause_resume(sandbox, manager, conn):
    sb = sandbox(BUSYBOX)
    bg = run(sb, "sleep 4321", background=True)
    assert bg.id
    sb.pause()
    _wait_state(manager, sb.id, "Paused")
    assert sb.get_info().status.state == "Paused"
    res = manager.list_sandbox_infos(SandboxFilter(states=["Paused"]))
    assert sb.id in {i.id for i in res.sandbox_infos}
    res = manager.list_sandbox_infos(SandboxFilter(states=["Running"]))
    assert sb.id not in {i.id for i in res.sandbox_infos}

    resumed = sandbox.track(SandboxSync.resume(sb.id, connection_config=conn))
    _wait_state(manager, sb.id, "Running")
    assert sh(resumed, "echo after-resume") == "after-resume"
    assert "sleep 4321" in sh(resumed, PS), "processes must survive pause/resume"
    assert resumed.commands.get_command_status(bg.id).running is True


@pytest.mark.deadline(60)
def test_kill_paused_sandbox(sandbox, manager):
    sb = sandbox(BUSYBOX)
    run(sb, "sleep 9999", background=True)
    sb.pause()
    _wait_state(manager, sb.id, "Paused")
    t0 = time.monotonic()
    sb.kill()
    with pytest.raises(SandboxApiException) as ei:
        manager.get_sandbox_info(sb.id)
    assert ei.value.status_code == 404
    assert time.monotonic() - t0 < 10
