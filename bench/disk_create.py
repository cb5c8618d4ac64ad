"""Create latency with and without the per-sandbox disk bound.

Starts `pvisor serve` twice on fresh data dirs (`--disk-limit 10Gi`, then
`--disk-limit 0`), creates and deletes N busybox sandboxes one at a time
through the raw API (the create answers once the agent is ready) and prints
P50/P90 per configuration. Root only (the disk bound needs it).

    PVISOR_BIN=target/dist/pvisor PVISOR_TEST_IMAGES=/var/cache/pvisor/test-images \
        python3 bench/disk_create.py [N]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from lib.common import free_port, wait_http

BIN = os.environ["PVISOR_BIN"]
IMAGES = os.environ["PVISOR_TEST_IMAGES"]
N = int(sys.argv[1]) if len(sys.argv) > 1 else 30
BODY = {"image": {"uri": "busybox:latest"}, "timeout": 300, "resourceLimits": {"cpu": "1", "memory": "512Mi"},
        "entrypoint": ["tail", "-f", "/dev/null"]}


def run(disk_limit: str) -> list[float]:
    data = tempfile.mkdtemp(prefix="pvisor-bench-disk-", dir="/tmp")
    os.chmod(data, 0o755)
    subprocess.run([BIN, "image", "import", f"{IMAGES}/busybox.tar", "--data-dir", data], check=True,
                   capture_output=True)
    p = free_port()
    log = open(f"{data}.log", "wb")
    srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{p}", "--data-dir", data, "--backend", "ns",
                            "--disk-limit", disk_limit], stdout=log, stderr=subprocess.STDOUT)
    times = []
    try:
        wait_http(f"http://127.0.0.1:{p}/health", "pvisor serve", Path(f"{data}.log"), proc=srv)
        c = httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=60)
        for i in range(N + 3):
            time.sleep(0.5)  # let the warm pool refill
            t = time.perf_counter()
            r = c.post("/v1/sandboxes", json=BODY)
            dt = time.perf_counter() - t
            r.raise_for_status()
            if i >= 3:  # the first creates start the image server
                times.append(dt * 1000)
            c.delete(f"/v1/sandboxes/{r.json()['id']}")
    finally:
        srv.terminate()
        srv.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
    return times


for limit in ("10Gi", "0"):
    t = sorted(run(limit))
    print(f"--disk-limit {limit:>5}: create P50 {statistics.median(t):.1f} ms, "
          f"P90 {t[int(len(t) * 0.9) - 1]:.1f} ms (n={len(t)})")
