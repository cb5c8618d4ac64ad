"""Product cgroups: one per side, holding every process of that side.

cgroup v1 (the benchmark hosts: memory, cpu, ... are v1 hierarchies) and v2.
Groups are created beneath the harness's own group in each hierarchy, never
by moving anything else out of its group. A process joins before exec (via
`preexec`), so everything it forks is charged there too.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def own_cgroups() -> dict[str, str]:
    """controller -> path of this process's group ('' key: the v2 group)."""
    res = {}
    for line in open("/proc/self/cgroup"):
        _, ctrls, path = line.rstrip("\n").split(":", 2)
        for c in ctrls.split(",") if ctrls else [""]:
            res[c] = path
    return res


def is_v2() -> bool:
    f = ROOT / "cgroup.controllers"
    return f.exists() and "memory" in f.read_text().split()


def v2_base(own: Path) -> Path:
    """Where v2 product groups go: beneath the harness's own group, unless that group holds
    processes and hands no memory controller down (v2's "no internal processes" rule, e.g. a
    shell's session scope): then beside it, under the same parent, as a root broker does."""
    busy = (own / "cgroup.procs").read_text().split()
    delegates = "memory" in (own / "cgroup.subtree_control").read_text().split()
    return own.parent if busy and not delegates else own


class ProductCgroup:
    def __init__(self, name: str, mem_limit: int, cpus: float):
        self.name = name
        self.v2 = is_v2()
        own = own_cgroups()
        if self.v2:
            self.dirs = {"unified": v2_base(ROOT / own[""].lstrip("/")) / name}
            self.mem_dir = self.dirs["unified"]
        else:
            self.dirs = {c: ROOT / c / own.get(c, "/").lstrip("/") / name for c in ("memory", "cpu")}
            self.mem_dir = self.dirs["memory"]
        for d in self.dirs.values():
            if d.exists():
                self._remove_dir(d)
            d.mkdir(parents=True)
        if self.v2:
            d = self.mem_dir
            (d / "memory.max").write_text(str(mem_limit))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
        else:
            m, c = self.dirs["memory"], self.dirs["cpu"]
            (m / "memory.limit_in_bytes").write_text(str(mem_limit))
            if (m / "memory.memsw.limit_in_bytes").exists():  # swap off: memory+swap = memory
                (m / "memory.memsw.limit_in_bytes").write_text(str(mem_limit))
            try:
                (m / "memory.swappiness").write_text("0")
            except OSError:
                pass
            (c / "cpu.cfs_period_us").write_text("100000")
            (c / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
        self.mem_limit = mem_limit
        self.cpus = cpus

    def describe(self) -> dict:
        return {"v2": self.v2, "dirs": {k: str(v) for k, v in self.dirs.items()}, "memory_limit": self.mem_limit,
                "cpus": self.cpus, "swap": "off (no swap on host; memsw/swap.max limited)"}

    def join(self, pid: int) -> None:
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(pid))

    def preexec(self):
        dirs = list(self.dirs.values())

        def _join():
            for d in dirs:
                with open(d / "cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
        return _join

    def usage(self) -> int:
        f = "memory.current" if self.v2 else "memory.usage_in_bytes"
        return int((self.mem_dir / f).read_text())

    def pids(self) -> set[int]:
        res = set()
        for d in self.dirs.values():
            for root, _dirs, _files in os.walk(d):
                try:
                    res.update(int(x) for x in Path(root, "cgroup.procs").read_text().split())
                except OSError:
                    pass
        return res

    def destroy(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for d in self.dirs.values():
            self._remove_dir(d)

    @staticmethod
    def _remove_dir(d: Path) -> None:
        for root, dirs, _files in sorted(os.walk(d), key=lambda t: -len(t[0])):
            try:
                os.rmdir(root)
            except OSError:
                pass


def remove_stray(name: str) -> None:
    """Remove empty groups called `name` that a runtime left in other v1 hierarchies."""
    if is_v2():
        return
    own = own_cgroups()
    for c, path in own.items():
        mount = "unified" if not c else c.removeprefix("name=")
        d = ROOT / mount / path.lstrip("/") / name
        if d.is_dir():
            ProductCgroup._remove_dir(d)
