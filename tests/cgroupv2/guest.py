"""Runs end-to-end tests on a pure cgroup v2 host: a QEMU TCG guest booted from the build
host's own root (9p, read-only) with the vm backend's guest kernel and `cgroup_no_v1=all`.

The guest's PID 1 (guest-init.sh) mounts what it needs and runs pytest on the test ids it is
given, with the broker, its workers and ns sandboxes inside the guest. The job goes in and the
results come out through an ext4 scratch disk made here (mke2fs -d) and read back with
debugfs, so nothing is mounted on the host.

Usage: python tests/cgroupv2/guest.py TEST_ID...   (as root; PVISOR_GUEST_KERNEL set)
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INIT = REPO / "tests" / "cgroupv2" / "guest-init.sh"
SCRATCH_BYTES = 32 << 30  # sparse; above the default --disk-limit (10Gi), or the broker bounds no disk
GUEST_MIB = 3072
# Emulation is slow (about 10-30x); the e2e deadlines and health waits scale with this.
DEADLINE_SCALE = 8


@dataclass
class Outcome:
    rc: int | None
    console: str
    cases: dict[str, str] = field(default_factory=dict)  # "file.py::name" → passed|failed|error|skipped
    details: dict[str, str] = field(default_factory=dict)


def kernel() -> Path:
    k = os.environ.get("PVISOR_GUEST_KERNEL")
    if not k or not Path(k).is_file():
        raise RuntimeError("PVISOR_GUEST_KERNEL is not set to a built guest kernel (scripts/guest-kernel.sh)")
    return Path(k)


def _job_dir(work: Path, tests: list[str], env: dict[str, str]) -> Path:
    job = work / "disk"
    (job / "job").mkdir(parents=True)
    lines = [f"export {k}={_quote(v)}" for k, v in env.items()]
    (job / "job" / "env").write_text("\n".join(lines) + "\n")
    (job / "job" / "tests").write_text("\n".join(tests) + "\n")
    return job


def _quote(v: str) -> str:
    return "'" + v.replace("'", "'\\''") + "'"


def _scratch(work: Path, job: Path) -> Path:
    img = work / "scratch.img"
    with open(img, "wb") as f:
        f.truncate(SCRATCH_BYTES)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-E", "root_owner=0:0", "-d", str(job), str(img)],
                   check=True)
    return img


def _debugfs_cat(img: Path, path: str) -> str | None:
    r = subprocess.run(["debugfs", "-R", f"cat {path}", str(img)], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 and r.stdout else None


def qemu_command(img: Path, console: Path) -> list[str]:
    cmdline = " ".join([
        "console=ttyS0", "reboot=t", "panic=-1", "quiet",
        "root=/dev/root", "rootfstype=9p", "rootflags=trans=virtio,version=9p2000.L,msize=524288,cache=loose", "ro",
        f"init={INIT}", "cgroup_no_v1=all",
    ])
    return [
        "qemu-system-x86_64", "-M", "microvm,acpi=off", "-cpu", "max", "-smp", "2", "-m", str(GUEST_MIB),
        "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-serial", f"file:{console}",
        "-kernel", str(kernel()), "-append", cmdline,
        "-fsdev", "local,id=root,path=/,security_model=passthrough,readonly=on,multidevs=remap",
        "-device", "virtio-9p-device,fsdev=root,mount_tag=/dev/root",
        "-drive", f"file={img},format=raw,if=none,id=scratch",
        "-device", "virtio-blk-device,drive=scratch",
    ]


def _parse(junit: str) -> tuple[dict[str, str], dict[str, str]]:
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


def run(tests: list[str], timeout: float = 2400, keep: Path | None = None) -> Outcome:
    """Boots the guest on `tests` (pytest ids relative to the checkout) and collects the outcome."""
    python = os.environ.get("PVISOR_PYTHON", sys.executable)
    env = {
        "REPO": str(REPO),
        "PYTHON": python,
        "PVISOR_BIN": os.environ.get("PVISOR_BIN", str(REPO / "target" / "dist" / "pvisor")),
        "PVISOR_TEST_IMAGES": os.environ.get("PVISOR_TEST_IMAGES", "/var/cache/pvisor/test-images"),
        "PVISOR_E2E_ARCHIVES": "busybox.tar",
        "PVISOR_E2E_DEADLINE_SCALE": str(DEADLINE_SCALE),
        "PVISOR_E2E_HEALTH_TIMEOUT": str(30 * DEADLINE_SCALE),
    }
    work = Path(tempfile.mkdtemp(prefix="pvisor-cgv2-"))
    try:
        img = _scratch(work, _job_dir(work, tests, env))
        console = work / "console.log"
        t0 = time.monotonic()
        proc = subprocess.Popen(qemu_command(img, console), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[launcher] guest killed after {timeout:.0f}s\n".encode()
        text = console.read_text(errors="replace") if console.exists() else ""
        text += out.decode(errors="replace")
        text += f"\n[launcher] guest ran {time.monotonic() - t0:.0f}s, qemu exit {proc.returncode}\n"
        rc_text = _debugfs_cat(img, "/results/rc")
        outcome = Outcome(int(rc_text) if rc_text and rc_text.strip().isdigit() else None, text)
        junit = _debugfs_cat(img, "/results/junit.xml")
        if junit:
            outcome.cases, outcome.details = _parse(junit)
        if keep:
            shutil.copy(img, keep)
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str]) -> int:
    o = run(argv or ["tests/e2e/test_cgroups.py"])
    print(o.console)
    for k, v in sorted(o.cases.items()):
        print(f"{v:8} {k}")
    print(f"pytest rc in the guest: {o.rc}")
    return 0 if o.rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
