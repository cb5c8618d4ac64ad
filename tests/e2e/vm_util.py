"""What the e2e suite knows about vm sandboxes on this host: which engine runs them, the guest
kernel, and the processes that are a sandbox's VMM.

Where hardware virtualization exists (a hardware host, or the KVM test host of
scripts/kvm-host.sh), vm sandboxes run under the project's own VMM (engine `kvm`: the worker is
the VMM) and nothing selects an engine. On these PVM hosts no Linux guest boots under KVM, so the
tests select the test-only QEMU TCG engine (`PVISOR_VM_ENGINE=qemu-tcg`: the worker starts
`qemu-system-x86_64` and serves its devices).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from e2e_util import children_of


def hardware_virtualization() -> bool:
    flags = Path("/proc/cpuinfo").read_text()
    return not Path("/sys/module/kvm_pvm").is_dir() and any(
        f in line.split() for line in flags.splitlines() if line.startswith("flags") for f in ("vmx", "svm")
    )


ENGINE = "kvm" if hardware_virtualization() else "qemu-tcg"
# What a vm server's environment adds to select the engine.
VM_ENV = {} if ENGINE == "kvm" else {"PVISOR_VM_ENGINE": "qemu-tcg"}


def require(what: str, ok: bool) -> None:
    if ok:
        return
    if os.environ.get("CI") == "true" or os.environ.get("PVISOR_TEST_STRICT"):
        pytest.fail(f"{what} is required for the vm backend tests", pytrace=False)
    pytest.skip(f"vm backend: {what} missing")


def guest_kernel() -> Path:
    k = os.environ.get("PVISOR_GUEST_KERNEL", "")
    require("PVISOR_GUEST_KERNEL (scripts/guest-kernel.sh)", bool(k) and Path(k).is_file())
    if ENGINE == "qemu-tcg":
        require("qemu-system-x86_64 (package qemu-system-x86)", shutil.which("qemu-system-x86_64") is not None)
    else:
        require("read-write /dev/kvm", os.access("/dev/kvm", os.R_OK | os.W_OK))
    return Path(k)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def vmm_pids(data_dir: Path, sandbox_id: str) -> set[int]:
    """The processes running sandbox `sandbox_id`'s machine: its worker under the project's
    own VMM (the worker is the VMM), its QEMU under the test engine."""
    rec = json.loads((data_dir / "state" / "sandboxes" / f"{sandbox_id}.json").read_text())
    worker = rec["worker"]["proc"]["pid"]
    if ENGINE == "kvm":
        return {worker}
    return {c for c in children_of(worker) if _comm(c).startswith("qemu-system")}


def all_vmm_pids() -> set[int]:
    """Every process on this host that could be a VMM of the engine in use (workers, or QEMUs)."""
    name = "pvisor-worker" if ENGINE == "kvm" else "qemu-system"
    return {int(d) for d in os.listdir("/proc") if d.isdigit() and _comm(int(d)).startswith(name)}


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists() and _comm(p) != ""}
