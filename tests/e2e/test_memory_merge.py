"""Memory merging (issue 13): `pvisor serve --memory-merge` opts every
sandbox into kernel same-page merging and turns the host's KSM on.

ns sandboxes are opted in by `prctl(PR_SET_MEMORY_MERGE)` (Linux 6.4+); a vm sandbox's guest
RAM is private memory marked MADV_MERGEABLE by its VMM (PVISOR_E2E_BACKEND=vm, in the KVM test
host): `test_identical_guest_memory_of_four_vm_sandboxes_merges`.

Four sandboxes hold the same 64 MiB of deterministic data (bench/peer/hold,
one word pattern for all): their merged page counts rise, the charge of
their four memory cgroups drops well below four copies, and after each
rewrites its data uniquely every word verifies (no corruption through
merging). Sandboxes of a server without the flag hold the same data while
ksmd runs and merge nothing. The host's KSM settings are put back when the
server stops with no sandbox left; an unprivileged broker leaves them alone
and reports whether KSM runs, and its sandboxes are mergeable all the same.
"""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from opensandbox.models.execd import RunCommandOpts
from opensandbox.sync.sandbox import SandboxSync

from conftest import SUITE_BACKEND, _make_conn, _start_server, free_port, images_dir, pvisor_bin
from e2e_util import BUSYBOX, REPO_ROOT, dataplane, sh, wait_healthy, wait_until
from test_nonroot import as_user, delegated  # noqa: F401 (fixture)
from user_files import binary_for_others, for_others

KSM = Path("/sys/kernel/mm/ksm")
MiB = 1 << 20
HOLD_MIB = 64
PAGE = os.sysconf("SC_PAGE_SIZE")
PAGES = HOLD_MIB * MiB // PAGE
RES = {"cpu": "1", "memory": "512Mi"}

GAMMA = 0x9E3779B97F4A7C15
SHARED_SEED = 0x5EED5EED5EED5EED
M64 = (1 << 64) - 1

pytestmark = [
    pytest.mark.skipif(not (KSM / "run").exists(), reason="this kernel has no KSM (/sys/kernel/mm/ksm)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="turning the host's KSM on needs a root broker"),
]
NS_ONLY = "an ns sandbox's processes are opted in one by one (prctl; /proc/PID/ksm_stat)"


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _fnv1a(s: str) -> int:
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def expected(kind: str, seed: int, words: int) -> str:
    """What hold writes after verifying `words` words of the sequence of `seed`."""
    return f"{kind} {words} {_mix64((seed + GAMMA) & M64):016x} {_mix64((seed + words * GAMMA) & M64):016x}"


def build_hold(tmp: Path) -> bytes:
    """bench/peer/hold/hold.c, static, so it runs in any image."""
    exe = tmp / "hold"
    subprocess.run(["gcc", "-static", "-O2", "-s", "-o", str(exe), str(REPO_ROOT / "bench/peer/hold/hold.c")],
                   check=True)
    return exe.read_bytes()


def start_hold(sb: SandboxSync, hold: bytes, mib: int, token: str) -> None:
    sb.files.write_file("/tmp/hold", hold, mode=755)
    sb.commands.run(f"/tmp/hold {mib} {token} /tmp", opts=RunCommandOpts(background=True))


def cat(sb: SandboxSync, path: str) -> str:
    return sh(sb, f"cat {path} 2>/dev/null || true").strip()


def metrics(sb: SandboxSync) -> dict:
    url, headers = dataplane(sb)
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    r.raise_for_status()
    return r.json()


def ksm_file(name: str) -> int:
    return int((KSM / name).read_text())


@pytest.fixture(scope="module")
def merge_server(tmp_path_factory):
    before = {k: (KSM / k).read_text() for k in ("run", "pages_to_scan", "sleep_millisecs")}
    srv = _start_server(tmp_path_factory, "pvisor-merge", ["busybox.tar"], {},
                        ["--memory-merge", "--stop-sandboxes-on-exit", "--warm-workers", "1", "--backend", SUITE_BACKEND])
    yield srv, before
    srv.stop()


@pytest.fixture(scope="module")
def hold(tmp_path_factory) -> bytes:
    return build_hold(tmp_path_factory.mktemp("hold"))


@pytest.mark.deadline(400)
@pytest.mark.backend("ns", why=NS_ONLY)
def test_identical_memory_of_four_sandboxes_merges_and_survives_unique_rewrites(merge_server, sandbox, hold):
    srv, _ = merge_server
    conn = _make_conn(srv.addr)
    assert ksm_file("run") == 1, "the broker turned KSM on"
    assert ksm_file("pages_to_scan") == 1000 and ksm_file("sleep_millisecs") == 20
    boxes = [sandbox(BUSYBOX, conn=conn, resource=RES) for _ in range(4)]
    idle = sum(metrics(sb)["mem_used_mib"] for sb in boxes)
    assert all(metrics(sb)["memory_merge"] is True for sb in boxes)
    # The init's opt-in reaches every process the sandbox starts (here: the agent's shell's cat).
    assert "ksm_merge_any: yes" in sh(boxes[0], "cat /proc/self/ksm_stat")
    tokens = [uuid.uuid4().hex for _ in boxes]
    for sb, tok in zip(boxes, tokens):
        start_hold(sb, hold, HOLD_MIB, tok)
    words = HOLD_MIB * MiB // 8
    for sb in boxes:
        got = wait_until(lambda: cat(sb, "/tmp/hold.ready"), 60, 0.5, "hold.ready")
        assert got == expected("identical", SHARED_SEED, words), got

    # ksmd merges within a few full scans: every sandbox's 64 MiB ends up backed by merged pages.
    def merged():
        m = [metrics(sb) for sb in boxes]
        pages = [x["ksm_merging_pages"] for x in m]
        return m if min(pages) >= 0.9 * PAGES else None
    m = wait_until(merged, 180, 1.0, f"each sandbox's {PAGES} pages merged")
    # Counted once per page of the sandbox (hold's, plus a few of its other processes), not per hierarchy.
    assert all(x["ksm_merging_pages"] <= PAGES + 2048 for x in m), [x["ksm_merging_pages"] for x in m]
    held = sum(x["mem_used_mib"] for x in m) - idle
    # Four copies would be 256 MiB more than idle; one shared copy plus bookkeeping is far less.
    assert held < 2 * HOLD_MIB, f"4 x {HOLD_MIB} MiB identical data still charge {held:.1f} MiB over idle"
    total = httpx.get(f"{srv.url}/pvisor/memory-merge", timeout=30).json()
    assert total["enabled"] is True and total["control"] == {"control": "pvisor"}, total
    assert total["host"]["pages_sharing"] >= 3 * 0.9 * PAGES, total["host"]
    ours = {s["id"]: s for s in total["sandboxes"]}
    assert all(ours[sb.id]["merging_pages"] >= 0.9 * PAGES for sb in boxes), ours
    cli = subprocess.run([str(srv.binary), "memory-merge", "--server", srv.addr], capture_output=True, text=True,
                         check=True).stdout
    assert "memory merge: on" in cli and all(sb.id in cli for sb in boxes), cli

    # Each rewrites its data uniquely (writes into merged pages break them apart) and verifies every word.
    for sb in boxes:
        sh(sb, "kill -USR1 $(cat /tmp/hold.pid)")
    for sb, tok in zip(boxes, tokens):
        got = wait_until(lambda: cat(sb, "/tmp/hold.unique"), 120, 0.5, "hold.unique")
        assert got == expected("ok", _fnv1a(tok), words), f"{sb.id}: {got}"
    # A write breaks the merged page at once; the count drops when ksmd next scans the page (its
    # old stable entry), later on a loaded host.
    merged = lambda: [metrics(sb)["ksm_merging_pages"] for sb in boxes]  # noqa: E731
    wait_until(lambda: max(merged()) < 0.1 * PAGES, 60, 0.5, f"unique data unmerged (merging pages: {merged()})")


@pytest.mark.deadline(900)
@pytest.mark.backend("vm", why="the ns variant is the test above")
def test_identical_guest_memory_of_four_vm_sandboxes_merges(merge_server, sandbox, hold):
    """Four vm sandboxes hold the same 64 MiB: the pages are in four guests' RAM, which their
    VMMs made mergeable, so ksmd merges them across the VMs (the worker counts its VMM's merged
    pages); after unique rewrites every word verifies and the merging is gone."""
    srv, _ = merge_server
    conn = _make_conn(srv.addr)
    assert ksm_file("run") == 1, "the broker turned KSM on"
    boxes = [sandbox(BUSYBOX, conn=conn, resource=RES) for _ in range(4)]
    assert all(metrics(sb)["memory_merge"] is True for sb in boxes)
    tokens = [uuid.uuid4().hex for _ in boxes]
    for sb, tok in zip(boxes, tokens):
        start_hold(sb, hold, HOLD_MIB, tok)
    words = HOLD_MIB * MiB // 8
    for sb in boxes:
        got = wait_until(lambda: cat(sb, "/tmp/hold.ready"), 180, 0.5, "hold.ready")
        assert got == expected("identical", SHARED_SEED, words), got

    # The guest's page cache and kernel hold more identical pages than hold's (each guest has
    # the same kernel and image): at least hold's 64 MiB per VM end up merged.
    def merged():
        m = [metrics(sb) for sb in boxes]
        return m if min(x["ksm_merging_pages"] for x in m) >= 0.9 * PAGES else None
    wait_until(merged, 400, 2.0, f"each VM's {PAGES} pages merged")
    total = httpx.get(f"{srv.url}/pvisor/memory-merge", timeout=30).json()
    assert total["host"]["pages_sharing"] >= 3 * 0.9 * PAGES, total["host"]

    # The merge counters (the VMM's ksm_merging_pages, pages_sharing) move only as ksmd's scans
    # go by, and ksmd is still merging the guests' other identical pages (under emulation it is
    # slow): read the peak two full scans after the hold merged, and the rest two full scans
    # after the rewrite, so that what drops between them is the unique data.
    def two_full_scans():
        scans = ksm_file("full_scans")
        wait_until(lambda: ksm_file("full_scans") >= scans + 2, 400, 1.0, "two full ksmd scans")

    two_full_scans()
    peak = [metrics(sb)["ksm_merging_pages"] for sb in boxes]
    for sb in boxes:
        sh(sb, "kill -USR1 $(cat /tmp/hold.pid)")
    for sb, tok in zip(boxes, tokens):
        got = wait_until(lambda: cat(sb, "/tmp/hold.unique"), 240, 0.5, "hold.unique")
        assert got == expected("ok", _fnv1a(tok), words), f"{sb.id}: {got}"
    two_full_scans()
    after = [metrics(sb)["ksm_merging_pages"] for sb in boxes]
    print(f"\nksm_merging_pages per VM: {peak} -> {after} ({PAGES} pages of unique data each)")
    assert all(p - a >= 0.8 * PAGES for p, a in zip(peak, after)), f"unique data stayed merged: {peak} -> {after}"


@pytest.mark.deadline(300)
def test_sandboxes_of_a_server_without_the_flag_merge_nothing(merge_server, sandbox, hold):
    # Two sandboxes of the merge server and two of the suite's server (no
    # --memory-merge) hold the same 16 MiB: ksmd runs and merges the first
    # two with each other, and leaves the other two alone.
    srv, _ = merge_server
    assert ksm_file("run") == 1
    merging = [sandbox(BUSYBOX, conn=_make_conn(srv.addr), resource=RES) for _ in range(2)]
    plain = [sandbox(BUSYBOX, resource=RES) for _ in range(2)]
    for sb in merging + plain:
        start_hold(sb, hold, 16, uuid.uuid4().hex)
    for sb in merging + plain:
        wait_until(lambda: cat(sb, "/tmp/hold.ready"), 60, 0.5, "hold.ready")
    pages = 16 * MiB // PAGE
    wait_until(lambda: min(metrics(sb)["ksm_merging_pages"] for sb in merging) >= 0.9 * pages, 180, 1.0,
               "the merge server's sandboxes to merge")
    start = ksm_file("full_scans")
    wait_until(lambda: ksm_file("full_scans") >= start + 2, 120, 0.5, "two more full KSM scans")
    for sb in plain:
        m = metrics(sb)
        assert m["memory_merge"] is False and m["ksm_merging_pages"] == 0, m
        if SUITE_BACKEND == "ns":
            # Nothing in the sandbox is marked mergeable.
            assert "ksm_merge_any: no" in sh(sb, "cat /proc/self/ksm_stat"), "the init opted in without the flag"


def test_the_hosts_settings_come_back_at_a_stop_without_sandboxes(merge_server):
    srv, before = merge_server
    srv.stop()
    after = {k: (KSM / k).read_text() for k in before}
    assert after == before, (before, after)
    assert not (srv.data_dir / "state" / "ksm-previous.json").exists()


@pytest.mark.deadline(180)
@pytest.mark.backend("ns", why=NS_ONLY)
def test_an_unprivileged_broker_leaves_the_hosts_ksm_alone_and_says_so(delegated, tmp_path):

    pw, groups, data = delegated
    before = {k: (KSM / k).read_text() for k in ("run", "pages_to_scan", "sleep_millisecs")}
    binary = binary_for_others(pvisor_bin())
    archive = for_others(images_dir() / "busybox.tar")
    port = free_port()
    user_cmd = (f"{binary} image import {archive} --data-dir {data} && exec {binary} serve --backend {SUITE_BACKEND} --listen 127.0.0.1:{port} "
                f"--data-dir {data} --memory-merge --stop-sandboxes-on-exit")
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            as_user(pw, groups, user_cmd),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(port, proc, log_path.read_text)
            state = httpx.get(f"http://127.0.0.1:{port}/pvisor/memory-merge", timeout=30).json()
            assert state["enabled"] is True, state
            if before["run"].strip() == "1":
                assert state["control"] == {"control": "host"}, state
            else:
                assert state["control"]["control"] == "off", state
                assert "may not turn it on" in state["control"]["reason"], state
                assert "KSM is off" in log_path.read_text()
            sb = SandboxSync.create("busybox", connection_config=_make_conn(f"127.0.0.1:{port}"),
                                    resource={"cpu": "1", "memory": "128Mi"})
            try:
                # The opt-in needs no privilege: the sandbox is mergeable all the same.
                assert "ksm_merge_any: yes" in sh(sb, "cat /proc/self/ksm_stat")
            finally:
                sb.kill()
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
    assert {k: (KSM / k).read_text() for k in before} == before, "an unprivileged broker changed the host's KSM"
