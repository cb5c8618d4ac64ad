"""The vm backend for real: in the KVM test host (scripts/kvm-host.sh: QEMU TCG with nested SVM,
a real /dev/kvm), `pvisor serve --backend vm` boots every sandbox under the worker's own VMM
(memfd RAM, PVH, virtio-mmio blk/vsock/net, per-thread seccomp filters) and the official SDK
drives it. No PVISOR_VM_ENGINE is set there.

Three boots of the host, one per fixture:
- `vmm_guests`: the vmm crate's test guests and the worker's own-VMM tests, under kvm_amd;
- `host_facts`: what the host is (`pvisor doctor`, `--backend auto`);
- `lane`: the e2e tests below with PVISOR_E2E_BACKEND=vm, a subset chosen so that every part of
  the vm path issue 20 names runs in CI (commands, sessions, files, code interpreter, network and
  egress through virtio-net and netd, volumes (refused on vm), limits, snapshots, templates,
  memory merging, pause/resume, expiry, broker kill -9 and re-adoption, fault injection, the
  hostile-tenant probes from inside the guest, cleanup). The whole e2e suite on vm runs with
  scripts/vm-suite.sh.

Every listed test must have run and passed in the host: failed, erred, skipped or missing all
fail here, so the lane cannot go green by skipping.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import host

REPO = host.REPO

# (file, test) pairs, grouped by what they cover.
LANE = [
    # the guest, commands, files, limits, network (virtio-net ↔ netd), cleanup, failures
    "tests/e2e/test_vm_backend.py",
    # sessions and commands through the session server's vm sandboxes
    "tests/e2e/test_commands.py::test_background_status_logs_interrupt",
    "tests/e2e/test_commands.py::test_session_state_persists",
    "tests/e2e/test_commands.py::test_uid_cannot_write_root_files",
    "tests/e2e/test_commands.py::test_2000_lines_in_order",
    "tests/e2e/test_files.py::test_binary_5mib_round_trip",
    "tests/e2e/test_files.py::test_search",
    "tests/e2e/test_files.py::test_owner_and_group",
    "tests/e2e/test_code_interpreter.py::test_state_persists_across_runs",
    "tests/e2e/test_code_interpreter.py::test_interrupt_a_busy_loop_and_reuse_the_context",
    # lifecycle: pause/resume, expiry
    "tests/e2e/test_lifecycle.py::test_pause_resume",
    "tests/e2e/test_lifecycle.py::test_kill_paused_sandbox",
    "tests/e2e/test_lifecycle.py::test_expiry_deletes_sandbox",
    "tests/e2e/test_lifecycle.py::test_renew_moves_expiry",
    # egress policy served for vm sandboxes, kept across a pause
    "tests/e2e/test_egress_api.py::test_create_with_policy_is_normalised",
    "tests/e2e/test_egress_api.py::test_policy_survives_pause_resume",
    # volumes: refused on vm, before any state
    "tests/e2e/test_volumes.py::test_volumes_are_refused_on_vm",
    # snapshots (memory file mapped copy-on-write) and templates
    "tests/e2e/test_vm_snapshots.py",
    "tests/e2e/test_vm_templates.py",
    # memory merging of guest RAM
    "tests/e2e/test_memory_merge.py::test_identical_memory_of_four_sandboxes_merges_and_survives_unique_rewrites",
    # durability: broker kill -9, re-adoption, a worker (the VMM) killed meanwhile
    "tests/e2e/test_durability.py::test_sandbox_survives_the_broker[sigkill]",
    "tests/e2e/test_durability.py::test_paused_sandbox_stays_paused_across_a_restart",
    "tests/e2e/test_durability.py::test_worker_killed_while_the_broker_is_down",
    # fault injection: worker (VMM) and agent killed at random points
    "tests/e2e/test_fault_injection.py::test_worker_agent_and_image_server_killed_at_random_points[root]",
    # the hostile tenant, from inside the guest
    "tests/e2e/test_hostile_tenant.py::test_kernel_surface_is_refused[root]",
    "tests/e2e/test_hostile_tenant.py::test_broker_sockets_and_api_are_out_of_reach[root]",
    "tests/e2e/test_hostile_tenant.py::test_host_identity_of_a_sandbox[root]",
]

# The vmm crate's test binaries that run guests on /dev/kvm (the qemu_* ones run QEMU TCG:
# not in an emulated host), and the worker's own-VMM tests.
VMM_TESTS = ["guests", "pvh", "pause", "snapshot", "seccomp", "ksm", "teardown", "virtio_guests",
             "virtio_vsock_fd_exhaustion"]


def _skip_or_fail(why: str):
    if os.environ.get("PVISOR_TEST_STRICT"):
        pytest.fail(f"cannot boot the KVM test host: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def ready():
    why = host.missing()
    if why:
        _skip_or_fail(why)
    if not os.environ.get("PVISOR_GUEST_KERNEL"):
        _skip_or_fail("PVISOR_GUEST_KERNEL is not set (scripts/guest-kernel.sh)")


def _test_executables() -> dict[str, str]:
    """name → path of the debug test binaries of pvisor-vmm and pvisor-worker (built by the
    suite's `cargo test`; rebuilt here if stale)."""
    out = subprocess.run(["cargo", "test", "--locked", "-p", "pvisor-vmm", "-p", "pvisor-worker", "--no-run",
                          "--message-format=json"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    exes = {}
    for line in out.splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
            name = "pvisor_worker_lib" if m["target"]["name"] == "pvisor_worker" and "lib" in m["target"]["kind"] \
                else m["target"]["name"]
            exes[name] = m["executable"]
    return exes


@pytest.fixture(scope="module")
def vmm_guests(ready):
    exes = _test_executables()
    missing = [t for t in VMM_TESTS + ["pvisor_worker_lib"] if t not in exes]
    assert not missing, f"no test executable for {missing}"
    lines = [f"echo '== {t}'; {exes[t]} --test-threads=1 2>&1" for t in VMM_TESTS]
    # The worker's engine with the whole device set on a counting PVH guest.
    lines.append(f"echo '== worker vm::kvm'; {exes['pvisor_worker_lib']} --test-threads=1 vm::kvm 2>&1")
    o = host.run(["bash", "-c", "; ".join(lines)], timeout=1800)
    print(o.output[-20000:])
    return o


def _results(output: str) -> dict[str, str]:
    """'== name' sections → their libtest summary line."""
    res, name = {}, None
    for line in output.splitlines():
        if line.startswith("== "):
            name = line[3:].strip()
        elif name and line.startswith("test result:"):
            res[name] = line
    return res


@pytest.mark.parametrize("name", VMM_TESTS + ["worker vm::kvm"])
def test_vmm_test_guests_run_under_kvm_amd(vmm_guests, name):
    got = _results(vmm_guests.output).get(name)
    assert got is not None, f"{name}: no test result in the host\n{vmm_guests.output[-4000:]}"
    assert got.startswith("test result: ok.") and " 0 failed" in got, got
    passed = int(got.split("ok.")[1].split("passed")[0])
    assert passed > 0, f"{name}: nothing ran: {got}"


@pytest.fixture(scope="module")
def host_facts(ready):
    pvisor = os.environ.get("PVISOR_BIN", str(REPO / "target" / "dist" / "pvisor"))
    line = ("grep -ow -E 'svm|npt' /proc/cpuinfo | sort -u | tr '\\n' ' '; echo; "
            f"ls -l /dev/kvm; {pvisor} doctor --json")
    o = host.run(["bash", "-c", line], timeout=600)
    print(o.output[-5000:])
    return o


def test_the_host_has_hardware_kvm_and_auto_picks_vm(host_facts):
    assert host_facts.rc == 0, host_facts.output[-3000:]
    first, rest = host_facts.output.split("\n", 1)
    assert {"svm", "npt"} <= set(first.split()), first
    report = json.loads(rest[rest.index("{"):])
    checks = {c["name"]: c for c in report["checks"]}
    assert "hardware" in checks["virtualization"]["detail"], report
    assert report["auto"]["backend"] == "vm", report


@pytest.fixture(scope="module")
def lane(ready):
    env = {"PVISOR_E2E_BACKEND": "vm", "PVISOR_READY_TIMEOUT_SECS": "60", "PVISOR_TEST_STRICT": "1"}
    o = host.pytest(LANE, env, timeout=3600)
    print(o.output[-30000:])
    print(f"the vm lane ran {o.seconds:.0f} s in the KVM test host")
    return o


def _lane_ids() -> list[str]:
    """The lane's test ids as junit names them (files expand to their tests)."""
    return [t for t in LANE if "::" in t]


def test_the_lane_ran(lane):
    assert lane.cases, f"pytest did not finish in the host (exit {lane.rc}):\n{lane.output[-5000:]}"
    not_passed = {k: v for k, v in lane.cases.items() if v != "passed"}
    assert not not_passed, "\n\n".join(f"{k}: {v}\n{lane.details.get(k, '')[-3000:]}" for k, v in not_passed.items())
    for f in {t.split("::")[0] for t in LANE if "::" not in t}:
        name = Path(f).name
        assert any(k.startswith(f"{name}::") for k in lane.cases), f"no test of {f} ran"


@pytest.mark.parametrize("test_id", _lane_ids())
def test_passes_with_vm_sandboxes(lane, test_id):
    file, name = test_id.rsplit("/", 1)[1].split("::")
    key = f"{file}::{name}"
    got = lane.cases.get(key)
    assert got is not None, f"{test_id} did not run in the host (ran: {sorted(lane.cases)})"
    assert got == "passed", f"{test_id}: {got}\n{lane.details.get(key, '')[-6000:]}"
