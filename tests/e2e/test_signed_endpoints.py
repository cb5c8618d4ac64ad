"""Signed endpoints (OpenSandbox OSEP-0011) through the official SDK.

`SandboxSync.get_signed_endpoint(port, expires)` asks
`GET /v1/sandboxes/{id}/endpoints/{port}?expires=<unix seconds>`; pvisor
answers `host/sandboxes/{id}/signed/{port}/{expires_b36}/{signature}`, a URL
that opens that port of that sandbox with no header until `expires`, and
nothing else. A bad `expires` is a 400 with a JSON {code, message}. The
signing key is kept in the data dir, so a URL outlives a broker restart.
"""
from __future__ import annotations

import time

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync.sandbox import SandboxSync

from conftest import _make_conn, _start_server
from e2e_util import BUSYBOX, EXECD_PORT, SMALL, assert_error_json, dataplane, run, wait_until

TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


def signed_url(sb: SandboxSync, port: int, expires: int) -> str:
    ep = sb.get_signed_endpoint(port, expires)
    assert "://" not in ep.endpoint, ep.endpoint
    assert not ep.headers, f"a signed endpoint needs no header: {ep.headers}"
    assert f"/sandboxes/{sb.id}/signed/{port}/" in ep.endpoint, ep.endpoint
    return f"http://{ep.endpoint.rstrip('/')}"


def later(seconds: int = 600) -> int:
    return int(time.time()) + seconds


def refused(resp: httpx.Response, code: str) -> None:
    assert assert_error_json(resp, 401)["code"] == code, resp.text


@pytest.fixture(scope="module")
def sbs(module_sandbox):
    """Two sandboxes of the main server; the first serves /srv on port 8080 (busybox httpd)."""
    a, b = module_sandbox(), module_sandbox()
    run(a, "mkdir -p /srv && echo hello-signed > /srv/index.html")
    run(a, "exec httpd -f -p 127.0.0.1:8080 -h /srv", background=True)
    return a, b


def test_a_signed_url_opens_its_port_without_a_header(sbs):
    a, _ = sbs
    unsigned, headers = dataplane(a)
    assert httpx.get(f"{unsigned}/ping", timeout=30).status_code == 401, "the unsigned URL alone stays closed"
    url = signed_url(a, EXECD_PORT, later())
    assert httpx.get(f"{url}/ping", timeout=30).status_code == 200
    r = httpx.post(f"{url}/command", json={"command": "echo via-signed"}, timeout=60)
    assert r.status_code == 200 and "via-signed" in r.text, r.text
    # The data-plane token still opens it; a wrong one is refused, with no fall back to the signature.
    assert httpx.get(f"{url}/ping", headers=headers, timeout=30).status_code == 200
    refused(httpx.get(f"{url}/ping", headers={TOKEN_HEADER: "nope"}, timeout=30), "INVALID_ACCESS_TOKEN")


def test_a_signed_url_tunnels_another_port(sbs):
    a, _ = sbs
    url = signed_url(a, 8080, later())
    r = wait_until(lambda: (r := httpx.get(f"{url}/index.html", timeout=10)).status_code == 200 and r,
                   20, 0.2, "busybox httpd through the signed URL")
    assert r.text.strip() == "hello-signed"
    # The root of the port, with and without its slash.
    for root in (url, f"{url}/"):
        r = httpx.get(root, timeout=10)
        assert r.status_code == 200 and r.text.strip() == "hello-signed", (root, r.status_code, r.text)


def test_a_token_opens_nothing_else(sbs):
    a, b = sbs
    url = signed_url(a, EXECD_PORT, later())
    base, exp, sig = url.rsplit("/", 2)
    # One hex digit of the signature changed.
    tampered = f"{base}/{exp}/{'1' if sig[0] == '0' else '0'}{sig[1:]}"
    refused(httpx.get(f"{tampered}/ping", timeout=30), "INVALID_SIGNATURE")
    # A later expiry with the same signature.
    refused(httpx.get(f"{base}/{exp}z/{sig}/ping", timeout=30), "INVALID_SIGNATURE")
    # The same token on another port of the sandbox, and on another sandbox.
    other_port = url.replace(f"/signed/{EXECD_PORT}/", "/signed/8080/")
    refused(httpx.get(f"{other_port}/index.html", timeout=30), "INVALID_SIGNATURE")
    other_sb = url.replace(f"/sandboxes/{a.id}/", f"/sandboxes/{b.id}/")
    refused(httpx.get(f"{other_sb}/ping", timeout=30), "INVALID_SIGNATURE")
    # b's own signed URL opens b.
    assert httpx.get(f"{signed_url(b, EXECD_PORT, later())}/ping", timeout=30).status_code == 200
    # Not of the signed shape: a 400.
    for bad in (f"{base}/{exp}/xyz", f"{base}/{exp.upper()}/{sig}", f"{base}/0{exp}/{sig}"):
        assert_error_json(httpx.get(f"{bad}/ping", timeout=30), 400)


def test_an_expired_url_is_refused(sbs):
    a, _ = sbs
    url = signed_url(a, EXECD_PORT, later(2))
    # It works until its second has passed, then is refused as expired (the code says the
    # signature itself was good); bounded, not timed.
    wait_until(lambda: httpx.get(f"{url}/ping", timeout=10).status_code == 401, 10, 0.25, "the signed URL to expire")
    refused(httpx.get(f"{url}/ping", timeout=10), "SIGNATURE_EXPIRED")


def test_bad_expires_is_a_400(sbs, http):
    a, _ = sbs
    route = f"/v1/sandboxes/{a.id}/endpoints/{EXECD_PORT}"
    past = int(time.time()) - 10
    for bad in ("abc", "", "-1", "1.5", "+99999999999", "0", str(past), "1" * 25):
        assert_error_json(http.get(route, params={"expires": bad}), 400)
    # No expires: the unsigned endpoint, as before.
    r = http.get(route)
    assert r.status_code == 200 and r.json()["headers"].get(TOKEN_HEADER), r.text
    with pytest.raises(SandboxApiException) as e:
        a.get_signed_endpoint(EXECD_PORT, past)
    assert e.value.status_code == 400


def test_server_proxy_mode_signs_the_same_route(sbs, proxy_conn):
    a, _ = sbs
    through_proxy = SandboxSync.connect(a.id, connection_config=proxy_conn)
    try:
        url = signed_url(through_proxy, EXECD_PORT, later())
        assert "/v1/" not in url, "a signed URL needs no API key"
        assert httpx.get(f"{url}/ping", timeout=30).status_code == 200
    finally:
        through_proxy.close()


@pytest.mark.deadline(240)
def test_a_signed_url_outlives_a_broker_restart(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "signed", ["busybox.tar"], {}, ["--warm-workers", "1"])
    try:
        key = srv.data_dir / "endpoint-signing.key"
        assert key.stat().st_mode & 0o777 == 0o600
        sb = SandboxSync.create(BUSYBOX, connection_config=_make_conn(srv.addr), resource=dict(SMALL))
        try:
            url = signed_url(sb, EXECD_PORT, later())
            path = url.split("/", 3)[3]
            assert httpx.get(f"{srv.url}/{path}/ping", timeout=30).status_code == 200
            assert srv.stop() == 0
            srv.start()
            assert httpx.get(f"{srv.url}/{path}/ping", timeout=30).status_code == 200
        finally:
            again = SandboxSync.connect(sb.id, connection_config=_make_conn(srv.addr))
            again.kill()
            again.close()
            sb.close()
    finally:
        srv.stop()
