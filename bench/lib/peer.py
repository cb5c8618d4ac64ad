"""The peer: the official OpenSandbox server (PyPI opensandbox-server) on Docker.

Everything here is started by the harness and stopped at the end:
- Debian's docker.io: a private dockerd (own data-root, exec-root, socket,
  bridge) with its managed containerd; the test images are `docker load`ed.
- opensandbox-server==1.1.1 in its own virtualenv, configured like the
  project's example config (bridge networking, loopback publish), on loopback.
- A stand-in execd image built here (bench/peer/execd): the official execd
  cannot be built on these hosts. Every report says so.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .cgroups import remove_stray
from .common import (BENCH, CACHE, IMAGE_FILES, IMAGES, connection, free_port, log, out, rm_tree, run,
                     sha256_file, wait_http)

SERVER_VERSION = "1.1.1"
PEER_VENV = CACHE / "peer-venv"
DOCKER = "/usr/bin/docker"
BRIDGE = "pvbench0"
BRIDGE_CIDR = "10.213.77.1/24"
BRIDGE_SUBNET = "10.213.77.0/24"
CGROUP_PARENT = "pvbench-ctr"  # relative: containers land beneath dockerd's own cgroup
EXECD_IMAGE_REPO = "pvbench/execd-standin"

STANDIN_NOTE = ("Peer data plane: the official execd cannot be built on this host (its Go modules cannot be "
                "downloaded), so the peer runs a stand-in execd built by the harness (bench/peer/execd, Go stdlib "
                "only): /ping, streamed /command in execd's SSE wire format, /files/upload, /files/download and "
                "/proxy/{port}/..., installed by the unmodified reference server through /execd + /bootstrap.sh. "
                "It streams output straight from pipes (the real execd tails files every 100 ms) and is smaller than "
                "the real execd, so it favours the peer.")


# ---------------------------------------------------------------- toolchain

def ensure_apt(binaries: dict[str, str]) -> None:
    """binaries: path -> Debian package. Installs the missing packages."""
    missing = sorted({pkg for path, pkg in binaries.items() if not Path(path).exists()})
    if missing:
        log("apt-get install", *missing)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env,
                           stdout=subprocess.DEVNULL)
        if r.returncode != 0:
            run(["apt-get", "update"], env=env, stdout=subprocess.DEVNULL)
            run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env, stdout=subprocess.DEVNULL)


def ensure_peer_tools() -> None:
    ensure_apt({"/usr/sbin/dockerd": "docker.io", "/usr/bin/go": "golang-go", "/usr/bin/gcc": "gcc",
                "/usr/sbin/iptables": "iptables"})


def ensure_peer_venv() -> Path:
    py = PEER_VENV / "bin/python"
    exe = PEER_VENV / "bin/opensandbox-server"
    if exe.exists() and out([py, "-c", "import importlib.metadata as m; print(m.version('opensandbox-server'))"]) == SERVER_VERSION:
        return exe
    log(f"creating {PEER_VENV} with opensandbox-server=={SERVER_VERSION}")
    rm_tree(PEER_VENV)
    run(["python3", "-m", "venv", PEER_VENV])
    run([PEER_VENV / "bin/pip", "install", "-q", f"opensandbox-server=={SERVER_VERSION}"])
    return exe


def _src_hash(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build_execd() -> Path:
    """The stand-in execd: static Go binary (stdlib only, CGO off)."""
    src = BENCH / "peer/execd/main.go"
    d = CACHE / "build" / f"execd-{_src_hash(src)}"
    exe = d / "execd"
    if not exe.exists():
        ensure_apt({"/usr/bin/go": "golang-go"})
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GO111MODULE="off", GOCACHE=str(CACHE / "build/gocache"),
                   GOPATH=str(CACHE / "build/gopath"), GOFLAGS="")
        run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", exe, src], env=env)
    return exe


def build_hold() -> Path:
    """The memory experiment's static worker program (C, glibc static)."""
    src = BENCH / "peer/hold/hold.c"
    d = CACHE / "build" / f"hold-{_src_hash(src)}"
    exe = d / "hold"
    if not exe.exists():
        ensure_apt({"/usr/bin/gcc": "gcc"})
        d.mkdir(parents=True, exist_ok=True)
        run(["gcc", "-static", "-O2", "-s", "-o", exe, src])
    return exe


# ---------------------------------------------------------------- host network

class NetGuard:
    """Creates the peer's bridge and, at the end, undoes what dockerd did to
    the host: its iptables chains/rules (only if none existed before), the
    FORWARD policy and net.ipv4.ip_forward."""

    def __init__(self):
        self.ip_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        self.forward_policy = "ACCEPT"
        for line in out(["iptables", "-S", "FORWARD"]).splitlines():
            if line.startswith("-P FORWARD"):
                self.forward_policy = line.split()[2]
        self.had_docker_chains = "DOCKER" in out(["iptables", "-S"]) + out(["iptables", "-t", "nat", "-S"])
        self.created_bridge = False
        if not Path(f"/sys/class/net/{BRIDGE}").exists():
            run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            run(["ip", "addr", "add", BRIDGE_CIDR, "dev", BRIDGE])
            run(["ip", "link", "set", BRIDGE, "up"])
            self.created_bridge = True

    def restore(self) -> None:
        if not self.had_docker_chains:
            for table in ("nat", "filter"):
                rules = out(["iptables", "-t", table, "-S"]).splitlines()
                for r in rules:
                    parts = r.split()
                    ours = "DOCKER" in r or BRIDGE in r or BRIDGE_SUBNET in r
                    if parts[:1] == ["-A"] and ours and not parts[1].startswith("DOCKER"):
                        subprocess.run(["iptables", "-t", table, "-D", *parts[1:]], check=False)
                chains = [r.split()[1] for r in rules if r.startswith("-N DOCKER")]
                for c in chains:
                    subprocess.run(["iptables", "-t", table, "-F", c], check=False)
                for c in chains:
                    subprocess.run(["iptables", "-t", table, "-X", c], check=False)
        subprocess.run(["iptables", "-P", "FORWARD", self.forward_policy], check=False)
        Path("/proc/sys/net/ipv4/ip_forward").write_text(self.ip_forward)
        if self.created_bridge:
            subprocess.run(["ip", "link", "del", BRIDGE], check=False)


# ---------------------------------------------------------------- dockerd

class Dockerd:
    """A private dockerd (plus its managed containerd)."""

    _n = 0

    def __init__(self, workdir: Path, network: bool = True, cgroup=None):
        Dockerd._n += 1
        self.workdir = workdir
        self.data_root = workdir / "docker-data"
        self.exec_root = Path(f"/run/pvb-{os.getpid()}-{Dockerd._n}")
        self.sock = self.exec_root / "docker.sock"
        self.log = workdir / "dockerd.log"
        self.network = network
        self.cgroup = cgroup
        self.proc = None

    def env(self) -> dict:
        return dict(os.environ, DOCKER_HOST=f"unix://{self.sock}")

    def command(self) -> list[str]:
        cmd = ["dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root / "exec"),
               "--pidfile", str(self.exec_root / "dockerd.pid"), "--host", f"unix://{self.sock}",
               "--storage-driver", "overlay2", "--log-level", "warn"]
        if self.network:
            cmd += ["--bridge", BRIDGE, "--cgroup-parent", CGROUP_PARENT]
        else:
            cmd += ["--bridge", "none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"]
        return cmd

    def start(self) -> None:
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     preexec_fn=self.cgroup.preexec() if self.cgroup else None,
                                     start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if subprocess.run([DOCKER, "version"], env=self.env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"dockerd did not start; see {self.log}\n{self.log.read_text(errors='replace')[-3000:]}")

    def docker(self, *args, capture=False, **kw):
        if capture:
            return out([DOCKER, *args], env=self.env())
        return run([DOCKER, *args], env=self.env(), stdout=subprocess.DEVNULL, **kw)

    def load(self, tarball: Path) -> None:
        self.docker("load", "-i", tarball)

    def stop(self) -> None:
        if not self.proc:
            return
        ids = self.docker("ps", "-aq", capture=True).split()
        if ids:
            subprocess.run([DOCKER, "rm", "-f", *ids], env=self.env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # The managed containerd is dockerd's child in the same session.
        try:
            os.killpg(self.proc.pid, 0)
            time.sleep(1)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc = None
        rm_tree(self.exec_root)

    def versions(self) -> dict:
        return {"dockerd": out(["dockerd", "--version"]), "containerd": out(["containerd", "--version"]),
                "runc": out(["runc", "--version"]).splitlines()[0] if out(["runc", "--version"]) else "",
                "docker_cli": out([DOCKER, "--version"])}


# ---------------------------------------------------------------- the peer service

CONFIG = """\
# Generated by bench/lib/peer.py, following the package's example.config.toml
# (Docker runtime), with the stand-in execd image and loopback-only publishing.
[server]
host = "127.0.0.1"
port = {port}
max_sandbox_timeout_seconds = 86400

[log]
level = "INFO"

[runtime]
type = "docker"
execd_image = "{execd_image}"

[storage]
allowed_host_paths = []

[store]
type = "sqlite"
path = "{db}"

[docker]
network_mode = "bridge"
port_range_min = 40000
port_range_max = 60000
publish_host = "127.0.0.1"
drop_capabilities = ["AUDIT_WRITE", "MKNOD", "NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_MODULE", "SYS_PTRACE", "SYS_TIME", "SYS_TTY_CONFIG"]
no_new_privileges = true
apparmor_profile = ""
pids_limit = 4096
seccomp_profile = ""

[ingress]
mode = "direct"
"""


class PeerService:
    """opensandbox-server on a private dockerd. start/stop/restart act on the
    server; the dockerd lives until close()."""

    name = "peer"

    def __init__(self, workdir: Path, images: list[str], cgroup=None):
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.cgroup = cgroup
        ensure_peer_tools()
        self.server_exe = ensure_peer_venv()
        self.execd = build_execd()
        self.net = NetGuard()
        self.dockerd = Dockerd(workdir, network=True, cgroup=cgroup)
        self.proc = None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "opensandbox-server.log"
        try:
            self.dockerd.start()
            for i in images:
                self.dockerd.load(IMAGES / IMAGE_FILES[i])
            if "busybox:latest" not in images:
                self.dockerd.load(IMAGES / IMAGE_FILES["busybox:latest"])
            self.execd_image = self._build_execd_image()
        except BaseException:
            self.close()
            raise
        self.config_file = workdir / "opensandbox.toml"
        self.config_file.write_text(CONFIG.format(port=self.port, execd_image=self.execd_image,
                                                  db=workdir / "opensandbox.db"))

    def _build_execd_image(self) -> str:
        ctx = self.workdir / "execd-image"
        ctx.mkdir(exist_ok=True)
        shutil.copy2(self.execd, ctx / "execd")
        shutil.copy2(BENCH / "peer/execd/bootstrap.sh", ctx / "bootstrap.sh")
        shutil.copy2(BENCH / "peer/execd/Dockerfile", ctx / "Dockerfile")
        tag = f"{EXECD_IMAGE_REPO}:{sha256_file(self.execd)[:12]}"
        run([DOCKER, "build", "-q", "-t", tag, ctx], env=dict(self.dockerd.env(), DOCKER_BUILDKIT="0"),
            stdout=subprocess.DEVNULL)
        return tag

    def describe(self) -> dict:
        return {"side": "peer", "server": f"opensandbox-server=={SERVER_VERSION}",
                "server_venv": str(PEER_VENV), "config": self.config_file.read_text(),
                "dockerd_command": self.dockerd.command(), "docker": self.dockerd.versions(),
                "execd_standin_sha256": sha256_file(self.execd), "execd_image": self.execd_image,
                "note": STANDIN_NOTE}

    def start(self) -> None:
        self.conn = connection(f"127.0.0.1:{self.port}")
        env = dict(self.dockerd.env(), OPENSANDBOX_INSECURE_SERVER="YES")
        self.proc = subprocess.Popen([str(self.server_exe), "--config", str(self.config_file)], env=env,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=self.cgroup.preexec() if self.cgroup else None)
        wait_http(f"{self.base_url}/health", "opensandbox-server", self.log, timeout=120, proc=self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()
        try:
            self.dockerd.stop()
        finally:
            self.net.restore()
            remove_stray(CGROUP_PARENT)

    def connection(self):
        return self.conn

    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"

    def diagnostics(self, sandbox_ids: list[str]) -> dict:
        """State and log tail (execd's output) of the sandboxes' containers, for failure reports."""
        res = {}
        for sid in sandbox_ids:
            cid = self.dockerd.docker("ps", "-aq", "--filter", f"name=sandbox-{sid}", capture=True)
            if not cid:
                res[sid] = "no container"
                continue
            state = self.dockerd.docker("inspect", "-f", "{{json .State}}", cid, capture=True)
            logs = subprocess.run([DOCKER, "logs", "--tail", "40", cid], env=self.dockerd.env(),
                                  capture_output=True, text=True)
            top = self.dockerd.docker("top", cid, capture=True)
            res[sid] = {"state": state, "logs": (logs.stdout + logs.stderr)[-4000:], "top": top}
        return res
