"""Sandboxes reach the network under the OpenSandbox egress policy (issue 9).

Against the private internet of tests/networld (no real internet): a `pvisor serve
--net-dns 198.51.100.53` drives sandboxes through the official SDK, and every assertion
is a probe run inside the sandbox (tests/e2e/netprobe.py in the python image). The whole
module runs twice, with the broker as root and as an unprivileged user (delegated
cgroups, as in test_nonroot.py). A blocked connection must fail with a refusal or reset
within the issue's one second (the probe's connect timeout), never by timing out.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess

import httpx
import pytest
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule
from opensandbox.sync import SandboxSync

from conftest import SUITE_BACKEND, _make_conn, _start_server
from e2e_util import (BLOCKED, EGRESS_PORT, NETPROBE_DIR, PYTHON, SMALL, assert_error_json, dataplane,
                      install_netprobe, list_all_ids, netprobe, run, sh, wait_until)
from unprivileged import start_unprivileged

DENY_TIMEOUT = 1  # seconds: "a denied connection fails immediately" (the bound)
ARCHIVES = ["busybox.tar", "python-3.11-slim.tar"]


def policy(default: str, *rules: tuple[str, str]) -> NetworkPolicy:
    return NetworkPolicy(default_action=default, egress=[NetworkRule(action=a, target=t) for a, t in rules])


# ---------------------------------------------------------------- brokers


@pytest.fixture(scope="module", params=["root", "unprivileged"])
def net_server(request, networld, tmp_path_factory):
    """A broker whose sandboxes' upstream resolver is the private internet's DNS."""
    if os.geteuid() != 0:
        pytest.skip("the private internet needs root")
    args = ["--backend", SUITE_BACKEND, "--net-dns", networld.DNS]
    if request.param == "root":
        srv = _start_server(tmp_path_factory, "pvisor-net", ARCHIVES, {}, args)
        yield srv
        srv.stop()
        return
    srv, deleg = start_unprivileged(tmp_path_factory, "pvisor-net-user", ARCHIVES, {}, args, tag="net")
    try:
        yield srv
        srv.stop()
    finally:
        deleg.close()


@pytest.fixture(scope="module")
def net_conn(net_server):
    return _make_conn(net_server.addr)


@pytest.fixture(scope="module")
def ca_pem(networld):
    from networld import world

    return world.ca_path().read_bytes()


@pytest.fixture
def netbox(net_conn, ca_pem):
    """Factory: netbox(policy=None) -> a python sandbox with the probe installed."""
    made: list[SandboxSync] = []

    def make(network_policy: NetworkPolicy | None = None, conn=None) -> SandboxSync:
        kw = {"network_policy": network_policy} if network_policy is not None else {}
        sb = SandboxSync.create(PYTHON, connection_config=conn or net_conn, resource=dict(SMALL), **kw)
        made.append(sb)
        install_netprobe(sb, ca_pem)
        return sb

    yield make
    for sb in made:
        try:
            sb.kill()
        except Exception:  # noqa: BLE001 - best effort; the server's stop removes the rest
            pass
        sb.close()


def ok(res: dict) -> dict:
    assert res["kind"] == "ok", f"expected success: {res}"
    return res


def blocked(res: dict) -> None:
    assert res["kind"] in BLOCKED, f"expected an immediate refusal or reset: {res}"


def nxdomain(res: dict) -> None:
    assert res["kind"] == "nxdomain", f"expected NXDOMAIN: {res}"


def served_by(sb, host: str, *rest) -> str:
    """The address of the web host that answered GET / for `host` (name or IP)."""
    res = ok(netprobe(sb, "http", host, *rest))
    return res["body"]["server"]


# ---------------------------------------------------------------- default egress


def test_default_egress_by_name_and_ip(netbox, networld):
    sb = netbox()
    assert ok(netprobe(sb, "resolve", "allowed.test"))["addrs"] == [networld.WEB_A]
    assert served_by(sb, "allowed.test") == networld.WEB_A
    assert served_by(sb, networld.WEB_B) == networld.WEB_B
    res = ok(netprobe(sb, "http", "allowed.test", "tls", f"{NETPROBE_DIR}/ca.pem"))
    assert res["body"]["sni"] == "allowed.test", res
    assert ok(netprobe(sb, "tcp_echo", "denied.test"))["echo"] == "ping\n"


def test_sandbox_has_eth0_and_resolver(netbox):
    sb = netbox()
    ifaces = ok(netprobe(sb, "ifaces"))["ifaces"]
    assert "eth0" in ifaces and ifaces["eth0"], ifaces
    assert "nameserver" in sh(sb, "cat /etc/resolv.conf")


def test_udp_echo_and_any_dns_server_answered(netbox, networld):
    sb = netbox()
    assert ok(netprobe(sb, "udp_echo", networld.WEB_A))["echo"] == "udp-ping"
    # 8.8.8.8 is not part of the private internet: only the sandbox's stack can answer.
    res = ok(netprobe(sb, "dns", "8.8.8.8", "allowed.test"))
    assert res["addrs"] == [networld.WEB_A], res


# ---------------------------------------------------------------- policy on create


def test_deny_all_plus_one_name(netbox, networld):
    sb = netbox(policy("deny", ("allow", "allowed.test")))
    assert served_by(sb, "allowed.test") == networld.WEB_A
    nxdomain(netprobe(sb, "resolve", "denied.test"))
    blocked(netprobe(sb, "connect", networld.WEB_B, 80, DENY_TIMEOUT))
    got = sb.get_egress_policy()
    assert got.default_action == "deny", got
    assert [(r.action, r.target) for r in got.egress or []] == [("allow", "allowed.test")], got


def test_wildcard_matches_subdomains_not_apex(netbox, networld):
    sb = netbox(policy("deny", ("allow", "*.wild.test")))
    assert served_by(sb, "a.wild.test") == networld.WILD_A
    assert served_by(sb, "b.c.wild.test") == networld.WILD_BC
    nxdomain(netprobe(sb, "resolve", "wild.test"))
    blocked(netprobe(sb, "connect", networld.WILD_APEX, 80, DENY_TIMEOUT))


def test_cidr_and_ip_rules_allow_direct_ips(netbox, networld):
    sb = netbox(policy("deny", ("allow", "203.0.113.16/28"), ("allow", networld.WEB_A)))
    assert served_by(sb, networld.WEB_B) == networld.WEB_B        # .20 in .16/28
    assert served_by(sb, networld.WILD_A) == networld.WILD_A      # .31 in .16/28
    assert served_by(sb, networld.WEB_A) == networld.WEB_A        # the plain IP rule
    blocked(netprobe(sb, "connect", networld.WILD_BC, 80, DENY_TIMEOUT))  # .32: outside both
    nxdomain(netprobe(sb, "resolve", "allowed.test"))             # IP rules allow no names


def test_first_matching_rule_wins(netbox, networld):
    sb = netbox(policy("deny", ("deny", "*.wild.test"), ("allow", "a.wild.test"), ("allow", "wild.test")))
    nxdomain(netprobe(sb, "resolve", "a.wild.test"))   # the wildcard deny comes first
    blocked(netprobe(sb, "connect", networld.WILD_A, 80, DENY_TIMEOUT))
    assert served_by(sb, "wild.test") == networld.WILD_APEX  # the apex is not under *.wild.test
    nxdomain(netprobe(sb, "resolve", "allowed.test"))  # no rule: the default


# ---------------------------------------------------------------- live changes


def test_patch_and_delete_apply_to_new_connections(netbox, networld):
    sb = netbox(policy("deny", ("allow", "allowed.test")))
    nxdomain(netprobe(sb, "resolve", "denied.test"))
    sb.patch_egress_rules([NetworkRule(action="allow", target="denied.test")])
    assert served_by(sb, "denied.test") == networld.WEB_B
    targets = [r.target for r in sb.get_egress_policy().egress or []]
    assert set(targets) == {"allowed.test", "denied.test"}, targets
    sb.delete_egress_rules(["allowed.test"])
    nxdomain(netprobe(sb, "resolve", "allowed.test"))
    assert served_by(sb, "denied.test") == networld.WEB_B
    assert [r.target for r in sb.get_egress_policy().egress or []] == ["denied.test"]


def test_open_connection_survives_a_patch(netbox, networld):
    sb = netbox(policy("deny", ("allow", "allowed.test")))
    go, out = f"{NETPROBE_DIR}/go", f"{NETPROBE_DIR}/hold.json"
    run(sb, f"python3 {NETPROBE_DIR}/netprobe.py hold allowed.test {go} {out}", background=True)
    wait_until(lambda: sh(sb, f"cat {out}.open 2>/dev/null || true") == "open", 20, what="the held connection")
    sb.patch_egress_rules([NetworkRule(action="deny", target="allowed.test")])
    nxdomain(netprobe(sb, "resolve", "allowed.test"))
    blocked(netprobe(sb, "connect", networld.WEB_A, 5432, DENY_TIMEOUT))
    sh(sb, f"touch {go}")
    res = json.loads(wait_until(lambda: sh(sb, f"cat {out} 2>/dev/null || true"), 20, what="the held probe"))
    assert res == {"first": "one\n", "second": "two\n", "kind": "ok"}, res


def test_policy_survives_pause_resume(netbox, net_conn, networld):
    sb = netbox(policy("deny", ("allow", "allowed.test")))
    sb.pause()
    resumed = SandboxSync.resume(sb.id, connection_config=net_conn)
    try:
        assert served_by(resumed, "allowed.test") == networld.WEB_A
        nxdomain(netprobe(resumed, "resolve", "denied.test"))
        blocked(netprobe(resumed, "connect", networld.WEB_B, 80, DENY_TIMEOUT))
        got = resumed.get_egress_policy()
        assert [(r.action, r.target) for r in got.egress or []] == [("allow", "allowed.test")], got
    finally:
        resumed.close()


# ---------------------------------------------------------------- always refused


def _host_addresses() -> list[str]:
    out = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    return [a["local"] for i in out for a in i.get("addr_info", []) if not a["local"].startswith("127.")]


def _gateway(sb) -> str:
    for line in sh(sb, "cat /proc/net/route").splitlines()[1:]:
        f = line.split()
        if f[1] == "00000000":
            return socket.inet_ntoa(int(f[2], 16).to_bytes(4, "little"))
    raise AssertionError("the sandbox has no default route")


def test_host_broker_and_metadata_unreachable(netbox, net_server, networld):
    sb = netbox()  # default egress: allow
    gw = _gateway(sb)
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        targets = [(gw, net_server.port), (gw, port), ("127.0.0.1", net_server.port),
                   (networld.LINK_HOST, port), (networld.METADATA, 80)]
        targets += [(a, port) for a in _host_addresses()]
        for host, p in targets:
            blocked(netprobe(sb, "connect", host, p, DENY_TIMEOUT))
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection from the sandbox reached the host
    finally:
        listener.close()
    res = netprobe(sb, "connect", "meta.test", 80, DENY_TIMEOUT)
    assert res["kind"] in (*BLOCKED, "nxdomain"), res


def test_rebinding_name_refused(netbox, networld):
    for sb in (netbox(), netbox(policy("deny", ("allow", "rebind.test")))):
        res = netprobe(sb, "connect", "rebind.test", 80, DENY_TIMEOUT)
        assert res["kind"] in (*BLOCKED, "nxdomain"), res


def test_lifecycle_networkpolicy_route_applies_live(netbox, net_server, networld):
    sb = netbox(policy("deny", ("allow", "allowed.test")))
    url = f"{net_server.url}/v1/sandboxes/{sb.id}/networkpolicy"
    r = httpx.get(url, timeout=30)
    assert r.status_code == 200 and r.json()["policy"]["defaultAction"] == "deny", r.text
    r = httpx.patch(url, json=[{"action": "allow", "target": "denied.test"}], timeout=30)
    assert r.status_code == 200, r.text
    assert served_by(sb, "denied.test") == networld.WEB_B
    r = httpx.request("DELETE", url, json=["denied.test"], timeout=30)
    assert r.status_code == 200, r.text
    nxdomain(netprobe(sb, "resolve", "denied.test"))


# ---------------------------------------------------------------- bad input, no network


def test_egress_endpoint_needs_the_token(netbox, none_server):
    sb = netbox(conn=_make_conn(none_server.addr))
    base, headers = dataplane(sb, EGRESS_PORT)
    assert httpx.get(f"{base}/policy", timeout=10).status_code == 401
    r = httpx.get(f"{base}/policy", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["policy"]["defaultAction"] == "deny", r.text  # no network reads as deny-all


BAD_POLICIES = {
    "unknown action": {"defaultAction": "deny", "egress": [{"action": "maybe", "target": "allowed.test"}]},
    "bad CIDR": {"defaultAction": "deny", "egress": [{"action": "allow", "target": "10.0.0.0/33"}]},
    "empty target": {"defaultAction": "deny", "egress": [{"action": "allow", "target": " "}]},
    "too many rules": {"defaultAction": "deny",
                       "egress": [{"action": "allow", "target": f"h{i}.test"} for i in range(4097)]},
}


@pytest.mark.parametrize("case", list(BAD_POLICIES))
def test_bad_policy_is_400(case, net_server):
    with httpx.Client(base_url=net_server.url, timeout=60) as http:
        before = list_all_ids(http)
        body = {"image": {"uri": PYTHON}, "timeout": 600, "resourceLimits": SMALL,
                "entrypoint": ["tail", "-f", "/dev/null"], "networkPolicy": BAD_POLICIES[case]}
        r = http.post("/v1/sandboxes", json=body)
        err = assert_error_json(r, 400)
        if case != "too many rules":
            rule = BAD_POLICIES[case]["egress"][0]
            assert rule["action"] in err["message"] or rule["target"].strip() in err["message"] \
                or "egress[0]" in err["message"], f"the message names the rule: {err}"
        assert list_all_ids(http) == before, "no sandbox state for a rejected create"


@pytest.fixture(scope="module")
def none_server(networld, tmp_path_factory):
    srv = _start_server(tmp_path_factory, "pvisor-net-none", ["python-3.11-slim.tar"], {},
                        ["--backend", SUITE_BACKEND, "--default-egress", "none"])
    yield srv
    srv.stop()


def test_default_egress_none_is_loopback_only(netbox, none_server, networld):
    sb = netbox(conn=_make_conn(none_server.addr))
    ifaces = ok(netprobe(sb, "ifaces"))["ifaces"]
    assert list(ifaces) == ["lo"], ifaces
    res = netprobe(sb, "connect", networld.WEB_A, 80, DENY_TIMEOUT)
    assert res["kind"] in ("unreachable", "refused"), res
    # No network process to enforce a policy: it reads as deny-all and cannot change.
    assert sb.get_egress_policy().default_action == "deny"
    r = httpx.patch(f"{none_server.url}/v1/sandboxes/{sb.id}/networkpolicy",
                    json=[{"action": "allow", "target": "allowed.test"}], timeout=30)
    assert_error_json(r, 409)
