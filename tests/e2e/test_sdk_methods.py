"""Every public method of the official SDK (1.1.1), called once against pvisor with its result checked.

The surface is read from the installed SDK itself (`SURFACE`: the sync sandbox, manager and code
interpreter classes and the facades they hand out: files, commands and their bash sessions,
isolation service and isolated session, credential vault, metrics, diagnostics, code contexts), and
`ROWS` has one row per member: a call that must work (the row's docstring says what it checks), a
deliberate refusal (the exact status and code the call must get), or a bug (the call that should
work, marked xfail(strict=True) so that a fix turns it into a failure until the row says `works`).

`test_every_sdk_member_has_a_row` fails when the SDK gains (or loses) a member without a row here;
`test_the_docs_table_is_current` fails when docs/sdk-methods.md differs from the table. Rewrite that
page with `python tests/e2e/test_sdk_methods.py > docs/sdk-methods.md` (the venv's python).

The `FilesystemSync` rows run twice: on the sandbox's `files` and on an isolated session's.
"""

from __future__ import annotations

import importlib.metadata
import io
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import httpx
import pytest
from code_interpreter import CodeInterpreterSync
from code_interpreter.sync.services.code import CodesSync
from opensandbox.exceptions import SandboxApiException, SandboxReadyTimeoutException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.isolated import CreateIsolatedSessionRequest, IsolatedRunOpts, IsolatedWorkspaceSpec
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule, SandboxFilter, SnapshotFilter
from opensandbox.models.templates import CreateTemplateRequest, TemplateFilter
from opensandbox.sync import SandboxManagerSync, SandboxSync
from opensandbox.sync.services import (
    CommandsSync,
    CredentialVaultSync,
    DiagnosticsSync,
    FilesystemSync,
    IsolationServiceSync,
    IsolationSessionSync,
    MetricsSync,
)

from e2e_util import BUSYBOX, EXECD_PORT, REPO_ROOT, TOOLS, dataplane, describe, stdout_text, wait_until

logging.getLogger("code_interpreter").setLevel(logging.CRITICAL)

SDK_VERSION = "1.1.1"
DOCS = REPO_ROOT / "docs" / "sdk-methods.md"

# The classes whose public members the table covers, under the names the table uses.
SURFACE: dict[str, type] = {
    "SandboxSync": SandboxSync,
    "SandboxManagerSync": SandboxManagerSync,
    "CodeInterpreterSync": CodeInterpreterSync,
    "CodesSync": CodesSync,
    "FilesystemSync": FilesystemSync,
    "CommandsSync": CommandsSync,
    "IsolationServiceSync": IsolationServiceSync,
    "IsolationSessionSync": IsolationSessionSync,
    "CredentialVaultSync": CredentialVaultSync,
    "MetricsSync": MetricsSync,
    "DiagnosticsSync": DiagnosticsSync,
}

# The views the FilesystemSync rows run in.
FILE_VIEWS = ("sandbox", "isolated")
VIEW_NAMES = {"sandbox": "a sandbox's files", "isolated": "an isolated session's files"}
TOOLS_RESOURCE = {"cpu": "1", "memory": "1Gi"}
# A busybox sandbox whose entrypoint says something (for the diagnostics rows).
CHATTY = ["sh", "-c", "echo entry-said-hi; echo entry-err >&2; exec tail -f /dev/null"]
READY_WAIT = 60  # seconds a snapshot may take to be Ready


def sdk_surface() -> set[str]:
    """`Class.member` for every public member (method, classmethod, property) of SURFACE."""
    return {f"{prefix}.{n}" for prefix, cls in SURFACE.items() for n in dir(cls) if not n.startswith("_")}


# ---------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    name: str
    verdict: str  # "works" | "refused" | "bug"
    call: Callable[["Ctx"], object]
    note: str  # works: what is checked; refused: why; bug: the error it gets
    status: int = 0  # refused: the HTTP status
    code: str = ""  # refused: the error code
    bug_in: dict[str, str] = field(default_factory=dict)  # works but for these file views: the error there

    def answer(self) -> str:
        if self.verdict == "refused":
            return f"refused: {self.status} `{self.code}`"
        if self.verdict == "bug":
            return "**bug** (xfail)"
        if self.bug_in:
            fine = [VIEW_NAMES[v] for v in FILE_VIEWS if v not in self.bug_in]
            return f"works on {', '.join(fine)}; **bug** (xfail) on {', '.join(VIEW_NAMES[v] for v in self.bug_in)}"
        return "works"

    def doc_note(self) -> str:
        return " ".join([self.note] + [f"On {VIEW_NAMES[v]}: {e}" for v, e in self.bug_in.items()])

    def xfail(self, view: str | None) -> str | None:
        """Why this case is a known bug (None: it must pass)."""
        return self.note if self.verdict == "bug" else self.bug_in.get(view)


ROWS: dict[str, Row] = {}


def _add(row: Row) -> None:
    assert row.name not in ROWS, f"two rows for {row.name}"
    ROWS[row.name] = row


def works(name: str, bug_in: dict[str, str] | None = None):
    """Registers a row that must work (but in the file views of `bug_in`, a known bug there);
    the function's docstring says what it checks."""

    def deco(fn):
        _add(Row(name, "works", fn, " ".join((fn.__doc__ or "").split()), bug_in=bug_in or {}))
        return fn

    return deco


def bug(name: str, error: str):
    """A row that should work but does not against pvisor: `error` is what it gets."""

    def deco(fn):
        _add(Row(name, "bug", fn, error))
        return fn

    return deco


def refused(name: str, call: Callable[["Ctx"], object], status: int, code: str, why: str) -> None:
    _add(Row(name, "refused", call, why, status, code))


# ---------------------------------------------------------------- the context of a row


@dataclass
class Shared:
    """What the rows share (one per module)."""

    conn: object
    manager: SandboxManagerSync
    sb: SandboxSync  # the tools image: bash, python, isolation, the code interpreter
    bb: SandboxSync  # busybox with CHATTY entrypoint and a metadata label of its own
    label: str
    ci: CodeInterpreterSync
    session: IsolationSessionSync  # an isolated session on sb, workspace `ws`
    ws: str


@dataclass
class Ctx:
    shared: Shared
    factory: object  # conftest's SandboxFactory (per test)
    view: str | None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def __getattr__(self, name):
        return getattr(self.shared, name)

    def fresh(self, image: str | None = BUSYBOX, **kw) -> SandboxSync:
        """A sandbox of this row alone (killed after it)."""
        return self.factory(image, **kw)

    def defer(self, fn: Callable[[], None]) -> None:
        self.cleanups.append(fn)

    def sh(self, command: str, sb: SandboxSync | None = None) -> str:
        ex = (sb or self.sb).commands.run(command)
        assert ex.exit_code == 0, f"{command!r}: {describe(ex)}"
        return stdout_text(ex)

    # The file view of a FilesystemSync row.
    @property
    def files(self) -> FilesystemSync:
        return self.session.files if self.view == "isolated" else self.sb.files

    def vsh(self, command: str) -> str:
        """Runs a shell command in the row's file view (the sandbox or the isolated session)."""
        if self.view != "isolated":
            return self.sh(command)
        ex = self.session.run(command)
        assert ex.exit_code == 0, f"{command!r}: {describe(ex)}"
        return stdout_text(ex)

    def vdir(self) -> str:
        """A fresh empty directory in the view (the isolated session's is in its workspace)."""
        base = self.ws if self.view == "isolated" else "/tmp"
        d = f"{base}/sdk-{uuid.uuid4().hex[:8]}"
        self.vsh(f"mkdir -p {d}")
        return d


def api_error(call: Callable[[], object]) -> SandboxApiException:
    with pytest.raises(SandboxApiException) as ei:
        call()
    return ei.value


def state_of(c: Ctx, sid: str) -> str:
    return c.manager.get_sandbox_info(sid).status.state


def wait_state(c: Ctx, sid: str, state: str) -> None:
    wait_until(lambda: state_of(c, sid) == state, 30, 0.05, what=f"sandbox {sid} {state}")


def gone(c: Ctx, sid: str) -> None:
    e = api_error(lambda: c.manager.get_sandbox_info(sid))
    assert (e.status_code, e.error.code) == (404, "SANDBOX_NOT_FOUND"), e


def snapshot_ready(c: Ctx, snap_id: str):
    def ready():
        info = c.manager.get_snapshot(snap_id)
        assert info.status.state != "Failed", info.status
        return info if info.status.state == "Ready" else None

    return wait_until(ready, READY_WAIT, 0.1, what=f"snapshot {snap_id} Ready")


def new_snapshot(c: Ctx, sb: SandboxSync, name: str, snap=None):
    info = snap or c.manager.create_snapshot(sb.id, name)
    c.defer(lambda: drop_snapshot(c, info.id))
    return info


def drop_snapshot(c: Ctx, snap_id: str) -> None:
    """Deletes a snapshot once it is no longer Creating (a delete before is a 409)."""
    def done():
        try:
            return c.manager.get_snapshot(snap_id).status.state != "Creating"
        except SandboxApiException as e:
            if e.status_code == 404:
                return "gone"
            raise

    if wait_until(done, READY_WAIT, 0.1, what=f"snapshot {snap_id} done") != "gone":
        _ignore_404(lambda: c.manager.delete_snapshot(snap_id))


def new_template(c: Ctx, **kw):
    kw.setdefault("image", BUSYBOX)
    kw.setdefault("publish", "s3://bucket/publish")
    kw.setdefault("metadata", {"sdk-table": uuid.uuid4().hex})
    info = c.manager.create_template(CreateTemplateRequest(**kw))
    c.defer(lambda: _ignore_404(lambda: c.manager.delete_template(info.template_id)))
    return info


def _ignore_404(fn: Callable[[], None]) -> None:
    try:
        fn()
    except SandboxApiException as e:
        if e.status_code != 404:
            raise


def background(c: Ctx, command: str) -> str:
    ex = c.sb.commands.run(command, opts=RunCommandOpts(background=True))
    assert ex.id, describe(ex)
    return ex.id


def finished(c: Ctx, exec_id: str):
    return wait_until(lambda: (s := c.sb.commands.get_command_status(exec_id)).running is False and s, 30,
                      0.05, what=f"command {exec_id} to end")


def iso_req(path: str) -> CreateIsolatedSessionRequest:
    return CreateIsolatedSessionRequest(workspace=IsolatedWorkspaceSpec(path=path))


# ================================================================ SandboxSync


@works("SandboxSync.create")
def _(c):
    """A busybox sandbox with env and metadata: Running, the env in its commands, the metadata in its info."""
    sb = c.fresh(env={"SDK_ROW": "create"}, metadata={"row": "create"})
    info = sb.get_info()
    assert info.status.state == "Running" and info.metadata == {"row": "create"}
    assert c.sh("echo $SDK_ROW", sb) == "create"


@works("SandboxSync.create_from_template")
def _(c):
    """A sandbox from a template: origin `template`, the template's env in its commands."""
    tpl = new_template(c, env={"FROM_TPL": "yes"})
    sb = c.factory.track(SandboxSync.create_from_template(
        tpl.template_id, connection_config=c.conn, timeout=timedelta(minutes=5)))
    assert sb.origin == "template"
    assert c.sh("echo $FROM_TPL", sb) == "yes"


@works("SandboxSync.connect")
def _(c):
    """A second handle on the shared sandbox sees the first one's file."""
    marker = uuid.uuid4().hex
    c.sh(f"echo {marker} > /tmp/connect-marker")
    other = SandboxSync.connect(c.sb.id, connection_config=c.conn)
    try:
        assert other.id == c.sb.id
        assert c.sh("cat /tmp/connect-marker", other) == marker
    finally:
        other.close()


@works("SandboxSync.resume")
def _(c):
    """Resumes a paused sandbox: Running again with its files."""
    sb = c.fresh()
    c.sh("echo kept > /root/state", sb)
    c.manager.pause_sandbox(sb.id)
    wait_state(c, sb.id, "Paused")
    again = c.factory.track(SandboxSync.resume(sb.id, connection_config=c.conn))
    assert state_of(c, sb.id) == "Running"
    assert c.sh("cat /root/state", again) == "kept"


@works("SandboxSync.check_ready")
def _(c):
    """Returns on a running sandbox; raises SandboxReadyTimeoutException on a paused one."""
    sb = c.fresh()
    assert sb.check_ready(timedelta(seconds=30), timedelta(milliseconds=100)) is None
    sb.pause()
    wait_state(c, sb.id, "Paused")
    with pytest.raises(SandboxReadyTimeoutException):
        sb.check_ready(timedelta(seconds=1), timedelta(milliseconds=100))


@works("SandboxSync.is_healthy")
def _(c):
    """True while running, False once paused."""
    sb = c.fresh()
    assert sb.is_healthy() is True
    sb.pause()
    wait_state(c, sb.id, "Paused")
    assert sb.is_healthy() is False


@works("SandboxSync.close")
def _(c):
    """Closes a handle only: the sandbox stays Running and serves other handles."""
    other = SandboxSync.connect(c.sb.id, connection_config=c.conn)
    other.close()
    assert state_of(c, c.sb.id) == "Running"
    assert c.sh("echo still-here") == "still-here"


@works("SandboxSync.kill")
def _(c):
    """The sandbox is gone: get_sandbox_info is a 404 SANDBOX_NOT_FOUND."""
    sb = c.fresh()
    sb.kill()
    gone(c, sb.id)


@works("SandboxSync.destroy")
def _(c):
    """Kills and closes: the sandbox is gone (404 SANDBOX_NOT_FOUND)."""
    sb = c.fresh()
    sb.destroy()
    gone(c, sb.id)


@works("SandboxSync.pause")
def _(c):
    """The sandbox becomes Paused."""
    sb = c.fresh()
    sb.pause()
    wait_state(c, sb.id, "Paused")


@works("SandboxSync.renew")
def _(c):
    """The new expiry is later than the old one and is what get_info reports."""
    sb = c.fresh(timeout=timedelta(minutes=10))
    before = sb.get_info().expires_at
    resp = sb.renew(timedelta(minutes=30))
    assert resp.expires_at > before
    assert sb.get_info().expires_at == resp.expires_at


@works("SandboxSync.get_info")
def _(c):
    """Its id, state Running and image."""
    info = c.bb.get_info()
    assert info.id == c.bb.id and info.status.state == "Running" and info.image.image == BUSYBOX
    assert info.entrypoint == CHATTY


@works("SandboxSync.patch_metadata")
def _(c):
    """A string adds or replaces a key, None deletes one; the info returned and get_info agree."""
    sb = c.fresh(metadata={"keep": "k", "drop": "d", "swap": "1"})
    info = sb.patch_metadata({"drop": None, "swap": "2", "new": "n"})
    assert info.metadata == {"keep": "k", "swap": "2", "new": "n"}
    assert sb.get_info().metadata == info.metadata


@works("SandboxSync.get_endpoint")
def _(c):
    """execd's endpoint (no scheme): /ping answers with its headers, 401 without."""
    url, headers = dataplane(c.bb)
    assert httpx.get(f"{url}/ping", headers=headers, timeout=30).status_code == 200
    assert httpx.get(f"{url}/ping", timeout=30).status_code == 401


@works("SandboxSync.get_signed_endpoint")
def _(c):
    """An OSEP-0011 signed URL: opens the port with no header; another port with its token is refused."""
    ep = c.bb.get_signed_endpoint(EXECD_PORT, int(time.time()) + 600)
    assert not ep.headers and f"/sandboxes/{c.bb.id}/signed/{EXECD_PORT}/" in ep.endpoint, ep
    assert httpx.get(f"http://{ep.endpoint}/ping", timeout=30).status_code == 200
    other = ep.endpoint.replace(f"/signed/{EXECD_PORT}/", "/signed/8080/")
    assert httpx.get(f"http://{other}/", timeout=30).status_code == 401


@works("SandboxSync.get_metrics")
def _(c):
    """One CPU and the 512 MiB limit the sandbox was made with; memory used is within it."""
    m = c.bb.get_metrics()
    assert m.cpu_count == 1 and m.memory_total_in_mib == 512
    assert 0 < m.memory_used_in_mib < 512


@works("SandboxSync.get_diagnostic_logs")
def _(c):
    """Scope `container`: the entrypoint's stdout and stderr."""
    d = c.bb.get_diagnostic_logs("container")
    assert d.sandbox_id == c.bb.id and d.kind == "logs" and d.delivery == "inline"
    assert d.content.splitlines() == ["entry-said-hi", "entry-err"], d.content


@works("SandboxSync.get_diagnostic_events")
def _(c):
    """Scope `lifecycle`: Created then Ready."""
    d = c.bb.get_diagnostic_events("lifecycle")
    assert [line.split(" ", 1)[1] for line in d.content.splitlines()[:2]] == ["Created", "Ready"], d.content


@works("SandboxSync.get_egress_policy")
def _(c):
    """The policy the sandbox was created with."""
    sb = c.fresh(network_policy=NetworkPolicy(default_action="deny",
                                              egress=[NetworkRule(action="allow", target="a.test")]))
    p = sb.get_egress_policy()
    assert p.default_action == "deny" and [(r.action, r.target) for r in p.egress] == [("allow", "a.test")]


@works("SandboxSync.patch_egress_rules")
def _(c):
    """The patch's rule comes first, the others stay, the default action too."""
    sb = c.fresh(network_policy=NetworkPolicy(default_action="deny",
                                              egress=[NetworkRule(action="allow", target="a.test")]))
    sb.patch_egress_rules([NetworkRule(action="allow", target="b.test")])
    p = sb.get_egress_policy()
    assert p.default_action == "deny"
    assert [(r.action, r.target) for r in p.egress] == [("allow", "b.test"), ("allow", "a.test")]


@works("SandboxSync.delete_egress_rules")
def _(c):
    """The named rule goes, the others stay; an unknown target is ignored."""
    sb = c.fresh(network_policy=NetworkPolicy(default_action="deny", egress=[
        NetworkRule(action="allow", target="a.test"), NetworkRule(action="allow", target="b.test")]))
    sb.delete_egress_rules(["a.test", "never.test"])
    assert [(r.action, r.target) for r in sb.get_egress_policy().egress] == [("allow", "b.test")]


@works("SandboxSync.create_snapshot")
def _(c):
    """Creating with its name, then Ready; a sandbox restored from it has the source's file."""
    src = c.fresh()
    c.sh("echo snap > /root/snapped", src)
    info = new_snapshot(c, src, "", src.create_snapshot("sdk-row"))
    assert (info.name, info.sandbox_id, info.status.state) == ("sdk-row", src.id, "Creating")
    snapshot_ready(c, info.id)
    restored = c.fresh(None, snapshot_id=info.id)
    assert c.sh("cat /root/snapped", restored) == "snap"


@works("SandboxSync.files_with_identity")
def _(c):
    """Files written as uid/gid 1000 belong to 1000:1000; root's /etc/shadow is a 403."""
    fs = c.sb.files_with_identity(1000, 1000)
    path = f"/tmp/ident-{uuid.uuid4().hex[:8]}"
    fs.write_file(path, "mine")
    assert c.sh(f"stat -c %u:%g {path}") == "1000:1000"
    assert api_error(lambda: fs.read_file("/etc/shadow")).status_code == 403


@works("SandboxSync.origin")
def _(c):
    """`unknown` for a sandbox made from an image (`template` is the create_from_template row's)."""
    assert c.bb.origin == "unknown"


@works("SandboxSync.connection_config")
def _(c):
    """The server's address."""
    assert c.bb.connection_config.get_domain() == c.conn.get_domain()


@works("SandboxSync.commands")
def _(c):
    """The commands facade runs in this sandbox (its OPENSANDBOX_ID)."""
    assert c.sh("echo $OPENSANDBOX_ID", c.bb) == c.bb.id


@works("SandboxSync.files")
def _(c):
    """The files facade reads this sandbox's files."""
    assert c.bb.files.read_file("/etc/passwd").startswith("root:")


@works("SandboxSync.isolation")
def _(c):
    """The isolation facade reports isolation available."""
    caps = c.sb.isolation.capabilities()
    assert caps.available is True and caps.isolator == "pvisor"


@works("SandboxSync.metrics")
def _(c):
    """The metrics facade reads this sandbox's limit."""
    assert c.bb.metrics.get_metrics(c.bb.id).memory_total_in_mib == 512


@works("SandboxSync.diagnostics")
def _(c):
    """The diagnostics facade reads this sandbox's entrypoint output."""
    assert "entry-said-hi" in c.bb.diagnostics.get_logs(c.bb.id, "container").content


@works("SandboxSync.credential_vault")
def _(c):
    """The facade reaches this sandbox's egress port (its calls are the CredentialVaultSync rows' 501)."""
    e = api_error(lambda: c.bb.credential_vault.list_bindings())
    assert (e.status_code, e.error.code) == (501, "NOT_SUPPORTED"), e


# ================================================================ SandboxManagerSync


@works("SandboxManagerSync.create")
def _(c):
    """A new manager lists the shared sandbox."""
    m = SandboxManagerSync.create(connection_config=c.conn)
    try:
        assert m.get_sandbox_info(c.bb.id).id == c.bb.id
    finally:
        m.close()


@works("SandboxManagerSync.close")
def _(c):
    """Closes the manager only: its sandboxes keep running."""
    m = SandboxManagerSync.create(connection_config=c.conn)
    m.close()
    assert state_of(c, c.bb.id) == "Running"


@works("SandboxManagerSync.connection_config")
def _(c):
    """The server's address."""
    assert c.manager.connection_config.get_domain() == c.conn.get_domain()


@works("SandboxManagerSync.list_sandbox_infos")
def _(c):
    """A metadata filter finds exactly the sandbox labelled so; a states filter and paging agree."""
    page = c.manager.list_sandbox_infos(SandboxFilter(metadata={"sdk-table": c.label}))
    assert [i.id for i in page.sandbox_infos] == [c.bb.id]
    assert page.pagination.total_items == 1 and not page.pagination.has_next_page
    paused = c.manager.list_sandbox_infos(SandboxFilter(metadata={"sdk-table": c.label}, states=["Paused"]))
    assert paused.sandbox_infos == []


@works("SandboxManagerSync.get_sandbox_info")
def _(c):
    """Its id, state and metadata."""
    info = c.manager.get_sandbox_info(c.bb.id)
    assert info.id == c.bb.id and info.status.state == "Running" and info.metadata == {"sdk-table": c.label}


@works("SandboxManagerSync.get_diagnostic_logs")
def _(c):
    """Scope `all`: the entrypoint's output under its heading."""
    content = c.manager.get_diagnostic_logs(c.bb.id, "all").content
    assert "entry-said-hi" in content and "entry-err" in content, content


@works("SandboxManagerSync.get_diagnostic_events")
def _(c):
    """Scope `all`: lifecycle and container events, the entrypoint's start among them."""
    content = c.manager.get_diagnostic_events(c.bb.id, "all").content
    assert " Created" in content and "EntrypointStarted" in content, content


@works("SandboxManagerSync.patch_sandbox_metadata")
def _(c):
    """Adds, replaces and deletes keys."""
    sb = c.fresh(metadata={"a": "1", "b": "2"})
    assert c.manager.patch_sandbox_metadata(sb.id, {"a": None, "b": "3", "c": "4"}).metadata == {"b": "3", "c": "4"}
    assert c.manager.get_sandbox_info(sb.id).metadata == {"b": "3", "c": "4"}


@works("SandboxManagerSync.kill_sandbox")
def _(c):
    """The sandbox is gone (404 SANDBOX_NOT_FOUND)."""
    sb = c.fresh()
    c.manager.kill_sandbox(sb.id)
    gone(c, sb.id)


@works("SandboxManagerSync.renew_sandbox")
def _(c):
    """The new expiry is later and is what get_sandbox_info reports."""
    sb = c.fresh(timeout=timedelta(minutes=10))
    before = c.manager.get_sandbox_info(sb.id).expires_at
    resp = c.manager.renew_sandbox(sb.id, timedelta(minutes=30))
    assert resp.expires_at > before and c.manager.get_sandbox_info(sb.id).expires_at == resp.expires_at


@works("SandboxManagerSync.pause_sandbox")
def _(c):
    """The sandbox becomes Paused and its commands stop answering (is_healthy False)."""
    sb = c.fresh()
    c.manager.pause_sandbox(sb.id)
    wait_state(c, sb.id, "Paused")
    assert sb.is_healthy() is False


@works("SandboxManagerSync.resume_sandbox")
def _(c):
    """Running again, with its files."""
    sb = c.fresh()
    c.sh("echo kept > /root/state", sb)
    c.manager.pause_sandbox(sb.id)
    wait_state(c, sb.id, "Paused")
    c.manager.resume_sandbox(sb.id)
    wait_state(c, sb.id, "Running")
    assert c.sh("cat /root/state", sb) == "kept"


@works("SandboxManagerSync.create_snapshot")
def _(c):
    """Accepted as Creating, with the sandbox's id and the name."""
    info = new_snapshot(c, c.fresh(), "sdk-mgr")
    assert (info.name, info.status.state, info.status.reason) == ("sdk-mgr", "Creating", "snapshot_accepted")


@works("SandboxManagerSync.get_snapshot")
def _(c):
    """Polls a new snapshot to Ready; its id, source and name."""
    sb = c.fresh()
    info = new_snapshot(c, sb, "sdk-get")
    ready = snapshot_ready(c, info.id)
    assert (ready.id, ready.sandbox_id, ready.name) == (info.id, sb.id, "sdk-get")


@works("SandboxManagerSync.list_snapshots")
def _(c):
    """Filtered by source sandbox: exactly its snapshot; by a state it is not in: none."""
    sb = c.fresh()
    info = new_snapshot(c, sb, "sdk-list")
    snapshot_ready(c, info.id)
    assert [s.id for s in c.manager.list_snapshots(SnapshotFilter(sandbox_id=sb.id)).snapshot_infos] == [info.id]
    assert c.manager.list_snapshots(SnapshotFilter(sandbox_id=sb.id, states=["Failed"])).snapshot_infos == []


@works("SandboxManagerSync.delete_snapshot")
def _(c):
    """Then get_snapshot is a 404."""
    info = new_snapshot(c, c.fresh(), "sdk-del")
    snapshot_ready(c, info.id)
    c.manager.delete_snapshot(info.id)
    assert api_error(lambda: c.manager.get_snapshot(info.id)).status_code == 404


@works("SandboxManagerSync.create_template")
def _(c):
    """Succeeded at once, with the fields it was given."""
    tpl = new_template(c, env={"K": "v"}, entrypoint=["sleep", "3600"], resource_limits={"cpu": "1", "memory": "256Mi"})
    assert tpl.template_id.startswith("tpl-") and tpl.status.phase == "Succeeded"
    assert (tpl.image, tpl.env, tpl.entrypoint) == (BUSYBOX, {"K": "v"}, ["sleep", "3600"])
    assert tpl.resource_limits == {"cpu": "1", "memory": "256Mi"}


@works("SandboxManagerSync.get_template")
def _(c):
    """The same template as the create returned."""
    tpl = new_template(c)
    assert c.manager.get_template(tpl.template_id).model_dump() == tpl.model_dump()


@works("SandboxManagerSync.list_templates")
def _(c):
    """A metadata filter finds exactly that template."""
    tpl = new_template(c)
    page = c.manager.list_templates(TemplateFilter(metadata=tpl.metadata))
    assert [t.template_id for t in page.template_infos] == [tpl.template_id]


@works("SandboxManagerSync.delete_template")
def _(c):
    """Then get_template is a 404 TEMPLATE::NOT_FOUND."""
    tpl = new_template(c)
    c.manager.delete_template(tpl.template_id)
    e = api_error(lambda: c.manager.get_template(tpl.template_id))
    assert (e.status_code, e.error.code) == (404, "TEMPLATE::NOT_FOUND"), e


# ================================================================ CodeInterpreterSync and CodesSync


@works("CodeInterpreterSync.create")
def _(c):
    """Over the tools sandbox (the SDK's own readiness check passes): python runs."""
    ci = CodeInterpreterSync.create(c.sb)
    try:
        assert [r.text for r in ci.codes.run("6 * 7").result] == ["42"]
    finally:
        ci.close()


@works("CodeInterpreterSync.close")
def _(c):
    """Closes the interpreter's clients only: the sandbox still runs code for another interpreter."""
    ci = CodeInterpreterSync.create(c.sb)
    ci.close()
    assert state_of(c, c.sb.id) == "Running"
    assert [r.text for r in c.ci.codes.run("'after-close'").result] == ["'after-close'"]


@works("CodeInterpreterSync.check_ready")
def _(c):
    """Returns (execd and the interpreter's port answer)."""
    assert c.ci.check_ready(timedelta(seconds=30), timedelta(milliseconds=100)) is None


@works("CodeInterpreterSync.is_healthy")
def _(c):
    """True."""
    assert c.ci.is_healthy() is True


@works("CodeInterpreterSync.ping")
def _(c):
    """True."""
    assert c.ci.ping() is True


@works("CodeInterpreterSync.id")
def _(c):
    """The sandbox's id."""
    assert c.ci.id == c.sb.id


@works("CodeInterpreterSync.sandbox")
def _(c):
    """The sandbox it was made over."""
    assert c.ci.sandbox is c.sb


@works("CodeInterpreterSync.codes")
def _(c):
    """Runs python: stdout and the last expression's value."""
    ex = c.ci.codes.run("print('out')\n'val'")
    assert [m.text for m in ex.logs.stdout] == ["out\n"] and [r.text for r in ex.result] == ["'val'"], describe(ex)


@works("CodeInterpreterSync.commands")
def _(c):
    """Runs a command in the sandbox."""
    ex = c.ci.commands.run("echo $OPENSANDBOX_ID")
    assert stdout_text(ex) == c.sb.id, describe(ex)


@works("CodeInterpreterSync.files")
def _(c):
    """Writes a file the sandbox's shell reads."""
    path = f"/tmp/ci-{uuid.uuid4().hex[:8]}"
    c.ci.files.write_file(path, "from-ci")
    assert c.sh(f"cat {path}") == "from-ci"


@works("CodeInterpreterSync.metrics")
def _(c):
    """The sandbox's 1 GiB limit."""
    assert c.ci.metrics.get_metrics(c.ci.id).memory_total_in_mib == 1024


@works("CodesSync.create_context")
def _(c):
    """A python context: its id and language; state persists across its runs."""
    ctx = c.ci.codes.create_context("python")
    c.defer(lambda: _ignore_404(lambda: c.ci.codes.delete_context(ctx.id)))
    assert ctx.id and ctx.language == "python"
    c.ci.codes.run("x = 20", context=ctx)
    assert [r.text for r in c.ci.codes.run("x + 22", context=ctx).result] == ["42"]


@works("CodesSync.get_context")
def _(c):
    """The context by its id."""
    ctx = c.ci.codes.create_context("bash")
    c.defer(lambda: _ignore_404(lambda: c.ci.codes.delete_context(ctx.id)))
    got = c.ci.codes.get_context(ctx.id)
    assert (got.id, got.language) == (ctx.id, "bash")


@works("CodesSync.list_contexts")
def _(c):
    """The language's contexts include a new one."""
    ctx = c.ci.codes.create_context("python")
    c.defer(lambda: _ignore_404(lambda: c.ci.codes.delete_context(ctx.id)))
    listed = c.ci.codes.list_contexts("python")
    assert ctx.id in {x.id for x in listed} and {x.language for x in listed} == {"python"}


@works("CodesSync.delete_context")
def _(c):
    """Then get_context is a 404 CONTEXT_NOT_FOUND."""
    ctx = c.ci.codes.create_context("python")
    c.ci.codes.delete_context(ctx.id)
    e = api_error(lambda: c.ci.codes.get_context(ctx.id))
    assert (e.status_code, e.error.code) == (404, "CONTEXT_NOT_FOUND"), e


@works("CodesSync.delete_contexts")
def _(c):
    """Every context of the language goes (bash here; python ones stay)."""
    for _ in range(2):
        c.ci.codes.create_context("bash")
    keep = c.ci.codes.create_context("python")
    c.defer(lambda: _ignore_404(lambda: c.ci.codes.delete_context(keep.id)))
    c.ci.codes.delete_contexts("bash")
    assert c.ci.codes.list_contexts("bash") == []
    assert keep.id in {x.id for x in c.ci.codes.list_contexts("python")}


@works("CodesSync.run")
def _(c):
    """python: stdout, the value, an exception as the error; bash by language."""
    ex = c.ci.codes.run("print(1 + 1)\n'v'", language="python")
    assert [m.text for m in ex.logs.stdout] == ["2\n"] and [r.text for r in ex.result] == ["'v'"], describe(ex)
    err = c.ci.codes.run("1 / 0", language="python")
    assert err.error is not None and err.error.name == "ZeroDivisionError", describe(err)
    sh = c.ci.codes.run("echo $((6 * 7))", language="bash")
    assert [m.text for m in sh.logs.stdout] == ["42\n"], describe(sh)


@works("CodesSync.interrupt")
def _(c):
    """A busy python cell ends with KeyboardInterrupt; its context runs the next cell."""
    ctx = c.ci.codes.create_context("python")
    c.defer(lambda: _ignore_404(lambda: c.ci.codes.delete_context(ctx.id)))
    ids: list[str] = []
    result: dict = {}
    handlers = ExecutionHandlersSync(on_init=lambda init: ids.append(init.id))
    t = threading.Thread(target=lambda: result.setdefault(
        "ex", c.ci.codes.run("import time\nwhile True: time.sleep(0.05)", context=ctx, handlers=handlers)))
    t.start()
    wait_until(lambda: ids, 30, 0.05, what="the cell's execution id")
    c.ci.codes.interrupt(ids[0])
    t.join(30)
    assert not t.is_alive(), "the interrupted cell did not end"
    assert result["ex"].error is not None and result["ex"].error.name == "KeyboardInterrupt", describe(result["ex"])
    assert [r.text for r in c.ci.codes.run("'next'", context=ctx).result] == ["'next'"]


@works("CodesSync.ping")
def _(c):
    """True."""
    assert c.ci.codes.ping() is True


# ================================================================ CommandsSync


@works("CommandsSync.run")
def _(c):
    """Shell text with cwd, env and uid options; argv without a shell; exit codes; a timeout is 137."""
    ex = c.sb.commands.run("pwd; echo $E1; id -u; echo err >&2; exit 3",
                           opts=RunCommandOpts(working_directory="/etc", envs={"E1": "v1"}, uid=1000, gid=1000))
    assert stdout_text(ex).splitlines() == ["/etc", "v1", "1000"] and ex.exit_code == 3, describe(ex)
    assert [m.text for m in ex.logs.stderr] == ["err"], describe(ex)
    argv = c.sb.commands.run(["echo", "a  b", "$HOME"])
    assert stdout_text(argv) == "a  b $HOME", describe(argv)
    slow = c.sb.commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(seconds=1)))
    assert slow.exit_code == 137, describe(slow)


@works("CommandsSync.set_env")
def _(c):
    """Later commands see the variable (a value with a single quote kept as given)."""
    key = f"SDK_ENV_{uuid.uuid4().hex[:6].upper()}"
    c.sb.commands.set_env(key, "it's set")
    assert c.sh(f"echo \"${key}\"") == "it's set"


@works("CommandsSync.get_command_status")
def _(c):
    """A background command: running, then ended with its exit code and its text."""
    cmd = "sleep 0.3; exit 3"
    exec_id = background(c, cmd)
    st = finished(c, exec_id)
    assert (st.id, st.content, st.exit_code) == (exec_id, cmd, 3) and st.finished_at >= st.started_at, st


@works("CommandsSync.get_background_command_logs")
def _(c):
    """All the output, then from a line cursor only what follows."""
    exec_id = background(c, "echo a; echo b")
    finished(c, exec_id)
    logs = c.sb.commands.get_background_command_logs(exec_id)
    assert logs.content == "a\nb\n", logs
    assert c.sb.commands.get_background_command_logs(exec_id, cursor=1).content == "b\n"


@works("CommandsSync.interrupt")
def _(c):
    """A background sleep ends at once: exit 137, error `interrupted`."""
    exec_id = background(c, "sleep 100")
    c.sb.commands.interrupt(exec_id)
    st = finished(c, exec_id)
    assert (st.exit_code, st.error) == (137, "interrupted"), st


@works("CommandsSync.create_session")
def _(c):
    """A bash session starting in the working directory given."""
    sid = c.sb.commands.create_session(working_directory="/etc")
    c.defer(lambda: c.sb.commands.delete_session(sid))
    assert stdout_text(c.sb.commands.run_in_session(sid, "pwd")) == "/etc"


@works("CommandsSync.run_in_session")
def _(c):
    """State persists between runs; a working directory per run; a timeout is 137 and the session goes on."""
    sid = c.sb.commands.create_session()
    c.defer(lambda: c.sb.commands.delete_session(sid))
    c.sb.commands.run_in_session(sid, "X=kept; f() { echo fn; }")
    assert stdout_text(c.sb.commands.run_in_session(sid, "echo $X; f; pwd", working_directory="/usr")) == "kept\nfn\n/usr"
    slow = c.sb.commands.run_in_session(sid, "sleep 30", timeout=timedelta(seconds=1))
    assert slow.exit_code == 137, describe(slow)
    assert stdout_text(c.sb.commands.run_in_session(sid, "echo alive")) == "alive"


@works("CommandsSync.delete_session")
def _(c):
    """Then running in it is a 404."""
    sid = c.sb.commands.create_session()
    c.sb.commands.delete_session(sid)
    assert api_error(lambda: c.sb.commands.run_in_session(sid, "echo x")).status_code == 404


# ================================================================ FilesystemSync (sandbox and isolated session)


@works("FilesystemSync.read_file")
def _(c):
    """Whole, by lines (offset/limit), by byte range, in another encoding."""
    d = c.vdir()
    c.vsh(f"printf 'one\\ntwo\\nthree\\n' > {d}/a; printf 'caf\\351' > {d}/l1")
    f = c.files
    assert f.read_file(f"{d}/a") == "one\ntwo\nthree\n"
    assert f.read_file(f"{d}/a", offset=2, limit=1) == "two\n"
    assert f.read_file(f"{d}/a", range_header="bytes=4-6") == "two"
    assert f.read_file(f"{d}/l1", encoding="latin-1") == "caf\u00e9"


@works("FilesystemSync.read_bytes")
def _(c):
    """Binary content exactly, and a byte range."""
    d = c.vdir()
    c.vsh(f"printf 'a\\000b\\377c' > {d}/bin")
    assert c.files.read_bytes(f"{d}/bin") == b"a\x00b\xffc"
    assert c.files.read_bytes(f"{d}/bin", range_header="bytes=1-3") == b"\x00b\xff"


@works("FilesystemSync.read_bytes_stream")
def _(c):
    """Chunks of at most chunk_size that add up to the file."""
    d = c.vdir()
    c.vsh(f"seq 1 2000 > {d}/big")
    chunks = list(c.files.read_bytes_stream(f"{d}/big", chunk_size=1000))
    assert b"".join(chunks) == "".join(f"{i}\n" for i in range(1, 2001)).encode()
    assert len(chunks) > 1 and all(len(x) <= 1000 for x in chunks)


@works("FilesystemSync.write_file")
def _(c):
    """Text and file-like data; mode and owner as given."""
    d = c.vdir()
    c.files.write_file(f"{d}/t.txt", "text", mode=640, owner="nobody")
    c.files.write_file(f"{d}/io.bin", io.BytesIO(b"\x00io"))
    assert c.vsh(f"cat {d}/t.txt; echo; stat -c '%a %u' {d}/t.txt") == "text\n640 65534"
    assert c.files.read_bytes(f"{d}/io.bin") == b"\x00io"


@works("FilesystemSync.write_files")
def _(c):
    """Several files at once, each with its content and mode."""
    d = c.vdir()
    c.files.write_files([WriteEntry(path=f"{d}/a", data="A", mode=600), WriteEntry(path=f"{d}/b", data=b"B\x00")])
    assert c.vsh(f"cat {d}/a; stat -c %a {d}/a") == "A600"
    assert c.files.read_bytes(f"{d}/b") == b"B\x00"


@works("FilesystemSync.create_directories")
def _(c):
    """Nested directories with the mode given."""
    d = c.vdir()
    c.files.create_directories([WriteEntry(path=f"{d}/x/y/z", mode=700)])
    assert c.vsh(f"test -d {d}/x/y/z && stat -c %a {d}/x/y/z") == "700"


@works("FilesystemSync.delete_files")
def _(c):
    """The files go, their neighbour stays."""
    d = c.vdir()
    c.vsh(f"touch {d}/a {d}/b {d}/c")
    c.files.delete_files([f"{d}/a", f"{d}/b"])
    assert c.vsh(f"ls {d}") == "c"


@works("FilesystemSync.delete_directories")
def _(c):
    """A directory goes with its contents."""
    d = c.vdir()
    c.vsh(f"mkdir -p {d}/gone/sub && touch {d}/gone/sub/f {d}/kept")
    c.files.delete_directories([f"{d}/gone"])
    assert c.vsh(f"ls {d}") == "kept"


@works("FilesystemSync.move_files")
def _(c):
    """The source is gone, the destination has its content."""
    d = c.vdir()
    c.vsh(f"echo moved > {d}/src")
    c.files.move_files([MoveEntry(src=f"{d}/src", dest=f"{d}/dest")])
    assert c.vsh(f"cat {d}/dest; test -e {d}/src || echo src-gone") == "moved\nsrc-gone"


@works("FilesystemSync.set_permissions")
def _(c):
    """Mode and owner change."""
    d = c.vdir()
    c.vsh(f"touch {d}/p")
    c.files.set_permissions([SetPermissionEntry(path=f"{d}/p", mode=604, owner="nobody")])
    assert c.vsh(f"stat -c '%a %u' {d}/p") == "604 65534"


@works("FilesystemSync.replace_contents")
def _(c):
    """Every occurrence is replaced."""
    d = c.vdir()
    c.vsh(f"printf 'cat dog cat' > {d}/r")
    c.files.replace_contents([ContentReplaceEntry(path=f"{d}/r", old_content="cat", new_content="cow")])
    assert c.vsh(f"cat {d}/r") == "cow dog cow"


@works("FilesystemSync.replace_contents_detailed")
def _(c):
    """The count per file, and the content replaced."""
    d = c.vdir()
    c.vsh(f"printf 'aXbXc' > {d}/r1; printf 'none' > {d}/r2")
    res = c.files.replace_contents_detailed([ContentReplaceEntry(path=f"{d}/r1", old_content="X", new_content="-"),
                                             ContentReplaceEntry(path=f"{d}/r2", old_content="X", new_content="-")])
    assert {(r.path, r.replaced_count) for r in res} == {(f"{d}/r1", 2), (f"{d}/r2", 0)}
    assert c.vsh(f"cat {d}/r1") == "a-b-c"


@works("FilesystemSync.search")
def _(c):
    """A glob finds the matching files below the path, nothing else."""
    d = c.vdir()
    c.vsh(f"mkdir -p {d}/s && touch {d}/a.txt {d}/b.log {d}/s/c.txt")
    found = {e.path for e in c.files.search(SearchEntry(path=d, pattern="*.txt"))}
    assert found == {f"{d}/a.txt", f"{d}/s/c.txt"}


@works("FilesystemSync.list_directory")
def _(c):
    """depth 1: the entries, with their types; depth 2 adds the next level."""
    d = c.vdir()
    c.vsh(f"mkdir -p {d}/sub && echo x > {d}/f && touch {d}/sub/g")
    one = {e.path: e.entry_type for e in c.files.list_directory(DirectoryListEntry(path=d, depth=1))}
    assert one == {f"{d}/f": "file", f"{d}/sub": "directory"}, one
    two = {e.path for e in c.files.list_directory(DirectoryListEntry(path=d, depth=2))}
    assert f"{d}/sub/g" in two, two


@works("FilesystemSync.get_file_info")
def _(c):
    """Size, type and mode of a file and a directory."""
    d = c.vdir()
    c.vsh(f"printf 12345 > {d}/f && chmod 640 {d}/f && mkdir {d}/dd")
    info = c.files.get_file_info([f"{d}/f", f"{d}/dd"])
    assert (info[f"{d}/f"].size, info[f"{d}/f"].entry_type, info[f"{d}/f"].mode) == (5, "file", 640)
    assert info[f"{d}/dd"].entry_type == "directory"


# ================================================================ IsolationServiceSync and IsolationSessionSync


@works("IsolationServiceSync.create")
def _(c):
    """A session on its workspace: its shell starts there and sees only its own processes."""
    ws = f"/iso-{uuid.uuid4().hex[:8]}"
    s = c.sb.isolation.create(iso_req(ws))
    c.defer(s.delete)
    ex = s.run("pwd; echo $$")
    lines = stdout_text(ex).splitlines()
    assert lines[0] == ws and int(lines[1]) < 20, describe(ex)


@works("IsolationServiceSync.attach")
def _(c):
    """A new handle on the shared session: same id, workspace and shell state."""
    c.session.run("ATTACHED=yes")
    h = c.sb.isolation.attach(c.session.session_id)
    assert h.session_id == c.session.session_id and h.info.workspace.path == c.ws
    assert stdout_text(h.run("echo $ATTACHED")) == "yes"


@works("IsolationServiceSync.capabilities")
def _(c):
    """Available; userns, diff and commit said to be unsupported."""
    caps = c.sb.isolation.capabilities()
    assert caps.available and caps.setpriv_available
    assert (caps.userns_available, caps.diff_supported, caps.commit_supported) == (False, False, False)


@works("IsolationServiceSync.list")
def _(c):
    """The shared session, active."""
    listed = {s.session_id: s for s in c.sb.isolation.list()}
    assert listed[c.session.session_id].status == "active"


@works("IsolationServiceSync.run_once")
def _(c):
    """Runs in a session of its own that is gone afterwards."""
    before = {s.session_id for s in c.sb.isolation.list()}
    ex = c.sb.isolation.run_once("echo once; pwd", workspace="/iso-once")
    assert stdout_text(ex) == "once\n/iso-once" and ex.exit_code == 0, describe(ex)
    assert {s.session_id for s in c.sb.isolation.list()} == before


@works("IsolationServiceSync.session")
def _(c):
    """A context manager: the session is listed inside and gone after."""
    with c.sb.isolation.session(iso_req("/iso-cm")) as s:
        sid = s.session_id
        assert sid in {x.session_id for x in c.sb.isolation.list()}
    assert sid not in {x.session_id for x in c.sb.isolation.list()}


@works("IsolationSessionSync.session_id")
def _(c):
    """The id the service lists."""
    assert c.session.session_id in {s.session_id for s in c.sb.isolation.list()}


@works("IsolationSessionSync.info")
def _(c):
    """The creation parameters echoed: workspace, strict profile, uid 0."""
    info = c.session.info
    assert (info.session_id, info.workspace.path, info.profile, info.uid) == (c.session.session_id, c.ws, "strict", 0)


@works("IsolationSessionSync.files")
def _(c):
    """The session's view: a file in its private /tmp is not the sandbox's."""
    name = f"/tmp/iso-files-{uuid.uuid4().hex[:8]}"
    c.session.files.write_file(name, "private")
    assert stdout_text(c.session.run(f"cat {name}")) == "private"
    assert c.sh(f"test -e {name} && echo leaked || echo absent") == "absent"


@works("IsolationSessionSync.run")
def _(c):
    """Output, exit code and state kept between runs."""
    c.session.run("cd /tmp; V=1")
    ex = c.session.run("pwd; echo $V; (exit 4)")
    assert stdout_text(ex) == "/tmp\n1" and ex.exit_code == 4, describe(ex)


@works("IsolationSessionSync.run_background")
def _(c):
    """A run handle in this session; its output lands in its log."""
    run = c.session.run_background("echo bg-out", opts=IsolatedRunOpts())
    assert run.session_id == c.session.session_id and run.run_id
    wait_until(lambda: c.session.run_status(run.run_id).running is False, 30, 0.05, what="the run to end")
    assert c.session.run_logs(run.run_id).text == "bg-out\n"


@works("IsolationSessionSync.run_status")
def _(c):
    """Ended with its exit code."""
    run = c.session.run_background("exit 5")
    st = wait_until(lambda: (s := c.session.run_status(run.run_id)).running is False and s, 30, 0.05,
                    what="the run to end")
    assert (st.run_id, st.exit_code) == (run.run_id, 5), st


@works("IsolationSessionSync.run_logs")
def _(c):
    """The whole log, then from a byte cursor the rest."""
    run = c.session.run_background("echo one; echo two")
    wait_until(lambda: c.session.run_status(run.run_id).running is False, 30, 0.05, what="the run to end")
    logs = c.session.run_logs(run.run_id)
    assert logs.text == "one\ntwo\n" and logs.cursor == 8, logs
    assert c.session.run_logs(run.run_id, cursor=4).text == "two\n"


@works("IsolationSessionSync.get")
def _(c):
    """Its state: active, created when its info says, run since, not idle for long."""
    st = c.session.get()
    assert st.status == "active" and st.created_at == c.session.info.created_at
    assert st.last_run_at >= st.created_at and st.idle_remaining_seconds > 0


@works("IsolationSessionSync.delete")
def _(c):
    """Then get is a 404 and the service no longer lists it."""
    s = c.sb.isolation.create(iso_req("/iso-del"))
    s.delete()
    assert api_error(s.get).status_code == 404
    assert s.session_id not in {x.session_id for x in c.sb.isolation.list()}


# ================================================================ CredentialVaultSync: deliberately refused

VAULT_WHY = ("pvisor has no credential vault (a sandbox-local secret store behind an egress proxy); every "
             "`/credential-vault*` route of port 18080 answers 501, and a create with `credentialProxy` is a 400")
VAULT_CALLS: dict[str, Callable[[CredentialVaultSync], object]] = {
    "create": lambda v: v.create(credentials=[], bindings=[]),
    "get": lambda v: v.get(),
    "patch": lambda v: v.patch(expected_revision=1),
    "delete": lambda v: v.delete(),
    "list_credentials": lambda v: v.list_credentials(),
    "get_credential": lambda v: v.get_credential("token"),
    "list_bindings": lambda v: v.list_bindings(),
    "get_binding": lambda v: v.get_binding("api"),
}
for _name, _call in VAULT_CALLS.items():
    refused(f"CredentialVaultSync.{_name}", lambda c, call=_call: call(c.bb.credential_vault),
            501, "NOT_SUPPORTED", VAULT_WHY)


# ================================================================ MetricsSync and DiagnosticsSync


@works("MetricsSync.get_metrics")
def _(c):
    """The tools sandbox's CPU and 1 GiB limit; a sample time."""
    m = c.sb.metrics.get_metrics(c.sb.id)
    assert (m.cpu_count, m.memory_total_in_mib) == (1, 1024) and m.timestamp > 0


@works("DiagnosticsSync.get_logs")
def _(c):
    """Scope `container`: the entrypoint's output; an unknown scope is a 400."""
    assert "entry-err" in c.bb.diagnostics.get_logs(c.bb.id, "container").content
    assert api_error(lambda: c.bb.diagnostics.get_logs(c.bb.id, "nonsense")).status_code == 400


@works("DiagnosticsSync.get_events")
def _(c):
    """Scope `container`: the entrypoint's start with its argv."""
    content = c.bb.diagnostics.get_events(c.bb.id, "container").content
    assert "EntrypointStarted" in content and "tail" in content, content


# ---------------------------------------------------------------- the docs page


def render_docs() -> str:
    version = importlib.metadata.version("opensandbox")
    counts = {
        "works": sum(r.verdict == "works" and not r.bug_in for r in ROWS.values()),
        "refused": sum(r.verdict == "refused" for r in ROWS.values()),
        "bug": sum(r.verdict == "bug" or bool(r.bug_in) for r in ROWS.values()),
    }
    out = [
        f"# The OpenSandbox SDK {version}, method by method",
        "",
        "Generated from the table of `tests/e2e/test_sdk_methods.py` "
        "(`python tests/e2e/test_sdk_methods.py > docs/sdk-methods.md`); that test fails when this page "
        "and the table differ, and when the installed SDK has a public member without a row.",
        "",
        "Every public method and property of the sync SDK's `SandboxSync`, `SandboxManagerSync` and "
        "`CodeInterpreterSync`, and of the facades they hand out (files, commands and their bash sessions, "
        "isolation and isolated sessions, the credential vault, metrics, diagnostics, code contexts), is "
        "called against pvisor (ns backend) in CI and its result checked. The `FilesystemSync` rows run "
        "twice: on a sandbox's `files` and on an isolated session's.",
        "",
        f"{len(ROWS)} members: {counts['works']} work, {counts['refused']} are refused on purpose, "
        f"{counts['bug']} have a known bug (in all or one of their uses; those tests are strict xfails: a "
        "fix makes them fail until the row says `works`).",
    ]
    for prefix in SURFACE:
        rows = [r for r in ROWS.values() if r.name.startswith(prefix + ".")]
        out += ["", f"## `{prefix}`", "", "| member | pvisor | checked, or why not |", "|---|---|---|"]
        for r in sorted(rows, key=lambda r: r.name):
            note = r.doc_note().replace("|", "\\|")
            out.append(f"| `{r.name.split('.', 1)[1]}` | {r.answer()} | {note} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the tests


def test_every_sdk_member_has_a_row():
    assert importlib.metadata.version("opensandbox") == SDK_VERSION
    assert importlib.metadata.version("opensandbox-code-interpreter") == SDK_VERSION
    surface = sdk_surface()
    assert sorted(surface - set(ROWS)) == [], "SDK members without a row"
    assert sorted(set(ROWS) - surface) == [], "rows for members the SDK does not have"


def test_the_docs_table_is_current():
    assert DOCS.is_file(), f"{DOCS} is missing: python tests/e2e/test_sdk_methods.py > docs/sdk-methods.md"
    assert DOCS.read_text() == render_docs(), (
        "docs/sdk-methods.md differs from the table: python tests/e2e/test_sdk_methods.py > docs/sdk-methods.md")


def _cases():
    for name, row in ROWS.items():
        for view in (FILE_VIEWS if name.startswith("FilesystemSync.") else (None,)):
            why = row.xfail(view)
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            yield pytest.param(name, view, id=name + (f"[{view}]" if view else ""), marks=marks)


@pytest.fixture(scope="module")
def shared(conn, manager, module_sandbox):
    sb = module_sandbox(TOOLS, resource=dict(TOOLS_RESOURCE))
    label = uuid.uuid4().hex
    bb = module_sandbox(BUSYBOX, entrypoint=CHATTY, metadata={"sdk-table": label})
    wait_until(lambda: "entry-err" in manager.get_diagnostic_logs(bb.id, "container").content, 30, 0.05,
               what="the entrypoint's output")
    ci = CodeInterpreterSync.create(sb)
    ws = "/sdk-ws"
    session = sb.isolation.create(iso_req(ws))
    yield Shared(conn, manager, sb, bb, label, ci, session, ws)
    _ignore_404(session.delete)
    ci.close()


@pytest.mark.parametrize("name,view", list(_cases()))
def test_sdk_method(name, view, shared, sandbox):
    row = ROWS[name]
    c = Ctx(shared, sandbox, view)
    try:
        if row.verdict == "refused":
            e = api_error(lambda: row.call(c))
            assert (e.status_code, e.error.code if e.error else None) == (row.status, row.code), e
        else:
            row.call(c)
    finally:
        for fn in reversed(c.cleanups):
            fn()


if __name__ == "__main__":
    print(render_docs(), end="")
