"""vm templates (`pvisor serve --vm-templates`): the first create of an image and
shape boots its guest and saves it once the agent first answers, before it is
configured; later creates of that key restore from the template, then
configure their own agent (environment, entrypoint) and get their own
hostname, clock and entropy (`Agent.Refresh`).

Under the project's own VMM (the KVM test host, tests/kvmhost) every clone maps the template's
memory file copy-on-write, so clones share the pages none of them wrote. Under the QEMU TCG test
engine (these PVM hosts) its clones load the state into memory of their own (nothing shared);
it needs the patched QEMU as the vm snapshot tests do.
"""

from __future__ import annotations

import time

import pytest

from conftest import SandboxFactory, _make_conn, _start_server
from e2e_util import BUSYBOX, run, sh, wait_until
from vm_util import ENGINE, VM_ENV, guest_kernel, vmm_pids
from test_vm_snapshots import snapshot_qemu


@pytest.fixture(scope="module")
def tpl_server(tmp_path_factory):
    kernel = guest_kernel()
    snapshot_qemu()
    srv = _start_server(tmp_path_factory, "vmtpl", ["busybox.tar"], {**VM_ENV, "PVISOR_GUEST_KERNEL": str(kernel)},
                        ["--backend", "vm", "--warm-workers", "1", "--vm-templates"])
    yield srv
    srv.stop()


@pytest.fixture
def vm(tpl_server):
    f = SandboxFactory(_make_conn(tpl_server.addr))
    yield f
    f.cleanup()


def booted(srv, sb) -> bool:
    """Whether the sandbox's guest booted (its agent's boot line is on its console) rather than
    being restored from a template (whose console starts after the boot)."""
    log = srv.data_dir / "sandboxes" / sb.id / "console.log"
    return "sandbox root ready" in log.read_text(errors="replace")


def templates(srv) -> list:
    return sorted((srv.data_dir / "templates").glob("*/meta.json"))


@pytest.mark.deadline(600)
def test_later_creates_are_clones_of_the_first_ones_template(vm, tpl_server):
    a = vm(BUSYBOX, env={"WHO": "a"})
    wait_until(lambda: templates(tpl_server), 120, 0.5, what="the template of busybox in this shape")
    assert len(templates(tpl_server)) == 1
    b = vm(BUSYBOX, env={"WHO": "b"})
    c = vm(BUSYBOX, env={"WHO": "c"}, entrypoint=["sh", "-c", "echo started > /root/ep; exec tail -f /dev/null"])
    # One boot: the others are the template's guest.
    assert booted(tpl_server, a)
    assert not booted(tpl_server, b) and not booted(tpl_server, c), "a create booted instead of cloning"
    for sb, who in ((a, "a"), (b, "b"), (c, "c")):
        # Each configured its own agent after the restore, and got its own identity and clock.
        assert sh(sb, "echo $WHO $OPENSANDBOX_ID") == f"{who} {sb.id}"
        assert sh(sb, "hostname") == f"sandbox-{sb.id[:8]}"
        skew = abs(int(sh(sb, "date +%s")) - time.time())
        assert skew < 5, f"{who}: clock off by {skew:.1f} s"
    wait_until(lambda: run(c, "cat /root/ep").exit_code == 0, 60, 0.5, what="the clone's own entrypoint")
    assert run(b, "test -e /root/ep").exit_code != 0, "another clone's entrypoint ran here"
    # Their disks are their own.
    sh(b, "echo only-b > /root/b.txt")
    assert run(c, "test -e /root/b.txt").exit_code != 0 and run(a, "test -e /root/b.txt").exit_code != 0
    assert sh(b, "head -c 32 /dev/urandom | od -An -tx1") != sh(c, "head -c 32 /dev/urandom | od -An -tx1")
    if ENGINE == "kvm":
        # The own VMM maps the template's memory file privately in each clone: the guest pages
        # neither clone wrote are one copy, in the page cache, shared by both.
        shared = [template_memory(tpl_server, sb) for sb in (b, c)]
        for m in shared:
            assert m["Shared_Clean"] >= 4096, f"a clone shares too little of the template's memory: {shared}"
            assert m["Private_Dirty"] < m["Rss"], f"a clone copied all it maps: {shared}"


def template_memory(srv, sb) -> dict[str, int]:
    """KiB counts (Rss, Shared_Clean, Private_Dirty, ...) of the template memory file's mapping in
    the sandbox's VMM (its worker)."""
    (pid,) = vmm_pids(srv.data_dir, sb.id)
    totals: dict[str, int] = {}
    inside = False
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()
        if head and "-" in head[0] and not head[0].endswith(":"):
            inside = len(head) >= 6 and "/templates/" in head[5] and head[5].endswith("/memory")
        elif inside and head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
            totals[head[0][:-1]] = totals.get(head[0][:-1], 0) + int(head[1])
    assert totals, f"no template memory file mapped in {pid}"
    return totals


@pytest.mark.deadline(600)
def test_another_shape_is_another_template_and_templates_outlive_the_broker(vm, tpl_server):
    a = vm(BUSYBOX)
    wait_until(lambda: templates(tpl_server), 120, 0.5, what="a template")
    before = templates(tpl_server)
    d = vm(BUSYBOX, resource={"cpu": "1", "memory": "256Mi"})
    assert booted(tpl_server, d), "a create of another shape must not clone this shape's template"
    wait_until(lambda: len(templates(tpl_server)) == len(before) + 1, 120, 0.5, what="the second shape's template")
    # A restarted broker keeps its templates: its first create of the shape is a clone.
    tpl_server.stop()
    tpl_server.start()
    vm.conn = _make_conn(tpl_server.addr)
    vm.created = []  # the old sandboxes were re-adopted by the new broker; cleaned below
    from opensandbox.sync.sandbox import SandboxSync

    vm.created = [SandboxSync.connect(x.id, connection_config=vm.conn) for x in (a, d)]
    e = vm(BUSYBOX, resource={"cpu": "1", "memory": "256Mi"})
    assert not booted(tpl_server, e)
    assert sh(e, "hostname") == f"sandbox-{e.id[:8]}"
