"""Soak: create -> command -> file -> delete cycles from several clients at once; the
broker's fds, RSS, threads, cgroups and mounts come back to their baseline (issue 12).

PVISOR_SOAK_CYCLES cycles (default 200 in CI, about 45 s here; the benchmark runs 1,000:
`PVISOR_SOAK_CYCLES=1000 pytest -s tests/e2e/test_soak.py`) over PVISOR_SOAK_CLIENTS
(default 4) threads. The figures are printed (`-s` shows them). Slack: fds +16,
threads +8, RSS +64 MiB (allocator caches); cgroups and mounts exactly back.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox.sync import SandboxSync

from conftest import _make_conn, _start_server
from e2e_util import BUSYBOX, SMALL, sh

CYCLES = int(os.environ.get("PVISOR_SOAK_CYCLES", "200"))
CLIENTS = int(os.environ.get("PVISOR_SOAK_CLIENTS", "4"))
SLACK = {"fds": 16, "threads": 8, "rss_kib": 64 * 1024, "cgroups": 0, "mounts": 0}


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "soak", ["busybox.tar"], {}, ["--backend", "ns"])
    yield srv
    srv.stop()


def cgroup_prefix(data_dir: Path) -> str:
    """The broker's own cgroup name prefix (server.rs: FNV-1a of the data dir's
    canonical path), so other brokers' groups on the host do not count."""
    h = 0xCBF29CE484222325
    for b in os.fsencode(os.path.realpath(data_dir)):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"pvisor-{h & 0xFFFFFFFF:08x}-"


def figures(srv) -> dict[str, int]:
    pid = srv.proc.pid
    status = Path(f"/proc/{pid}/status").read_text()
    field = lambda name: int(next(l.split()[1] for l in status.splitlines() if l.startswith(name + ":")))
    data = str(srv.data_dir)
    mounts = sum(1 for l in Path("/proc/self/mountinfo").read_text().splitlines() if data in l)
    prefix = cgroup_prefix(srv.data_dir)
    cgroups = 0
    for base in Path("/sys/fs/cgroup").iterdir():
        for dirpath, dirnames, _ in os.walk(base):
            cgroups += sum(1 for d in dirnames if d.startswith(prefix))
            if dirpath.count("/") > 8:
                dirnames.clear()
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": field("Threads"),
        "rss_kib": field("VmRSS"),
        "cgroups": cgroups,
        "mounts": mounts,
    }


def cycle(conn, i: int) -> None:
    sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL), timeout=timedelta(minutes=5))
    try:
        assert sh(sb, f"echo cycle-{i}") == f"cycle-{i}"
        sb.files.write_file("/root/soak.txt", f"payload {i}")
        assert sb.files.read_file("/root/soak.txt") == f"payload {i}"
    finally:
        sb.kill()
        sb.close()


def settle(srv, base: dict[str, int], timeout: float = 60) -> dict[str, int]:
    """Figures once within slack of the baseline (or the last seen at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        now = figures(srv)
        if all(now[k] <= base[k] + SLACK[k] for k in base) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


@pytest.mark.deadline(3600)
def test_soak_returns_to_baseline(soak_server):
    conn = _make_conn(soak_server.addr)
    # Warm-up: the image server, thread pools and caches the first creates start.
    with ThreadPoolExecutor(CLIENTS) as ex:
        list(ex.map(lambda i: cycle(conn, i), range(2 * CLIENTS)))
    time.sleep(2)  # the last teardowns finish
    base = figures(soak_server)
    t0 = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as ex:
        list(ex.map(lambda i: cycle(conn, i), range(CYCLES)))
    elapsed = time.monotonic() - t0
    after = settle(soak_server, base)
    print(f"\nsoak: {CYCLES} cycles, {CLIENTS} clients, {elapsed:.1f}s ({CYCLES / elapsed:.1f} cycles/s)")
    for k in base:
        print(f"  {k:8} baseline {base[k]:>8}  after {after[k]:>8}  (slack {SLACK[k]})")
    over = {k: (base[k], after[k]) for k in base if after[k] > base[k] + SLACK[k]}
    assert not over, f"not back to baseline (baseline, after): {over}"
