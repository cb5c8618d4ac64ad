"""The egress policy API: what the SDK reads and writes, not what netd enforces.

The broker serves the policy itself on port 18080 of a sandbox's endpoint
(`/policy`, `/healthz`, `/credential-vault*`) and on the lifecycle routes
`/v1/sandboxes/{id}/networkpolicy`; every change is pushed to the worker.
Enforcement (names, addresses, the hard-deny table) is tested with the private
test network elsewhere.
"""

from __future__ import annotations

import json

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule
from opensandbox.sync import SandboxSync

from conftest import _make_conn, _start_server
from e2e_util import BUSYBOX, EGRESS_PORT, SMALL, assert_error_json, sandbox_dirs, sh, wait_until


def rules(policy: NetworkPolicy) -> list[tuple[str, str]]:
    return [(r.action, r.target) for r in policy.egress or []]


def egress_client(sb: SandboxSync, **headers: str) -> httpx.Client:
    """A raw client on the sandbox's 18080 endpoint (with its token unless overridden)."""
    ep = sb.get_endpoint(EGRESS_PORT)
    hdrs = dict(ep.headers) if not headers else headers
    return httpx.Client(base_url=f"http://{ep.endpoint}", headers=hdrs, timeout=30)


def sandbox_ids(http) -> set[str]:
    return {i["id"] for i in http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]}


# ------------------------------------------------------------------- the SDK's calls


def test_default_policy_is_allow_all(sandbox):
    sb = sandbox(BUSYBOX)
    p = sb.get_egress_policy()
    assert p.default_action == "allow"
    assert rules(p) == []
    with egress_client(sb) as c:
        r = c.get("/policy")
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": "ok",
            "mode": "allow_all",
            "enforcementMode": "dns+nft",
            "policy": {"defaultAction": "allow", "egress": []},
        }


def test_create_with_policy_is_normalised(sandbox):
    policy = NetworkPolicy(
        default_action="deny",
        egress=[
            NetworkRule(action="allow", target="Pkgs.Example.ORG."),
            NetworkRule(action="allow", target="*.Wild.Test"),
            NetworkRule(action="deny", target="203.0.113.0/24"),
            NetworkRule(action="allow", target="2001:DB8::1"),
        ],
    )
    sb = sandbox(BUSYBOX, network_policy=policy)
    p = sb.get_egress_policy()
    assert p.default_action == "deny"
    assert rules(p) == [
        ("allow", "pkgs.example.org"),
        ("allow", "*.wild.test"),
        ("deny", "203.0.113.0/24"),
        ("allow", "2001:db8::1"),
    ]
    with egress_client(sb) as c:
        assert c.get("/policy").json()["mode"] == "enforcing"
    # The sandbox itself works as ever.
    assert sh(sb, "echo up") == "up"


def test_patch_merges_incoming_first(sandbox):
    policy = NetworkPolicy(
        default_action="deny",
        egress=[NetworkRule(action="allow", target="a.test"), NetworkRule(action="allow", target="b.test")],
    )
    sb = sandbox(BUSYBOX, network_policy=policy)
    sb.patch_egress_rules([
        NetworkRule(action="deny", target="B.test"),
        NetworkRule(action="allow", target="c.test"),
        NetworkRule(action="allow", target="b.test"),  # a second rule for b.test: the first wins
    ])
    p = sb.get_egress_policy()
    assert p.default_action == "deny", "PATCH keeps the default action"
    assert rules(p) == [("deny", "b.test"), ("allow", "c.test"), ("allow", "a.test")]
    with egress_client(sb) as c:
        r = c.patch("/policy", json=[])
        assert_error_json(r, 400)


def test_delete_rules_is_idempotent(sandbox):
    policy = NetworkPolicy(
        default_action="allow",
        egress=[NetworkRule(action="deny", target="*.x.test"), NetworkRule(action="deny", target="y.test")],
    )
    sb = sandbox(BUSYBOX, network_policy=policy)
    sb.delete_egress_rules(["*.X.test"])
    assert rules(sb.get_egress_policy()) == [("deny", "y.test")]
    sb.delete_egress_rules(["*.x.test"])  # again: no error
    with egress_client(sb) as c:
        r = c.request("DELETE", "/policy", json=["nothing.test"])
        assert r.status_code == 200, r.text
        assert r.json()["reason"] == "no matching targets found"
        r = c.request("DELETE", "/policy", json=["y.test"])
        assert r.status_code == 200 and "reason" not in r.json(), r.text
        assert r.json()["mode"] == "allow_all"
        assert_error_json(c.request("DELETE", "/policy", json=[]), 400)
    assert rules(sb.get_egress_policy()) == []


def test_replace_and_reset(sandbox):
    sb = sandbox(BUSYBOX)
    with egress_client(sb) as c:
        r = c.post("/policy", json={"defaultAction": "deny", "egress": [{"action": "ALLOW", "target": "x.test"}]})
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == "enforcing"
        assert rules(sb.get_egress_policy()) == [("allow", "x.test")]
        r = c.put("/policy", json={"defaultAction": "allow"})
        assert r.json()["mode"] == "allow_all"
        r = c.post("/policy", content=b"")
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == "deny_all"
        assert r.json()["reason"] == "policy reset to default deny-all"
        p = sb.get_egress_policy()
        assert (p.default_action, rules(p)) == ("deny", [])
        body = assert_error_json(c.post("/policy", json={"egress": [{"action": "allow", "target": "10.0.0.0/33"}]}), 400)
        assert body["message"] == 'egress[0]: bad CIDR "10.0.0.0/33"'
        assert c.put("/policy", json={"defaultAction": "maybe"}).status_code == 400
        # A failed request changes nothing.
        assert c.get("/policy").json()["mode"] == "deny_all"


def test_more_than_4096_rules_is_413(sandbox):
    sb = sandbox(BUSYBOX)
    many = [{"action": "allow", "target": f"h{i}.test"} for i in range(4097)]
    with egress_client(sb) as c:
        assert_error_json(c.post("/policy", json={"defaultAction": "deny", "egress": many}), 413)
        assert_error_json(c.patch("/policy", json=many), 413)
        r = c.post("/policy", json={"defaultAction": "deny", "egress": many[:4096]})
        assert r.status_code == 200, r.text
        assert_error_json(c.patch("/policy", json=[{"action": "allow", "target": "one-more.test"}]), 413)
        r = c.patch("/policy", json=[{"action": "deny", "target": "h0.test"}])
        assert r.status_code == 200, "replacing a rule keeps the count: " + r.text
    assert len(sb.get_egress_policy().egress) == 4096


def test_server_proxy_mode(sandbox, proxy_conn):
    sb = sandbox(BUSYBOX, conn=proxy_conn, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="x.test")]))
    sb.patch_egress_rules([NetworkRule(action="allow", target="y.test")])
    assert rules(sb.get_egress_policy()) == [("allow", "y.test"), ("allow", "x.test")]


# ------------------------------------------------------------------- the 18080 door


def test_egress_port_needs_the_token(sandbox):
    sb = sandbox(BUSYBOX)
    ep = sb.get_endpoint(EGRESS_PORT)
    token = next(iter(ep.headers.values()))
    base = f"http://{ep.endpoint}"
    for path in ("/policy", "/healthz", "/credential-vault"):
        assert_error_json(httpx.get(base + path, timeout=30), 401)
        assert_error_json(httpx.get(base + path, headers={"X-EXECD-ACCESS-TOKEN": "wrong"}, timeout=30), 401)
        assert_error_json(httpx.get(base + path, headers={"OPENSANDBOX-EGRESS-AUTH": "wrong"}, timeout=30), 401)
    assert_error_json(httpx.patch(base + "/policy", json=[{"action": "allow", "target": "x.test"}], timeout=30), 401)
    r = httpx.get(base + "/policy", headers={"OPENSANDBOX-EGRESS-AUTH": token}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "allow_all"
    assert rules(sb.get_egress_policy()) == [], "unauthorised calls changed nothing"


def test_healthz_vault_and_unknown_routes(sandbox):
    sb = sandbox(BUSYBOX)
    with egress_client(sb) as c:
        r = c.get("/healthz")
        assert (r.status_code, r.text) == (200, "ok")
        for method, path in (("GET", "/credential-vault"), ("POST", "/credential-vault"),
                             ("GET", "/credential-vault/credentials"), ("GET", "/credential-vault/bindings/x")):
            assert_error_json(c.request(method, path, json={} if method == "POST" else None), 501)
        assert_error_json(c.get("/nothing-here"), 404)
        r = c.request("OPTIONS", "/policy")
        assert_error_json(r, 405)
        assert "PATCH" in r.headers.get("allow", "")


def test_sdk_vault_calls_fail_clearly(sandbox):
    sb = sandbox(BUSYBOX)
    with pytest.raises(SandboxException) as ei:
        sb.credential_vault.get()
    assert "501" in str(ei.value) or getattr(ei.value, "status_code", None) == 501, ei.value


# ------------------------------------------------------------------- lifecycle routes


def test_lifecycle_networkpolicy_routes(http, sandbox):
    sb = sandbox(BUSYBOX, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="a.test")]))
    base = f"/v1/sandboxes/{sb.id}/networkpolicy"
    r = http.get(base)
    assert r.status_code == 200, r.text
    assert r.json()["policy"] == {"defaultAction": "deny", "egress": [{"action": "allow", "target": "a.test"}]}
    r = http.patch(base, json=[{"action": "allow", "target": "b.test"}])
    assert r.status_code == 200, r.text
    r = http.request("DELETE", base, json=["a.test"])
    assert r.status_code == 200, r.text
    assert rules(sb.get_egress_policy()) == [("allow", "b.test")], "both doors share one policy"
    r = http.put(base, json={"defaultAction": "allow", "egress": []})
    assert r.json()["mode"] == "allow_all"
    assert_error_json(http.put(base, json={"egress": [{"action": "nope", "target": "x.test"}]}), 400)
    assert_error_json(http.get("/v1/sandboxes/does-not-exist/networkpolicy"), 404)
    # The SDK's own control-plane adapter speaks the same routes.
    from opensandbox.sync.adapters.network_policy_adapter import NetworkPolicyAdapterSync

    adapter = NetworkPolicyAdapterSync(sb.connection_config, sb.id)
    adapter.patch_rules([NetworkRule(action="deny", target="c.test")])
    assert rules(adapter.get_policy()) == [("deny", "c.test")]
    adapter.delete_rules(["c.test"])
    assert rules(adapter.get_policy()) == []


@pytest.mark.deadline(90)
def test_policy_survives_pause_resume(sandbox, manager, conn):
    sb = sandbox(BUSYBOX, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="a.test")]))
    sb.pause()
    wait_until(lambda: manager.get_sandbox_info(sb.id).status.state == "Paused", 10, what="paused")
    # Editable while paused (stored; the resumed netd gets it).
    r = httpx.patch(f"http://{conn.get_domain()}/v1/sandboxes/{sb.id}/networkpolicy",
                    json=[{"action": "allow", "target": "b.test"}], timeout=30)
    assert r.status_code == 200, r.text
    resumed = sandbox.track(SandboxSync.resume(sb.id, connection_config=conn))
    wait_until(lambda: manager.get_sandbox_info(sb.id).status.state == "Running", 10, what="running")
    assert rules(resumed.get_egress_policy()) == [("allow", "b.test"), ("allow", "a.test")]
    assert sh(resumed, "echo back") == "back"


# ------------------------------------------------------------------- bad creates


BAD_POLICIES = [
    ({"defaultAction": "deny", "egress": [{"action": "allow", "target": "a.test"},
                                          {"action": "allow", "target": "10.0.0.0/33"}]},
     'egress[1]: bad CIDR "10.0.0.0/33"'),
    ({"defaultAction": "deny", "egress": [{"action": "permit", "target": "a.test"}]}, 'egress[0]: unknown action "permit"'),
    ({"defaultAction": "deny", "egress": [{"action": "allow", "target": "  "}]}, "egress[0]: empty target"),
    ({"defaultAction": "deny", "egress": [{"action": "allow", "target": "a.*.test"}]}, 'egress[0]: bad domain "a.*.test"'),
    ({"defaultAction": "sometimes"}, 'defaultAction: unknown action "sometimes"'),
    ({"defaultAction": "deny", "egress": [{"action": "allow", "target": f"h{i}.test"} for i in range(4097)]},
     "4097 egress rules, at most 4096"),
]


@pytest.mark.parametrize("policy,message", BAD_POLICIES, ids=lambda x: str(x)[:40])
def test_bad_policy_is_400_before_any_sandbox(http, pvisor_server, policy, message):
    before_ids, before_dirs = sandbox_ids(http), sandbox_dirs(pvisor_server)
    body = {"image": {"uri": BUSYBOX}, "entrypoint": ["/bin/sh", "-c", "sleep 600"],
            "resourceLimits": dict(SMALL), "timeout": 600, "networkPolicy": policy}
    r = http.post("/v1/sandboxes", content=json.dumps(body), headers={"Content-Type": "application/json"})
    err = assert_error_json(r, 400)
    assert message in err["message"], err
    assert sandbox_ids(http) == before_ids
    assert sandbox_dirs(pvisor_server) == before_dirs


def test_bad_policy_through_the_sdk(http, conn):
    before = sandbox_ids(http)
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                           network_policy=NetworkPolicy(default_action="deny",
                                                        egress=[NetworkRule(action="allow", target="300.1.1.1")]))
    assert ei.value.status_code == 400
    assert 'egress[0]: bad IP address "300.1.1.1"' in (ei.value.error.message or ""), ei.value.error
    assert sandbox_ids(http) == before


def test_credential_proxy_is_400(http, conn):
    before = sandbox_ids(http)
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                           credential_proxy=CredentialProxyConfig(enabled=True))
    assert ei.value.status_code == 400
    assert "credentialProxy" in (ei.value.error.message or "")
    body = {"image": {"uri": BUSYBOX}, "resourceLimits": dict(SMALL), "credentialProxy": {"enabled": True}}
    assert_error_json(http.post("/v1/sandboxes", json=body), 400)
    assert sandbox_ids(http) == before


# ------------------------------------------------------------------- --default-egress none


@pytest.fixture(scope="module")
def no_net_server(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "pvisor-nonet", ["busybox.tar"], {},
                        ["--backend", "ns", "--default-egress", "none", "--net-dns", "192.0.2.53"])
    yield srv
    srv.stop()


def test_default_egress_none(no_net_server, sandbox):
    conn = _make_conn(no_net_server.addr)
    sb = sandbox(BUSYBOX, conn=conn)
    with egress_client(sb) as c:
        r = c.get("/policy")
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == "deny_all"
        assert "no network" in r.json()["reason"]
        err = assert_error_json(c.patch("/policy", json=[{"action": "allow", "target": "x.test"}]), 409)
        assert err["code"] == "NETWORK_DISABLED"
        assert_error_json(c.post("/policy", json={"defaultAction": "allow"}), 409)
    with pytest.raises(SandboxApiException) as ei:
        sb.patch_egress_rules([NetworkRule(action="allow", target="x.test")])
    assert ei.value.status_code == 409
    # A create with a policy gets a network (and its policy) even here.
    sb2 = sandbox(BUSYBOX, conn=conn, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="x.test")]))
    sb2.patch_egress_rules([NetworkRule(action="allow", target="y.test")])
    assert rules(sb2.get_egress_policy()) == [("allow", "y.test"), ("allow", "x.test")]
