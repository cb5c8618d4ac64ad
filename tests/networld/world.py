"""Builds and tears down the private internet (needs root).

  host root netns                         netns pvisor-networld
  nw-host 198.18.0.1/24  <--- veth --->   nw-inet 198.18.0.254/24, default via 198.18.0.1
  routes to each of those /32s           lo: 203.0.113.{10,20,30,31,32}/32, 198.51.100.53/32
         via 198.18.0.254                 servers.py (started with nsenter --net=)

`up()` is idempotent (a healthy world is left alone, a broken or half-built one from a
crashed run is torn down and rebuilt) and serialized by a lock file; `down()` removes the
servers, the namespace, the veth and the routes, and tolerates any of them missing.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from . import addresses as A
from . import certs, probe

STATE = Path(A.STATE_DIR)
NETNS_PATH = Path("/run/netns") / A.NETNS
LOCK = Path("/run/pvisor-networld.lock")
READY_TIMEOUT = 20.0


class WorldError(RuntimeError):
    """The world cannot be built here (with the reason)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise WorldError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@contextmanager
def _locked():
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def missing_requirements() -> str | None:
    """Why the world cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building the private internet (netns, veth, routes) needs root"
    for tool in ("ip", "nsenter", "openssl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    return None


def _conflicts() -> list[str]:
    """Host routes that overlap the world's networks and are not the world's own."""
    ours = [ipaddress.ip_network(n) for n in A.ROUTED]
    ours.append(ipaddress.ip_interface(f"{A.LINK_HOST}/{A.LINK_PREFIX}").network)
    found = []
    for r in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst, dev = r.get("dst", ""), r.get("dev", "")
        if dst in ("default", "") or dev == A.VETH_HOST:
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if any(net.overlaps(o) for o in ours):
            found.append(f"route {dst} dev {dev}")
    return found


def _our_routes() -> set[str]:
    """The world's host routes that exist (as A.ROUTED spells them)."""
    found = set()
    for r in json.loads(_ip("-j", "-4", "route", "show", check=False).stdout or "[]"):
        dst = r.get("dst", "")
        if r.get("gateway") == A.LINK_INET:
            found.add(dst if "/" in dst else f"{dst}/32")
    return found


# Names the host must keep reaching while the world is up (its package registries).
REGISTRIES = ["deb.debian.org", "pypi.org", "files.pythonhosted.org", "index.crates.io", "static.crates.io",
              "crates.io", "registry.npmjs.org"]


def _shadowed() -> list[str]:
    """Host services the world's addresses would hide: registries resolving to them, or a
    nameserver of the host's resolv.conf among them."""
    ours = {n.split("/")[0] for n in A.ROUTED} | {A.LINK_HOST, A.LINK_INET}
    hit = []
    for name in REGISTRIES:
        try:
            addrs = {i[4][0] for i in socket.getaddrinfo(name, 443, socket.AF_INET)}
        except OSError:
            continue
        hit += [f"{name} -> {a}" for a in addrs & ours]
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            f = line.split()
            if len(f) >= 2 and f[0] == "nameserver" and f[1] in ours:
                hit.append(f"the host's nameserver {f[1]}")
    except OSError:
        pass
    return hit


def _healthy() -> str | None:
    """None when the world is up and answering, else what is wrong."""
    if not NETNS_PATH.exists():
        return "no namespace"
    pid = _server_pid()
    if pid is None:
        return "servers not running"
    if set(A.ROUTED) - _our_routes():
        return "routes missing"
    try:
        probe.quick_check()
    except Exception as e:  # noqa: BLE001 - reported
        return f"not answering: {e!r}"
    return None


def _server_pid() -> int | None:
    try:
        pid = int((STATE / "servers.pid").read_text())
        if os.stat(f"/proc/{pid}/ns/net").st_ino == NETNS_PATH.stat().st_ino:
            return pid
    except (OSError, ValueError):
        pass
    return None


def _pidfile_server() -> int | None:
    """The pid file's process if it still is a networld server (pids get reused)."""
    try:
        pid = int((STATE / "servers.pid").read_text())
        if b"networld.servers" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    except (OSError, ValueError):
        pass
    return None


def _netns_pids() -> list[int]:
    """Every process in the world's namespace (all started by servers.py runs)."""
    if not NETNS_PATH.exists():
        return []
    ino = NETNS_PATH.stat().st_ino
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}/ns/net").st_ino == ino:
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def up() -> None:
    """Builds the world unless it is already up and healthy."""
    why = missing_requirements()
    if why:
        raise WorldError(why)
    with _locked():
        if _healthy() is None:
            return
        _down()
        shadowed = _shadowed()
        if shadowed:
            raise WorldError("the world's addresses would hide host services: " + ", ".join(shadowed))
        conflicts = _conflicts()
        if conflicts:
            raise WorldError("the host already routes the world's networks: " + ", ".join(conflicts)
                             + " (set PVISOR_NETWORLD_LINK to a free /24 for the link)")
        _build()


def _build() -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    certs.make(STATE)
    _ip("netns", "add", A.NETNS)
    _ip("link", "add", A.VETH_HOST, "type", "veth", "peer", "name", A.VETH_INET, "netns", A.NETNS)
    _ip("addr", "add", f"{A.LINK_HOST}/{A.LINK_PREFIX}", "dev", A.VETH_HOST)
    _ip("link", "set", A.VETH_HOST, "up")
    n = ["-n", A.NETNS]
    _ip(*n, "link", "set", "lo", "up")
    _ip(*n, "addr", "add", f"{A.LINK_INET}/{A.LINK_PREFIX}", "dev", A.VETH_INET)
    _ip(*n, "link", "set", A.VETH_INET, "up")
    for addr in [*A.WEB_HOSTS, A.DNS]:
        _ip(*n, "addr", "add", f"{addr}/32", "dev", "lo")
    _ip(*n, "route", "add", "default", "via", A.LINK_HOST)
    for net in A.ROUTED:
        _ip("route", "add", net, "via", A.LINK_INET, "dev", A.VETH_HOST)
    _start_servers()


def _start_servers() -> None:
    (STATE / "ready").unlink(missing_ok=True)
    log = open(STATE / "servers.log", "ab")
    pkg_parent = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        ["nsenter", f"--net={NETNS_PATH}", "--", sys.executable, "-m", "networld.servers", "--state", str(STATE)],
        cwd=pkg_parent, env={**os.environ, "PYTHONPATH": str(pkg_parent)},
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    (STATE / "servers.pid").write_text(f"{proc.pid}\n")  # nsenter execs: same pid
    deadline = time.monotonic() + READY_TIMEOUT
    while not (STATE / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (STATE / "servers.log").read_text(errors="replace")[-2000:]
            raise WorldError(f"servers did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.05)
    probe.quick_check()


def down() -> None:
    with _locked():
        _down()


def _down() -> None:
    pids = _netns_pids()
    stale = _pidfile_server()
    if stale is not None and stale not in pids:
        pids.append(stale)  # a run whose namespace was deleted under it
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for net in _our_routes():
        _ip("route", "del", net, "via", A.LINK_INET, check=False)
    if NETNS_PATH.exists():
        _ip("netns", "del", A.NETNS, check=False)
    if Path(f"/sys/class/net/{A.VETH_HOST}").exists():
        _ip("link", "del", A.VETH_HOST, check=False)
    for f in ("servers.pid", "ready"):
        (STATE / f).unlink(missing_ok=True)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def leftovers() -> list[str]:
    """What of the world exists (empty after a clean down)."""
    out = []
    if NETNS_PATH.exists():
        out.append(f"netns {A.NETNS}")
    if Path(f"/sys/class/net/{A.VETH_HOST}").exists():
        out.append(f"link {A.VETH_HOST}")
    out += [f"route {n}" for n in sorted(_our_routes())]
    if _netns_pids():
        out.append("processes in the namespace")
    return out


def status() -> str:
    why = _healthy()
    return "up" if why is None else f"down ({why})"


def ca_path() -> Path:
    return STATE / "ca.pem"
