"""The network bench's client, run identically inside a pvisor sandbox, inside a Docker
container and on the host (stdlib only; uploaded as one file). Prints one JSON line.

  download HOST PORT SIZE [verify]  GET /bytes/SIZE over HTTP/1.1, discard (or sha256) the body;
                                    {bytes, seconds, sha256?}; the clock covers connect + body
  connects HOST PORT COUNT          COUNT sequential TCP connects (each closed at once);
                                    {us: [connect time of each, µs]}
"""
import hashlib
import json
import socket
import sys
import time


def download(host, port, size, verify=False):
    t0 = time.perf_counter()
    s = socket.create_connection((host, int(port)), 10)
    s.sendall(f"GET /bytes/{size} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    head = b""
    h = hashlib.sha256() if verify else None
    got = 0
    while b"\r\n\r\n" not in head:
        n = s.recv_into(buf)
        if not n:
            raise RuntimeError(f"connection closed in the headers: {head[:200]!r}")
        head += bytes(view[:n])
    head, body = head.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad status: {head[:200]!r}")
    got = len(body)
    if h:
        h.update(body)
    while True:
        n = s.recv_into(buf)
        if not n:
            break
        got += n
        if h:
            h.update(view[:n])
    dt = time.perf_counter() - t0
    s.close()
    if got != int(size):
        raise RuntimeError(f"got {got} of {size} bytes")
    out = {"bytes": got, "seconds": dt}
    if h:
        out["sha256"] = h.hexdigest()
    return out


def connects(host, port, count):
    us = []
    addr = (host, int(port))
    for _ in range(int(count)):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        t0 = time.perf_counter()
        s.connect(addr)
        us.append(round((time.perf_counter() - t0) * 1e6, 1))
        s.close()
    return {"us": us}


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "download":
        res = download(*args[:3], verify=len(args) > 3 and args[3] == "verify")
    elif cmd == "connects":
        res = connects(*args)
    else:
        raise SystemExit(f"unknown command {cmd}")
    print(json.dumps(res))
