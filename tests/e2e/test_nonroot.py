"""The broker runs unprivileged: a non-root user given a data directory and a
delegated cgroup serves sandboxes end to end through the official SDK, with
the limits applied beneath the delegated group.

Needs root to set the scene (a user, delegated cgroups); skipped otherwise.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from opensandbox.sync.sandbox import SandboxSync

from conftest import SUITE_BACKEND, _make_conn, free_port, images_dir, pvisor_bin
from e2e_util import wait_healthy
from user_files import binary_for_others, for_others

USER = "pvisor-e2e"
V1_CONTROLLERS = ["cpu", "cpuacct", "pids", "freezer"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setting up a user and delegated cgroups needs root")


def own_cgroup_dirs() -> dict[str, Path]:
    """Per hierarchy, the directory of this process's own cgroup."""
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, post = line.split(" - ", 1)
        f, g = pre.split(), post.split()
        if g[0] == "cgroup":
            for c in g[2].split(","):
                mounts[c] = (Path(f[4]), f[3])
        elif g[0] == "cgroup2":
            mounts.setdefault("", (Path(f[4]), f[3]))
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else [""]):
            if c in mounts:
                point, root = mounts[c]
                rel = path[len(root):] if path.startswith(root) and root != "/" else path
                out[c] = point / rel.lstrip("/")
    return out


def _group_name(tag: str) -> str:
    return f"{USER}-{tag}-{os.getpid()}" if tag else f"{USER}-{os.getpid()}"


def delegate(pw, tag: str = "") -> list[Path]:
    """Delegated groups for the user, on whichever hierarchy the host has (`tag` keeps
    delegations of one test process apart)."""
    dirs = own_cgroup_dirs()
    return [delegate_v2(pw, tag)] if "memory" not in dirs else delegate_v1(pw, dirs, tag)


def delegate_v1(pw, dirs: dict[str, Path], tag: str = "") -> list[Path]:
    """v1 (these hosts): a group of the user's in every hierarchy pvisor uses."""
    groups = []
    for c in ["memory", *V1_CONTROLLERS]:
        g = dirs[c] / _group_name(tag)
        g.mkdir(exist_ok=True)
        for p in [g, *g.iterdir()]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        groups.append(g)
    return groups


def delegate_v2(pw, tag: str = "") -> Path:
    """v2 (tests/cgroupv2): a subtree delegated as systemd delegates one (Delegate=yes): a
    group whose parent hands it memory, cpu and pids, the group and its cgroup.procs,
    cgroup.subtree_control and cgroup.threads owned by the user. Made at the hierarchy's
    root: this process's own group holds processes, so it cannot have controlled children."""
    root = next(Path(f.split()[4]) for f in Path("/proc/self/mountinfo").read_text().splitlines()
                if f.split(" - ", 1)[1].split()[0] == "cgroup2")
    have = (root / "cgroup.subtree_control").read_text().split()
    for c in ("memory", "cpu", "pids"):
        if c not in have:
            (root / "cgroup.subtree_control").write_text(f"+{c}")
    g = root / _group_name(tag)
    g.mkdir(exist_ok=True)
    for p in (g, g / "cgroup.procs", g / "cgroup.subtree_control", g / "cgroup.threads"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    return g


def memory_limits_beneath(groups: list[Path]) -> set[int]:
    """The memory limits of the sandbox groups pvisor made beneath the delegated ones."""
    limit = "memory.max" if (groups[0] / "cgroup.controllers").exists() else "memory.limit_in_bytes"
    # (v2 image servers' groups and the broker's own leaf have no memory limit: "max")
    values = {(p / limit).read_text().strip() for p in groups[0].iterdir()
              if p.is_dir() and p.name.startswith("pvisor-") and (p / limit).exists()}
    return {int(v) for v in values if v.isdigit()}


@pytest.fixture
def delegated():
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", USER], check=True)
    pw = pwd.getpwnam(USER)
    groups = delegate(pw)
    data = Path(tempfile.mkdtemp(prefix="pvisor-nonroot-", dir="/tmp"))
    data.chmod(0o755)
    os.chown(data, pw.pw_uid, pw.pw_gid)
    # An unprivileged image server mounts through fusermount3, which opens
    # /dev/fuse as the user: Debian's udev makes it 0666; hosts without udev
    # (like these) leave it 0600, so give it Debian's mode for the test.
    fuse_mode = os.stat("/dev/fuse").st_mode & 0o7777
    os.chmod("/dev/fuse", 0o666)
    try:
        yield pw, groups, data
    finally:
        os.chmod("/dev/fuse", fuse_mode)
    for g in groups:
        for sub in sorted(g.glob("**/"), key=lambda p: -len(p.parts)):
            for _ in range(50):
                try:
                    sub.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
    shutil.rmtree(data, ignore_errors=True)


def user_prefix(pw, groups) -> list[str]:
    """The argv prefix that moves itself into the delegated `groups` and then runs the rest of
    its argv as the user `pw` (setpriv), as an unprivileged broker is started."""
    join = "; ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)
    return ["bash", "-c", f'{join}; exec setpriv --reuid={pw.pw_uid} --regid={pw.pw_gid} --clear-groups "$@"',
            "pvisor-unprivileged"]


def as_user(pw, groups, user_cmd: str) -> list[str]:
    """argv running the shell command `user_cmd` as `pw` inside the delegated `groups`."""
    return [*user_prefix(pw, groups), "bash", "-c", user_cmd]


def test_unprivileged_broker_serves_sandboxes(delegated, tmp_path):
    pw, groups, data = delegated
    # The checkout may be private (a root user's clone under /root): the user
    # gets copies it can reach.
    binary = binary_for_others(pvisor_bin())
    archive = for_others(images_dir() / "busybox.tar")
    port = free_port()
    user_cmd = (
        f"{binary} image import {archive} --data-dir {data} && "
        f"exec {binary} serve --backend {SUITE_BACKEND} --listen 127.0.0.1:{port} --data-dir {data}"
    )
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        as_user(pw, groups, user_cmd),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_healthy(port, proc, lambda: (tmp_path / "server.log").read_text())
        assert Path(f"/proc/{proc.pid}/status").read_text().count(f"Uid:\t{pw.pw_uid}") == 1, "the broker runs as the user"

        sb = SandboxSync.create("busybox", connection_config=_make_conn(f"127.0.0.1:{port}"),
                                resource={"cpu": "1", "memory": "128Mi"})
        try:
            ex = sb.commands.run("id -u; hostname; echo data > /root/f; cat /root/f")
            assert ex.exit_code == 0
            assert [m.text for m in ex.logs.stdout] == ["0", f"sandbox-{sb.id[:8]}", "data"]
            # The sandbox's limits sit beneath the delegated groups.
            limits = memory_limits_beneath(groups)
            assert 128 << 20 in limits, limits
            rows = subprocess.run(["ps", "-o", "uid=,ppid=", "-C", "pvisor-worker"], capture_output=True, text=True).stdout.split("\n")
            ours = [r.split() for r in rows if r.split() and int(r.split()[1]) == proc.pid]
            assert ours, "the broker's workers are its children"
            assert all(int(uid) == pw.pw_uid for uid, _ in ours), f"workers run as the user: {ours}"
        finally:
            sb.kill()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
        log.close()
