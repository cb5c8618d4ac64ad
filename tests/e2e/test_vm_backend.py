"""The vm backend end to end: each sandbox a Linux microVM.

Where hardware virtualization exists (the KVM test host of scripts/kvm-host.sh, where
tests/kvmhost runs this file) the guest runs under the project's own VMM: the worker owns
the KVM fd, guest memory and the device models. On these PVM hosts (no Linux guest boots
under KVM) it runs under the test-only QEMU TCG engine (`PVISOR_VM_ENGINE=qemu-tcg`): the
worker starts `qemu-system-x86_64 -M microvm` and serves the guest's virtio-blk (the image's
erofs view from the pool, the sandbox's scratch disk), virtio-vsock (the agent's connection)
and virtio-net itself, as vhost-user back-ends. Either way the image, the agent, the
commands and files take the product path (vm_util.py says which engine runs).

Needs the guest kernel (`PVISOR_GUEST_KERNEL`, set by scripts/test.sh from
scripts/guest-kernel.sh), and qemu-system-x86_64 or a read-write /dev/kvm. Without them the
tests are skipped (and reported so) unless CI=true or PVISOR_TEST_STRICT is set, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import sys
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import SandboxFactory, _make_conn, _start_server, pvisor_bin
from e2e_util import BUSYBOX, DEBIAN, PYTHON, SMALL, assert_error_json, describe, run, sh, stdout_text, wait_until
from vm_util import ENGINE, VM_ENV, all_vmm_pids, alive, guest_kernel, hardware_virtualization, vmm_pids

BACKEND = "pvisor.io/backend"
HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture(scope="module")
def vm_server(tmp_path_factory):
    kernel = guest_kernel()
    srv = _start_server(
        tmp_path_factory,
        "vm",
        ["busybox.tar", "debian-bookworm-slim.tar", "python-3.11-slim.tar"],
        {**VM_ENV, "PVISOR_GUEST_KERNEL": str(kernel)},
        ["--backend", "vm", "--warm-workers", "1"],
    )
    yield srv
    srv.stop()


@pytest.fixture
def vm(vm_server):
    f = SandboxFactory(_make_conn(vm_server.addr))
    yield f
    f.cleanup()


@pytest.fixture(scope="module")
def vm_bb(vm_server):
    f = SandboxFactory(_make_conn(vm_server.addr))
    yield f(BUSYBOX)
    f.cleanup()


# ------------------------------------------------------------ commands and files


def test_a_vm_sandbox_runs_its_own_linux_kernel(vm_bb):
    guest = sh(vm_bb, "uname -r")
    assert guest.startswith("6.1."), f"guest kernel {guest!r} (the host runs {os.uname().release})"
    # Another kernel, whatever its release (the KVM test host runs 6.1 too): another boot.
    assert sh(vm_bb, "cat /proc/sys/kernel/random/boot_id") != HOST_BOOT_ID
    # The agent is init of the guest, and the guest sees only its own processes.
    assert sh(vm_bb, "cat /proc/1/comm") in ("init", "pvisor-agent")
    procs = sh(vm_bb, "ls -d /proc/[0-9]* | wc -l")
    assert int(procs) < 60, f"{procs} processes: the guest must not see the host's"
    assert sh(vm_bb, "hostname").startswith("sandbox-")


def test_commands_stdout_stderr_exit_codes(vm_bb):
    ex = run(vm_bb, "echo out; echo err >&2; exit 7")
    assert ex.exit_code == 7, describe(ex)
    assert [m.text for m in ex.logs.stdout] == ["out"], describe(ex)
    assert [m.text for m in ex.logs.stderr] == ["err"], describe(ex)
    ex = run(vm_bb, "for i in 1 2 3; do echo line$i; done")
    assert stdout_text(ex) == "line1\nline2\nline3", describe(ex)


def test_files_upload_download_list(vm_bb):
    data = "hello from the host\n" * 100
    vm_bb.files.write_file("/tmp/up/hello.txt", data)
    assert vm_bb.files.read_file("/tmp/up/hello.txt") == data
    assert sh(vm_bb, "wc -c < /tmp/up/hello.txt") == str(len(data))
    sh(vm_bb, "echo made-inside > /root/inside.txt")
    assert vm_bb.files.read_file("/root/inside.txt") == "made-inside\n"


def test_the_image_is_read_only_and_writes_land_on_the_scratch_disk(vm_bb):
    mounts = sh(vm_bb, "cat /proc/mounts")
    assert " / overlay " in mounts, mounts
    # Writes over image files go to the overlay's upper (the scratch disk).
    sh(vm_bb, "echo changed > /etc/hostname-copy && rm /bin/true && echo ok")
    assert sh(vm_bb, "cat /etc/hostname-copy") == "changed"
    assert "true" not in sh(vm_bb, "ls /bin").split()


def test_sandboxes_do_not_share_their_writes(vm):
    a = vm(BUSYBOX)
    b = vm(BUSYBOX)
    sh(a, "echo only-a > /etc/marker")
    ex = run(b, "cat /etc/marker")
    assert ex.exit_code != 0, describe(ex)
    assert sh(a, "cat /etc/marker") == "only-a"


def test_debian_and_python_images_boot(vm):
    deb = vm(DEBIAN)
    assert "bookworm" in sh(deb, "cat /etc/os-release") or "12" in sh(deb, "cat /etc/debian_version")
    assert sh(deb, "id -u") == "0"
    py = vm(PYTHON)
    assert sh(py, "python3 -c 'print(6*7)'") == "42"


def test_resource_limits_shape_the_vm(vm):
    sb = vm(BUSYBOX, resource={"cpu": "2", "memory": "256Mi"})
    assert sh(sb, "grep -c ^processor /proc/cpuinfo") == "2", "CPUs become vCPUs"
    total_kib = int(sh(sb, "awk '/^MemTotal/ {print $2}' /proc/meminfo"))
    assert 200 * 1024 < total_kib <= 256 * 1024, f"memory becomes guest RAM: MemTotal {total_kib} KiB"


def _guest_ram_mib(pid: int) -> float:
    """Resident guest RAM of a VMM: the Rss of its guest-RAM memfd mappings."""
    total, in_ram = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", line.split(maxsplit=1)[0]):
            in_ram = "pvisor-guest-ram" in line
        elif in_ram and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total / 1024


def test_memory_the_guest_frees_goes_back_to_the_host(vm, vm_server):
    """Free page reporting (the own VMM's virtio-balloon): 200 MiB the guest fills (page cache of
    a file) and then frees (the file removed) is given back to the host, so an idle guest costs
    what it uses, not what it once touched."""
    if ENGINE != "kvm":
        pytest.skip("free page reporting is a device of the project's own VMM; the QEMU test engine has none")
    sb = vm(BUSYBOX, resource={"cpu": "1", "memory": "512Mi"})
    (pid,) = vmm_pids(vm_server.data_dir, sb.id)
    base = _guest_ram_mib(pid)
    sh(sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>/dev/null && sync")
    filled = _guest_ram_mib(pid)
    assert filled >= base + 150, f"the guest's 200 MiB is not in its RAM: {base:.0f} -> {filled:.0f} MiB"
    sh(sb, "rm /tmp/fill")
    wait_until(lambda: _guest_ram_mib(pid) <= base + 48, 120,
               what=f"the freed 200 MiB to go back to the host (base {base:.0f} MiB, filled {filled:.0f} MiB)")
    assert sh(sb, "echo alive") == "alive", "the guest runs on after its pages were taken back"


def test_the_disk_bound_is_the_scratch_disk_size(vm):
    sb = vm(BUSYBOX, resource={"cpu": "1", "memory": "256Mi", "ephemeral-storage": "64Mi"})
    # The overlay's upper lives on the scratch disk, and an overlay's statfs
    # is its upper's: `df /` shows the scratch disk.
    size_kib = int(sh(sb, "df -k / | awk 'NR==2 {print $2}'"))
    assert 48 * 1024 < size_kib <= 64 * 1024, f"the scratch disk is the bound: {size_kib} KiB"
    ex = run(sb, "dd if=/dev/zero of=/root/fill bs=1M count=100")
    assert ex.exit_code != 0, describe(ex)
    assert "No space left on device" in describe(ex), describe(ex)
    assert sh(sb, "echo still-works") == "still-works"


def test_the_host_filesystem_is_not_reachable(vm_bb, vm_server):
    # Paths that exist on the host: the server's data dir (with this
    # sandbox's own scratch disk in it) and the repository.
    assert vm_server.data_dir.is_dir() and Path(__file__).is_file()
    for p in (vm_server.data_dir, Path(__file__)):
        ex = run(vm_bb, f"ls {p}")
        assert ex.exit_code != 0, f"{p} visible in the guest: {describe(ex)}"
    # No block device but the two the sandbox was given.
    assert sorted(sh(vm_bb, "ls /sys/block").split()) == ["vda", "vdb"]


# ------------------------------------------------------------------ lifecycle


def test_kill_ends_the_vm_and_cleans_up(vm, vm_server):
    sb = vm(BUSYBOX)
    assert sh(sb, "echo up") == "up"
    started = vmm_pids(vm_server.data_dir, sb.id)
    assert alive(started), f"a process runs the sandbox's machine ({ENGINE})"
    state = vm_server.data_dir / "sandboxes" / sb.id
    assert (state / "scratch.img").is_file()
    sb.kill()
    wait_until(lambda: not alive(started), timeout=20, what=f"the sandbox's VMM ({ENGINE}) to exit")
    wait_until(lambda: not state.exists(), timeout=20, what="the sandbox's directory to be removed")
    assert httpx.get(f"{vm_server.url}/v1/sandboxes/{sb.id}").status_code == 404


def test_a_crashed_vm_is_reported_failed_and_cleaned_up(vm, vm_server):
    sb = vm(BUSYBOX)
    assert sh(sb, "echo up") == "up"
    state = vm_server.data_dir / "sandboxes" / sb.id
    # The machine under the sandbox dies (nothing inside the guest can end it:
    # its processes have no CAP_SYS_BOOT).
    ex = run(sb, "reboot -f; echo still-here")
    assert stdout_text(ex).endswith("still-here"), describe(ex)
    for pid in vmm_pids(vm_server.data_dir, sb.id):
        os.kill(pid, 9)
    http = httpx.Client(base_url=vm_server.url)

    def failed():
        r = http.get(f"/v1/sandboxes/{sb.id}")
        return r.status_code == 404 or r.json()["status"]["state"] == "Failed"

    wait_until(failed, timeout=60, what="the sandbox to be reported Failed")
    wait_until(lambda: not state.exists(), timeout=30, what="the failed sandbox's directory to be removed")


def test_guest_processes_get_the_sandbox_privileges_and_cannot_reach_the_agent(vm):
    py = vm(PYTHON)
    # Docker's default capabilities, in every set and in the bounding set;
    # no_new_privs and the sandbox seccomp filter.
    status = sh(py, "cat /proc/self/status")
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    for f in ("CapEff", "CapPrm", "CapBnd"):
        assert int(fields[f].strip(), 16) == 0xA80425FB, status
    assert fields["NoNewPrivs"].strip() == "1", status
    assert fields["Seccomp"].strip() == "2", status
    ex = run(py, "mount -t tmpfs none /mnt")
    assert ex.exit_code != 0, describe(ex)

    # The agent serves the host only: a process in the guest reaching it over
    # vsock loopback (CID 1) is cut off before a byte is answered.
    probe = (
        "import socket\n"
        "s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        "s.settimeout(10)\n"
        "s.connect((1, 1024))\n"
        "s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n')\n"
        "try:\n"
        "    print('answered' if s.recv(64) else 'closed')\n"
        "except OSError as e:\n"
        "    print('closed', e)\n"
    )
    py.files.write_file("/tmp/probe.py", probe)
    ex = run(py, "python3 /tmp/probe.py")
    assert stdout_text(ex).startswith("closed") or ex.exit_code != 0, describe(ex)
    assert "answered" not in stdout_text(ex), describe(ex)


def test_per_sandbox_backend_choice(vm_server):
    conn = _make_conn(vm_server.addr)
    f = SandboxFactory(conn)
    try:
        ns = f(BUSYBOX, extensions={BACKEND: "ns"})
        vmsb = f(BUSYBOX, extensions={BACKEND: "vm"})
        assert sh(ns, "cat /proc/sys/kernel/random/boot_id") == HOST_BOOT_ID, "ns shares the host kernel"
        assert sh(vmsb, "cat /proc/sys/kernel/random/boot_id") != HOST_BOOT_ID, "vm runs a kernel of its own"
        assert sh(vmsb, "uname -r").startswith("6.1.")
    finally:
        f.cleanup()


# ---------------------------------------------------------------- bad input


def test_vm_where_it_cannot_run_is_a_clear_400(http):
    if hardware_virtualization() or os.environ.get("PVISOR_E2E_BACKEND") == "vm":
        pytest.skip("the session server can run vm sandboxes on this host")
    # The session server runs without a vm engine (KVM here is PVM, and it was
    # not given the test engine), so asking for vm is refused before any state.
    body = {"image": {"uri": BUSYBOX}, "entrypoint": ["/bin/sh"], "resourceLimits": SMALL,
            "extensions": {BACKEND: "vm"}}
    r = http.post("/v1/sandboxes", json=body)
    err = assert_error_json(r, 400)
    assert err["code"] == "BACKEND_UNAVAILABLE", err
    assert "vm" in err["message"]
    body["extensions"] = {BACKEND: "firecracker"}
    err = assert_error_json(http.post("/v1/sandboxes", json=body), 400)
    assert err["code"] == "INVALID_BACKEND", err


def _create_fails_and_leaves_nothing(srv) -> dict:
    """Creates a sandbox that cannot start; checks the error and that no
    sandbox, directory or VMM process is left; returns the error body."""
    before = all_vmm_pids()
    r = httpx.post(f"{srv.url}/v1/sandboxes", timeout=60,
                   json={"image": {"uri": BUSYBOX}, "entrypoint": ["/bin/sh"], "resourceLimits": SMALL})
    err = assert_error_json(r, 500)
    assert err["code"] == "SANDBOX_START_FAILED", err
    assert httpx.get(f"{srv.url}/v1/sandboxes").json()["items"] == []
    wait_until(lambda: not list((srv.data_dir / "sandboxes").iterdir()), timeout=20, what="no sandbox directory left")
    wait_until(lambda: not (all_vmm_pids() - before), timeout=20, what=f"no VMM ({ENGINE}) left")
    return err


def test_a_kernel_that_does_not_boot_fails_the_create_and_leaves_nothing(tmp_path_factory, tmp_path):
    guest_kernel()
    bad = tmp_path / "vmlinux"
    bad.write_bytes(b"\x7fELF" + os.urandom(4096))
    srv = _start_server(tmp_path_factory, "vmbad", ["busybox.tar"],
                        {**VM_ENV, "PVISOR_GUEST_KERNEL": str(bad)}, ["--backend", "vm", "--warm-workers", "0"])
    try:
        err = _create_fails_and_leaves_nothing(srv)
        assert "qemu" in err["message"].lower() or "kernel" in err["message"].lower(), err
    finally:
        srv.stop()


def test_a_guest_that_never_answers_fails_at_the_ready_timeout(tmp_path_factory):
    # /init is busybox's init, which waits on the console: the guest boots,
    # but no agent ever listens on vsock.
    guest_kernel()
    srv = _start_server(tmp_path_factory, "vmhang", ["busybox.tar"],
                        {**VM_ENV, "PVISOR_GUEST_KERNEL": os.environ["PVISOR_GUEST_KERNEL"]},
                        ["--backend", "vm", "--warm-workers", "0", "--agent-bin", "/bin/busybox"])
    try:
        err = _create_fails_and_leaves_nothing(srv)
        assert "1024" in err["message"] and "console:" in err["message"], err
    finally:
        srv.stop()


def test_doctor_explains_the_host():
    r = subprocess.run([str(pvisor_bin()), "doctor", "--json"], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PVISOR_VM_ENGINE": ""})
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    names = {c["name"]: c for c in report["checks"]}
    for want in ("virtualization", "/dev/kvm", "cgroups", "fuse", "user namespaces", "guest kernel"):
        assert want in names, report
    if Path("/sys/module/kvm_pvm").is_dir():
        assert "PVM" in names["virtualization"]["detail"]
        assert report["auto"]["backend"] == "ns"
        assert "cannot boot" in report["auto"]["why"]
    elif hardware_virtualization():
        # The KVM test host (scripts/kvm-host.sh), or a hardware host.
        assert "hardware" in names["virtualization"]["detail"], report
        if os.environ.get("PVISOR_GUEST_KERNEL") and os.access("/dev/kvm", os.R_OK | os.W_OK):
            assert report["auto"]["backend"] == "vm", report


def test_the_whole_suite_on_the_project_s_own_vmm():
    """Where hardware virtualization exists, every e2e test again with vm sandboxes
    under the project's own VMM (engine kvm)."""
    if not hardware_virtualization():
        pytest.skip("no hardware virtualization here (KVM is PVM or absent): the vm suite runs under the "
                    "project's own VMM in the KVM test host instead (tests/kvmhost: a subset in scripts/test.sh; all of it "
                    "with scripts/vm-suite.sh)")
    if os.environ.get("PVISOR_E2E_BACKEND") == "vm":
        pytest.skip("this run already is the vm run")
    guest_kernel()
    env = {**os.environ, "PVISOR_E2E_BACKEND": "vm"}
    env.pop("PVISOR_VM_ENGINE", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__).parent)],
                       env=env, timeout=3600)
    assert r.returncode == 0, "the e2e suite failed on the vm backend (output above)"


# -------------------------------------------------------------------- network


def test_the_guest_reaches_netd_through_its_virtio_net_device(vm_bb):
    """Default egress (allow): the worker gave the guest a virtio-net device
    whose link goes to the sandbox's netd. eth0 has the plan's address, the
    MTU the device offers and the default route via netd; resolv.conf points
    at netd. A hard-denied destination (cloud metadata) is refused at once
    with netd's RST: the SYN went guest -> virtio-net -> netd and back."""
    assert sh(vm_bb, "cat /sys/class/net/eth0/mtu") == "65520"
    assert "inet 10.0.2.100/24" in sh(vm_bb, "ip -4 addr show dev eth0")
    resolv = sh(vm_bb, "cat /etc/resolv.conf").splitlines()
    assert "nameserver 10.0.2.3" in resolv, resolv
    routes = [line.split()[:3] for line in sh(vm_bb, "cat /proc/net/route").splitlines()[1:]]
    assert ["eth0", "00000000", "0202000A"] in routes, f"no default route via 10.0.2.2: {routes}"
    ex = run(vm_bb, "nc -w 10 169.254.169.254 80 </dev/null")
    out = (stdout_text(ex) + " ".join(m.text for m in ex.logs.stderr)).lower()
    assert ex.exit_code != 0 and "refused" in out, f"not refused by netd: {describe(ex)}"


def test_a_vm_sandboxs_dns_answers_under_its_policy(vm):
    """netd answers the guest's DNS itself: a name the policy denies is
    NXDOMAIN, decided without any upstream resolver."""
    from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

    policy = NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="*.allowed.test")])
    sb = vm(BUSYBOX, network_policy=policy)
    ex = run(sb, "nslookup denied.test 10.0.2.3")
    out = stdout_text(ex) + " ".join(m.text for m in ex.logs.stderr)
    assert ex.exit_code != 0 and "NXDOMAIN" in out, describe(ex)
    assert sb.get_egress_policy().default_action == "deny"
