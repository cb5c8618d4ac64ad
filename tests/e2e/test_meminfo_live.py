"""A live `/proc/meminfo` in ns sandboxes (issue 12): MemTotal is the
sandbox's memory limit, and MemFree/MemAvailable/AnonPages follow what its
cgroup charges now, so procps' `free` inside shows memory the sandbox
allocates (and frees). The file keeps one length (the worker rewrites it in
place).

procps' `free` reads everything from /proc/meminfo; busybox's takes total and
free from sysinfo(2), which reports the host's RAM (a syscall, no file to
replace), so the test uses the host's procps `free` (Debian 12, as the image)
in debian:bookworm-slim, whose base has the libraries it links.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from e2e_util import DEBIAN, run, sh, wait_until
from test_memory_merge import build_hold, start_hold

RES = {"cpu": "1", "memory": "512Mi"}
FREE = Path("/usr/bin/free")
LIBPROC = Path("/lib/x86_64-linux-gnu/libproc2.so.0")


def meminfo(sb) -> dict[str, int]:
    text = sh(sb, "cat /proc/meminfo")
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+):\s+(\d+) kB$", text, re.M)}


def free_used_mib(sb) -> int:
    # "Mem: total used free shared buff/cache available"
    line = sh(sb, "LD_LIBRARY_PATH=/tmp/procps /tmp/procps/free -m | sed -n 2p").split()
    assert line[0] == "Mem:" and int(line[1]) == 512, line
    return int(line[2])


@pytest.mark.skipif(os.environ.get("PVISOR_E2E_BACKEND", "ns") != "ns",
                    reason="the worker's /proc/meminfo is the ns backend's (a vm guest has its own kernel's)")
@pytest.mark.skipif(not (FREE.is_file() and LIBPROC.is_file()), reason="the host has no procps 4 free (libproc2)")
def test_free_shows_100_mib_allocated_inside_and_freed_again(sandbox, tmp_path):
    sb = sandbox(DEBIAN, resource=RES)
    sb.files.write_file("/tmp/procps/free", FREE.read_bytes(), mode=755)
    sb.files.write_file("/tmp/procps/libproc2.so.0", LIBPROC.read_bytes(), mode=644)
    size = len(sh(sb, "cat /proc/meminfo"))
    first = meminfo(sb)
    assert first["MemTotal"] == 512 * 1024, first
    used0 = free_used_mib(sb)
    assert 0 <= used0 < 100, used0
    start_hold(sb, build_hold(tmp_path), 100, "meminfo")
    wait_until(lambda: sh(sb, "cat /tmp/hold.ready 2>/dev/null || true").startswith("identical"), 60, 0.5,
               "100 MiB held")
    used = wait_until(lambda: (u := free_used_mib(sb)) >= used0 + 95 and u, 30, 0.5, "free to show the 100 MiB")
    # MemFree/MemAvailable follow memory.current (exact); AnonPages follows memory.stat, which the
    # kernel refreshes at most every 2 s (rate-limited rstat flushing), so it may trail a moment.
    now = wait_until(lambda: (m := meminfo(sb))["AnonPages"] >= 100 * 1024 and m, 10, 0.5,
                     "AnonPages to show the 100 MiB")
    assert now["MemTotal"] == first["MemTotal"], now
    assert now["MemAvailable"] <= first["MemAvailable"] - 95 * 1024, (first, now)
    assert len(sh(sb, "cat /proc/meminfo")) == size, "the file changed length"
    # Freed: back down.
    run(sb, "kill $(cat /tmp/hold.pid)")
    wait_until(lambda: free_used_mib(sb) < used - 90, 30, 0.5, "free to show the 100 MiB released")
