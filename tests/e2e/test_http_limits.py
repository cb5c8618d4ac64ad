"""The broker survives hostile HTTP clients (issue 12: request limits, hostile-tenant item 5).

A server of its own with short timeouts and small caps:
* thousands of half-open connections (a request head that never ends) and slow bodies:
  /health and a create keep answering, the server closes the half-open connections once
  the header timeout has passed, and its fd count and RSS come back (figures printed);
* heads and bodies over their bounds get 431/413 JSON;
* creates past the concurrency bound wait in a queue; a full queue and a create that waited
  past its deadline answer 429 `TOO_MANY_CREATES`, the sandbox cap 429 `SANDBOX_LIMIT_REACHED`.
"""

from __future__ import annotations

import os
import resource
import selectors
import socket
import threading
import time

import httpx
import pytest

from conftest import _start_server
from e2e_util import BUSYBOX, SMALL, assert_error_json, wait_until

HEADER_TIMEOUT = 3
BODY_TIMEOUT = 3
MAX_BODY = 64 << 10
MAX_SANDBOXES = 3
HALF_OPEN = 3000
SLOW_BODIES = 200
MAX_STREAMS = 2
MAX_CONNECTIONS = 50
QUEUE_WAIT = 10


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = _start_server(
        tmp_path_factory, "pvisor-limits", ["busybox.tar"], {},
        [
            "--backend", "ns", "--allow-pull",
            "--header-timeout-secs", str(HEADER_TIMEOUT),
            "--body-timeout-secs", str(BODY_TIMEOUT),
            "--max-body-bytes", str(MAX_BODY),
            "--max-sandboxes", str(MAX_SANDBOXES),
            "--max-concurrent-creates", "1",
            "--create-queue", "1",
            "--create-queue-wait-secs", str(QUEUE_WAIT),
            "--max-streams", str(MAX_STREAMS),
        ],
    )
    yield s
    s.stop()


@pytest.fixture
def http(srv):
    # The server closes keep-alive connections idle for HEADER_TIMEOUT (3 s
    # here); a client must not keep them longer, or a reuse can race the
    # server's close ("Server disconnected"). httpx's default expiry (5 s) is
    # below the server's default timeout (10 s), not below this test's.
    limits = httpx.Limits(keepalive_expiry=HEADER_TIMEOUT / 3)
    with httpx.Client(base_url=srv.url, timeout=60, limits=limits) as c:
        yield c


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))


def create_body(image: str = BUSYBOX) -> dict:
    return {"image": {"uri": image}, "entrypoint": ["sleep", "600"], "timeout": 600,
            "resourceLimits": dict(SMALL)}


def create(http: httpx.Client, image: str = BUSYBOX) -> httpx.Response:
    return http.post("/v1/sandboxes", json=create_body(image))


def delete_all(http: httpx.Client) -> None:
    for sb in http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]:
        http.delete(f"/v1/sandboxes/{sb['id']}")


def open_half(port: int, n: int, payload: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(payload)
        socks.append(s)
    return socks


def closed_by_server(socks: list[socket.socket], within: float) -> tuple[int, list[bytes]]:
    """Waits for the server to close each socket; returns how many it closed and what it sent."""
    sel = selectors.DefaultSelector()  # epoll: thousands of fds
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    data: dict[int, bytes] = {}
    closed = 0
    deadline = time.monotonic() + within
    while closed < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                data[s.fileno()] = data.get(s.fileno(), b"") + chunk
                continue
            closed += 1
            sel.unregister(s)
    sel.close()
    return closed, list(data.values())


def test_half_open_connections_and_slow_bodies_do_not_starve_the_server(srv, http):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = HALF_OPEN + SLOW_BODIES + 200
    if soft < need:
        if hard < need:
            pytest.skip(f"this test needs {need} open files; RLIMIT_NOFILE is {soft}/{hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    pid = srv.proc.pid
    assert http.get("/health").status_code == 200
    fd0, rss0 = fds(pid), rss_kib(pid)

    half = open_half(srv.port, HALF_OPEN, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    slow = open_half(
        srv.port, SLOW_BODIES,
        b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"image\":",
    )
    fd1, rss1 = fds(pid), rss_kib(pid)
    try:
        # The service answers while they hang.
        r = http.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "healthy"}
        r = create(http)
        assert r.status_code == 202, r.text
        assert http.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204

        closed, _ = closed_by_server(half, within=HEADER_TIMEOUT + 30)
        assert closed == HALF_OPEN, f"the server closed {closed} of {HALF_OPEN} half-open connections"
        closed, answers = closed_by_server(slow, within=BODY_TIMEOUT + 30)
        assert closed == SLOW_BODIES, f"the server closed {closed} of {SLOW_BODIES} slow-body connections"
        assert len(answers) == SLOW_BODIES, f"{len(answers)} of {SLOW_BODIES} slow bodies got an answer"
        for a in answers[:5]:
            head, _, body = a.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), a[:300]
            assert b'"code":"BODY_TIMEOUT"' in body, a[:300]
    finally:
        for s in half + slow:
            s.close()

    wait_until(lambda: fds(pid) <= fd0 + 16, timeout=30, what="the broker's fds to come back")
    fd2, rss2 = fds(pid), rss_kib(pid)
    print(f"\nbroker fds: {fd0} before, {fd1} with {HALF_OPEN} half-open + {SLOW_BODIES} slow-body "
          f"connections, {fd2} after; RSS KiB: {rss0} before, {rss1} during, {rss2} after")
    # The accept loop returns freed heap after a burst (malloc_trim): RSS comes back near its start.
    assert rss2 < rss0 + 16 * 1024, f"RSS stayed up: {rss0} -> {rss2} KiB"
    assert http.get("/health").status_code == 200


def test_oversize_heads_and_bodies_get_json_errors(srv, http):
    body = assert_error_json(http.get("/health", headers={"x-big": "a" * (40 << 10)}), 431)
    assert body["code"] == "HEADERS_TOO_LARGE"
    many = {f"x-h{i}": "v" for i in range(150)}
    body = assert_error_json(http.get("/health", headers=many), 431)
    assert body["code"] == "HEADERS_TOO_LARGE"

    big = b'{"image":{"uri":"' + b"a" * (MAX_BODY + 100) + b'"}}'
    body = assert_error_json(
        http.post("/v1/sandboxes", content=big, headers={"content-type": "application/json"}), 413)
    assert body["code"] == "PAYLOAD_TOO_LARGE"

    def chunks():  # no Content-Length: the limit holds while reading
        for _ in range(4):
            yield b"a" * (MAX_BODY // 2)

    body = assert_error_json(
        http.post("/v1/sandboxes", content=chunks(), headers={"content-type": "application/json"}), 413)
    assert body["code"] == "PAYLOAD_TOO_LARGE"
    assert http.get("/health").status_code == 200


class HangingRegistry:
    """Accepts connections and never answers: a pull from it holds its create open. Once
    `refuse`d it answers every connection, held or new, with 404."""

    NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted = threading.Event()
        self._refusing = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                if self._refusing:
                    self._answer(c)
                    continue
                self.conns.append(c)
            self.accepted.set()

    def _answer(self, c: socket.socket):
        try:
            c.sendall(self.NOT_FOUND)
            c.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.close()

    def refuse(self):
        """Answers the held pulls and every later one with 404 (the pull, https first, then
        plain http, fails at once)."""
        with self._lock:
            self._refusing = True
            for c in self.conns:
                self._answer(c)
            self.conns.clear()

    def close(self):
        # shutdown wakes the accept() a close alone would leave listening
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            for c in self.conns:
                c.close()
            self.conns.clear()


def test_creates_past_the_concurrency_bound_queue_and_are_refused_when_full_or_late(srv, http):
    reg = HangingRegistry()
    first: dict = {}
    queued: dict = {}

    def slow_create():
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            first["r"] = create(c, f"127.0.0.1:{reg.port}/hang/forever:1")

    def queued_create():
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            t0 = time.monotonic()
            queued["r"] = create(c)
            queued["waited"] = time.monotonic() - t0

    t = threading.Thread(target=slow_create)
    t.start()
    q = threading.Thread(target=queued_create)
    try:
        assert reg.accepted.wait(30), "the create did not reach the hanging registry"
        # The one slot is taken: the next create waits in the queue (of one)...
        q.start()
        time.sleep(1)
        assert q.is_alive(), f"the second create did not wait: {queued}"
        # ... and one more finds the queue full, at once.
        r = create(http)
        body = assert_error_json(r, 429)
        assert body["code"] == "TOO_MANY_CREATES" and "--create-queue" in body["message"], body
        assert r.headers.get("retry-after") == "1"
        # The queued one gives up at its deadline, with the same code and its reason.
        q.join(QUEUE_WAIT + 30)
        body = assert_error_json(queued["r"], 429)
        assert body["code"] == "TOO_MANY_CREATES" and "--create-queue-wait-secs" in body["message"], body
        assert queued["r"].headers.get("retry-after") == "1"
        assert queued["waited"] >= QUEUE_WAIT - 0.5, queued
    finally:
        reg.close()
        t.join(120)
        if q.is_alive():
            q.join(120)
    assert first["r"].status_code >= 400, first["r"].text
    r = create(http)
    assert r.status_code == 202, r.text
    http.delete(f"/v1/sandboxes/{r.json()['id']}")


def test_a_queued_create_is_served_when_the_slot_frees(srv, http):
    reg = HangingRegistry()
    first: dict = {}

    def slow_create():
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            first["r"] = create(c, f"127.0.0.1:{reg.port}/hang/forever:1")
            first["at"] = time.monotonic()

    t = threading.Thread(target=slow_create)
    t.start()
    try:
        assert reg.accepted.wait(30), "the create did not reach the hanging registry"
        threading.Timer(1.0, reg.refuse).start()  # the slot frees while the next create waits
        t0 = time.monotonic()
        r = create(http)
        print(f"\nthe queued create was answered after {time.monotonic() - t0:.1f} s; the held one "
              f"{first.get('at', float('nan')) - t0:.1f} s: {first.get('r') and first['r'].text}")
        assert r.status_code == 202, r.text
        http.delete(f"/v1/sandboxes/{r.json()['id']}")
    finally:
        reg.close()
        t.join(120)
    assert first["r"].status_code >= 400, first["r"].text


def test_sandbox_cap_answers_429(srv, http):
    delete_all(http)
    ids = []
    try:
        for _ in range(MAX_SANDBOXES):
            r = create(http)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        body = assert_error_json(create(http), 429)
        assert body["code"] == "SANDBOX_LIMIT_REACHED"
        assert "--max-sandboxes" in body["message"]
        assert http.delete(f"/v1/sandboxes/{ids.pop()}").status_code == 204
        r = create(http)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    finally:
        for i in ids:
            http.delete(f"/v1/sandboxes/{i}")


def test_stream_cap_answers_429(srv, http):
    r = create(http)
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    try:
        ep = http.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()
        base, headers = f"http://{ep['endpoint']}", ep["headers"]
        wait_until(lambda: httpx.get(f"{base}/ping", headers=headers, timeout=10).status_code == 200,
                   timeout=30, what="the sandbox's execd")
        with httpx.Client(timeout=30, headers=headers) as c:
            streams = [c.stream("GET", f"{base}/metrics/watch") for _ in range(MAX_STREAMS)]
            opened = [s.__enter__() for s in streams]
            try:
                assert all(o.status_code == 200 for o in opened)
                body = assert_error_json(httpx.get(f"{base}/ping", headers=headers, timeout=10), 429)
                assert body["code"] == "TOO_MANY_STREAMS"
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        # Closed streams give their slots back.
        wait_until(lambda: httpx.get(f"{base}/ping", headers=headers, timeout=10).status_code == 200,
                   timeout=30, what="a stream slot to be free again")
    finally:
        http.delete(f"/v1/sandboxes/{sid}")


@pytest.fixture(scope="module")
def small_srv(tmp_path_factory):
    s = _start_server(tmp_path_factory, "pvisor-conncap", ["busybox.tar"], {},
                      ["--backend", "ns", "--max-connections", str(MAX_CONNECTIONS),
                       "--header-timeout-secs", "60"])
    yield s
    s.stop()


def test_connections_over_the_cap_get_a_json_503(small_srv):
    # Held open (a 60 s header timeout): the cap, not the timeout, decides.
    held = open_half(small_srv.port, MAX_CONNECTIONS, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    try:
        over = socket.create_connection(("127.0.0.1", small_srv.port))
        over.settimeout(10)
        answer = b""
        while chunk := over.recv(4096):
            answer += chunk
        over.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b'"code":"TOO_MANY_CONNECTIONS"' in body, answer[:300]
    finally:
        for s in held:
            s.close()
    wait_until(lambda: httpx.get(f"{small_srv.url}/health", timeout=5).status_code == 200,
               timeout=30, what="/health once the held connections closed")
