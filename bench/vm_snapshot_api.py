"""vm snapshots through the API and vm templates under the QEMU TCG test
engine: what a snapshot stops the guest for, how big its state is, and the
create latency of a restore and of a template clone beside a fresh boot's, in
the same run.

Starts `pvisor serve --backend vm` (PVISOR_VM_ENGINE=qemu-tcg, PVISOR_QEMU: the
patched QEMU of scripts/common.sh), creates one busybox source (1 vCPU,
512 MiB), snapshots it N times (the broker's log gives the stopped time and
the state's size), then creates N sandboxes by booting and N by restoring,
one at a time (a create answers once the agent is ready and, for a restore,
refreshed), each deleted after; then a second server with `--vm-templates`:
one create captures the template, N more are its clones. TCG emulates the guest's CPU: these are
test-engine timings, not performance figures of the product engine.

    PVISOR_BIN=target/dist/pvisor PVISOR_TEST_IMAGES=/var/cache/pvisor/test-images \\
    PVISOR_GUEST_KERNEL=... PVISOR_QEMU=... python3 bench/vm_snapshot_api.py [N]
"""
import json
import os
import re
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
N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SHAPE = {"cpu": "1", "memory": "512Mi"}
BOOT = {"image": {"uri": "busybox:latest"}, "timeout": 600, "resourceLimits": SHAPE,
        "entrypoint": ["tail", "-f", "/dev/null"]}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def timed_create(c: httpx.Client, body: dict) -> float:
    t = time.perf_counter()
    r = c.post("/v1/sandboxes", json=body)
    dt = time.perf_counter() - t
    r.raise_for_status()
    c.delete(f"/v1/sandboxes/{r.json()['id']}").raise_for_status()
    return dt * 1000


def serve(extra: list[str]) -> tuple[subprocess.Popen, httpx.Client, str]:
    data = tempfile.mkdtemp(prefix="pvisor-bench-vmsnap-", dir="/tmp")
    os.chmod(data, 0o755)
    subprocess.run([BIN, "image", "import", f"{IMAGES}/busybox.tar", "--data-dir", data], check=True,
                   capture_output=True)
    p = free_port()
    log_path = f"{data}.log"
    env = {**os.environ, "PVISOR_VM_ENGINE": "qemu-tcg"}
    srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{p}", "--data-dir", data, "--backend", "vm",
                            "--warm-workers", "1", "--stop-sandboxes-on-exit", *extra], stdout=open(log_path, "wb"),
                           stderr=subprocess.STDOUT,
                           env=env)
    wait_http(f"http://127.0.0.1:{p}/health", "pvisor serve", Path(log_path), proc=srv)
    return srv, httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=300), log_path


def main() -> None:
    srv, c, log_path = serve([])
    try:
        src = c.post("/v1/sandboxes", json=BOOT)
        src.raise_for_status()
        sid_src = src.json()["id"]
        snaps = []
        for _ in range(N):
            s = c.post(f"/v1/sandboxes/{sid_src}/snapshots", json={}).json()["id"]
            while (st := c.get(f"/v1/snapshots/{s}").json()["status"]["state"]) == "Creating":
                time.sleep(0.1)
            assert st == "Ready", st
            snaps.append(s)
        boots = [timed_create(c, BOOT) for _ in range(N)]
        restores = [timed_create(c, {"snapshotId": snaps[-1], "timeout": 600, "resourceLimits": SHAPE})
                    for _ in range(N)]
        c.delete(f"/v1/sandboxes/{sid_src}").raise_for_status()
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    srv2, c2, log2 = serve(["--vm-templates"])
    try:
        capture = timed_create(c2, BOOT)
        clones = [timed_create(c2, BOOT) for _ in range(N)]
    finally:
        srv2.terminate()
        srv2.wait(timeout=30)
    made = "vm template made" in re.sub(r"\x1b\[[0-9;]*m", "", open(log2).read())
    text = re.sub(r"\x1b\[[0-9;]*m", "", open(log_path).read())
    stopped = [float(m) for m in re.findall(r"vm machine saved .*?stopped_ms=(\d+)", text)]
    state = [int(m) for m in re.findall(r"vm machine saved .*?state_bytes=(\d+)", text)]
    out = {
        "n": N,
        "shape": SHAPE,
        "snapshot_stopped_ms_p50": statistics.median(stopped),
        "snapshot_state_mib_p50": statistics.median(state) / 2**20,
        "boot_create_ms_p50": statistics.median(boots),
        "boot_create_ms_p90": pct(boots, 0.9),
        "restore_create_ms_p50": statistics.median(restores),
        "restore_create_ms_p90": pct(restores, 0.9),
        "restore_vs_boot_p50": statistics.median(restores) / statistics.median(boots),
        "template_made": made,
        "template_capture_create_ms": capture,
        "template_clone_create_ms_p50": statistics.median(clones),
        "template_clone_create_ms_p90": pct(clones, 0.9),
        "template_clone_vs_boot_p50": statistics.median(clones) / statistics.median(boots),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
