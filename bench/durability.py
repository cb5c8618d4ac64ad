#!/usr/bin/env python3
"""Durability figures (issue 12, "Numbers"):

* restart: a broker with N live sandboxes (default 100) is killed with SIGKILL
  and started again on the same data dir; reported: time from exec to the
  first healthy `/health` (every sandbox is re-adopted before the listener
  opens), the adoption time the broker logs, and that all N are Running;
* create P50 with the sandbox records on disk vs without
  (`PVISOR_BENCH_NO_STATE=1`, a benchmark-only switch: records are not
  written), alternating the two servers in rounds so host noise hits both.

Usage: bench/durability.py [--sandboxes 100] [--creates 40] [--pvisor target/dist/pvisor]
Needs root (cgroups) and the test images (/var/cache/pvisor/test-images).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import urllib.request

REPO = Path(__file__).resolve().parents[1]
IMAGES = Path(os.environ.get("PVISOR_TEST_IMAGES", "/var/cache/pvisor/test-images"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(method: str, url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict | None]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, None


class Server:
    def __init__(self, pvisor: Path, data: Path, env: dict[str, str] | None = None, warm: int = 2):
        self.pvisor, self.data, self.env, self.warm = pvisor, data, env or {}, warm
        self.proc = None
        self.log = data.parent / f"{data.name}.log"

    def start(self) -> float:
        """Starts the server; returns seconds from exec to healthy."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(self.log, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(self.pvisor), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data),
             "--warm-workers", str(self.warm)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True)
        while True:
            try:
                if call("GET", f"{self.url}/health", timeout=2)[0] == 200:
                    return time.monotonic() - t0
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.005)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)

    def create(self) -> str:
        code, body = call("POST", f"{self.url}/v1/sandboxes", {
            "image": {"uri": "busybox:latest"}, "timeout": 3600, "resourceLimits": {"cpu": "1", "memory": "64Mi"},
            "entrypoint": ["tail", "-f", "/dev/null"]})
        assert code == 202, code
        return body["id"]

    def delete(self, sid: str) -> None:
        call("DELETE", f"{self.url}/v1/sandboxes/{sid}")


def new_data(root: Path, name: str, pvisor: Path) -> Path:
    d = root / name
    d.mkdir()
    subprocess.run([str(pvisor), "image", "import", str(IMAGES / "busybox.tar"), "--data-dir", str(d)],
                   check=True, stdout=subprocess.DEVNULL)
    return d


def restart(pvisor: Path, root: Path, n: int) -> dict:
    srv = Server(pvisor, new_data(root, "restart", pvisor))
    srv.start()
    # The same restart with nothing to adopt: what any start costs.
    srv.kill9()
    baseline = srv.start()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        ids = list(ex.map(lambda _: srv.create(), range(n)))
    srv.kill9()
    t = srv.start()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", srv.log.read_text())
    took = re.findall(r"re-adopted.*took=([0-9.]+)(µs|ms|s)", plain)
    code, body = call("GET", f"{srv.url}/v1/sandboxes?pageSize=200")
    running = sum(1 for i in body["items"] if i["status"]["state"] == "Running")
    for sid in ids:
        srv.delete(sid)
    srv.stop()
    scale = {"µs": 1e-3, "ms": 1.0, "s": 1e3}
    adopt_ms = float(took[-1][0]) * scale[took[-1][1]] if took else None
    return {"sandboxes": n, "running_after": running, "exec_to_healthy_ms": round(t * 1e3, 1),
            "exec_to_healthy_with_nothing_to_adopt_ms": round(baseline * 1e3, 1), "adoption_ms": adopt_ms}


def creates(pvisor: Path, root: Path, rounds: int) -> dict:
    with_state = Server(pvisor, new_data(root, "with-state", pvisor))
    without = Server(pvisor, new_data(root, "without-state", pvisor), env={"PVISOR_BENCH_NO_STATE": "1"})
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for s in (with_state, without):
        s.start()
        s.delete(s.create())  # warm-up
    for i in range(rounds):
        for name, s in (("with", with_state), ("without", without))[:: 1 if i % 2 == 0 else -1]:
            time.sleep(0.4)  # let the warm pool refill
            t0 = time.monotonic()
            sid = s.create()
            samples[name].append((time.monotonic() - t0) * 1e3)
            s.delete(sid)
    for s in (with_state, without):
        s.stop()
    p50 = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    return {"rounds": rounds, "p50_ms": p50, "delta_ms": round(p50["with"] - p50["without"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--creates", type=int, default=40)
    ap.add_argument("--pvisor", type=Path, default=REPO / "target/dist/pvisor")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="pvisor-bench-durable-", dir="/tmp"))
    root.chmod(0o755)
    try:
        out = {"restart": restart(a.pvisor, root, a.sandboxes), "create": creates(a.pvisor, root, a.creates)}
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
