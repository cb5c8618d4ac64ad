"""Client-side checks of the world's servers, from wherever this runs (the host's root
namespace for `check`; the e2e suite has its own in-sandbox probes). Stdlib only.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import socket
import ssl

from . import addresses as A
from . import dnswire, payload

TIMEOUT = 5.0


def http_json(ip: str, *, host: str | None = None, tls: bool = False, cafile: str | None = None,
              path: str = "/") -> dict:
    """GET path from ip (TLS with SNI = host when tls) and return the server's JSON."""
    if tls:
        ctx = ssl.create_default_context(cafile=cafile)
        conn = http.client.HTTPSConnection(ip, A.TLS_PORT, timeout=TIMEOUT, context=ctx)
        if host:  # connect to the IP, but send SNI / verify for the name
            conn = http.client.HTTPSConnection(host, A.TLS_PORT, timeout=TIMEOUT, context=ctx)
            conn.sock = ctx.wrap_socket(socket.create_connection((ip, A.TLS_PORT), TIMEOUT), server_hostname=host)
    else:
        conn = http.client.HTTPConnection(ip, A.HTTP_PORT, timeout=TIMEOUT)
    try:
        conn.request("GET", path, headers={"Host": host or ip})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise AssertionError(f"GET {path} on {ip}: {r.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        conn.close()


def download(ip: str, n: int) -> str:
    """GET /bytes/n from ip; returns the sha256 of what arrived (compare with payload.digest)."""
    conn = http.client.HTTPConnection(ip, A.HTTP_PORT, timeout=TIMEOUT)
    try:
        conn.request("GET", f"/bytes/{n}")
        r = conn.getresponse()
        h = hashlib.sha256()
        got = 0
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            h.update(b)
            got += len(b)
        if got != n:
            raise AssertionError(f"/bytes/{n} from {ip}: got {got} bytes")
        return h.hexdigest()
    finally:
        conn.close()


def tcp_echo(ip: str, data: bytes = b"networld tcp echo\n") -> bytes:
    with socket.create_connection((ip, A.TCP_ECHO_PORT), TIMEOUT) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def udp_echo(ip: str, data: bytes = b"networld udp echo") -> bytes:
    """Over a connected socket, so a reply from another address than `ip` is not accepted."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((ip, A.UDP_ECHO_PORT))
        s.send(data)
        return s.recv(65536)


def quick_check() -> None:
    """One HTTP request and one DNS answer: the world answers."""
    got = http_json(A.WEB_A)
    if got.get("server") != A.WEB_A:
        raise AssertionError(f"HTTP on {A.WEB_A} answered {got}")
    rcode, addrs = dnswire.resolve(A.DNS, "allowed.test", timeout=2)
    if rcode != 0 or [a for a, _ in addrs] != [A.WEB_A]:
        raise AssertionError(f"DNS allowed.test -> rcode {rcode} {addrs}")


def full_check(cafile: str, big: bool = True) -> list[str]:
    """Every server and every record; returns one line per check (raises on the first failure)."""
    lines = []
    for ip in A.WEB_HOSTS:
        got = http_json(ip)
        assert got["server"] == ip, got
        got = http_json(ip, tls=True, cafile=cafile, host="allowed.test")
        assert got["server"] == ip and got["sni"] == "allowed.test", got
        assert tcp_echo(ip) == b"networld tcp echo\n"
        assert udp_echo(ip) == b"networld udp echo"
        lines.append(f"ok {ip}: http :80, tls :443 (sni allowed.test, CA-verified), tcp echo :5432, udp echo :9999")
    for name, want in A.RECORDS.items():
        rcode, addrs = dnswire.resolve(A.DNS, name)
        assert rcode == 0 and addrs == [(want, A.TTL)], (name, rcode, addrs)
        lines.append(f"ok dns {name} -> {want} ttl {A.TTL}")
    for name in ("nope.test", "wild.test.example", "c.wild.test"):
        rcode, addrs = dnswire.resolve(A.DNS, name)
        assert rcode == dnswire.RCODE_NXDOMAIN and not addrs, (name, rcode, addrs)
        lines.append(f"ok dns {name} -> NXDOMAIN")
    with socket.create_connection((A.DNS, A.DNS_PORT), TIMEOUT) as s:
        q = dnswire.build_query("denied.test")
        s.sendall(len(q).to_bytes(2, "big") + q)
        n = int.from_bytes(s.recv(2), "big")
        data = b""
        while len(data) < n:
            data += s.recv(n - len(data))
        assert dnswire.parse_answer(data)[2] == [(A.WEB_B, A.TTL)]
        lines.append("ok dns over tcp denied.test")
    if big:
        assert download(A.WEB_A, A.BIG) == payload.digest(A.BIG)
        lines.append(f"ok 100 MiB payload from {A.WEB_A}, sha256 verified")
    return lines
