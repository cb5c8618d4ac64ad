"""A sandbox's cgroup, on whichever hierarchy the host has (v1 on these hosts; v2 in the
cgroup v2 test guest, tests/cgroupv2): the limits are written to the sandbox's own group,
enforced (memory: the allocator is OOM-killed, the sandbox lives on; pids: forks fail past
the bound; cpu: the group is throttled), reported by the metrics API, the freezer holds a
paused sandbox, and a deleted sandbox's group is gone.

The group is found from the worker's pid (its durable record) and /proc/PID/cgroup: the
worker starts in the group's `sandbox` leaf (the sandbox's init inherits it at clone) and
moves to the `worker` leaf at the first pause.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from opensandbox.models.sandboxes import LifecycleHook, SandboxLifecycle
from opensandbox.sync.sandbox import SandboxSync

from e2e_util import BUSYBOX

MiB = 1 << 20
SETTLE = 30.0


def _mounts() -> dict[str, tuple[Path, str]]:
    """Controller ("" for the unified hierarchy) → (mount point, mount root)."""
    out: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, post = line.split(" - ", 1)
        f, g = pre.split(), post.split()
        if g[0] == "cgroup2":
            out.setdefault("", (Path(f[4]), f[3]))
        elif g[0] == "cgroup":
            for c in g[2].split(","):
                out.setdefault(c, (Path(f[4]), f[3]))
    return out


class Group:
    """The sandbox group of a worker: v2 (one directory) or v1 (one per controller)."""

    def __init__(self, worker_pid: int):
        mounts = _mounts()
        self.dirs: dict[str, Path] = {}
        for line in Path(f"/proc/{worker_pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                if c in mounts:
                    point, root = mounts[c]
                    rel = path[len(root):] if root != "/" and path.startswith(root) else path
                    leaf = point / rel.lstrip("/")
                    # Hierarchies pvisor does not use keep the broker's group.
                    if leaf.name in ("worker", "sandbox") and leaf.parent.name.startswith("pvisor-"):
                        self.dirs[c] = leaf.parent
        # v2 (the unified hierarchy holds the group) or v1 (memory, cpu, pids, freezer do).
        self.v2 = "" in self.dirs
        if self.v2:
            self.dirs = {"": self.dirs[""]}
        assert self.dirs, f"worker {worker_pid} is in no pvisor group: {Path(f'/proc/{worker_pid}/cgroup').read_text()}"

    def file(self, v2_name: str, v1_controller: str, v1_name: str) -> Path:
        return self.dirs[""] / v2_name if self.v2 else self.dirs[v1_controller] / v1_name

    def read(self, v2_name: str, v1_controller: str, v1_name: str) -> str:
        return self.file(v2_name, v1_controller, v1_name).read_text().strip()

    def stat(self, v2_name: str, v1_controller: str, v1_name: str) -> dict[str, int]:
        text = self.read(v2_name, v1_controller, v1_name)
        return {k: int(v) for k, v in (line.split() for line in text.splitlines())}

    def exists(self) -> bool:
        return any(d.exists() for d in self.dirs.values())


def group_of(srv, sid: str) -> Group:
    """The group of sandbox `sid`, from its durable record's worker pid."""
    path = srv.data_dir / "state" / "sandboxes" / f"{sid}.json"
    deadline = time.monotonic() + SETTLE
    while not path.exists():  # records are written off the request path
        assert time.monotonic() < deadline, f"no record {path}"
        time.sleep(0.05)
    return Group(json.loads(path.read_text())["worker"]["proc"]["pid"])


def eventually(what: str, pred) -> None:
    deadline = time.monotonic() + SETTLE
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"not so after {SETTLE:.0f}s: {what}")
        time.sleep(0.05)


def run(sb, cmd: str):
    ex = sb.commands.run(cmd)
    return ex.exit_code, "\n".join(m.text for m in ex.logs.stdout), "\n".join(m.text for m in ex.logs.stderr)


def test_limits_are_written_to_the_sandbox_group(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX, resource={"cpu": "500m", "memory": "96Mi"})
    g = group_of(pvisor_server, sb.id)
    assert int(g.read("memory.max", "memory", "memory.limit_in_bytes")) == 96 * MiB
    if g.v2:
        assert g.read("cpu.max", "", "") == "50000 100000"
        assert g.read("memory.swap.max", "", "") == "0"
        assert "memory" in (g.dirs[""].parent / "cgroup.subtree_control").read_text().split()
    else:
        assert g.read("", "cpu", "cpu.cfs_quota_us") == "50000"
    assert int(g.read("pids.max", "pids", "pids.max")) > 0
    # Both leaves, and the sandbox's processes in the sandbox leaf.
    procs = g.file("sandbox/cgroup.procs", "memory", "sandbox/cgroup.procs").read_text().split()
    assert procs, "the sandbox's init is in the sandbox leaf"


def test_memory_limit_is_enforced_and_the_sandbox_lives_on(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX, resource={"cpu": "1", "memory": "64Mi"})
    g = group_of(pvisor_server, sb.id)
    # awk doubles a string until the memory cgroup's OOM killer ends it.
    code, _, _ = run(sb, "awk 'BEGIN { s = \"x\"; while (1) s = s s }'")
    assert code == 137, "the allocator is SIGKILLed by the OOM killer"
    if g.v2:  # (v1's memory.oom_control has no oom_kill count on these kernels)
        assert g.stat("memory.events", "", "")["oom_kill"] >= 1
    assert run(sb, "echo alive") == (0, "alive", ""), "the sandbox survives its allocator's OOM kill"
    assert int(g.read("memory.peak", "memory", "memory.max_usage_in_bytes")) <= 64 * MiB
    # Reported: the metrics API gives the limit as the sandbox's memory.
    m = sb.get_metrics()
    assert abs(m.memory_total_in_mib - 64) < 1, m


def test_pids_limit_is_enforced(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX, resource={"cpu": "1", "memory": "128Mi", "pids": "32"})
    g = group_of(pvisor_server, sb.id)
    assert int(g.read("pids.max", "pids", "pids.max")) == 32
    idle = int(g.read("pids.current", "pids", "pids.current"))  # the worker's threads count too
    # The shell gives up at its first refused fork; the sleepers it started end by themselves.
    run(sb, "for i in $(seq 64); do sleep 3 & done 2>/dev/null; wait")
    # Counted where the fork failed (the sandbox leaf) or where the limit sits, by kernel version.
    # (v2 has it on the group only: the leaves have no pids controller of their own.)
    refused = sum(g.stat(f"{d}pids.events", "pids", f"{d}pids.events")["max"] for d in ("", "sandbox/")
                  if g.file(f"{d}pids.events", "pids", f"{d}pids.events").exists())
    assert refused >= 1, "forks past the bound were refused"
    eventually("the sleepers are gone", lambda: int(g.read("pids.current", "pids", "pids.current")) <= idle)
    assert run(sb, "echo alive")[1] == "alive"


def test_cpu_limit_throttles_the_group(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX, resource={"cpu": "100m", "memory": "64Mi"})
    g = group_of(pvisor_server, sb.id)
    run(sb, "timeout 2 sh -c 'while :; do :; done'; true")
    assert g.stat("cpu.stat", "cpu", "cpu.stat")["nr_throttled"] > 0


def test_a_small_cpu_quota_does_not_stretch_the_start(sandbox, pvisor_server):
    # The start (worker, agent, and here a preStart hook with ~0.1 s of CPU work on a native
    # host) runs before the quota is written: under 100m it would be throttled in every period.
    busy = "i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done"
    sb = sandbox(BUSYBOX, resource={"cpu": "100m", "memory": "64Mi"},
                 lifecycle=SandboxLifecycle(pre_start=LifecycleHook(command=["/bin/sh", "-c", busy])))
    g = group_of(pvisor_server, sb.id)
    # The quota holds from the create's answer on (one period's throttling allowed: the worker's
    # own work right after Ready, on a slow emulated host).
    assert g.stat("cpu.stat", "cpu", "cpu.stat")["nr_throttled"] <= 1
    if g.v2:
        assert g.read("cpu.max", "", "") == "10000 100000"
    else:
        assert g.read("", "cpu", "cpu.cfs_quota_us") == "10000"


def test_pause_freezes_the_sandbox_leaf_and_resume_thaws_it(sandbox, conn, pvisor_server):
    sb = sandbox(BUSYBOX)
    g = group_of(pvisor_server, sb.id)
    sb.pause()
    if g.v2:
        eventually("the sandbox leaf is frozen",
                   lambda: "frozen 1" in g.read("sandbox/cgroup.events", "", "").splitlines())
        assert g.read("sandbox/cgroup.freeze", "", "") == "1"
        assert "frozen 0" in g.read("worker/cgroup.events", "", "").splitlines(), "the worker is not frozen"
    else:
        eventually("the sandbox leaf is frozen", lambda: g.read("", "freezer", "sandbox/freezer.state") == "FROZEN")
        assert g.read("", "freezer", "worker/freezer.state") == "THAWED"
    resumed = sandbox.track(SandboxSync.resume(sb.id, connection_config=conn))
    if g.v2:
        assert g.read("sandbox/cgroup.freeze", "", "") == "0"
    else:
        assert g.read("", "freezer", "sandbox/freezer.state") == "THAWED"
    assert run(resumed, "echo thawed")[1] == "thawed"


def test_a_deleted_sandbox_leaves_no_group(sandbox, pvisor_server):
    sb = sandbox(BUSYBOX)
    g = group_of(pvisor_server, sb.id)
    assert g.exists()
    sb.kill()
    eventually(f"the group of a deleted sandbox is gone: {g.dirs}", lambda: not g.exists())
