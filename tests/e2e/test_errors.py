"""Error paths: bad requests, unknown ids, unknown images, path escapes, data-plane tokens."""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.sync import SandboxSync

from e2e_util import (
    BUSYBOX,
    create_body,
    SMALL,
    assert_error_json,
    dataplane,
    list_all_ids,
    sh,
)

VALID = {
    "image": {"uri": BUSYBOX},
    "timeout": 600,
    "resourceLimits": SMALL,
    "entrypoint": ["tail", "-f", "/dev/null"],
}


def with_(**changes):
    return create_body(VALID, **changes)


# ------------------------------------------------------------------- create validation


def test_unknown_image_sdk(conn, http):
    before = list_all_ids(http)
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create("no-such-image/e2e:missing", connection_config=conn, resource=dict(SMALL))
    assert 400 <= ei.value.status_code < 500, ei.value.status_code
    assert ei.value.error.code and ei.value.error.code != "INTERNAL_UNKNOWN_ERROR"
    assert list_all_ids(http) == before, "a failed create left a sandbox behind"


def test_unknown_image_raw(http):
    before = list_all_ids(http)
    r = http.post("/v1/sandboxes", json=with_(image={"uri": "no-such-image/e2e:missing"}))
    assert_error_json(r)
    r = http.post("/v1/sandboxes", json=with_(image={"uri": "busybox@sha256:" + "0" * 64}))
    assert_error_json(r)
    assert list_all_ids(http) == before


@pytest.mark.parametrize(
    "label,body",
    [
        ("malformed json", b"{bad json"),
        ("empty body", b""),
        ("json array", b"[]"),
        ("timeout string", with_(timeout="abc")),
        ("timeout zero", with_(timeout=0)),
        ("timeout negative", with_(timeout=-5)),
        ("timeout float string", with_(timeout="1.5")),
        ("missing image", with_(image=...)),
        ("image without uri", with_(image={})),
        ("image uri number", with_(image={"uri": 42})),
        ("entrypoint not a list", with_(entrypoint="tail -f /dev/null")),
        ("entrypoint empty", with_(entrypoint=[])),
        ("bad memory quantity", with_(resourceLimits={"cpu": "1", "memory": "lots"})),
        ("bad cpu quantity", with_(resourceLimits={"cpu": "-1", "memory": "512Mi"})),
        ("metadata not a map", with_(metadata=["a"])),
        ("env value not a string", with_(env={"A": 1})),
    ],
)
def test_bad_create_requests_are_400(http, label, body):
    before = list_all_ids(http)
    if isinstance(body, bytes):
        r = http.post("/v1/sandboxes", content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post("/v1/sandboxes", json=body)
    assert_error_json(r, 400)
    assert list_all_ids(http) == before, f"{label}: a rejected create left a sandbox behind"


def test_bad_list_query_is_400(http):
    assert_error_json(http.get("/v1/sandboxes", params={"pageSize": "abc"}), 400)
    assert_error_json(http.get("/v1/sandboxes", params={"page": "-1"}), 400)


def test_bad_renew_and_patch_bodies(http, sandbox):
    sb = sandbox(BUSYBOX, skip_health_check=True)
    for body in (b"{bad", b"{}", json.dumps({"expiresAt": "garbage"}).encode()):
        r = http.post(f"/v1/sandboxes/{sb.id}/renew-expiration", content=body,
                      headers={"Content-Type": "application/json"})
        assert_error_json(r, 400)
    for body in (b"{bad", json.dumps({"k": 5}).encode(), b"[]"):
        r = http.patch(f"/v1/sandboxes/{sb.id}/metadata", content=body,
                       headers={"Content-Type": "application/merge-patch+json"})
        assert_error_json(r, 400)
    assert sb.get_info().status.state == "Running"


# ------------------------------------------------------------------- unknown ids


@pytest.mark.parametrize("sid", ["does-not-exist", "0b7d3f1e-5c55-4b8e-9d0e-2f6f1f0c9a11"])
def test_unknown_sandbox_raw_404(http, sid):
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    calls = [
        ("GET", f"/v1/sandboxes/{sid}", None),
        ("DELETE", f"/v1/sandboxes/{sid}", None),
        ("POST", f"/v1/sandboxes/{sid}/renew-expiration", {"expiresAt": future}),
        ("GET", f"/v1/sandboxes/{sid}/endpoints/44772?use_server_proxy=false", None),
        ("GET", f"/v1/sandboxes/{sid}/endpoints/18080?use_server_proxy=true", None),
        ("POST", f"/v1/sandboxes/{sid}/pause", None),
        ("POST", f"/v1/sandboxes/{sid}/resume", None),
        ("PATCH", f"/v1/sandboxes/{sid}/metadata", {"a": "b"}),
    ]
    for method, path, body in calls:
        r = http.request(method, path, json=body)
        assert_error_json(r, 404)


def test_unknown_sandbox_sdk_404(manager):
    sid = str(uuid.uuid4())
    for op in (
        lambda: manager.get_sandbox_info(sid),
        lambda: manager.kill_sandbox(sid),
        lambda: manager.renew_sandbox(sid, timedelta(minutes=5)),
        lambda: manager.pause_sandbox(sid),
        lambda: manager.resume_sandbox(sid),
    ):
        with pytest.raises(SandboxApiException) as ei:
            op()
        assert ei.value.status_code == 404
        assert ei.value.error.code


def test_connect_unknown_sandbox_fails(conn):
    with pytest.raises(SandboxException):
        SandboxSync.connect(str(uuid.uuid4()), connection_config=conn,
                            connect_timeout=timedelta(seconds=5))


def test_unknown_route_is_json_404(http):
    assert_error_json(http.get("/v1/no-such-thing"), 404)


# ------------------------------------------------------------------- path escapes


def _host_candidates(name: str, data_dir: Path) -> list[Path]:
    return [Path("/etc") / name, Path("/tmp") / name, Path("/") / name,
            data_dir / name, data_dir.parent / name]


def _found_under(root: Path, name: str) -> list[str]:
    # find(1), not os.walk: the tree may hold other tests' deep directories
    # (os.walk recurses in Python and fails past ~1000 levels).
    out = subprocess.run(["find", str(root), "-xdev", "-name", name], capture_output=True, text=True)
    return out.stdout.split()


def test_upload_path_escape_sdk(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX)
    name = f"pvisor-e2e-esc-{uuid.uuid4().hex}"
    for path in (f"/../../etc/{name}", f"/../../../../../../tmp/{name}", f"/tmp/../../../{name}",
                 f"../../{name}"):
        with pytest.raises(SandboxApiException) as ei:
            sb.files.write_file(path, "escaped")
        assert 400 <= ei.value.status_code < 500, (path, ei.value.status_code)
    for p in _host_candidates(name, pvisor_server.data_dir):
        assert not p.exists(), f"escape wrote {p}"
    assert _found_under(pvisor_server.data_dir.parent, name) == []
    assert sh(sb, f"find / -xdev -name '{name}' 2>/dev/null; echo end") == "end"


def test_upload_download_path_escape_raw(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX)
    url, headers = dataplane(sb)
    name = f"pvisor-e2e-raw-{uuid.uuid4().hex}"
    for path in (f"/../../etc/{name}", f"/../../../../../../../tmp/{name}", f"/a/../../../{name}"):
        meta = json.dumps({"path": path, "owner": None, "group": None, "mode": 644})
        r = httpx.post(f"{url}/files/upload", headers=headers, timeout=30, files=[
            ("metadata", ("metadata", meta, "application/json")),
            ("file", (name, b"escaped", "application/octet-stream")),
        ])
        assert_error_json(r)
    for p in _host_candidates(name, pvisor_server.data_dir):
        assert not p.exists(), f"escape wrote {p}"
    assert _found_under(pvisor_server.data_dir.parent, name) == []

    host_passwd = Path("/etc/passwd").read_bytes()
    for path in ("/../../etc/passwd", "/../../../../../../../etc/hostname", "../../../etc/passwd"):
        r = httpx.get(f"{url}/files/download", params={"path": path}, headers=headers, timeout=30)
        assert 400 <= r.status_code < 500, f"download {path}: {r.status_code} {r.content[:200]!r}"
        assert r.content != host_passwd
    for path in ("/../../etc", "/../../../tmp"):
        r = httpx.get(f"{url}/files/info", params={"path": path}, headers=headers, timeout=30)
        assert 400 <= r.status_code < 500, f"info {path}: {r.status_code} {r.text[:200]}"
        r = httpx.delete(f"{url}/directories", params={"path": path}, headers=headers, timeout=30)
        assert 400 <= r.status_code < 500, f"rmdir {path}: {r.status_code} {r.text[:200]}"
    assert Path("/etc/passwd").read_bytes() == host_passwd


# ------------------------------------------------------------------- data-plane token


def test_dataplane_requires_token(sandbox):
    a, b = sandbox(BUSYBOX), sandbox(BUSYBOX)
    url_a, headers_a = dataplane(a)
    url_b, headers_b = dataplane(b)
    assert headers_a and headers_a != headers_b, "each sandbox must get its own token"
    wrong = {k: "not-the-token" for k in headers_a}
    requests = [
        ("GET", "/ping", None),
        ("GET", "/metrics", None),
        ("GET", "/files/download?path=/etc/passwd", None),
        ("GET", "/files/info?path=/etc", None),
        ("POST", "/command", {"command": "touch /tmp/unauthorized"}),
        ("POST", "/session", {}),
    ]
    for method, path, body in requests:
        for label, hdrs, url in (("no token", {}, url_a), ("wrong token", wrong, url_a),
                                 ("token of another sandbox", headers_b, url_a)):
            r = httpx.request(method, url + path, json=body, headers=hdrs, timeout=30)
            assert r.status_code == 401, f"{label}: {method} {path} -> {r.status_code} {r.text[:200]}"
            assert_error_json(r, 401)
    assert sh(a, "test -e /tmp/unauthorized && echo yes || echo no") == "no"
    r = httpx.get(url_a + "/ping", headers=headers_a, timeout=30)
    assert 200 <= r.status_code < 300


def test_dataplane_after_kill(sandbox):
    sb = sandbox(BUSYBOX)
    url, headers = dataplane(sb)
    files_svc, cmd_svc = sb.files, sb.commands
    sb.kill()
    r = httpx.get(url + "/ping", headers=headers, timeout=30)
    assert_error_json(r, (401, 404))
    with pytest.raises(SandboxApiException) as ei:
        cmd_svc.run("echo zombie")
    assert ei.value.status_code in (401, 404)
    with pytest.raises(SandboxApiException):
        files_svc.read_bytes("/etc/passwd")
