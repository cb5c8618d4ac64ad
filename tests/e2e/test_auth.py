"""API-key gate: a second server started with PVISOR_API_KEY=secret."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import SandboxFilter
from opensandbox.sync import SandboxManagerSync, SandboxSync

from conftest import API_KEY, SandboxFactory, _make_conn
from e2e_util import BUSYBOX, EXECD_PORT, SMALL, assert_error_json, dataplane, sh

KEY_HEADER = "OPEN-SANDBOX-API-KEY"


@pytest.fixture(scope="module")
def auth_http(auth_server):
    with httpx.Client(base_url=auth_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def auth_conn(auth_server):
    return _make_conn(auth_server.addr, api_key=API_KEY)


@pytest.fixture(scope="module")
def auth_proxy_conn(auth_server):
    return _make_conn(auth_server.addr, api_key=API_KEY, use_server_proxy=True)


@pytest.fixture
def auth_sandbox(auth_conn):
    f = SandboxFactory(auth_conn)
    yield f
    f.cleanup()


def test_health_needs_no_key(auth_http):
    r = auth_http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "healthy"}


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/sandboxes"),
    ("POST", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/some-id"),
    ("DELETE", "/v1/sandboxes/some-id"),
    ("GET", "/v1/sandboxes/some-id/endpoints/44772"),
])
def test_missing_and_invalid_key(auth_http, method, path):
    body = {"image": {"uri": BUSYBOX}, "timeout": 60, "resourceLimits": SMALL,
            "entrypoint": ["tail", "-f", "/dev/null"]} if method == "POST" else None
    r = auth_http.request(method, path, json=body)
    assert assert_error_json(r, 401)["code"] == "MISSING_API_KEY"
    r = auth_http.request(method, path, json=body, headers={KEY_HEADER: "wrong"})
    assert assert_error_json(r, 401)["code"] == "INVALID_API_KEY"
    r = auth_http.request(method, path, json=body, headers={KEY_HEADER: API_KEY + "x"})
    assert assert_error_json(r, 401)["code"] == "INVALID_API_KEY"
    r = auth_http.get("/v1/sandboxes", headers={KEY_HEADER: ""})
    assert r.status_code == 401


def test_nothing_created_without_key(auth_http):
    before = auth_http.get("/v1/sandboxes", headers={KEY_HEADER: API_KEY}).json()["pagination"]["totalItems"]
    auth_http.post("/v1/sandboxes", json={"image": {"uri": BUSYBOX}, "timeout": 60, "resourceLimits": SMALL,
                                          "entrypoint": ["tail", "-f", "/dev/null"]},
                   headers={KEY_HEADER: "wrong"})
    after = auth_http.get("/v1/sandboxes", headers={KEY_HEADER: API_KEY}).json()["pagination"]["totalItems"]
    assert after == before


def test_sdk_wrong_key_rejected(auth_server):
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=_make_conn(auth_server.addr, api_key="wrong"),
                           resource=dict(SMALL))
    assert ei.value.status_code == 401
    assert ei.value.error.code == "INVALID_API_KEY"
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=_make_conn(auth_server.addr), resource=dict(SMALL))
    assert ei.value.status_code == 401
    assert ei.value.error.code == "MISSING_API_KEY"


def test_sdk_with_key_end_to_end(auth_sandbox, auth_conn):
    sb = auth_sandbox(BUSYBOX, metadata={"auth": "yes"})
    assert sh(sb, "echo authed") == "authed"
    sb.files.write_file("/tmp/auth.txt", "with key")
    assert sb.files.read_file("/tmp/auth.txt") == "with key"
    assert sb.get_info().status.state == "Running"
    sb.renew(timedelta(minutes=20))
    with SandboxManagerSync.create(connection_config=auth_conn) as m:
        res = m.list_sandbox_infos(SandboxFilter(metadata={"auth": "yes"}))
        assert sb.id in {i.id for i in res.sandbox_infos}
        sb.kill()
        with pytest.raises(SandboxApiException) as ei:
            m.get_sandbox_info(sb.id)
        assert ei.value.status_code == 404


def test_sdk_proxy_mode_with_key(auth_sandbox, auth_proxy_conn):
    sb = auth_sandbox(BUSYBOX, conn=auth_proxy_conn)
    assert f"/sandboxes/{sb.id}/proxy/{EXECD_PORT}" in sb.get_endpoint(EXECD_PORT).endpoint
    assert sh(sb, "echo via-proxy") == "via-proxy"
    sb.files.write_file("/tmp/p.bin", b"\x00\xffproxy")
    assert sb.files.read_bytes("/tmp/p.bin") == b"\x00\xffproxy"


def test_dataplane_gates(auth_sandbox, auth_server, auth_proxy_conn):
    sb = auth_sandbox(BUSYBOX)
    # Direct data plane: the per-sandbox token is enough, no API key needed.
    url, headers = dataplane(sb)
    assert KEY_HEADER not in headers
    r = httpx.get(f"{url}/ping", headers=headers, timeout=30)
    assert 200 <= r.status_code < 300, r.text
    r = httpx.get(f"{url}/ping", timeout=30)
    assert_error_json(r, 401)
    # Proxy data plane under /v1: API key and token.
    proxy = SandboxSync.connect(sb.id, connection_config=auth_proxy_conn)
    auth_sandbox.track(proxy)
    purl, pheaders = dataplane(proxy)
    r = httpx.get(f"{purl}/ping", headers=pheaders, timeout=30)
    assert assert_error_json(r, 401)["code"] == "MISSING_API_KEY"
    r = httpx.get(f"{purl}/ping", headers={**pheaders, KEY_HEADER: "wrong"}, timeout=30)
    assert assert_error_json(r, 401)["code"] == "INVALID_API_KEY"
    r = httpx.get(f"{purl}/ping", headers={**pheaders, KEY_HEADER: API_KEY}, timeout=30)
    assert 200 <= r.status_code < 300, r.text
    r = httpx.get(f"{purl}/ping", headers={KEY_HEADER: API_KEY}, timeout=30)
    assert_error_json(r, 401)
