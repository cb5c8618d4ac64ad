"""Operators' view of a broker (issue 14): Prometheus `GET /metrics` (parsed by the official
Python client's text parsers), `pvisor ps --json` (backend, worker pid, cgroup), the workers'
process titles, `serve --log-format json`, and the operator CLI (`logs`, `stats`,
`completions`, `exec -it`).

The server of this module has an API key (so /metrics is seen gated) and ends its sandboxes
on exit. The parsers run in their own venv (tests/ops/requirements.txt, scripts/common.sh
`ops_env`, PVISOR_OPS_PYTHON).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from opensandbox.sync import SandboxSync

from conftest import API_KEY, SandboxFactory, _make_conn, _start_server, pvisor_bin
from e2e_util import BUSYBOX, REPO_ROOT, SMALL, assert_error_json, sh, wait_until

KEY = {"OPEN-SANDBOX-API-KEY": API_KEY}
PARSER = REPO_ROOT / "tests" / "ops" / "parse_metrics.py"


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory):
    srv = _start_server(tmp_path_factory, "pvisor-ops", ["busybox.tar"], {"PVISOR_API_KEY": API_KEY},
                        ["--backend", "ns", "--stop-sandboxes-on-exit", "--log-format", "json"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def ops_http(ops_server):
    with httpx.Client(base_url=ops_server.url, timeout=60, headers=KEY) as c:
        yield c


@pytest.fixture
def ops_sandbox(ops_server):
    f = SandboxFactory(_make_conn(ops_server.addr, api_key=API_KEY))
    yield f
    f.cleanup()


def cli(server, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PVISOR_SERVER": server.addr, "PVISOR_API_KEY": API_KEY}
    return subprocess.run([str(pvisor_bin()), *args], capture_output=True, text=True, timeout=timeout, env=env)


def scrape(http: httpx.Client, fmt: str = "prometheus") -> dict:
    """GET /metrics parsed by prometheus_client: {families: {name: type}, samples: {(name, labels): value}}."""
    python = os.environ.get("PVISOR_OPS_PYTHON")
    if not python:
        pytest.skip("PVISOR_OPS_PYTHON is unset: run scripts/common.sh ops_env for the Prometheus parsers")
    accept = "application/openmetrics-text; version=1.0.0" if fmt == "openmetrics" else "text/plain; version=0.0.4"
    r = http.get("/metrics", headers={"Accept": accept})
    assert r.status_code == 200, r.text[:500]
    want = "application/openmetrics-text" if fmt == "openmetrics" else "text/plain; version=0.0.4"
    assert r.headers["content-type"].startswith(want), r.headers
    p = subprocess.run([python, str(PARSER), fmt], input=r.text, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"the {fmt} parser refused the exposition: {p.stderr[-2000:]}\n{r.text[:3000]}"
    out = json.loads(p.stdout)
    samples = {(n, tuple(sorted(l.items()))): v for n, l, v in out["samples"]}
    return {"families": out["families"], "samples": samples, "text": r.text}


def value(m: dict, name: str, **labels: str) -> float:
    return m["samples"].get((name, tuple(sorted(labels.items()))), 0.0)


def series(m: dict, name: str, **labels: str) -> list[dict]:
    """Label sets of the samples of `name` that carry `labels`."""
    return [dict(l) for (n, l) in m["samples"] if n == name and labels.items() <= dict(l).items()]


def test_metrics_is_gated_by_the_api_key(ops_server):
    r = httpx.get(f"{ops_server.url}/metrics", timeout=30)
    assert assert_error_json(r, 401)["code"] == "MISSING_API_KEY"
    r = httpx.get(f"{ops_server.url}/metrics", timeout=30, headers={"OPEN-SANDBOX-API-KEY": "wrong"})
    assert assert_error_json(r, 401)["code"] == "INVALID_API_KEY"


def test_metrics_move_with_creates_commands_and_deletes(ops_http, ops_sandbox):
    before = scrape(ops_http)
    sb = ops_sandbox(BUSYBOX, entrypoint=["tail", "-f", "/dev/null"])
    assert sh(sb, "echo hi").strip() == "hi"
    # Traffic through the sandbox's netd: a DNS query to its resolver (the answer is not needed).
    sh(sb, "nslookup example.invalid 10.0.2.3 >/dev/null 2>&1; true")
    after = scrape(ops_http)
    assert after["families"]["pvisor_sandbox_creates"] == "counter"
    assert after["families"]["pvisor_sandbox_create_duration_seconds"] == "histogram"
    assert after["families"]["pvisor_sandboxes"] == "gauge"

    assert value(after, "pvisor_sandbox_creates_total", backend="ns") == \
        value(before, "pvisor_sandbox_creates_total", backend="ns") + 1
    assert value(after, "pvisor_sandbox_create_duration_seconds_count", backend="ns") == \
        value(before, "pvisor_sandbox_create_duration_seconds_count", backend="ns") + 1
    assert value(after, "pvisor_sandbox_first_command_duration_seconds_count", backend="ns") == \
        value(before, "pvisor_sandbox_first_command_duration_seconds_count", backend="ns") + 1
    running = [s for s in ops_http.get("/v1/sandboxes", params={"pageSize": 200}).json()["items"]
               if s["status"]["state"] == "Running"]
    assert value(after, "pvisor_sandboxes", state="Running", backend="ns") == len(running) >= 1

    assert value(after, "pvisor_sandbox_cpu_seconds_total", sandbox=sb.id, backend="ns") > 0
    assert value(after, "pvisor_sandbox_memory_bytes", sandbox=sb.id, backend="ns") > 0
    assert value(after, "pvisor_sandbox_network_bytes_total", sandbox=sb.id, direction="tx") > 0
    assert value(after, "pvisor_image_pool_images") >= 1
    assert value(after, "pvisor_image_pool_logical_bytes") > 0
    assert value(after, "pvisor_image_servers") >= 1
    assert series(after, "pvisor_image_server_memory_bytes", image=BUSYBOX)

    # A refused create is counted by its code; a delete by its reason, and the
    # sandbox's own series go with it.
    r = ops_http.post("/v1/sandboxes", json={"image": {"uri": "no-such-image:1"}, "resourceLimits": SMALL,
                                             "entrypoint": ["true"], "timeout": 60})
    code = assert_error_json(r)["code"]
    ops_http.delete(f"/v1/sandboxes/{sb.id}").raise_for_status()
    gone = scrape(ops_http)
    assert value(gone, "pvisor_sandbox_create_failures_total", reason=code) == \
        value(after, "pvisor_sandbox_create_failures_total", reason=code) + 1
    assert value(gone, "pvisor_sandbox_deletes_total", reason="api") == \
        value(after, "pvisor_sandbox_deletes_total", reason="api") + 1
    assert not series(gone, "pvisor_sandbox_memory_bytes", sandbox=sb.id)


def test_metrics_in_openmetrics_format(ops_http, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["tail", "-f", "/dev/null"])
    m = scrape(ops_http, "openmetrics")
    assert m["text"].endswith("# EOF\n")
    assert m["families"]["pvisor_sandbox_creates"] == "counter"
    assert value(m, "pvisor_sandbox_memory_bytes", sandbox=sb.id, backend="ns") > 0


def test_ps_shows_backend_worker_pid_and_cgroup(ops_server, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["tail", "-f", "/dev/null"])
    r = cli(ops_server, "ps", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    row = rows[sb.id]
    assert row["backend"] == "ns" and row["state"] == "Running" and row["image"] == BUSYBOX
    pid = row["workerPid"]
    assert Path(f"/proc/{pid}").is_dir()
    # The worker's title carries the sandbox id (ps -ef, top -c, systemd-cgls show cmdline).
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert cmdline == f"pvisor-worker sbx {sb.id}", cmdline
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "pvisor-worker"
    ps = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True, check=True)
    assert sb.id in ps.stdout
    # The cgroup is the worker's (it sits in a leaf beneath it).
    group = Path(row["cgroup"])
    assert group.is_dir(), group
    mine = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    assert any(str(group).endswith(line.split(":", 2)[2].rsplit("/", 1)[0]) for line in mine), (group, mine)
    # The table shows the same.
    r = cli(ops_server, "ps")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(sb.id))
    assert {"ns", str(pid), str(group), "Running"} <= set(line.split()), line


def test_serve_log_format_json(ops_server, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["tail", "-f", "/dev/null"])

    def created_line():
        for line in ops_server.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                rec = json.loads(line)  # every log line is one JSON object
                assert {"timestamp", "level", "fields", "target"} <= rec.keys(), rec
                if rec["fields"].get("message") == "created" and rec["fields"].get("sandbox") == sb.id:
                    return rec
            else:
                assert line.startswith("=== pytest:"), f"not a JSON log line: {line!r}"
        return None

    rec = wait_until(created_line, 30, what="the JSON log line of the create")
    assert rec["level"] == "INFO"


def test_logs_prints_and_follows_the_entrypoint_output(ops_server, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["sh", "-c", "echo first-line; i=0; while [ $i -lt 6 ]; do "
                                                      "sleep 0.5; i=$((i+1)); echo tick-$i; done; echo last-line"])
    wait_until(lambda: "first-line" in cli(ops_server, "logs", sb.id).stdout, 30, what="the first line")
    # -f prints what comes later, and returns once the entrypoint has ended.
    r = cli(ops_server, "logs", "-f", sb.id, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines == ["first-line", *(f"tick-{i}" for i in range(1, 7)), "last-line"], lines
    r = cli(ops_server, "logs", "no-such-sandbox")
    assert r.returncode != 0 and "SANDBOX_NOT_FOUND" in r.stderr, r.stderr


def test_stats_shows_cpu_memory_and_network(ops_server, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["sh", "-c", "while :; do :; done"])  # busy: CPU % > 0
    r = cli(ops_server, "stats", "--no-stream", "--json")
    assert r.returncode == 0, r.stderr
    row = next(x for x in json.loads(r.stdout) if x["id"] == sb.id)
    assert row["state"] == "Running" and row["backend"] == "ns"
    assert row["cpuPercent"] > 10, row
    assert row["memoryBytes"] > 0 and row["pids"] >= 2, row
    assert row["netRxBytes"] is not None and row["netTxBytes"] is not None, row
    r = cli(ops_server, "stats", "--no-stream")
    assert r.returncode == 0, r.stderr
    head, *rest = r.stdout.splitlines()
    assert head.split()[:4] == ["ID", "STATE", "CPU", "%"], head
    line = next(ln for ln in rest if ln.startswith(sb.id))
    assert "Running" in line and "%" in line and "iB" in line, line


@pytest.mark.parametrize("shell,marker", [("bash", "complete -F"), ("zsh", "#compdef pvisor"),
                                          ("fish", "complete -c pvisor")])
def test_completions(shell, marker):
    r = subprocess.run([str(pvisor_bin()), "completions", shell], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert marker in r.stdout and "stats" in r.stdout and "logs" in r.stdout


class Terminal:
    """`pvisor exec -it` on a local pty driven like a person at a terminal."""

    def __init__(self, server, sandbox_id: str, *command: str, rows: int = 24, cols: int = 80):
        import pty as ptymod

        self.master, slave = ptymod.openpty()
        self.resize(rows, cols, signal_child=False)
        env = {**os.environ, "PVISOR_SERVER": server.addr, "PVISOR_API_KEY": API_KEY, "TERM": "xterm"}
        self.proc = subprocess.Popen([str(pvisor_bin()), "exec", "-it", sandbox_id, "--", *command],
                                     stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.seen = b""

    def resize(self, rows: int, cols: int, signal_child: bool = True) -> None:
        import fcntl
        import signal
        import struct
        import termios

        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signal_child:
            os.kill(self.proc.pid, signal.SIGWINCH)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def expect(self, needle: bytes, timeout: float = 30) -> bytes:
        import select

        def found():
            r, _, _ = select.select([self.master], [], [], 0.2)
            if r:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # EIO: the CLI exited
                    pass
            return needle in self.seen

        wait_until(found, timeout, interval=0, what=f"{needle!r} on the terminal (seen {self.seen[-500:]!r})")
        i = self.seen.index(needle) + len(needle)
        before, self.seen = self.seen[:i], self.seen[i:]
        return before

    def close(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait(timeout=30)
        os.close(self.master)
        return rc


def test_exec_it_types_resizes_and_interrupts(ops_server, ops_sandbox):
    sb = ops_sandbox(BUSYBOX, entrypoint=["tail", "-f", "/dev/null"])
    t = Terminal(ops_server, sb.id, "sh", rows=30, cols=100)
    try:
        t.send(b"PS1='$ '; echo hi-$((40+2))\r")
        t.expect(b"hi-42")  # typed, echoed by the remote pty, run
        t.send(b"tty; stty size\r")
        t.expect(b"/dev/pts/")
        t.expect(b"30 100")
        t.resize(50, 132)  # SIGWINCH to the CLI: the new size goes along
        t.expect(b"$ ")

        def size_is_new():  # the resize and the next keys travel separately: ask until it shows
            t.send(b"stty size\r")
            return b"50 132" in t.expect(b"$ ")

        wait_until(size_is_new, 30, interval=0.2, what="the new window size in the sandbox")
        t.send(b"sleep 1000\r")
        wait_until(lambda: "sleep 1000" in sh(sb, "ps -o args"), 30, what="the sleep in the sandbox")
        t.send(b"\x03")  # Ctrl-C in raw mode: a byte for the remote line discipline
        t.expect(b"$ ")
        t.send(b"echo after-sleep-$?\r")
        t.expect(b"after-sleep-130")
        t.send(b"exit 7\r")
        assert t.proc.wait(timeout=30) == 7
    finally:
        t.close()


def test_exec_it_errors(ops_server):
    r = cli(ops_server, "exec", "-it", "no-such-sandbox", "--", "sh")
    assert r.returncode != 0 and "SANDBOX_NOT_FOUND" in r.stderr, r.stderr
