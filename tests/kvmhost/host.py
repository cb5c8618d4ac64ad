"""Commands and pytest runs in the KVM test host (scripts/kvm-host.sh), for the test lanes that
need a host of their own: a pure cgroup v2 host (tests/cgroupv2) and a host with real KVM where
the project's own VMM boots Linux guests (tests/kvmhost).

Each call boots one host: the results come back through a directory shared writable with it
(`KVM_HOST_SHARE`), pytest's junit XML among them.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KVM_HOST = REPO / "scripts" / "kvm-host.sh"
# Everything in the host runs under TCG (10-30x a hardware host's time): the e2e deadlines and
# health waits scale with this.
DEADLINE_SCALE = 8


@dataclass
class Outcome:
    rc: int
    output: str
    seconds: float
    cases: dict[str, str] = field(default_factory=dict)  # "file.py::name" → passed|failed|error|skipped
    details: dict[str, str] = field(default_factory=dict)


def kernel() -> Path:
    k = os.environ.get("PVISOR_HOST_KERNEL")
    if not k or not Path(k).is_file():
        raise RuntimeError("PVISOR_HOST_KERNEL is not set to a built test host kernel "
                           "(scripts/guest-kernel.sh --kvm-host)")
    return Path(k)


def missing() -> str | None:
    """Why no test host can boot here, or None."""
    if os.geteuid() != 0:
        return "booting the test host from this machine's root (9p passthrough) needs root"
    for tool in ("qemu-system-x86_64", "mke2fs"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        kernel()
    except RuntimeError as e:
        return str(e)
    return None


def run(argv: list[str], env: dict[str, str] | None = None, shares: list[Path] | None = None,
        timeout: float = 3600, memory_mib: int | None = None) -> Outcome:
    """Runs `argv` in a fresh test host; its stdout and stderr come back merged."""
    e = {**os.environ, **(env or {}), "KVM_HOST_TIMEOUT": str(int(timeout))}
    e["KVM_HOST_SHARE"] = ":".join(str(s) for s in shares or [])
    if memory_mib:
        e["KVM_HOST_MEMORY_MIB"] = str(memory_mib)
    t0 = time.monotonic()
    r = subprocess.run([str(KVM_HOST), *argv], env=e, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout + 120)
    return Outcome(r.returncode, r.stdout.decode(errors="replace"), time.monotonic() - t0)


def pytest(tests: list[str], env: dict[str, str], timeout: float = 3600, before: str = "",
           memory_mib: int | None = None, per_test: float = 900) -> Outcome:
    """Runs pytest on `tests` (ids relative to the checkout) in a fresh test host with `env`
    added to this process's; `before` is a shell line run first (its output comes back too).
    A test that runs past `per_test` seconds fails there (pytest-timeout) and the run goes on:
    one hung call must not cost the lane every test after it."""
    python = os.environ.get("PVISOR_PYTHON", sys.executable)
    results = Path(tempfile.mkdtemp(prefix="pvisor-kvm-host-results-"))
    try:
        junit = results / "junit.xml"
        line = " ".join([
            "cd", shlex.quote(str(REPO)), "&&", before or ":", "&&",
            "exec", shlex.quote(python), "-m", "pytest", "-v", "-p", "no:cacheprovider",
            "-o", "junit_family=xunit2", f"--junitxml={shlex.quote(str(junit))}",
            f"--timeout={int(per_test)}", "--timeout-method=signal",
            *(shlex.quote(t) for t in tests),
        ])
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PVISOR_E2E_DEADLINE_SCALE": str(DEADLINE_SCALE),
               "PVISOR_E2E_HEALTH_TIMEOUT": str(30 * DEADLINE_SCALE), **env}
        o = run(["bash", "-c", line], env=env, shares=[results], timeout=timeout, memory_mib=memory_mib)
        if junit.is_file():
            o.cases, o.details = parse_junit(junit.read_text())
        return o
    finally:
        shutil.rmtree(results, ignore_errors=True)


def parse_junit(junit: str) -> tuple[dict[str, str], dict[str, str]]:
    cases, details = {}, {}
    for tc in ET.fromstring(junit).iter("testcase"):
        module = tc.get("classname", "").split(".")[-1] if tc.get("classname") else ""
        file = tc.get("file") or f"{module}.py"
        key = f"{Path(file).name}::{tc.get('name')}"
        outcome, text = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = tc.find(kind)
            if el is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                text = (el.get("message") or "") + "\n" + (el.text or "")
                break
        cases[key] = outcome
        details[key] = text
    return cases, details
