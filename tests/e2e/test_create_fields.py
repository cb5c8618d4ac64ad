"""Create fields pvisor answers explicitly (issue 23, item 9): `platform`, `resourceRequests`,
`secureAccess`, `extensions` (`poolRef`, renew-on-access, `pvisor.io/` keys) and fields the API
does not define. Each is served and shown back, or refused with a 400 {code, message}."""

from __future__ import annotations

import platform as host_platform

import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import PlatformSpec

from e2e_util import BUSYBOX, RAW_CREATE, SMALL, assert_error_json, create_body, list_all_ids, sh

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[host_platform.machine()]
OTHER_ARCH = "arm64" if HOST_ARCH == "amd64" else "amd64"
UNAME_ARCH = host_platform.machine()

VALID = RAW_CREATE


def with_(**changes):
    return create_body(**changes)


def create_raw(http, body) -> dict:
    r = http.post("/v1/sandboxes", json=body)
    assert r.status_code == 202, r.text
    return r.json()


def delete(http, sid):
    assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204


# ------------------------------------------------------------------- platform


def test_host_platform_through_the_sdk_is_served_and_shown(sandbox):
    sb = sandbox(BUSYBOX, platform=PlatformSpec(os="linux", arch=HOST_ARCH))
    info = sb.get_info()
    assert info.platform is not None and (info.platform.os, info.platform.arch) == ("linux", HOST_ARCH)
    assert sh(sb, "echo ok").strip() == "ok"


def test_other_arch_through_the_sdk_fails_explicitly(conn, http):
    before = list_all_ids(http)
    from opensandbox.sync import SandboxSync

    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                           platform=PlatformSpec(os="linux", arch=OTHER_ARCH))
    assert ei.value.status_code == 400
    assert ei.value.error.code == "PLATFORM_UNSUPPORTED"
    assert OTHER_ARCH in ei.value.error.message and HOST_ARCH in ei.value.error.message
    assert list_all_ids(http) == before


@pytest.mark.parametrize("spec", [
    {"os": "windows", "arch": HOST_ARCH},
    {"os": "linux", "arch": OTHER_ARCH},
    {"os": "linux", "arch": "riscv64"},
    {"os": "darwin", "arch": "arm64"},
])
def test_unrunnable_platforms_are_400(http, spec):
    before = list_all_ids(http)
    body = assert_error_json(http.post("/v1/sandboxes", json=with_(platform=spec)), 400)
    assert body["code"] == "PLATFORM_UNSUPPORTED", body
    assert f"{spec['os']}/{spec['arch']}" in body["message"]
    assert list_all_ids(http) == before


def test_uname_spelling_is_accepted_and_shown_as_the_api_spells_it(http):
    created = create_raw(http, with_(platform={"os": "linux", "arch": UNAME_ARCH}))
    try:
        assert created["platform"] == {"os": "linux", "arch": HOST_ARCH}
        got = http.get(f"/v1/sandboxes/{created['id']}").json()
        assert got["platform"] == {"os": "linux", "arch": HOST_ARCH}
        listed = http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]
        assert [s["platform"] for s in listed if s["id"] == created["id"]] == [{"os": "linux", "arch": HOST_ARCH}]
    finally:
        delete(http, created["id"])


def test_malformed_platform_is_400(http):
    for spec in ({"os": "linux"}, "linux/amd64", {"os": 1, "arch": HOST_ARCH}):
        assert_error_json(http.post("/v1/sandboxes", json=with_(platform=spec)), 400)


# ------------------------------------------------------------------- resourceRequests


def test_resource_requests_through_the_sdk_are_shown(sandbox, http):
    sb = sandbox(BUSYBOX, resource={"cpu": "1", "memory": "512Mi"},
                 resource_requests={"cpu": "250m", "memory": "256Mi"})
    got = http.get(f"/v1/sandboxes/{sb.id}").json()
    assert got["resourceRequests"] == {"cpu": "250m", "memory": "256Mi"}
    listed = http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]
    assert [s.get("resourceRequests") for s in listed if s["id"] == sb.id] == [{"cpu": "250m", "memory": "256Mi"}]
    sb.get_info()  # the SDK parses the view with the extra field


def test_no_resource_requests_shows_none(http):
    created = create_raw(http, VALID)
    try:
        assert "resourceRequests" not in http.get(f"/v1/sandboxes/{created['id']}").json()
    finally:
        delete(http, created["id"])


@pytest.mark.parametrize("requests,code", [
    ({"cpu": "2"}, "RESOURCE_REQUEST_ABOVE_LIMIT"),
    ({"memory": "1Gi"}, "RESOURCE_REQUEST_ABOVE_LIMIT"),
    ({"gpu": "1"}, "RESOURCE_LIMIT_UNKNOWN"),
    ({"cpu": "lots"}, "RESOURCE_LIMIT_INVALID"),
    ({"memory": "1e30Ti"}, "RESOURCE_LIMIT_INVALID"),
])
def test_bad_resource_requests_are_400(http, requests, code):
    before = list_all_ids(http)
    body = assert_error_json(http.post("/v1/sandboxes", json=with_(resourceRequests=requests)), 400)
    assert body["code"] == code, body
    assert "resourceRequests" in body["message"], body
    assert list_all_ids(http) == before


def test_resource_requests_above_the_sdk_limits_fail_through_the_sdk(conn):
    from opensandbox.sync import SandboxSync

    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                           resource_requests={"memory": "4Gi"})
    assert ei.value.status_code == 400 and ei.value.error.code == "RESOURCE_REQUEST_ABOVE_LIMIT"


# ------------------------------------------------------------------- secureAccess


def test_secure_access_is_honoured_by_the_endpoint_token(sandbox, http):
    sb = sandbox(BUSYBOX, secure_access=True)
    assert sh(sb, "echo secured").strip() == "secured"
    ep = http.get(f"/v1/sandboxes/{sb.id}/endpoints/44772", params={"use_server_proxy": "true"}).json()
    assert ep["headers"].get("X-EXECD-ACCESS-TOKEN"), ep
    # Without the headers the endpoint gives, the sandbox is not reachable.
    r = http.get(f"/v1/sandboxes/{sb.id}/proxy/44772/ping")
    assert_error_json(r, 401)


def test_secure_access_must_be_a_bool(http):
    assert_error_json(http.post("/v1/sandboxes", json=with_(secureAccess="yes")), 400)


# ------------------------------------------------------------------- extensions


def test_pool_ref_default_is_served_by_the_warm_pool(sandbox, http):
    sb = sandbox(BUSYBOX, extensions={"poolRef": "default"})
    info = sb.get_info()
    assert info.allocation is not None
    assert (info.allocation.mode, info.allocation.pool_ref, info.allocation.state) == ("pool", "default", "allocated")
    assert info.extensions == {"poolRef": "default"}
    assert sh(sb, "echo pooled").strip() == "pooled"


def test_unknown_pool_is_refused_by_name(conn, http):
    from opensandbox.sync import SandboxSync

    before = list_all_ids(http)
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                           extensions={"poolRef": "gpu-pool-e2e"})
    assert ei.value.status_code == 400 and ei.value.error.code == "POOL_NOT_FOUND"
    assert "gpu-pool-e2e" in ei.value.error.message
    assert list_all_ids(http) == before


def test_pool_ref_with_a_snapshot_is_400(http):
    body = dict(VALID, snapshotId="0b7d3f1e-5c55-4b8e-9d0e-2f6f1f0c9a11", extensions={"poolRef": "default"})
    body.pop("image")
    assert assert_error_json(http.post("/v1/sandboxes", json=body), 400)["code"] == "INVALID_PARAMETER"


def test_renew_on_access_is_refused(http):
    r = http.post("/v1/sandboxes", json=with_(extensions={"access.renew.extend.seconds": "600"}))
    assert assert_error_json(r, 400)["code"] == "EXTENSION_UNSUPPORTED"


def test_unknown_pvisor_extension_is_refused(http):
    r = http.post("/v1/sandboxes", json=with_(extensions={"pvisor.io/backnd": "ns"}))
    body = assert_error_json(r, 400)
    assert body["code"] == "EXTENSION_UNKNOWN" and "pvisor.io/backnd" in body["message"]


def test_opaque_extensions_are_kept_and_shown(http):
    ext = {"team.example.com/cost-center": "42", "pvisor.io/backend": "ns"}
    created = create_raw(http, with_(extensions=ext))
    try:
        assert created["extensions"] == ext
        assert http.get(f"/v1/sandboxes/{created['id']}").json()["extensions"] == ext
    finally:
        delete(http, created["id"])


# ------------------------------------------------------------------- fields the API does not define


def test_unknown_field_is_400_unless_empty(http):
    body = assert_error_json(http.post("/v1/sandboxes", json=with_(gpus=2)), 400)
    assert body["code"] == "UNKNOWN_FIELD" and "gpus" in body["message"]
    created = create_raw(http, with_(futureFlag=False, futureList=[], futureMap={}, futureNull=None))
    delete(http, created["id"])


def test_credential_proxy_enabled_must_be_a_bool(http):
    assert_error_json(http.post("/v1/sandboxes", json=with_(credentialProxy={"enabled": "yes"})), 400)
    created = create_raw(http, with_(credentialProxy={"enabled": False}))
    delete(http, created["id"])


# ------------------------------------------------------------------- volumes: pvc provisioning hints


def test_pvc_provisioning_hints_are_refused_unless_null(conn, http):
    from opensandbox.models.sandboxes import PVC, Volume
    from opensandbox.sync import SandboxSync

    before = list_all_ids(http)
    vol = Volume(name="data", mount_path="/mnt/data", pvc=PVC(claim_name="create-fields-e2e", storage="1Gi"))
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL), volumes=[vol])
    assert ei.value.status_code == 400 and ei.value.error.code == "VOLUME::UNSUPPORTED_OPTION"
    assert "pvc.storage" in ei.value.error.message
    for hint in ({"storageClass": "fast"}, {"accessModes": ["ReadWriteMany"]}):
        pvc = {"claimName": "create-fields-e2e", **hint}
        r = http.post("/v1/sandboxes", json=with_(volumes=[{"name": "d", "mountPath": "/mnt/d", "pvc": pvc}]))
        assert assert_error_json(r, 400)["code"] == "VOLUME::UNSUPPORTED_OPTION"
    assert list_all_ids(http) == before
