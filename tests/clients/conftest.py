"""Fixtures for the real-client suite (osb, MCP, gRPC reflection, the API reference page).

One `pvisor serve` per session (a fresh data dir with busybox imported, an API key,
`--stop-sandboxes-on-exit`); the clients are the official ones from PyPI, installed in their
own venv (tests/clients/requirements.txt, scripts/common.sh `clients_env`), configured the
way their users configure them, with no pvisor-specific option.

Environment:
  PVISOR_BIN          pvisor binary (default: <repo>/target/dist/pvisor)
  PVISOR_TEST_IMAGES  directory of test image archives (default: /var/cache/pvisor/test-images)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "clients-secret"
BUSYBOX = "busybox:latest"
HEALTH_TRIES = 300  # 0.1 s apart


@dataclass
class Server:
    addr: str  # 127.0.0.1:PORT
    data_dir: Path
    log_path: Path
    api_key: str

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary() -> Path:
    p = Path(os.environ.get("PVISOR_BIN", "target/dist/pvisor"))
    return p if p.is_absolute() else REPO_ROOT / p


def _wait_healthy(proc: subprocess.Popen, url: str) -> str:
    last = "no answer"
    for _ in range(HEALTH_TRIES):
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        try:
            r = httpx.get(f"{url}/health", timeout=2)
            if r.status_code == 200:
                return ""
            last = f"/health -> {r.status_code}"
        except httpx.HTTPError as e:
            last = repr(e)
        time.sleep(0.1)
    return f"not healthy ({last})"


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    binary = _binary()
    if not os.access(binary, os.X_OK):
        pytest.fail(f"pvisor binary {binary} not found: build it first (or set PVISOR_BIN)", pytrace=False)
    archive = Path(os.environ.get("PVISOR_TEST_IMAGES", "/var/cache/pvisor/test-images")) / "busybox.tar"
    if not archive.is_file():
        pytest.fail(f"{archive} is missing: run images/testdata/build-test-images.sh", pytrace=False)
    # Under /tmp, 0755: the sandboxes' mapped uids traverse the data dir's ancestors.
    data_dir = Path(tempfile.mkdtemp(prefix="clients-data-", dir="/tmp"))
    data_dir.chmod(0o755)
    subprocess.run([str(binary), "image", "import", str(archive), "--data-dir", str(data_dir)],
                   check=True, capture_output=True, timeout=600)
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    addr = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "PVISOR_API_KEY": API_KEY}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(binary), "serve", "--listen", addr, "--data-dir", str(data_dir), "--backend", "ns",
             "--stop-sandboxes-on-exit"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
    srv = Server(addr, data_dir, log_path, API_KEY)
    why = _wait_healthy(proc, srv.url)
    if why:
        proc.kill()
        proc.wait()
        pytest.fail(f"pvisor serve {why}\n{srv.log_tail()}", pytrace=False)
    yield srv
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def api(server) -> httpx.Client:
    """Raw HTTP to the lifecycle API, for set-up and checks the client under test does not do."""
    with httpx.Client(base_url=server.url, headers={"OPEN-SANDBOX-API-KEY": server.api_key}, timeout=60) as c:
        yield c


@pytest.fixture
def sandbox_id(api):
    """A running busybox sandbox created over the raw API; deleted afterwards."""
    r = api.post("/v1/sandboxes", json={
        "image": {"uri": BUSYBOX}, "timeout": 300, "entrypoint": ["sleep", "infinity"],
        "resourceLimits": {"cpu": "1", "memory": "256Mi"},
    })
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    for _ in range(600):
        state = api.get(f"/v1/sandboxes/{sid}").json()["status"]["state"]
        if state != "Pending":
            break
        time.sleep(0.1)
    assert state == "Running", state
    yield sid
    api.delete(f"/v1/sandboxes/{sid}")
