"""Templates (issue 23, item 6): `SandboxManager.create_template/get_template/list_templates/
delete_template` and `Sandbox.create_from_template` of the official SDK.

A template here is an image of the pool and the settings its sandboxes get (entrypoint, env,
limits), with its own metadata; it is `Succeeded` once created (its image is in the pool) and
survives broker restarts. A create from it takes a sandbox started ahead with those settings
where one is ready (a warm sandbox, `--template-warm`, shown by `GET /pvisor/templates`), else
starts one. As the reference: only metadata (over the template's), networkPolicy, extensions
and timeout (required) may come with `templateId`; the rest is a 400.
"""
from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import timedelta

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule
from opensandbox.models.templates import CreateTemplateRequest, TemplateFilter, TemplateReadiness
from opensandbox.sync import SandboxManagerSync, SandboxSync

from conftest import SUITE_BACKEND, _make_conn, _start_server
from e2e_util import BUSYBOX, assert_error_json, dataplane, run, sandbox_dirs, sh, stdout_text, wait_until

# What the template tests' templates ask for.
LIMITS = {"cpu": "1", "memory": "256Mi", "disk": "1Gi"}
MEMTOTAL_KB = 256 * 1024
WARM_WAIT = 60  # seconds a warm sandbox may take to be ready (a fresh sandbox, gate included)


def new_template(manager, **kw) -> str:
    kw.setdefault("image", BUSYBOX)
    kw.setdefault("publish", "s3://bucket/publish")
    return manager.create_template(CreateTemplateRequest(**kw)).template_id


def warm_of(base_url: str, tid: str) -> list[dict]:
    """The ready warm sandboxes of a template (`GET /pvisor/templates`)."""
    r = httpx.get(f"{base_url}/pvisor/templates", timeout=10)
    assert r.status_code == 200, r.text
    for t in r.json():
        if t["templateId"] == tid:
            return t["ready"]
    return []


def wait_warm(base_url: str, tid: str) -> dict:
    return wait_until(lambda: (w := warm_of(base_url, tid)) and w[0], WARM_WAIT, what=f"a warm sandbox of {tid}")


def error_code(e: SandboxApiException) -> str:
    """The server's error code. The SDK's create does not expect a 404 (the reference's spec lists
    none for POST /sandboxes) and reports UNEXPECTED_RESPONSE with the body kept."""
    if e.error is not None and e.error.code != "UNEXPECTED_RESPONSE":
        return e.error.code
    return json.loads(e.response_body)["code"]


def created_event(manager, sid: str) -> str:
    content = manager.get_diagnostic_events(sid, "lifecycle").content
    lines = [line for line in content.splitlines() if " Created" in line]
    assert lines, content
    return lines[0]


@pytest.fixture
def templates(manager):
    """Deletes the templates a test made (and with them their warm sandboxes)."""
    made: list[str] = []
    yield made
    for tid in made:
        try:
            manager.delete_template(tid)
        except SandboxApiException as e:
            if e.status_code != 404:
                raise


@pytest.fixture
def tracked(conn):
    """Kills the sandboxes a test made from templates."""
    made: list[SandboxSync] = []
    yield made
    for sb in made:
        try:
            sb.kill()
        except SandboxApiException as e:
            if e.status_code != 404:
                raise
        finally:
            sb.close()


def from_template(conn, tracked, tid: str, **kw) -> SandboxSync:
    kw.setdefault("timeout", timedelta(minutes=10))
    sb = SandboxSync.create_from_template(tid, connection_config=conn, **kw)
    tracked.append(sb)
    return sb


# ------------------------------------------------------------------ the catalog


def test_every_field_round_trips_through_create_get_list_and_delete(manager, templates):
    req = CreateTemplateRequest(
        image=BUSYBOX, publish="s3://bucket/publish", resource_limits=dict(LIMITS),
        entrypoint=["sleep", "3600"], env={"GREETING": "hello", "LEVEL": "3"},
        metadata={"team": "tpl-e2e", "case": "round-trip"},
        readiness=TemplateReadiness(probe="cmd://true", warmup_seconds=30), format="native",
    )
    made = manager.create_template(req)
    templates.append(made.template_id)
    assert made.template_id.startswith("tpl-") and len(made.template_id) == 40
    assert made.status.phase == "Succeeded" and made.status.message is None
    assert made.image == BUSYBOX and made.publish == "s3://bucket/publish" and made.format == "native"
    assert made.resource_limits == LIMITS
    assert made.entrypoint == ["sleep", "3600"]
    assert made.env == {"GREETING": "hello", "LEVEL": "3"}
    assert made.metadata == {"team": "tpl-e2e", "case": "round-trip"}
    assert made.readiness.probe == "cmd://true" and made.readiness.warmup_seconds == 30
    assert made.created_at == made.updated_at
    got = manager.get_template(made.template_id)
    assert got.model_dump() == made.model_dump()

    # Listed, filtered by metadata (all pairs must match), paged.
    page = manager.list_templates(TemplateFilter(metadata={"team": "tpl-e2e", "case": "round-trip"}))
    assert [t.template_id for t in page.template_infos] == [made.template_id]
    assert page.template_infos[0].model_dump() == made.model_dump()
    assert page.pagination.total_items == 1 and not page.pagination.has_next_page
    none = manager.list_templates(TemplateFilter(metadata={"team": "tpl-e2e", "case": "other"}))
    assert none.template_infos == [] and none.pagination.total_items == 0

    manager.delete_template(made.template_id)
    with pytest.raises(SandboxApiException) as ei:
        manager.get_template(made.template_id)
    assert ei.value.status_code == 404 and ei.value.error.code == "TEMPLATE::NOT_FOUND"
    assert made.template_id not in {t.template_id for t in manager.list_templates(TemplateFilter()).template_infos}


def test_defaults_and_paging(manager, templates, http):
    # Only the image: no publish (pvisor publishes nothing), the reference's default format.
    r = http.post("/v1/templates", json={"image": BUSYBOX, "metadata": {"case": "paging"}})
    assert r.status_code == 201, r.text
    body = r.json()
    templates.append(body["templateId"])
    assert r.headers["location"] == f"/v1/templates/{body['templateId']}"
    assert body["publish"] == "" and body["format"] == "overlaybd" and body["status"] == {"phase": "Succeeded"}
    for absent in ("resourceLimits", "entrypoint", "env", "readiness"):
        assert absent not in body, body
    # Identical bodies make distinct templates (ids are the server's: no name to collide).
    second = http.post("/v1/templates", json={"image": BUSYBOX, "metadata": {"case": "paging"}}).json()
    templates.append(second["templateId"])
    assert second["templateId"] != body["templateId"]
    # Newest first, two pages of one.
    p1 = http.get("/v1/templates", params={"metadata": "case=paging", "pageSize": 1}).json()
    p2 = http.get("/v1/templates", params={"metadata": "case=paging", "pageSize": 1, "page": 2}).json()
    assert [i["templateId"] for i in p1["items"] + p2["items"]] == [second["templateId"], body["templateId"]]
    assert p1["pagination"] == {"page": 1, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": True}
    assert p2["pagination"]["hasNextPage"] is False


# ------------------------------------------------------------------ sandboxes from a template


def test_a_sandbox_gets_the_templates_image_env_entrypoint_limits_and_metadata(
        manager, templates, tracked, conn, base_url):
    tid = new_template(manager, resource_limits=dict(LIMITS), env={"GREETING": "hello"},
                       entrypoint=["sh", "-c", "echo up > /tmp/entrypoint-ran; exec sleep 3600"],
                       metadata={"team": "template", "tier": "gold"})
    templates.append(tid)
    warm = wait_warm(base_url, tid)
    sb = from_template(conn, tracked, tid, metadata={"team": "mine"})
    assert sb.origin == "template"
    # The warm sandbox was handed out: its id, its Created event says it was started ahead.
    assert sb.id == warm["id"]
    assert f"from template {tid}, started ahead at" in created_event(manager, sb.id)
    info = sb.get_info()
    assert info.image.image == BUSYBOX
    assert info.entrypoint == ["sh", "-c", "echo up > /tmp/entrypoint-ran; exec sleep 3600"]
    assert info.metadata == {"team": "mine", "tier": "gold"}, "the create's metadata goes over the template's"
    assert info.expires_at - info.created_at == timedelta(minutes=10)
    assert info.status.state == "Running"
    assert sh(sb, "echo $GREETING") == "hello"
    assert "/bin" in sh(sb, "echo $PATH"), "the image's own environment is kept"
    assert sh(sb, "cat /tmp/entrypoint-ran") == "up"
    mem_kb = int(sh(sb, "grep MemTotal /proc/meminfo").split()[1])
    if SUITE_BACKEND == "ns":
        assert mem_kb == MEMTOTAL_KB, "the ns sandbox's /proc/meminfo shows its memory limit"
    else:
        assert MEMTOTAL_KB // 2 < mem_kb <= MEMTOTAL_KB, "the guest has the template's memory"
    # The next create gets the replacement, also started ahead.
    again = wait_warm(base_url, tid)
    assert again["id"] != sb.id
    sb2 = from_template(conn, tracked, tid)
    assert sb2.id == again["id"] and sb2.get_info().metadata == {"team": "template", "tier": "gold"}
    # Connecting reports the origin from the endpoint (OPEN-SANDBOX-ORIGIN), and the egress
    # policy goes through the lifecycle route.
    other = SandboxSync.connect(sb.id, connection_config=conn)
    try:
        assert other.origin == "template"
        assert other.get_egress_policy().default_action == "allow"
        other.patch_egress_rules([NetworkRule(action="deny", target="example.com")])
        assert any(r.target == "example.com" for r in sb.get_egress_policy().egress)
    finally:
        other.close()


def test_without_a_warm_sandbox_the_create_starts_one_with_the_same_settings(
        manager, templates, tracked, conn, base_url):
    tid = new_template(manager, env={"GREETING": "cold"}, entrypoint=["sleep", "3600"])
    templates.append(tid)
    warm = wait_warm(base_url, tid)
    # A networkPolicy of its own: the warm sandbox ran under the default one, so not that.
    sb = from_template(conn, tracked, tid, network_policy=NetworkPolicy(default_action="deny", egress=[]))
    assert sb.id != warm["id"]
    assert created_event(manager, sb.id).endswith(f"from template {tid}")
    assert sh(sb, "echo $GREETING") == "cold"
    assert sb.get_egress_policy().default_action == "deny"
    assert warm_of(base_url, tid)[0]["id"] == warm["id"], "the warm sandbox is still there"
    # The request's extensions pick the backend; the warm one (default backend) fits ns.
    sb2 = from_template(conn, tracked, tid, extensions={"pvisor.io/backend": "ns", "team.example.com/k": "v"})
    assert sb2.id == warm["id"]
    assert sb2.get_info().extensions == {"pvisor.io/backend": "ns", "team.example.com/k": "v"}


def test_readiness_gate_holds_warm_sandboxes_back_until_the_probe_passes(
        manager, templates, tracked, conn, base_url, http):
    # The entrypoint becomes ready a while after it starts; the gate waits for it.
    tid = new_template(manager, entrypoint=["sh", "-c", "sleep 2; touch /tmp/ready; exec sleep 3600"],
                       readiness=TemplateReadiness(probe="cmd://test -f /tmp/ready", warmup_seconds=120))
    templates.append(tid)
    warm = wait_warm(base_url, tid)
    sb = from_template(conn, tracked, tid)
    assert sb.id == warm["id"]
    assert run(sb, "test -f /tmp/ready").exit_code == 0, "handed out before its probe passed"
    # A tcp probe: busybox's httpd on a port of the sandbox.
    tcp = new_template(manager, entrypoint=["sh", "-c", "sleep 1; mkdir -p /srv; echo ok > /srv/index.html; "
                                                        "exec httpd -f -p 127.0.0.1:8080 -h /srv"],
                       readiness=TemplateReadiness(probe="tcp://127.0.0.1:8080"))
    templates.append(tcp)
    warm = wait_warm(base_url, tcp)
    sb = from_template(conn, tracked, tcp)
    assert sb.id == warm["id"]
    base, headers = dataplane(sb, 8080)
    r = httpx.get(f"{base}/index.html", headers=headers, timeout=30)
    assert r.status_code == 200 and r.text.strip() == "ok", r.text


def test_deleting_a_template_ends_its_warm_sandboxes_not_its_sandboxes(
        manager, templates, tracked, conn, base_url, pvisor_server):
    tid = new_template(manager, entrypoint=["sleep", "3600"])
    templates.append(tid)
    wait_warm(base_url, tid)
    sb = from_template(conn, tracked, tid)
    warm = wait_warm(base_url, tid)
    assert warm["id"] in sandbox_dirs(pvisor_server)
    manager.delete_template(tid)
    assert warm["id"] not in sandbox_dirs(pvisor_server), "the warm sandbox's state dir is gone"
    assert not (pvisor_server.data_dir / "state" / "sandboxes" / f"{warm['id']}.json").exists()
    assert warm_of(base_url, tid) == []
    assert sh(sb, "echo still") == "still", "a sandbox made from the template runs on"
    with pytest.raises(SandboxApiException) as ei:
        from_template(conn, tracked, tid)
    assert ei.value.status_code == 404 and error_code(ei.value) == "TEMPLATE::NOT_FOUND"


# ------------------------------------------------------------------ errors


def test_unknown_templates_are_404(manager, conn, http):
    missing = f"tpl-{uuid.uuid4()}"
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create_from_template(missing, connection_config=conn, timeout=timedelta(minutes=1))
    assert ei.value.status_code == 404 and error_code(ei.value) == "TEMPLATE::NOT_FOUND"
    for call in (manager.get_template, manager.delete_template):
        with pytest.raises(SandboxApiException) as ei:
            call(missing)
        assert ei.value.status_code == 404 and ei.value.error.code == "TEMPLATE::NOT_FOUND"
    for method in ("GET", "DELETE"):
        body = assert_error_json(http.request(method, f"/v1/templates/{missing}"), 404)
        assert body["code"] == "TEMPLATE::NOT_FOUND" and missing in body["message"]
    body = assert_error_json(http.post("/v1/sandboxes", json={"templateId": missing, "timeout": 60}), 404)
    assert body["code"] == "TEMPLATE::NOT_FOUND"


@pytest.mark.parametrize("body,code,says", [
    ({}, "INVALID_REQUEST_BODY", "image"),
    ({"image": "  "}, "INVALID_REQUEST", "image"),
    ({"image": BUSYBOX, "kernel": "vmlinux.bin"}, "UNKNOWN_FIELD", "kernel"),
    ({"image": BUSYBOX, "resourceLimits": {"gpu": "1"}}, "RESOURCE_LIMIT_UNKNOWN", "gpu"),
    ({"image": BUSYBOX, "resourceLimits": {"memory": "lots"}}, "RESOURCE_LIMIT_INVALID", "memory"),
    ({"image": BUSYBOX, "resourceLimits": {"disk": "1e9Ti"}}, "RESOURCE_LIMIT_INVALID", "resourceLimits.disk"),
    ({"image": BUSYBOX, "entrypoint": []}, "INVALID_REQUEST", "entrypoint"),
    ({"image": BUSYBOX, "env": {"1BAD": "x"}}, "INVALID_REQUEST", "1BAD"),
    ({"image": BUSYBOX, "metadata": {"opensandbox.io/x": "y"}}, "INVALID_REQUEST", "reserved"),
    ({"image": BUSYBOX, "readiness": {"probe": "http://x"}}, "INVALID_REQUEST", "probe"),
    ({"image": BUSYBOX, "readiness": {"probe": "tcp://10.0.0.1:80"}}, "INVALID_REQUEST", "the sandbox itself"),
    ({"image": BUSYBOX, "readiness": {"warmupSeconds": -1}}, "INVALID_REQUEST_BODY", "-1"),
    ({"image": BUSYBOX, "readiness": {"warmupSeconds": 7200}}, "INVALID_REQUEST", "warmupSeconds"),
    ({"image": BUSYBOX, "readiness": {"probe": "cmd://true", "extra": 1}}, "INVALID_REQUEST_BODY", "extra"),
    ({"image": BUSYBOX, "format": "zip"}, "INVALID_REQUEST_BODY", "zip"),
    ({"image": "no-such-image:never"}, "IMAGE_NOT_FOUND", "no-such-image"),
])
def test_bad_template_bodies(http, body, code, says):
    r = http.post("/v1/templates", json=body)
    status = 404 if code == "IMAGE_NOT_FOUND" else 400
    err = assert_error_json(r, status)
    assert err["code"] == code and says in err["message"], err


def test_bad_json_and_bad_paging(http):
    r = http.post("/v1/templates", content=b"{not json", headers={"content-type": "application/json"})
    assert assert_error_json(r, 400)["code"] == "INVALID_REQUEST_BODY"
    for params in ({"page": 0}, {"pageSize": 201}, {"page": "x"}):
        assert_error_json(http.get("/v1/templates", params=params), 400)


@pytest.mark.parametrize("field,value", [
    ("entrypoint", ["sleep", "1"]), ("env", {"A": "1"}), ("resourceLimits", {"cpu": "1"}),
    ("resourceRequests", {"cpu": "500m"}), ("image", {"uri": BUSYBOX}), ("snapshotId", "snap"),
    ("volumes", [{"name": "v", "host": {"path": "/tmp"}, "mountPath": "/v"}]),
    ("platform", {"os": "linux", "arch": "amd64"}), ("secureAccess", True), ("lifecycle", {}),
])
def test_a_template_fixes_the_workload_fields(manager, templates, http, field, value):
    tid = new_template(manager)
    templates.append(tid)
    err = assert_error_json(http.post("/v1/sandboxes", json={"templateId": tid, "timeout": 600, field: value}), 400)
    assert err["code"] == "INVALID_PARAMETER" and field in err["message"], err


def test_timeout_is_required_and_checked(manager, templates, http):
    tid = new_template(manager)
    templates.append(tid)
    err = assert_error_json(http.post("/v1/sandboxes", json={"templateId": tid}), 400)
    assert "timeout is required" in err["message"]
    assert_error_json(http.post("/v1/sandboxes", json={"templateId": tid, "timeout": 0}), 400)
    err = assert_error_json(http.post("/v1/sandboxes", json={"templateId": tid, "timeout": 60,
                                                             "metadata": {"opensandbox.io/id": "x"}}), 400)
    assert "reserved" in err["message"]
    err = assert_error_json(http.post("/v1/sandboxes", json={"templateId": tid, "timeout": 60,
                                                             "extensions": {"poolRef": "gpu"}}), 400)
    assert err["code"] == "POOL_NOT_FOUND"


# ------------------------------------------------------------------ restarts


@pytest.mark.deadline(300)
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_templates_survive_a_broker_restart_and_warm_sandboxes_do_not_leak(tmp_path_factory, how):
    from test_durability import alive, kill9, leaks, server

    srv = server(tmp_path_factory, f"templates-{how}")
    try:
        m = SandboxManagerSync.create(connection_config=_make_conn(srv.addr))
        made = m.create_template(CreateTemplateRequest(
            image=BUSYBOX, publish="s3://b/p", resource_limits={"cpu": "1", "memory": "128Mi"},
            entrypoint=["sleep", "3600"], env={"K": "v"}, metadata={"durable": how}, format="native"))
        warm = wait_warm(srv.url, made.template_id)
        old_worker = warm["workerPid"]
        assert alive(old_worker)
        if how == "sigkill":
            kill9(srv)
        else:
            srv.stop()
        srv.start()
        m.close()
        m = SandboxManagerSync.create(connection_config=_make_conn(srv.addr))
        assert m.get_template(made.template_id).model_dump() == made.model_dump()
        # The warm sandbox nobody had is gone (its worker, record and dirs), a new one is made.
        wait_until(lambda: not alive(old_worker), 30, what="the old warm sandbox's worker to end")
        again = wait_warm(srv.url, made.template_id)
        assert again["id"] != warm["id"]
        assert not (srv.data_dir / "state" / "sandboxes" / f"{warm['id']}.json").exists()
        sb = SandboxSync.create_from_template(made.template_id, connection_config=_make_conn(srv.addr),
                                              timeout=timedelta(minutes=5))
        try:
            assert sb.id == again["id"]
            assert sh(sb, "echo $K") == "v"
            assert json.loads(httpx.get(f"{srv.url}/v1/sandboxes/{sb.id}").text)["metadata"] == {"durable": how}
        finally:
            sb.kill()
            sb.close()
        m.delete_template(made.template_id)
        m.close()
        # Settled: a warm worker being refilled has its cgroup a moment before its process.
        deadline = time.monotonic() + 30
        while (problems := leaks(srv)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert problems == []
    finally:
        if srv.alive():
            srv.proc.send_signal(signal.SIGTERM)
        srv.stop()


# ------------------------------------------------------------------ the vm backend


@pytest.mark.deadline(900)
def test_vm_warm_sandboxes_are_booted_guests_then_clones_of_the_vm_template(tmp_path_factory):
    """On the vm backend a warm sandbox is a booted guest; with --vm-templates the first one's
    boot is saved as the vm template and the next ones are its clones."""
    from test_vm_snapshots import snapshot_qemu
    from test_vm_templates import booted, templates as vm_templates
    from vm_util import VM_ENV, guest_kernel

    kernel = guest_kernel()
    snapshot_qemu()
    srv = _start_server(tmp_path_factory, "tplvm", ["busybox.tar"], {**VM_ENV, "PVISOR_GUEST_KERNEL": str(kernel)},
                        ["--backend", "vm", "--warm-workers", "1", "--vm-templates"])
    conn = _make_conn(srv.addr)
    m = SandboxManagerSync.create(connection_config=conn)
    made: list[SandboxSync] = []
    try:
        tid = new_template(m, env={"WHO": "tpl"}, resource_limits={"cpu": "1", "memory": "256Mi"},
                           entrypoint=["sh", "-c", "echo ep > /root/ep; exec tail -f /dev/null"])
        first = wait_until(lambda: (w := warm_of(srv.url, tid)) and w[0], 300, 0.5, what="the first warm guest")
        wait_until(lambda: vm_templates(srv), 120, 0.5, what="the vm template saved from its boot")
        made.append(sb := SandboxSync.create_from_template(tid, connection_config=conn, timeout=timedelta(minutes=10)))
        assert sb.id == first["id"] and booted(srv, sb)
        assert sh(sb, "echo $WHO $OPENSANDBOX_ID") == f"tpl {sb.id}"
        second = wait_until(lambda: (w := warm_of(srv.url, tid)) and w[0], 300, 0.5, what="the second warm guest")
        made.append(sb2 := SandboxSync.create_from_template(tid, connection_config=conn,
                                                             timeout=timedelta(minutes=10)))
        assert sb2.id == second["id"]
        assert not booted(srv, sb2), "the second warm guest booted instead of being a clone of the vm template"
        assert sh(sb2, "echo $WHO $OPENSANDBOX_ID; cat /root/ep") == f"tpl {sb2.id}\nep"
        assert sh(sb2, "hostname") == f"sandbox-{sb2.id[:8]}"
        m.delete_template(tid)
    finally:
        for sb in made:
            sb.kill()
            sb.close()
        m.close()
        srv.stop()
