"""The end-to-end subset on a pure cgroup v2 host (guest.py boots it once for the module).

Every test id below must have run and passed inside the guest: a test that failed, erred,
was skipped or did not run at all fails here, so this cannot go green by skipping.
"""
from __future__ import annotations

import os
import shutil

import pytest

import guest

# What the issue asks to see on v2: create, limits enforced and reported, pause/resume through
# the v2 freezer, teardown, and an unprivileged broker with a delegated subtree.
TESTS = [
    "tests/e2e/test_cgroups.py::test_limits_are_written_to_the_sandbox_group",
    "tests/e2e/test_cgroups.py::test_memory_limit_is_enforced_and_the_sandbox_lives_on",
    "tests/e2e/test_cgroups.py::test_pids_limit_is_enforced",
    "tests/e2e/test_cgroups.py::test_cpu_limit_throttles_the_group",
    "tests/e2e/test_cgroups.py::test_pause_freezes_the_sandbox_leaf_and_resume_thaws_it",
    "tests/e2e/test_cgroups.py::test_a_deleted_sandbox_leaves_no_group",
    "tests/e2e/test_lifecycle.py::test_create_and_get_info",
    "tests/e2e/test_lifecycle.py::test_pause_resume",
    "tests/e2e/test_lifecycle.py::test_kill_paused_sandbox",
    "tests/e2e/test_commands.py::test_stdout",
    "tests/e2e/test_commands.py::test_background_status_logs_interrupt",
    "tests/e2e/test_commands.py::test_metrics_sdk",
    "tests/e2e/test_limits.py::test_write_past_the_disk_bound_fails_with_enospc_and_nothing_else_suffers",
    "tests/e2e/test_limits.py::test_tmp_and_shm_are_sized_from_the_limits",
    "tests/e2e/test_nonroot.py::test_unprivileged_broker_serves_sandboxes",
    "tests/e2e/test_limits.py::test_unprivileged_broker_bounds_tmp_and_refuses_a_disk_bound",
]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "booting the guest from the host's root (9p passthrough) needs root"
    for tool in ("qemu-system-x86_64", "mke2fs", "debugfs"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        guest.kernel()
    except RuntimeError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def outcome():
    why = _missing()
    if why:
        if os.environ.get("PVISOR_TEST_STRICT"):
            pytest.fail(f"cannot boot the cgroup v2 guest: {why}", pytrace=False)
        pytest.skip(why)
    o = guest.run(TESTS)
    print(o.console[-20000:])
    return o


def test_the_guest_is_a_pure_cgroup_v2_host(outcome):
    assert "v1 hierarchies: 0" in outcome.console, outcome.console[-3000:]
    assert "cgroup2 controllers:" in outcome.console and "memory" in outcome.console
    assert outcome.rc is not None, f"pytest did not finish in the guest:\n{outcome.console[-5000:]}"


@pytest.mark.parametrize("test_id", TESTS)
def test_passes_on_cgroup_v2(outcome, test_id):
    file, name = test_id.rsplit("/", 1)[1].split("::")
    key = f"{file}::{name}"
    got = outcome.cases.get(key)
    assert got is not None, f"{test_id} did not run in the guest (ran: {sorted(outcome.cases)})\n" \
                            f"{outcome.console[-3000:]}"
    assert got == "passed", f"{test_id}: {got}\n{outcome.details.get(key, '')[-6000:]}"
