"""Fixtures for the pvisor end-to-end suite.

A session fixture imports the test images into a fresh data directory, starts
`pvisor serve` on a free port and stops it at the end. Tests drive it with the
unmodified official OpenSandbox SDK (sync API) and with raw httpx calls.

Environment:
  PVISOR_BIN          pvisor binary (default: <repo>/target/dist/pvisor)
  PVISOR_TEST_IMAGES  directory of test image archives
                      (default: /var/cache/pvisor/test-images)
  PVISOR_E2E_ARCHIVES comma-separated archives the session server imports (default: all;
                      the cgroup v2 guest, tests/cgroupv2, imports busybox.tar only)
  PVISOR_E2E_DEADLINE_SCALE  multiplies every test's deadline (slow emulated guests)
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox.config import ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.sync import SandboxManagerSync, SandboxSync

from e2e_util import BUSYBOX, DEADLINE_SCALE, REPO_ROOT, SMALL
from user_files import binary_for_others, for_others

# The SDK logs every failed call at ERROR with a traceback; polling loops make that
# noise. Exceptions carry the details, so keep only its critical messages.
logging.getLogger("opensandbox").setLevel(logging.CRITICAL)

# The SDK reads these when the config leaves them unset; the suite sets everything.
for _var in ("OPEN_SANDBOX_API_KEY", "OPEN_SANDBOX_DOMAIN"):
    os.environ.pop(_var, None)

DEFAULT_IMAGES_DIR = "/var/cache/pvisor/test-images"
IMAGE_ARCHIVES = {
    "busybox.tar": "busybox:latest",
    "debian-bookworm-slim.tar": "debian:bookworm-slim",
    "python-3.11-slim.tar": "python:3.11-slim",
    "python-3.11-tools.tar": "pvisor/python-tools:latest",
    "busybox-oci.tar": "busybox-oci:latest",
}
# Imported when built (older image caches lack them); the tests needing one skip without it.
OPTIONAL_ARCHIVES = {
    "node-bookworm.tar": "pvisor/node:latest",
}
API_KEY = "secret"
HEALTH_TIMEOUT = float(os.environ.get("PVISOR_E2E_HEALTH_TIMEOUT", "30"))
IMPORT_TIMEOUT = 600
DEFAULT_TEST_DEADLINE = 120

# Servers started by this session; their logs are attached to failing tests.
_SERVERS: list["PvisorServer"] = []
_DATA_DIRS: list[Path] = []


def pvisor_bin() -> Path:
    p = Path(os.environ.get("PVISOR_BIN", "target/dist/pvisor"))
    if not p.is_absolute():
        p = REPO_ROOT / p
    return p


def images_dir() -> Path:
    return Path(os.environ.get("PVISOR_TEST_IMAGES", DEFAULT_IMAGES_DIR))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def import_images(binary: Path, data_dir: Path, archives: list[str], prefix: list[str] | None = None) -> None:
    src = images_dir()
    if not src.is_dir():
        pytest.fail(
            f"test image directory {src} does not exist: build the archives with "
            f"`sudo images/testdata/build-test-images.sh` (or point PVISOR_TEST_IMAGES at them)",
            pytrace=False,
        )
    for name in archives:
        f = src / name
        if f.is_file() and prefix:
            f = for_others(f)
        if not f.is_file():
            pytest.fail(
                f"test image archive {f} ({IMAGE_ARCHIVES[name]}) is missing: rerun "
                f"`sudo images/testdata/build-test-images.sh`",
                pytrace=False,
            )
        cmd = [*(prefix or []), str(binary), "image", "import", str(f), "--data-dir", str(data_dir)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=IMPORT_TIMEOUT)
        if r.returncode != 0:
            pytest.fail(
                f"`{' '.join(cmd)}` exited {r.returncode} after {time.monotonic() - t0:.1f}s\n"
                f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}",
                pytrace=False,
            )


class PvisorServer:
    """A `pvisor serve` subprocess with its own data directory and log file."""

    def __init__(self, name: str, binary: Path, data_dir: Path, log_path: Path, env: dict[str, str],
                 args: list[str] | None = None, prefix: list[str] | None = None):
        self.args = args or []
        self.prefix = prefix or []  # exec'd before the binary (e.g. setpriv for a non-root broker)
        self.name = name
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.env = env
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    def start(self, must_succeed: bool = True) -> str:
        """Starts the server; returns "" when healthy, else why not (or fails the test)."""
        last_err = ""
        for _attempt in range(3):
            self.port = free_port()
            self._log_file = open(self.log_path, "ab", buffering=0)
            self._log_file.write(f"=== pytest: starting {self.name} on {self.addr}\n".encode())
            cmd = [*self.prefix, str(self.binary), "serve", "--listen", self.addr, "--data-dir", str(self.data_dir), *self.args]
            env = {k: v for k, v in os.environ.items() if k != "PVISOR_API_KEY"}
            env.update({"RUST_BACKTRACE": "1", **self.env})
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # no stray group signals either way (e.g. Ctrl-C)
            )
            ok, last_err = self._wait_healthy()
            if ok:
                _SERVERS.append(self)
                return ""
            self.stop()
            if "in use" not in self.log_tail(20).lower():
                break
        if not must_succeed:
            return last_err
        pytest.fail(
            f"{self.name} (`{self.binary} serve --listen {self.addr} --data-dir {self.data_dir}`) "
            f"did not become healthy: {last_err}\n--- log tail ({self.log_path}) ---\n{self.log_tail(60)}",
            pytrace=False,
        )

    def _wait_healthy(self) -> tuple[bool, str]:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False, f"process exited with {self.proc.returncode}"
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200 and r.json() == {"status": "healthy"}:
                    return True, ""
                last = f"GET /health -> {r.status_code} {r.text[:200]!r}"
            except (httpx.HTTPError, ValueError) as e:
                last = repr(e)
            time.sleep(0.1)
        return False, f"timed out after {HEALTH_TIMEOUT}s (last: {last})"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                if self._log_file:
                    self._log_file.write(b"=== pytest: SIGTERM ignored for 20s, sent SIGKILL\n")
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        if self in _SERVERS:
            _SERVERS.remove(self)
        return self.proc.returncode

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, lines: int = 60, since: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                data = f.read()
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"
        text = data.decode("utf-8", "replace").splitlines()
        return "\n".join(text[-lines:])

    def rss_kib(self) -> int:
        """Resident memory of the server and all its descendants (KiB)."""
        if not self.alive():
            return 0
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{d}/status") as f:
                    kb = next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
            rss[int(d)] = kb
        total, stack = 0, [self.proc.pid]
        while stack:
            pid = stack.pop()
            total += rss.get(pid, 0)
            stack.extend(children.get(pid, []))
        return total


def _start_server(tmp_path_factory, name: str, archives: list[str], env: dict[str, str],
                  args: list[str] | None = None, prefix: list[str] | None = None,
                  data_owner: tuple[int, int] | None = None) -> PvisorServer:
    binary = pvisor_bin()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        pytest.fail(
            f"pvisor binary {binary} not found or not executable: build it first "
            f"(or set PVISOR_BIN)",
            pytrace=False,
        )
    if prefix:  # run as another user: the checkout may be private (e.g. under /root)
        binary = binary_for_others(binary)
    args = list(args or [])
    if "--backend" not in args:
        # The suite's backend, not `auto`: on a host with hardware virtualization (the KVM test
        # host of tests/cgroupv2) auto would pick vm for an ns run.
        args += ["--backend", SUITE_BACKEND]
    base = tmp_path_factory.mktemp(name)
    data_dir = make_data_dir(name)
    if data_owner is not None:
        os.chown(data_dir, *data_owner)
    import_images(binary, data_dir, archives, prefix)
    srv = PvisorServer(name, binary, data_dir, base / "server.log", env, args, prefix)
    srv.start()
    return srv


def make_data_dir(name: str, mode: int = 0o755) -> Path:
    """A fresh data directory under /tmp.

    Not under pytest's tmp dirs: those are private (0700), and pvisor's sandboxes
    (mapped to an unprivileged host uid) must traverse the data dir's ancestors
    to mount their overlays. test_server.py covers the private-parent case.
    """
    d = Path(tempfile.mkdtemp(prefix=f"{name}-e2e-data-", dir=os.environ.get("PVISOR_E2E_TMP", "/tmp")))
    d.chmod(mode)
    _DATA_DIRS.append(d)
    return d


def _make_conn(addr: str, **kw) -> ConnectionConfigSync:
    # Scaled too: a create that fails slowly on an emulated host must get the broker's reason
    # back, not the SDK's own timeout.
    return ConnectionConfigSync(
        domain=addr, protocol="http", request_timeout=timedelta(seconds=60 * DEADLINE_SCALE), **kw
    )


# ---------------------------------------------------------------- server fixtures


@pytest.fixture(scope="session", autouse=True)
def _remove_data_dirs():
    yield
    for d in _DATA_DIRS:
        if os.environ.get("PVISOR_E2E_KEEP_DATA"):
            print(f"\nkeeping data dir {d}")
            continue
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pvisor_server(tmp_path_factory):
    # The suite's backend: ns unless PVISOR_E2E_BACKEND says otherwise
    # (test_vm_backend.py runs the whole suite again on vm where it can).
    backend = os.environ.get("PVISOR_E2E_BACKEND", "ns")
    optional = [n for n in OPTIONAL_ARCHIVES if (images_dir() / n).is_file()]
    archives = list(IMAGE_ARCHIVES) + optional
    if os.environ.get("PVISOR_E2E_ARCHIVES"):
        archives = os.environ["PVISOR_E2E_ARCHIVES"].split(",")
    srv = _start_server(tmp_path_factory, "pvisor", archives, {}, ["--backend", backend])
    yield srv
    t0 = time.monotonic()
    rc = srv.stop()
    print(f"\n{srv.name} exited with {rc} {time.monotonic() - t0:.1f}s after SIGTERM; log: {srv.log_path}")


@pytest.fixture(scope="session")
def server(pvisor_server) -> str:
    """`127.0.0.1:PORT` of the main server (no API key)."""
    return pvisor_server.addr


@pytest.fixture(scope="session")
def base_url(pvisor_server) -> str:
    return pvisor_server.url


@pytest.fixture(scope="session")
def conn(server) -> ConnectionConfigSync:
    """Direct mode: the SDK talks to the endpoint pvisor hands out."""
    return _make_conn(server)


@pytest.fixture(scope="session")
def proxy_conn(server) -> ConnectionConfigSync:
    """Server-proxy mode: data-plane calls go through /v1/sandboxes/{id}/proxy/44772."""
    return _make_conn(server, use_server_proxy=True)


@pytest.fixture(scope="session")
def http(base_url):
    """Raw httpx client against the main server."""
    with httpx.Client(base_url=base_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def manager(conn):
    m = SandboxManagerSync.create(connection_config=conn)
    yield m
    m.close()


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory) -> PvisorServer:
    """A second server with PVISOR_API_KEY=secret (own data dir, busybox only)."""
    srv = _start_server(tmp_path_factory, "pvisor-auth", ["busybox.tar"], {"PVISOR_API_KEY": API_KEY})
    yield srv
    t0 = time.monotonic()
    rc = srv.stop()
    print(f"\n{srv.name} exited with {rc} {time.monotonic() - t0:.1f}s after SIGTERM; log: {srv.log_path}")


# ---------------------------------------------------------------- the private test internet


@pytest.fixture(scope="session")
def networld():
    """The private internet of tests/networld (built as root, torn down at the end if this
    session built it); yields its addresses module. Skips where it cannot be built."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from networld import addresses, world

    why = world.missing_requirements()
    if why:
        pytest.skip(f"the private test internet (tests/networld) cannot be built: {why}")
    was_up = world.status() == "up"
    world.up()
    yield addresses
    if not was_up and not os.environ.get("PVISOR_NETWORLD_KEEP"):
        world.down()


# ---------------------------------------------------------------- sandbox factories


class SandboxFactory:
    """Creates sandboxes with the SDK and kills every one of them at teardown."""

    def __init__(self, conn: ConnectionConfigSync):
        self.conn = conn
        self.created: list[SandboxSync] = []

    def __call__(
        self,
        image: str = BUSYBOX,
        *,
        conn: ConnectionConfigSync | None = None,
        resource: dict[str, str] | None = None,
        timeout: timedelta | None = timedelta(minutes=10),
        **kwargs,
    ) -> SandboxSync:
        sb = SandboxSync.create(
            image,
            connection_config=conn or self.conn,
            resource=resource or dict(SMALL),
            timeout=timeout,
            **kwargs,
        )
        self.created.append(sb)
        return sb

    def track(self, sb: SandboxSync) -> SandboxSync:
        """Registers an SDK object made elsewhere (connect/resume) for close()."""
        self.created.append(sb)
        return sb

    def cleanup(self) -> None:
        errors = []
        killed: set[str] = set()
        for sb in reversed(self.created):
            try:
                if sb.id not in killed:
                    killed.add(sb.id)
                    sb.kill()
            except SandboxApiException as e:
                if e.status_code != 404:
                    errors.append(f"kill {sb.id}: {e!r} status={e.status_code}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"kill {sb.id}: {e!r}")
            finally:
                sb.close()
        self.created.clear()
        if errors:
            pytest.fail("sandbox cleanup failed:\n" + "\n".join(errors), pytrace=False)


@pytest.fixture
def sandbox(conn):
    """Factory: sandbox(image=BUSYBOX, conn=..., resource=..., timeout=..., **create_kwargs)."""
    f = SandboxFactory(conn)
    yield f
    f.cleanup()


@pytest.fixture(scope="module")
def module_sandbox(conn):
    """Module-scoped factory, for sandboxes shared by the tests of one module."""
    f = SandboxFactory(conn)
    yield f
    f.cleanup()


# ---------------------------------------------------------------- per-test guards


class DeadlineExceeded(BaseException):
    """Raised by SIGALRM; a BaseException so the SDK's `except Exception` cannot swallow it."""


@pytest.fixture(autouse=True)
def _deadline(request):
    marker = request.node.get_closest_marker("deadline")
    seconds = int(marker.args[0]) if marker else DEFAULT_TEST_DEADLINE
    seconds = int(seconds * DEADLINE_SCALE)

    def on_alarm(signum, frame):
        raise DeadlineExceeded(f"test exceeded its {seconds}s deadline (hung request?)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# The backend of the suite's sandboxes (the session server's `--backend`, and the default of
# the servers tests start themselves).
SUITE_BACKEND = os.environ.get("PVISOR_E2E_BACKEND", "ns")


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("backend")
    if marker and marker.args[0] != SUITE_BACKEND:
        why = marker.kwargs.get("why") or (marker.args[1] if len(marker.args) > 1 else "")
        pytest.skip(f"{marker.args[0]} sandboxes only (this run's are {SUITE_BACKEND}): {why}")
    item._pvisor_log_offsets = {s.name: s.log_size() for s in _SERVERS}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    offsets = getattr(item, "_pvisor_log_offsets", {})
    for s in _SERVERS:
        state = "running" if s.alive() else f"EXITED with {s.proc.returncode}"
        since = offsets.get(s.name, 0)
        tail = s.log_tail(80, since=since) or "<no log output during this test>"
        rep.sections.append((f"{s.name} ({state}) log during this test: {s.log_path}", tail))
