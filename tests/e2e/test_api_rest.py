"""The rest of the OpenSandbox surface: X-Request-ID, diagnostics, the identity file API
and template routes the SDK does not call."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import httpx
import pytest
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync import SandboxManagerSync

from e2e_util import BUSYBOX, assert_error_json, dataplane, sh, wait_until

GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def bb(module_sandbox):
    return module_sandbox(BUSYBOX)


# ------------------------------------------------------------------- X-Request-ID


def test_request_id_echoed_by_the_sdk_on_a_404(server):
    rid = f"e2e-{uuid.uuid4().hex}"
    conn = ConnectionConfigSync(domain=server, protocol="http", request_timeout=timedelta(seconds=30),
                                headers={"X-Request-ID": rid})
    m = SandboxManagerSync.create(connection_config=conn)
    try:
        with pytest.raises(SandboxApiException) as ei:
            m.get_sandbox_info(str(uuid.uuid4()))
    finally:
        m.close()
    assert ei.value.status_code == 404
    assert ei.value.request_id == rid


def test_request_id_generated_when_absent_and_on_every_kind_of_answer(http):
    a = http.get("/v1/no-such-route")
    assert_error_json(a, 404)
    b = http.get("/health")
    for r in (a, b):
        assert GENERATED_ID.match(r.headers.get("x-request-id", "")), r.headers
    assert a.headers["x-request-id"] != b.headers["x-request-id"]
    # (Trimming is a unit test: httpx refuses to send padded header values.)
    r = http.get("/v1/templates/x", headers={"X-Request-ID": "tpl-1"})
    assert r.headers["x-request-id"] == "tpl-1"


def test_request_id_on_the_data_plane(bb):
    base, headers = dataplane(bb)
    with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
        r = c.get("/ping", headers={"X-Request-ID": "dp-ping"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "dp-ping"
        r = c.get("/ping")
        assert GENERATED_ID.match(r.headers.get("x-request-id", "")), r.headers
        # An SSE stream carries it in its response head.
        with c.stream("POST", "/command", json={"command": "echo hi"},
                      headers={"X-Request-ID": "dp-sse"}) as s:
            assert s.status_code == 200
            assert s.headers["x-request-id"] == "dp-sse"
            assert "hi" in s.read().decode()
        # A data-plane error (missing file) and a proxied port with nothing listening.
        r = c.get("/files/download", params={"path": "/no/such/file"}, headers={"X-Request-ID": "dp-404"})
        assert_error_json(r, 404)
        assert r.headers["x-request-id"] == "dp-404"
    pbase, pheaders = dataplane(bb, 8999)
    r = httpx.get(f"{pbase}/", headers={**pheaders, "X-Request-ID": "dp-port"}, timeout=30)
    assert r.status_code >= 400 and r.headers["x-request-id"] == "dp-port"


# ------------------------------------------------------------------- diagnostics


@pytest.mark.deadline(90)
def test_diagnostics_show_lifecycle_and_entrypoint_output(sandbox, manager):
    sb = sandbox(BUSYBOX, entrypoint=["sh", "-c", "echo entry-out-$((6*7)); echo entry-err >&2; exec sleep 100000"])
    sb.pause()
    wait_until(lambda: manager.get_sandbox_info(sb.id).status.state == "Paused", 10, what="Paused")
    paused = manager.get_diagnostic_logs(sb.id, "container")
    assert paused.content == "" and paused.warnings and "paused" in " ".join(paused.warnings)
    manager.resume_sandbox(sb.id)
    wait_until(lambda: manager.get_sandbox_info(sb.id).status.state == "Running", 10, what="Running")
    manager.renew_sandbox(sb.id, timedelta(minutes=20))

    ev = manager.get_diagnostic_events(sb.id, "lifecycle")
    assert (ev.sandbox_id, ev.kind, ev.scope, ev.delivery) == (sb.id, "events", "lifecycle", "inline")
    assert ev.content_type.startswith("text/plain") and ev.truncated is False
    kinds = [line.split(" ", 1)[1].split(":")[0] for line in ev.content.splitlines()]
    assert kinds == ["Created", "Ready", "Paused", "Resumed", "Renewed"], ev.content

    logs = wait_until(lambda: (c := manager.get_diagnostic_logs(sb.id, "container")).content
                      and "entry-err" in c.content and c, 10, what="entrypoint output")
    assert "entry-out-42" in logs.content and "entry-err" in logs.content, logs.content
    assert logs.kind == "logs" and logs.content_length == len(logs.content.encode())

    status = manager.get_diagnostic_events(sb.id, "container")
    assert "EntrypointStarted" in status.content and "EntrypointExited" not in status.content

    everything = manager.get_diagnostic_logs(sb.id, "all")
    for part in ("==> lifecycle <==", "Paused", "==> container <==", "entry-out-42", "==> runtime <=="):
        assert part in everything.content, everything.content
    net = manager.get_diagnostic_logs(sb.id, "network")
    assert net.content == "" and net.warnings


def test_diagnostics_of_a_failed_entrypoint(sandbox, manager):
    sb = sandbox(BUSYBOX, entrypoint=["sh", "-c", "echo dying; exit 3"])
    ev = wait_until(lambda: "EntrypointExited" in (e := manager.get_diagnostic_events(sb.id, "process")).content
                    and e, 20, what="entrypoint exit in the events")
    assert "exit code 3" in ev.content, ev.content
    assert "dying" in manager.get_diagnostic_logs(sb.id, "process").content


def test_diagnostics_errors(http, bb):
    sid = bb.id
    for path in (f"/v1/sandboxes/{sid}/diagnostics/logs", f"/v1/sandboxes/{sid}/diagnostics/events"):
        assert_error_json(http.get(path), 400)
        assert_error_json(http.get(path, params={"scope": "disk"}), 400)
        assert http.get(path, params={"scope": "runtime"}).status_code == 200
    missing = str(uuid.uuid4())
    assert_error_json(http.get(f"/v1/sandboxes/{missing}/diagnostics/logs", params={"scope": "all"}), 404)


# ------------------------------------------------------------------- identity file API


def test_identity_file_api(bb):
    as_user = bb.files_with_identity(1000, 1000)
    path = f"/tmp/owned-{uuid.uuid4().hex[:8]}.txt"
    as_user.write_file(path, "mine")
    assert sh(bb, f"stat -c %u:%g {path}") == "1000:1000"
    assert as_user.read_file(path) == "mine"
    info = as_user.get_file_info([path])[path]
    # By name where the image's passwd has one (busybox's 1000 is "app").
    assert f"{info.owner}:{info.group}" == sh(bb, f"stat -c %U:%G {path}"), info

    secret = f"/tmp/secret-{uuid.uuid4().hex[:8]}"
    sh(bb, f"echo root-only > {secret} && chmod 0600 {secret}")
    with pytest.raises(SandboxApiException) as ei:
        as_user.read_file(secret)
    assert ei.value.status_code == 403, ei.value
    # The same file as root through the identity routes, and through the plain ones.
    assert bb.files_with_identity(0, 0).read_file(secret).strip() == "root-only"
    assert bb.files.read_file(secret).strip() == "root-only"
    # Root's directory is closed to the user, for writes too; and the user cannot delete root's file.
    with pytest.raises(SandboxApiException) as ei:
        as_user.write_file("/root/intruder.txt", "x")
    assert ei.value.status_code == 403, ei.value
    assert sh(bb, "ls /root/intruder.txt 2>/dev/null || echo absent") == "absent"
    with pytest.raises(SandboxApiException) as ei:
        as_user.delete_files([secret])
    assert ei.value.status_code == 403, ei.value
    assert sh(bb, f"cat {secret}") == "root-only"


def test_identity_routes_check_ids(bb):
    base, headers = dataplane(bb)
    for bad in ("-1/0", "x/0", "0/4294967295"):
        r = httpx.get(f"{base}/v1/filesystem/{bad}/files/info", params={"path": "/tmp"}, headers=headers)
        assert_error_json(r, 400)


# ------------------------------------------------------------------- templates
# (isolated sessions: test_isolated_sessions.py)


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/templates/t1/versions/2", 404), ("PUT", "/v1/templates/t1", 405), ("PATCH", "/v1/templates", 405),
])
def test_template_routes_beyond_the_sdks_are_json_errors(http, method, path, status):
    # test_templates.py covers the four routes the SDK calls.
    assert_error_json(http.request(method, path, json={}), status)
