"""pvisor as a benchmark side: `pvisor serve` on a private data dir."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .common import IMAGE_FILES, IMAGES, PVISOR, connection, free_port, run, sha256_file, wait_http


def snapshot_binaries(workdir: Path) -> Path:
    """Copy pvisor, pvisor-worker, pvisor-imaged, pvisor-agent (and pvisor-netd) into the work dir, so a
    rebuild of the dist dir during a run cannot mix binaries."""
    dst = workdir / "pvisor-bin"
    dst.mkdir(parents=True, exist_ok=True)
    for b in ("pvisor", "pvisor-worker", "pvisor-imaged", "pvisor-agent", "pvisor-netd"):
        src = PVISOR.parent / b if b != "pvisor" else PVISOR
        if b == "pvisor-netd" and not src.exists():
            continue  # dists from before networking have none; the worker says so if it needs one
        shutil.copy2(src, dst / b)
    return dst / "pvisor"


def import_images(pvisor: Path, data_dir: Path, images: list[str]) -> None:
    run([pvisor, "image", "import", *[IMAGES / IMAGE_FILES[i] for i in images], "--data-dir", data_dir],
        stdout=subprocess.DEVNULL)


class PvisorService:
    """A `pvisor serve` on a private data dir, with the test images imported."""

    name = "pvisor"

    def __init__(self, workdir: Path, images: list[str], warm_workers: int | None = None, cgroup=None,
                 pvisor: Path | None = None, serve_args=(), env: dict | None = None, request_timeout_s=None):
        self.workdir = workdir
        self.pvisor = pvisor or snapshot_binaries(workdir)
        self.data = workdir / "pvisor-data"
        self.log = workdir / "pvisor.log"
        self.warm_workers = warm_workers
        self.cgroup = cgroup
        self.serve_args = [str(a) for a in serve_args]
        self.env = dict(env or {})
        self.request_timeout_s = request_timeout_s
        import_images(self.pvisor, self.data, images)
        self.proc = None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"

    def describe(self) -> dict:
        d = self.pvisor.parent
        return {"side": "pvisor", "command": self.command(), "env": self.env,
                "warm_workers": self.warm_workers if self.warm_workers is not None else "default (2)",
                "binaries": {b: sha256_file(d / b) for b in ("pvisor", "pvisor-worker", "pvisor-imaged", "pvisor-agent",
                                                             "pvisor-netd") if (d / b).exists()}}

    def command(self) -> list[str]:
        cmd = [str(self.pvisor), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data)]
        if self.warm_workers is not None:
            cmd += ["--warm-workers", str(self.warm_workers)]
        return cmd + self.serve_args

    def start(self) -> None:
        # One transport per service start, shared by every SDK call; built
        # before any timed region (see common.connection).
        self.conn = connection(f"127.0.0.1:{self.port}", self.request_timeout_s)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
                                     env={**os.environ, **self.env} if self.env else None,
                                     preexec_fn=self.cgroup.preexec() if self.cgroup else None)
        wait_http(f"{self.base_url}/health", "pvisor", self.log, timeout=120, proc=self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def close(self) -> None:
        self.stop()

    def connection(self):
        return self.conn

    def domain(self) -> str:
        return f"127.0.0.1:{self.port}"
