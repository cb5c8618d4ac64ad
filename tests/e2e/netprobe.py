"""In-sandbox network probe for test_network.py (uploaded with networld's dnswire.py into
/tmp/netprobe/ of a python sandbox and run there). Stdlib only. Prints one JSON object:
{"kind": ok|refused|reset|timeout|unreachable|nxdomain|error, ...}.

  resolve NAME                 getaddrinfo through the sandbox's resolver -> addrs
  dns SERVER NAME              one raw UDP query to SERVER:53 -> rcode, addrs
  connect HOST PORT TIMEOUT    TCP connect (HOST may be a name)
  http HOST [tls CAFILE]       GET / on :80 (or :443, SNI = HOST) -> the server's JSON
  tcp_echo HOST / udp_echo HOST
  hold HOST GO OUT             TCP echo round trip, wait for file GO, a second round trip
                               on the same connection, JSON into file OUT
  ifaces                       interface names and their IPv4 addresses
"""
from __future__ import annotations

import errno
import fcntl
import http.client
import json
import os
import socket
import ssl
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dnswire  # noqa: E402


def classify(e: BaseException) -> dict:
    if isinstance(e, socket.gaierror):
        kind = "nxdomain" if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)) else "error"
        return {"kind": kind, "error": f"gaierror {e.errno}: {e}"}
    if isinstance(e, (socket.timeout, TimeoutError)):
        return {"kind": "timeout", "error": repr(e)}
    if isinstance(e, ssl.SSLError):
        return {"kind": "reset", "error": repr(e)}  # a TLS stream cut by the stack
    if isinstance(e, OSError):
        kinds = {errno.ECONNREFUSED: "refused", errno.ECONNRESET: "reset", errno.EPIPE: "reset",
                 errno.ENETUNREACH: "unreachable", errno.EHOSTUNREACH: "unreachable",
                 errno.ECONNABORTED: "reset"}
        return {"kind": kinds.get(e.errno, "error"), "errno": e.errno, "error": repr(e)}
    return {"kind": "error", "error": repr(e)}


def resolve(name: str) -> dict:
    infos = socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)
    return {"kind": "ok", "addrs": sorted({i[4][0] for i in infos})}


def dns(server: str, name: str) -> dict:
    rcode, addrs = dnswire.resolve(server, name, timeout=3)
    return {"kind": "ok" if rcode == 0 else ("nxdomain" if rcode == 3 else "error"),
            "rcode": rcode, "addrs": [a for a, _ in addrs], "ttls": [t for _, t in addrs]}


def connect(host: str, port: str, timeout: str) -> dict:
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), float(timeout)) as s:
            peer = s.getpeername()[0]
        return {"kind": "ok", "peer": peer, "elapsed": time.monotonic() - t0}
    except BaseException as e:  # noqa: BLE001 - classified
        return {**classify(e), "elapsed": time.monotonic() - t0}


def http_get(host: str, *rest: str) -> dict:
    if rest and rest[0] == "tls":
        ctx = ssl.create_default_context(cafile=rest[1])
        conn = http.client.HTTPSConnection(host, 443, timeout=5, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, 80, timeout=5)
    try:
        conn.request("GET", "/")
        r = conn.getresponse()
        return {"kind": "ok", "status": r.status, "body": json.loads(r.read())}
    finally:
        conn.close()


def tcp_echo(host: str) -> dict:
    with socket.create_connection((host, 5432), 5) as s:
        s.sendall(b"ping\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return {"kind": "ok", "echo": data.decode()}


def udp_echo(host: str) -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(b"udp-ping", (host, 9999))
        data, peer = s.recvfrom(4096)
    return {"kind": "ok", "echo": data.decode(), "peer": peer[0]}


def hold(host: str, go: str, out: str) -> dict:
    res: dict = {}
    try:
        with socket.create_connection((host, 5432), 5) as s:
            s.settimeout(10)
            s.sendall(b"one\n")
            res["first"] = s.recv(4096).decode()
            with open(out + ".open", "w") as f:
                f.write("open\n")
            deadline = time.monotonic() + 60
            while not os.path.exists(go) and time.monotonic() < deadline:
                time.sleep(0.05)
            s.sendall(b"two\n")
            res["second"] = s.recv(4096).decode()
            res["kind"] = "ok"
    except BaseException as e:  # noqa: BLE001 - classified
        res.update(classify(e))
    with open(out + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(out + ".tmp", out)
    return res


def ifaces() -> dict:
    out = {}
    for name in sorted(os.listdir("/sys/class/net")):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                out[name] = socket.inet_ntoa(raw[20:24])
            except OSError:
                out[name] = None
    return {"kind": "ok", "ifaces": out}


COMMANDS = {"resolve": resolve, "dns": dns, "connect": connect, "http": http_get, "tcp_echo": tcp_echo,
            "udp_echo": udp_echo, "hold": hold, "ifaces": ifaces}


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        res = COMMANDS[cmd](*args)
    except BaseException as e:  # noqa: BLE001 - classified
        res = classify(e)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
