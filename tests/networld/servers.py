"""The private internet's servers; runs inside the networld namespace (world.py starts it
with `nsenter --net=`). One process, one thread per listener, TCP bound to 0.0.0.0 (so every
address of the namespace serves), UDP bound per address (replies come from the address asked):

  :80   HTTP   GET /bytes/N (N-byte payload.py stream; /100m = 100 MiB), anything else:
               a JSON description of the request {server, port, host, sni, path, client}
  :443  TLS    the same, with a certificate for every test name and address (SNI-aware:
               the name the client sent is echoed back as "sni")
  :5432 TCP echo, :9999 UDP echo, :53 DNS (UDP and TCP) answering addresses.RECORDS

Writes `ready` into the state directory once every socket is bound.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import ssl
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from networld import addresses as A  # noqa: E402
from networld import dnswire, payload  # noqa: E402


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "networld/1"

    def log_message(self, fmt, *args):  # quiet: the bench makes thousands of requests
        pass

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        n = None
        if path == "/100m":
            n = A.BIG
        elif path.startswith("/bytes/"):
            try:
                n = int(path[len("/bytes/"):])
            except ValueError:
                return self._json(400, {"error": "bad size"})
            if n < 0 or n > (8 << 30):
                return self._json(400, {"error": "size out of range"})
        if n is None:
            local = self.connection.getsockname()
            return self._json(200, {
                "server": local[0], "port": local[1], "host": self.headers.get("Host"),
                "sni": getattr(self.connection, "networld_sni", None), "path": self.path,
                "client": self.client_address[0],
            })
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(n))
        self.end_headers()
        if self.command == "HEAD":
            return
        for chunk in payload.chunks(n):
            self.wfile.write(chunk)

    do_HEAD = do_GET

    def _json(self, code: int, body: dict):
        data = (json.dumps(body) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


class TlsServer(HttpServer):
    """TLS is set up in the connection's own thread, so a slow handshake blocks no one."""

    def __init__(self, addr, handler, context: ssl.SSLContext):
        super().__init__(addr, handler)
        self.context = context

    def finish_request(self, request, client_address):
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass


def tls_context(state: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(state / "server.pem", state / "server.key")

    def on_sni(sock, name, _ctx):
        sock.networld_sni = name  # echoed to the client by Handler

    ctx.sni_callback = on_sni
    return ctx


class TcpEcho(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


class TcpEchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


def udp_echo(sock: socket.socket) -> None:
    while True:
        data, peer = sock.recvfrom(65536)
        sock.sendto(data, peer)


def dns_udp(sock: socket.socket) -> None:
    while True:
        data, peer = sock.recvfrom(4096)
        resp = dnswire.answer(data, A.RECORDS, A.TTL)
        if resp:
            sock.sendto(resp, peer)


class DnsTcpHandler(socketserver.BaseRequestHandler):
    def handle(self):
        f = self.request.makefile("rb")
        while True:
            head = f.read(2)
            if len(head) < 2:
                return
            (n,) = struct.unpack("!H", head)
            resp = dnswire.answer(f.read(n), A.RECORDS, A.TTL)
            if not resp:
                return
            self.request.sendall(struct.pack("!H", len(resp)) + resp)


def bound_udp(addr: str, port: int) -> socket.socket:
    """One UDP socket per address: a reply must come from the address the query went to
    (a socket on 0.0.0.0 answers from the route's source, 198.18.0.254, which a client's
    connected UDP socket, e.g. a resolver's, drops)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", type=Path, required=True)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    servers = [
        HttpServer(("0.0.0.0", A.HTTP_PORT), Handler),
        TlsServer(("0.0.0.0", A.TLS_PORT), Handler, tls_context(args.state)),
        TcpEcho(("0.0.0.0", A.TCP_ECHO_PORT), TcpEchoHandler),
        TcpEcho(("0.0.0.0", A.DNS_PORT), DnsTcpHandler),
    ]
    loops = [(udp_echo, bound_udp(a, A.UDP_ECHO_PORT)) for a in A.WEB_HOSTS]
    loops.append((dns_udp, bound_udp(A.DNS, A.DNS_PORT)))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    threads += [threading.Thread(target=f, args=(s,), daemon=True) for f, s in loops]
    for t in threads:
        t.start()
    (args.state / "ready").write_text(f"{os.getpid()}\n")
    print(f"networld servers ready (pid {os.getpid()})", flush=True)
    signal.pause()


if __name__ == "__main__":
    main()
