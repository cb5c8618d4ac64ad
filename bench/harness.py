"""pvisor benchmark harness.

Experiments are subcommands. Today: `startup` (SDK create and create → first
checked command), against pvisor. The OpenSandbox-on-Docker peer is added by
the benchmark-harness issue; `--pvisor-only` is the CI smoke mode.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException

REPO = Path(__file__).resolve().parent.parent
IMAGES = Path(os.environ.get("PVISOR_TEST_IMAGES", "/var/cache/pvisor/test-images"))
PVISOR = Path(os.environ.get("PVISOR_BIN", REPO / "target/dist/pvisor"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PvisorService:
    """A `pvisor serve` on a private data dir, with the test images imported."""

    name = "pvisor"

    def __init__(self, workdir: Path, image_file: str):
        self.data = workdir / "pvisor-data"
        self.log = workdir / "pvisor.log"
        subprocess.run([PVISOR, "image", "import", IMAGES / image_file, "--data-dir", self.data],
                       check=True, stdout=subprocess.DEVNULL)
        self.proc = None
        self.port = free_port()

    def start(self) -> None:
        # One transport per service start, shared by every SDK call (the SDK's
        # own reuse mechanism; without it each create builds a TLS context,
        # ~33 ms of client CPU here). Built before any timed region.
        self.conn = ConnectionConfigSync(domain=f"127.0.0.1:{self.port}").with_transport_if_missing()
        self.proc = subprocess.Popen([PVISOR, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.02)
        raise RuntimeError(f"pvisor did not start; see {self.log}")

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def connection(self) -> ConnectionConfigSync:
        return self.conn


def checked_first_command(sb: SandboxSync) -> None:
    """The first command: a private file must be absent, a unique token must
    round-trip through a file, exit 0 with exact output."""
    token = uuid.uuid4().hex
    ex = sb.commands.run(f"test ! -e /tmp/private-{token} && echo {token} > /tmp/t && cat /tmp/t")
    out = "".join(m.text for m in ex.logs.stdout)
    if ex.exit_code != 0 or out != token:
        raise AssertionError(f"checked command failed: exit={ex.exit_code} out={out!r}")


def verify_deleted(svc, sandbox_id: str) -> None:
    r = httpx.get(f"http://127.0.0.1:{svc.port}/v1/sandboxes/{sandbox_id}", timeout=10)
    if r.status_code != 404:
        raise AssertionError(f"sandbox {sandbox_id} still answers {r.status_code} after delete")


def one_sample(svc, image: str) -> dict:
    t0 = time.perf_counter()
    sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=5),
                            resource={"cpu": "1", "memory": "512Mi"})
    t1 = time.perf_counter()
    checked_first_command(sb)
    t2 = time.perf_counter()
    sb.kill()
    verify_deleted(svc, sb.id)
    return {"create_ms": (t1 - t0) * 1e3, "first_command_ms": (t2 - t0) * 1e3, "additional_wait_ms": (t2 - t1) * 1e3}


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def sha256_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else ""


def environment() -> dict:
    dist = PVISOR.parent
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "binaries": {b: sha256_file(dist / b) for b in ("pvisor", "pvisor-worker", "pvisor-agent")},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def startup(args) -> int:
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="pvisor-bench-"))
    svc = PvisorService(work, args.image_file)
    results = {"experiment": "startup", "seed": args.seed, "image": args.image, "env": environment(),
               "note": ("pvisor only; " if args.pvisor_only else "") + "SDK ConnectionConfigSync with one shared transport per service start", "scenarios": {}}
    try:
        for scenario in ("first_after_restart", "steady"):
            samples = []
            svc.start()
            if scenario == "steady":
                for _ in range(args.warmup):
                    one_sample(svc, args.image)
            for i in range(args.pairs):
                if scenario == "first_after_restart" and i > 0:
                    svc.stop()
                    svc.start()
                time.sleep(rng.uniform(0, 0.05))
                s = one_sample(svc, args.image)
                s["index"] = i
                samples.append(s)
            svc.stop()
            summary = {k: p50([s[k] for s in samples]) for k in ("create_ms", "first_command_ms", "additional_wait_ms")}
            results["scenarios"][scenario] = {"samples": samples, "p50": summary}
    finally:
        svc.stop()
    (out / "startup.json").write_text(json.dumps(results, indent=2))
    lines = ["| scenario | side | create P50 (ms) | create → first command P50 (ms) | additional wait P50 (ms) | n |",
             "|---|---|---:|---:|---:|---:|"]
    for name, sc in results["scenarios"].items():
        p = sc["p50"]
        lines.append(f"| {name} | pvisor | {p['create_ms']:.1f} | {p['first_command_ms']:.1f} | {p['additional_wait_ms']:.1f} | {len(sc['samples'])} |")
    (out / "startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/run")
    sub = ap.add_subparsers(dest="experiment", required=True)
    s = sub.add_parser("startup", help="SDK create and create → first checked command")
    s.add_argument("--pairs", type=int, default=20)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--seed", type=int, default=20261130)
    s.add_argument("--image", default="python:3.11-slim")
    s.add_argument("--image-file", default="python-3.11-slim.tar")
    s.add_argument("--pvisor-only", action="store_true", help="smoke mode: no peer")
    s.add_argument("--out", default=str(REPO / "bench/out"))
    args = ap.parse_args()
    return {"startup": startup}[args.experiment](args)


if __name__ == "__main__":
    sys.exit(main())
