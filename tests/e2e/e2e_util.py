"""Shared helpers for the pvisor end-to-end tests (imported by the test modules)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from opensandbox.models.execd import Execution, RunCommandOpts, _format_output_messages
from opensandbox.sync import SandboxSync

REPO_ROOT = Path(__file__).resolve().parents[2]

# Image tags the suite imports before starting the server (see conftest.py).
BUSYBOX = "busybox:latest"
BUSYBOX_OCI = "busybox-oci:latest"
DEBIAN = "debian:bookworm-slim"
PYTHON = "python:3.11-slim"
TOOLS = "pvisor/python-tools:latest"

# What every sandbox of the suite asks for unless a test says otherwise.
SMALL = {"cpu": "1", "memory": "512Mi"}
# Multiplies every deadline of the suite, for slow emulated hosts (the KVM test host runs
# everything under TCG).
DEADLINE_SCALE = float(os.environ.get("PVISOR_E2E_DEADLINE_SCALE", "1"))

# Lists the command line of every process visible in the sandbox, one per line
# (works with busybox and procps alike).
PS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"

EXECD_PORT = 44772
EGRESS_PORT = 18080


# A create body of the raw API that succeeds (what the SDK sends by default).
RAW_CREATE = {
    "image": {"uri": BUSYBOX},
    "timeout": 600,
    "resourceLimits": SMALL,
    "entrypoint": ["tail", "-f", "/dev/null"],
    "secureAccess": False,
}


def create_body(base: dict = RAW_CREATE, /, **changes: Any) -> dict:
    """A deep copy of `base` with `changes` applied; a change to `...` removes the field."""
    body = json.loads(json.dumps(base))
    for k, v in changes.items():
        if v is ...:
            body.pop(k, None)
        else:
            body[k] = v
    return body


# A warm worker's disk made ahead: `<data>/sandboxes/.ahead-<slot>`, not a sandbox's.
AHEAD = ".ahead-"


def sandbox_dirs(srv) -> set[str]:
    """The sandboxes' state dirs (not the warm workers' disks made ahead)."""
    d = srv.data_dir / "sandboxes"
    return {p.name for p in d.iterdir() if not p.name.startswith(AHEAD)} if d.is_dir() else set()


def stdout_text(ex: Execution) -> str:
    """Stdout as the SDK renders it (lines joined with \\n, no trailing newline)."""
    return _format_output_messages(ex.logs.stdout)


def stderr_text(ex: Execution) -> str:
    return _format_output_messages(ex.logs.stderr)


def describe(ex: Execution, limit: int = 20) -> str:
    """A compact description of an Execution for assertion messages."""
    out = [m.text for m in ex.logs.stdout]
    err = [m.text for m in ex.logs.stderr]

    def clip(lines: list[str]) -> str:
        if len(lines) <= limit:
            return repr(lines)
        return f"{lines[:limit]!r} ... ({len(lines)} events)"

    error = None
    if ex.error is not None:
        error = f"{ex.error.name}: {ex.error.value} {ex.error.traceback}"
    return (
        f"id={ex.id} exit_code={ex.exit_code} complete={ex.complete is not None} "
        f"error={error} stdout={clip(out)} stderr={clip(err)}"
    )


def run(sb: SandboxSync, command: str, **opts: Any) -> Execution:
    """Runs a command through the SDK; keyword args become RunCommandOpts fields."""
    if "timeout_ms" in opts:
        opts["timeout"] = timedelta(milliseconds=opts.pop("timeout_ms"))
    return sb.commands.run(command, opts=RunCommandOpts(**opts) if opts else None)


def sh(sb: SandboxSync, command: str, **opts: Any) -> str:
    """Runs a command that must succeed and returns its stdout text."""
    ex = run(sb, command, **opts)
    assert ex.exit_code == 0, f"command {command!r} failed: {describe(ex)}"
    return stdout_text(ex)


def wait_until(
    pred: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Polls pred() until it returns a truthy value; returns that value."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
            last_exc = None
        except Exception as e:  # noqa: BLE001 - reported on timeout
            last_exc = e
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}"
                + (f" (last error: {last_exc!r})" if last_exc else "")
            )
        time.sleep(interval)


def dataplane(sb: SandboxSync, port: int = EXECD_PORT) -> tuple[str, dict[str, str]]:
    """Base URL and headers (the per-sandbox token) of a sandbox's endpoint."""
    ep = sb.get_endpoint(port)
    assert "://" not in ep.endpoint, f"endpoint must have no scheme: {ep.endpoint!r}"
    return f"http://{ep.endpoint.rstrip('/')}", dict(ep.headers or {})


def assert_error_json(resp: httpx.Response, status: int | tuple[int, ...] | None = None) -> dict:
    """Asserts an error response with a JSON {code, message} body; returns the body."""
    ctx = f"{resp.request.method} {resp.request.url} -> {resp.status_code} {resp.text[:500]!r}"
    if isinstance(status, int):
        assert resp.status_code == status, ctx
    elif status is not None:
        assert resp.status_code in status, ctx
    else:
        assert 400 <= resp.status_code < 500, ctx
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {ctx}") from None
    assert isinstance(body, dict), ctx
    assert isinstance(body.get("code"), str) and body["code"], ctx
    assert isinstance(body.get("message"), str), ctx
    return body


def find_nulls(obj: Any, path: str = "$") -> list[str]:
    """JSON paths whose value is null (the SDK's parsers reject nulls in optional fields)."""
    found: list[str] = []
    if obj is None:
        found.append(path)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            found.extend(find_nulls(v, f"{path}.{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.extend(find_nulls(v, f"{path}[{i}]"))
    return found


def list_all_ids(http: httpx.Client) -> set[str]:
    """Ids of every sandbox the server knows (raw API, all pages)."""
    ids: set[str] = set()
    page = 1
    while True:
        r = http.get("/v1/sandboxes", params={"page": page, "pageSize": 200})
        assert r.status_code == 200, f"list failed: {r.status_code} {r.text[:300]}"
        body = r.json()
        ids.update(item["id"] for item in body["items"])
        if not body["pagination"]["hasNextPage"]:
            return ids
        page += 1


def wait_healthy(port: int, proc, why: Callable[[], str], timeout: float = 30) -> None:
    """Waits until the server on `port` answers /health; fails with `why()`
    if its process `proc` exits first or the timeout passes (scaled by
    PVISOR_E2E_DEADLINE_SCALE, for slow emulated guests)."""
    deadline = time.monotonic() + timeout * DEADLINE_SCALE
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, f"server exited: {why()}"
        assert time.monotonic() < deadline, f"server did not come up: {why()}"
        time.sleep(0.05)


# ---------------------------------------------------------------- network probes (test_network.py)

NETPROBE_DIR = "/tmp/netprobe"
# What a blocked connection must look like: an immediate refusal or reset, never a timeout.
BLOCKED = ("refused", "reset")


def install_netprobe(sb: SandboxSync, ca_pem: bytes | None = None) -> None:
    """Puts netprobe.py (and networld's dnswire.py, and the test CA) into a python sandbox."""
    here = Path(__file__).resolve().parent
    sh(sb, f"mkdir -p {NETPROBE_DIR}")
    sb.files.write_file(f"{NETPROBE_DIR}/netprobe.py", (here / "netprobe.py").read_text())
    sb.files.write_file(f"{NETPROBE_DIR}/dnswire.py", (here.parent / "networld" / "dnswire.py").read_text())
    if ca_pem is not None:
        sb.files.write_file(f"{NETPROBE_DIR}/ca.pem", ca_pem.decode())


def netprobe(sb: SandboxSync, *args: Any) -> dict:
    """Runs `netprobe.py ARGS` in the sandbox; its JSON result (kind: ok, refused, ...)."""
    import json
    import shlex

    cmd = "python3 " + shlex.join([f"{NETPROBE_DIR}/netprobe.py", *map(str, args)])
    ex = run(sb, cmd)
    out = stdout_text(ex).strip().splitlines()
    assert ex.exit_code == 0 and out, f"netprobe {args} failed: {describe(ex)}"
    res = json.loads(out[-1])
    res["probe"] = " ".join(map(str, args))
    if os.environ.get("PVISOR_E2E_NETPROBE_LOG"):  # see what each probe met (pytest -s)
        print(f"netprobe {res}")
    return res


def children_of(parent: int) -> list[int]:
    """The processes whose parent is `parent`, by each one's PPid (/proc/PID/task/*/children needs
    CONFIG_PROC_CHILDREN, which the KVM test host's kernel lacks)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        if any(line.split() == ["PPid:", str(parent)] for line in status.splitlines()):
            out.append(int(d.name))
    return out
