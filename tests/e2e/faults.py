"""Shared helpers of the fault-injection tests (issue 12, "Tests that break things").

`full_leaks(srv, fd_baseline)` extends test_durability's `leaks(srv)` (sandbox dirs,
records, workers, cgroups, run-dir files, mounts) to brokers without image server
records (`--stop-sandboxes-on-exit`) and to delegated cgroups, and adds sandbox inits
of no worker and the broker's own fd count. The rest finds the processes a test
kills: a worker's agent (the sandbox's init: its child that is not pvisor-netd) and
the image servers of an image (by their `--image` argument).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from e2e_util import children_of
from test_durability import _ppid, cgroup_prefix, ids_listed, leaks, memory_base, memory_group_of, ours, record

KINDS = ["worker", "agent", "imaged"]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def agents_of(worker: int) -> list[int]:
    """The sandbox init of a worker: its child that is not pvisor-netd."""
    return [c for c in children_of(worker) if comm(c) != "pvisor-netd"]


def broker_fds(srv) -> int:
    return len(os.listdir(f"/proc/{srv.proc.pid}/fd"))


def image_of(pid: int) -> str | None:
    """The image an image server serves (its `--image` argument)."""
    return arg_of(pid, "--image")


def image_ids(srv, name: str) -> set[str]:
    """The pool ids of the images called `name` (as `pvisor image ls --json` lists them)."""
    r = subprocess.run([str(srv.binary), "image", "ls", "--json", "--data-dir", str(srv.data_dir)],
                       capture_output=True, text=True, check=True)
    return {i["id"] for i in json.loads(r.stdout) if name in i["names"]}


def image_servers(srv, ids: set[str]) -> list[int]:
    """The pids of the live image servers of those images (a durable broker also records
    them in `<run>/imaged-*.json`; one with --stop-sandboxes-on-exit does not)."""
    return [p for p in ours(srv, "pvisor-imaged") if image_of(p) in ids]


def arg_of(pid: int, flag: str) -> str | None:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for i, a in enumerate(args[:-1]):
        if a == flag.encode():
            return args[i + 1].decode()
    return None


def full_leaks(srv, fd_baseline: int | None = None) -> list[str]:
    """test_durability's `leaks` for a broker with or without image server records
    (`--stop-sandboxes-on-exit` writes none: the live servers' own logs and mounts are
    what is expected), plus sandbox inits of no worker and the broker's fd count."""
    servers = ours(srv, "pvisor-imaged")
    logs = set()
    for pid in servers:
        try:
            logs.add(Path(os.readlink(f"/proc/{pid}/fd/2")).name)
        except OSError:
            pass
    mounts = {arg_of(pid, "--mountpoint") for pid in servers}
    out = []
    for problem in leaks(srv):
        if problem.startswith("run dir files of nothing live: "):
            rest = eval(problem.split(": ", 1)[1]) - logs  # noqa: S307 - our own set repr
            if rest:
                out.append(f"run dir files of nothing live: {rest}")
        elif problem.startswith("mounts of no image server: "):
            rest = eval(problem.split(": ", 1)[1]) - mounts  # noqa: S307
            if rest:
                out.append(f"mounts of no image server: {rest}")
        else:
            out.append(problem)
    workers = ours(srv, "pvisor-worker")
    # An unprivileged broker's groups sit one level down, beneath its delegated group.
    base = memory_base()
    if base is not None:
        nested = {d.name for d in base.glob(f"*/{cgroup_prefix(srv.data_dir)}*")}
        used = {memory_group_of(p) for p in workers | servers}
        if nested - used:
            out.append(f"delegated cgroups without a process: {nested - used}")
    # A sandbox init (its output goes to the run dir too) whose worker is gone. The
    # init's own agent children (its isolated sessions' isolator) belong to its worker.
    agents = ours(srv, "pvisor-agent")

    def worker_of(pid: int) -> int:
        while pid in agents:
            pid = _ppid(pid)
        return pid

    orphans = {a for a in agents if worker_of(a) not in workers}
    if orphans:
        out.append(f"sandbox inits of no worker: {orphans}")
    if fd_baseline is not None:
        n = broker_fds(srv)
        if n > fd_baseline:
            out.append(f"broker fds {n} > baseline {fd_baseline}: {fd_targets(srv)}")
    return out


def fd_targets(srv) -> dict[str, int]:
    """What the broker's fds point at, counted by kind (for the message of a leak)."""
    kinds: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{srv.proc.pid}/fd"):
        try:
            t = os.readlink(f"/proc/{srv.proc.pid}/fd/{fd}")
        except OSError:
            continue
        k = t.split(":", 1)[0] if ":" in t and not t.startswith("/") else t
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


def settle(check, timeout: float = 15.0):
    """Polls `check()` (a list of problems) until empty or the timeout; the last list."""
    deadline = time.monotonic() + timeout
    while (problems := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return problems
