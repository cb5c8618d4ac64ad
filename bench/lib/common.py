"""Shared pieces: paths, environment record, SDK connection, the checked first command."""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfig, ConnectionConfigSync

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
IMAGES = Path(os.environ.get("PVISOR_TEST_IMAGES", "/var/cache/pvisor/test-images"))
PVISOR = Path(os.environ.get("PVISOR_BIN", REPO / "target/dist/pvisor"))
CACHE = Path(os.environ.get("PVISOR_BENCH_CACHE", "/var/cache/pvisor/bench"))

# The four test images (docker-archive tarballs), by reference.
IMAGE_FILES = {
    "busybox:latest": "busybox.tar",
    "debian:bookworm-slim": "debian-bookworm-slim.tar",
    "python:3.11-slim": "python-3.11-slim.tar",
    "pvisor/python-tools:latest": "python-3.11-tools.tar",
}

# Same resource request on both sides.
RESOURCE = {"cpu": "1", "memory": "512Mi"}

SDK_METRICS = False  # set by the CLI (--sdk-metrics)


class _RetryLog(logging.Handler):
    """Records the SDK transport's own retries ("retrying GET ...: attempt=2 ..."),
    so every sample can report them: they happen inside the SDK (e.g. while it
    polls /ping for readiness), not in the harness, which never retries."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.events: list[str] = []

    def emit(self, record):
        self.events.append(record.getMessage())


SDK_RETRIES = _RetryLog()
logging.getLogger("opensandbox.transport").addHandler(SDK_RETRIES)
logging.getLogger("opensandbox.transport").propagate = False


def retries_since(mark: int) -> list[str]:
    return SDK_RETRIES.events[mark:]


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return ""
    return h.hexdigest()


def run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    return subprocess.run([str(c) for c in cmd], **kw)


def out(cmd, **kw) -> str:
    try:
        return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, **kw).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def connection(domain: str, request_timeout_s: float | None = None) -> ConnectionConfigSync:
    """One SDK connection config per service start, built before any timed region.

    It carries its own transport (the SDK's reuse mechanism): without one, every
    `SandboxSync.create` builds a TLS context (~33 ms of client CPU here). The
    transport is passed explicitly, so the SDK never closes it (not even after a
    failed create); the harness drops it with the service. SDK telemetry (a
    fire-and-forget POST /v1/metrics/events on a fresh httpx client per create)
    is off on both sides unless --sdk-metrics: it is client work that would run
    inside the timed window. `request_timeout_s`: the SDK's per-request timeout where its
    default (30 s) is too short (emulated hosts).
    """
    base = ConnectionConfigSync(domain=domain)
    extra = {"request_timeout": timedelta(seconds=request_timeout_s)} if request_timeout_s else {}
    return ConnectionConfigSync(domain=domain, transport=base.new_owned_transport(), disable_metrics=not SDK_METRICS,
                                **extra)


def async_connection(domain: str) -> ConnectionConfig:
    """The async twin of `connection`; build it inside the event loop that uses it."""
    base = ConnectionConfig(domain=domain)
    return ConnectionConfig(domain=domain, transport=base.new_owned_transport(), disable_metrics=not SDK_METRICS)


def checked_command_text(token: str) -> str:
    return f"test ! -e /tmp/private-{token} && echo {token} > /tmp/t-{token} && cat /tmp/t-{token}"


def check_execution(ex, token: str) -> None:
    got = "".join(m.text for m in ex.logs.stdout)
    if ex.exit_code != 0 or got != token:
        raise AssertionError(f"checked command failed: exit={ex.exit_code} out={got!r}")


def checked_first_command(sb: SandboxSync) -> None:
    """The first command: a private file must be absent, an instance-unique
    token must round-trip through a file, exit 0 with exact output."""
    token = uuid.uuid4().hex
    check_execution(sb.commands.run(checked_command_text(token)), token)


async def checked_first_command_async(sb) -> None:
    token = uuid.uuid4().hex
    check_execution(await sb.commands.run(checked_command_text(token)), token)


def verify_deleted(base_url: str, sandbox_id: str) -> None:
    r = httpx.get(f"{base_url}/v1/sandboxes/{sandbox_id}", timeout=30)
    if r.status_code != 404:
        raise AssertionError(f"sandbox {sandbox_id} still answers {r.status_code} after delete")


def wait_http(url: str, what: str, logfile: Path, timeout: float = 60, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            break
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    tail = ""
    try:
        tail = logfile.read_text(errors="replace")[-3000:]
    except OSError:
        pass
    raise RuntimeError(f"{what} did not start; see {logfile}\n{tail}")


def pkg_version(python: Path, pkg: str) -> str:
    return out([python, "-c", f"import importlib.metadata as m; print(m.version('{pkg}'))"])


def environment(extra: dict | None = None) -> dict:
    dist = PVISOR.parent
    mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
    env = {
        "host": platform.node(),
        "kernel": platform.release(),
        "os": next((l.split("=", 1)[1].strip().strip('"') for l in open("/etc/os-release") if l.startswith("PRETTY_NAME")), ""),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), ""),
        "nproc": os.cpu_count(),
        "mem_total_kib": int(mem),
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
        "python": sys.version.split()[0],
        "opensandbox_sdk": pkg_version(Path(sys.executable), "opensandbox"),
        "pvisor_binaries": {b: sha256_file(dist / b) for b in ("pvisor", "pvisor-worker", "pvisor-agent")},
        "pvisor_dir": str(dist),
        "git_head": out(["git", "-C", REPO, "rev-parse", "HEAD"]),
        "git_dirty": bool(out(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"])),
        "test_images": {f: sha256_file(IMAGES / f) for f in IMAGE_FILES.values()},
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sdk_metrics": SDK_METRICS,
    }
    if extra:
        env.update(extra)
    return env


def rm_tree(p: Path) -> None:
    """rm -rf that first unmounts anything still mounted below p."""
    p = Path(p)
    if not p.exists():
        return
    mounts = []
    for line in open("/proc/self/mounts"):
        mp = line.split()[1].encode().decode("unicode_escape")
        if mp == str(p) or mp.startswith(str(p) + "/"):
            mounts.append(mp)
    for mp in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", mp], check=False)
    shutil.rmtree(p, ignore_errors=True)
