"""Isolated sessions (`sandbox.isolation`, OSEP-0013) through the official SDK.

An isolated session is a persistent shell in pid, mount, ipc and uts namespaces of its own
inside a sandbox: its processes see only their own pids, its root is the sandbox's read-only
but for its overlays, its /tmp (strict profile), /dev and /run are its own, its environment
is filtered, and deleting it ends every process and mount it had. Every public method of the
SDK's isolation facade (service, session handle, session files) is used here with its result
checked. (`test_isolation.py` is about sandbox-vs-sandbox and sandbox-vs-host isolation.)
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.isolated import (
    BindMount,
    CreateIsolatedSessionRequest,
    EnvPassthroughSpec,
    IsolatedOverlaySpec,
    IsolatedRunOpts,
    IsolatedWorkspaceSpec,
)

from e2e_util import BUSYBOX, DEBIAN, PS, assert_error_json, dataplane, describe, sh, stdout_text, wait_until

SECRET_ENV = {"MY_API_KEY": "k-secret", "PLAIN_SETTING": "plain-value"}


@pytest.fixture(scope="module")
def sb(module_sandbox):
    """A debian sandbox (bash) with a credential-like and a plain variable."""
    return module_sandbox(DEBIAN, env=SECRET_ENV)


@pytest.fixture(scope="module")
def iso(sb):
    return sb.isolation


@pytest.fixture
def ws():
    """A fresh workspace path (auto-created in the sandbox by the first session on it)."""
    return f"/work-{uuid.uuid4().hex[:8]}"


def req(path: str, **kw) -> CreateIsolatedSessionRequest:
    return CreateIsolatedSessionRequest(workspace=IsolatedWorkspaceSpec(path=path), **kw)


@pytest.fixture
def session(iso, ws):
    """A strict session on `ws` (an overlay over the sandbox's directory), deleted after."""
    s = iso.create(req(ws))
    yield s
    try:
        s.delete()
    except SandboxApiException:
        pass  # the test deleted it


def out(ex) -> str:
    assert ex.exit_code == 0, describe(ex)
    return stdout_text(ex)


def isolated_url(sb, path: str) -> tuple[str, dict[str, str]]:
    base, headers = dataplane(sb)
    return f"{base}/v1/isolated{path}", headers


# ------------------------------------------------------------------ capabilities


def test_capabilities_report_what_is_served(iso):
    c = iso.capabilities()
    assert c.available is True, c
    assert c.isolator == "pvisor" and c.version
    assert c.setpriv_available is True
    # Not served, and said so: user namespaces per session, diff and commit of uppers.
    assert (c.userns_available, c.commit_supported, c.diff_supported) == (False, False, False)
    assert c.hardening is not None and c.hardening.init_mode == "pid1" and c.hardening.signal_shield is True
    assert c.hardening.seccomp.state == "active" and c.hardening.cap_drop.state == "active"


# ------------------------------------------------------------------ namespaces


def test_a_session_sees_only_its_own_processes(sb, session):
    sh(sb, "sleep 1000 >/dev/null 2>&1 &")
    text = out(session.run(f"echo shell=$$; {PS}"))
    shell_pid = int(re.search(r"shell=(\d+)", text).group(1))
    procs = [line for line in text.splitlines()[1:] if line.strip()]
    assert not any("sleep 1000" in p for p in procs), f"the sandbox's processes leak into the session: {procs}"
    assert not any("--fd" in p for p in procs), f"the sandbox's agent is visible: {procs}"
    # Its own pid namespace: a handful of small pids (its init, the shell, this command).
    assert shell_pid < 20 and len(procs) < 10, text
    # Its /proc is its pid namespace's: its init is pid 1 there, and only there.
    assert out(session.run("grep '^NSpid' /proc/1/status | tr -s ' \t' ' '")) == "NSpid: 1"
    # The sandbox sees the session's processes (a child namespace), under other pids.
    session.run_background("exec sleep 1001")
    wait_until(lambda: "sleep 1001" in sh(sb, PS), 30, what="the session's sleep, seen from the sandbox")
    sh(sb, "pkill -f 'sleep 1000' || kill $(pgrep -f 'sleep 1000') || true")


def test_strict_tmp_is_private_and_gone_after(sb, iso, ws):
    sh(sb, "echo sandbox > /tmp/from-sandbox")
    name = f"/tmp/from-session-{uuid.uuid4().hex[:8]}"
    s = iso.create(req(ws))
    try:
        assert out(s.run(f"echo secret > {name}; cat {name}; ls /tmp")) == f"secret\n{name[5:]}"
        assert sh(sb, f"test -e {name} && echo leaked || echo absent") == "absent"
        other = iso.create(req(ws))
        try:
            assert out(other.run(f"test -e {name} && echo seen || echo absent")) == "absent"
        finally:
            other.delete()
    finally:
        s.delete()
    again = iso.create(req(ws))
    try:
        assert out(again.run(f"ls -A /tmp; test -e {name} && echo seen || echo absent")) == "absent"
    finally:
        again.delete()


def test_balanced_profile_shares_the_sandbox_tmp(sb, iso, ws):
    sh(sb, "echo sandbox > /tmp/shared-in")
    with iso.session(req(ws, profile="balanced")) as s:
        assert out(s.run("cat /tmp/shared-in; echo session > /tmp/shared-out")) == "sandbox"
        assert s.get().profile == "balanced"
        # The balanced workspace is the sandbox's directory itself (rw).
        assert s.info.workspace.mode == "rw"
        out(s.run(f"echo through > {ws}/rw.txt"))
    assert sh(sb, f"cat /tmp/shared-out {ws}/rw.txt") == "session\nthrough"


def test_session_processes_have_the_sandboxs_privileges(sb, session):
    probe = "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status"
    mine, sandbox = out(session.run(probe)), sh(sb, probe)
    # Same capabilities and no_new_privs; the sandbox filter (plus the isolator's beneath it).
    strip = lambda t: [line for line in t.splitlines() if not line.startswith("Seccomp_filters")]
    assert strip(mine) == strip(sandbox), (mine, sandbox)
    assert "NoNewPrivs:\t1" in mine and "Seccomp:\t2" in mine
    # What the sandbox may not do, the session may not either.
    ex = session.run("unshare -m true 2>&1; echo rc=$?; mount -t tmpfs t /mnt 2>&1; echo rc=$?")
    assert stdout_text(ex).count("rc=1") + stdout_text(ex).count("rc=32") == 2, describe(ex)


def test_the_root_is_read_only(session):
    ex = session.run("touch /etc/pvisor-session-write 2>&1; echo rc=$?")
    text = stdout_text(ex)
    assert "Read-only file system" in text and "rc=1" in text, describe(ex)


def test_network_is_shared_unless_asked_otherwise(sb, iso, ws):
    def interfaces(s) -> set[str]:
        lines = out(s.run("tail -n +3 /proc/net/dev")).splitlines()
        return {line.split(":")[0].strip() for line in lines}

    sandbox_ifaces = {line.split(":")[0].strip() for line in sh(sb, "tail -n +3 /proc/net/dev").splitlines()}
    with iso.session(req(ws)) as s:
        assert interfaces(s) == sandbox_ifaces
    with iso.session(req(ws, share_net=False)) as s:
        assert interfaces(s) == {"lo"}
        assert s.get().share_net is False
        assert out(s.run("cat /sys/class/net/lo/operstate 2>/dev/null || echo ?; grep -c lo /proc/net/dev")) != ""


# ------------------------------------------------------------------ workspaces


def test_an_overlay_workspace_is_copy_on_write(sb, iso, ws):
    sh(sb, f"mkdir -p {ws} && echo original > {ws}/base.txt")
    with iso.session(req(ws)) as s:
        assert s.info.workspace.mode == "overlay" and s.info.overlays[0].persist is True
        assert out(s.run("pwd; cat base.txt")) == f"{ws}\noriginal"
        out(s.run("echo changed > base.txt; echo new > new.txt; rm -f gone.txt"))
        assert out(s.run("cat base.txt new.txt")) == "changed\nnew"
        # The sandbox's directory is untouched, during and after.
        assert sh(sb, f"cat {ws}/base.txt; ls {ws}") == "original\nbase.txt"
        # The session's files API sees the session's view, the sandbox's its own.
        assert s.files.read_file(f"{ws}/base.txt") == "changed\n"
        assert sb.files.read_file(f"{ws}/base.txt") == "original\n"
    assert sh(sb, f"cat {ws}/base.txt; ls {ws}") == "original\nbase.txt"


def test_persistent_uppers_are_on_the_sandboxs_disk(sb, iso, ws):
    overlays = [IsolatedOverlaySpec(path=f"{ws}/disk"), IsolatedOverlaySpec(path=f"{ws}/mem", persist=False)]
    with iso.session(CreateIsolatedSessionRequest(overlays=overlays)) as s:
        kib = lambda p: int(out(s.run(f"df -Pk {p} | tail -1")).split()[1])
        tmp = kib("/tmp")
        # An overlay reports its upper's file system: the disk bound, or the session's tmpfs (/tmp's size).
        assert kib(f"{ws}/mem") == tmp
        assert kib(f"{ws}/disk") > 4 * tmp, "a persistent upper lives on the sandbox's disk"


def test_ephemeral_overlays_rw_and_ro(sb, iso, ws):
    for d in ("eph", "rw", "ro"):
        sh(sb, f"mkdir -p {ws}/{d} && echo sandbox > {ws}/{d}/f")
    overlays = [
        IsolatedOverlaySpec(path=f"{ws}/eph", mode="overlay", persist=False),
        IsolatedOverlaySpec(path=f"{ws}/rw", mode="rw"),
        IsolatedOverlaySpec(path=f"{ws}/ro", mode="ro"),
    ]
    with iso.session(CreateIsolatedSessionRequest(overlays=overlays)) as s:
        assert [(o.path[len(ws):], o.mode, o.persist) for o in s.get().overlays] == [
            ("/eph", "overlay", False),
            ("/rw", "rw", None),
            ("/ro", "ro", None),
        ]
        assert s.get().workspace is None, "workspace is echoed for legacy single-workspace sessions only"
        assert out(s.run(f"echo s > {ws}/eph/f; echo s > {ws}/rw/f; cat {ws}/eph/f {ws}/rw/f")) == "s\ns"
        ex = s.run(f"echo s > {ws}/ro/f")
        assert ex.exit_code == 1, describe(ex)
        # Through the files API too: a read-only mount refuses with 403.
        with pytest.raises(SandboxApiException) as e:
            s.files.write_file(f"{ws}/ro/g", "x")
        assert e.value.status_code == 403
        s.files.write_file(f"{ws}/eph/g", "eph-file")
        assert out(s.run(f"cat {ws}/eph/g")) == "eph-file"
    assert sh(sb, f"cat {ws}/eph/f {ws}/rw/f {ws}/ro/f; ls {ws}/eph") == "sandbox\ns\nsandbox\nf"


def test_binds_and_extra_writable(sb, iso, ws):
    sh(sb, f"mkdir -p /srv/data-{ws[6:]} /srv/cache-{ws[6:]} && echo data > /srv/data-{ws[6:]}/d")
    data, cache = f"/srv/data-{ws[6:]}", f"/srv/cache-{ws[6:]}"
    r = req(ws, binds=[BindMount(source=data, dest="/mnt/data", readonly=True)], extra_writable=[cache])
    with iso.session(r) as s:
        assert out(s.run("cat /mnt/data/d")) == "data"
        assert s.run("echo x > /mnt/data/e").exit_code == 1
        out(s.run(f"echo cached > {cache}/c"))
        assert [(b.source, b.dest, b.readonly) for b in s.get().binds] == [(data, "/mnt/data", True)]
        assert s.get().extra_writable == [cache]
    assert sh(sb, f"cat {cache}/c; ls {data}") == "cached\nd"


# ------------------------------------------------------------------ environment and state


def test_environment_is_filtered_and_does_not_leak(sb, iso, ws):
    with iso.session(req(ws)) as s:
        # Strict: credential-like names are dropped, the rest passes.
        assert out(s.run("echo key=${MY_API_KEY:-unset} plain=$PLAIN_SETTING")) == "key=unset plain=plain-value"
        ex = s.run("echo run=$RUN_VAR", opts=IsolatedRunOpts(envs={"RUN_VAR": "it's set"}))
        assert out(ex) == "run=it's set"
        # Exported into the session's shell: later runs of the session see it...
        assert out(s.run("echo again=$RUN_VAR")) == "again=it's set"
        out(s.run("export SESSION_ONLY=1"))
        with iso.session(req(ws)) as other:
            # ...no other session does, nor the sandbox's commands.
            assert out(other.run("echo ${RUN_VAR:-unset} ${SESSION_ONLY:-unset}")) == "unset unset"
        assert sh(sb, "echo ${RUN_VAR:-unset} ${SESSION_ONLY:-unset}") == "unset unset"
    with iso.session(req(ws, profile="balanced")) as s:
        assert out(s.run("echo key=${MY_API_KEY:-unset}")) == "key=k-secret"
    allow = EnvPassthroughSpec(mode="allow", keys=["PLAIN_SETTING"])
    with iso.session(req(ws, env_passthrough=allow)) as s:
        names = set(out(s.run("env | cut -d= -f1")).split())
        assert "PLAIN_SETTING" in names and "MY_API_KEY" not in names and "HOME" not in names, names
        assert (s.info.env_passthrough.mode, s.info.env_passthrough.keys) == ("allow", ["PLAIN_SETTING"])
    deny = EnvPassthroughSpec(mode="deny", keys=["PLAIN_SETTING"])
    with iso.session(req(ws, profile="balanced", env_passthrough=deny)) as s:
        assert out(s.run("echo ${PLAIN_SETTING:-unset} $MY_API_KEY")) == "unset k-secret"


def test_state_persists_within_a_session(session):
    out(session.run("cd /tmp && X=42 && f() { echo fn-$1; } && echo kept > /tmp/state"))
    assert out(session.run("pwd; echo $X; f ok; cat /tmp/state")) == "/tmp\n42\nfn-ok\nkept"
    # A failing run reports its exit code and leaves the state alone.
    ex = session.run("echo before; false")
    assert ex.exit_code == 1 and ex.error is not None, describe(ex)
    assert out(session.run("echo $X")) == "42"
    assert session.get().last_run_at >= session.get().created_at


def test_a_timeout_ends_the_run_and_the_session_goes_on(session):
    out(session.run("echo survives > /tmp/file; V=shell-var"))
    ex = session.run("echo started; sleep 60", opts=IsolatedRunOpts(timeout_seconds=1))
    assert ex.exit_code == 137 and "timed out" in " ".join(ex.error.traceback), describe(ex)
    assert [m.text for m in ex.logs.stdout] == ["started"]
    # The shell was killed with what it ran; the next run gets a fresh one in the same session.
    assert out(session.run("cat /tmp/file; echo ${V:-unset}; pgrep -c sleep || echo 0")) == "survives\nunset\n0"


def test_stderr_and_handlers(session):
    from opensandbox.models.execd_sync import ExecutionHandlersSync

    seen: list[str] = []
    handlers = ExecutionHandlersSync(on_stdout=lambda m: seen.append(f"out:{m.text}"), on_stderr=lambda m: seen.append(f"err:{m.text}"))
    ex = session.run("echo to-out; echo to-err >&2", handlers=handlers)
    assert ex.exit_code == 0, describe(ex)
    assert sorted(seen) == ["err:to-err", "out:to-out"]
    assert [m.text for m in ex.logs.stderr] == ["to-err"]


# ------------------------------------------------------------------ background runs


def test_background_runs_status_and_logs(session):
    run = session.run_background(
        "echo out-line; echo err-line >&2; echo $BG; cd /; pwd; sleep 0.3; echo done; exit 7",
        opts=IsolatedRunOpts(envs={"BG": "bg-env"}),
    )
    assert run.session_id == session.session_id and run.run_id and run.started_at is not None
    st = session.run_status(run.run_id)
    assert st.run_id == run.run_id and st.session_id == session.session_id
    st = wait_until(lambda: (s := session.run_status(run.run_id)).running is False and s, 30, what="the run to end")
    assert st.exit_code == 7 and st.finished_at is not None and st.error is None, st
    logs = session.run_logs(run.run_id)
    assert logs.text.splitlines() == ["out-line", "err-line", "bg-env", "/", "done"], logs
    assert logs.cursor == len(logs.text.encode())
    # From a cursor: only what follows it, and an empty read at the end.
    tail = session.run_logs(run.run_id, cursor=len(b"out-line\n"))
    assert tail.text.startswith("err-line\n") and tail.cursor == logs.cursor
    assert session.run_logs(run.run_id, cursor=logs.cursor).text == ""
    # A background run does not change the shell's state, and the shell is free meanwhile.
    assert out(session.run("pwd")) == session.info.workspace.path


def test_background_runs_outlive_a_foreground_timeout_and_die_with_the_session(sb, iso, ws):
    s = iso.create(req(ws))
    marker = f"bg-{uuid.uuid4().hex[:8]}"
    run = s.run_background(f"exec -a {marker} sleep 1000")
    s.run("sleep 60", opts=IsolatedRunOpts(timeout_seconds=1))
    assert s.run_status(run.run_id).running is True
    wait_until(lambda: marker in sh(sb, PS), 30, what="the background run, seen from the sandbox")
    s.delete()
    wait_until(lambda: marker not in sh(sb, PS), 30, what="the background run to end with its session")


# ------------------------------------------------------------------ the files facade


def test_session_files_facade(sb, iso, ws):
    with iso.session(req(ws)) as s:
        f = s.files
        f.write_file(f"{ws}/a.txt", "alpha\nbeta\n", mode=640)
        f.write_files(
            [WriteEntry(path=f"{ws}/b.bin", data=b"\x00\x01\x02"), WriteEntry(path="/tmp/private.txt", data="tmp")]
        )
        assert f.read_file(f"{ws}/a.txt") == "alpha\nbeta\n"
        assert f.read_file(f"{ws}/a.txt", offset=2, limit=1) == "beta\n"
        assert f.read_bytes(f"{ws}/b.bin") == b"\x00\x01\x02"
        assert b"".join(f.read_bytes_stream(f"{ws}/b.bin", chunk_size=1)) == b"\x00\x01\x02"
        # The session sees what its files API wrote, the sandbox does not.
        assert out(s.run(f"cat /tmp/private.txt; echo; stat -c %a {ws}/a.txt")) == "tmp\n640"
        assert sh(sb, f"ls {ws} /tmp/private.txt 2>&1 || true").count("No such file") >= 1
        f.create_directories([WriteEntry(path=f"{ws}/d1/d2", mode=700)])
        info = f.get_file_info([f"{ws}/a.txt", f"{ws}/d1/d2"])
        assert info[f"{ws}/a.txt"].size == 11 and info[f"{ws}/d1/d2"].mode == 700
        listed = {e.path for e in f.list_directory(DirectoryListEntry(path=ws, depth=1))}
        assert {f"{ws}/a.txt", f"{ws}/b.bin", f"{ws}/d1"} <= listed
        assert [e.path for e in f.search(SearchEntry(path=ws, pattern="*.txt"))] == [f"{ws}/a.txt"]
        f.replace_contents([ContentReplaceEntry(path=f"{ws}/a.txt", old_content="beta", new_content="gamma")])
        assert out(s.run(f"cat {ws}/a.txt")) == "alpha\ngamma"
        f.move_files([MoveEntry(src=f"{ws}/a.txt", dest=f"{ws}/d1/moved.txt")])
        f.set_permissions([SetPermissionEntry(path=f"{ws}/d1/moved.txt", mode=600)])
        assert out(s.run(f"stat -c %a {ws}/d1/moved.txt; test -e {ws}/a.txt || echo gone")) == "600\ngone"
        f.delete_files([f"{ws}/b.bin"])
        f.delete_directories([f"{ws}/d1"])
        assert out(s.run(f"ls -A {ws}")) == ""
        # Outside the session's mounts the root is read-only for the files API too.
        with pytest.raises(SandboxApiException) as e:
            f.write_file("/etc/pvisor-files-write", "x")
        assert e.value.status_code == 403
    assert sh(sb, f"ls -A {ws}") == ""


def test_files_run_as_the_session_identity(sb, iso, ws):
    with iso.session(req(ws, uid=1000, gid=1000)) as s:
        assert (s.info.uid, s.info.gid, s.info.uid_mode) == (1000, 1000, "setpriv")
        assert out(s.run("id -u; id -g")) == "1000\n1000"
        # The workspace the session made is the session's.
        assert sh(sb, f"stat -c %u:%g {ws}") == "1000:1000"
        s.files.write_file(f"{ws}/owned.txt", "x")
        assert out(s.run(f"stat -c %u:%g {ws}/owned.txt")) == "1000:1000"
        # The identity's permissions apply: root's files stay root's.
        with pytest.raises(SandboxApiException) as e:
            s.files.read_file("/etc/shadow")
        assert e.value.status_code == 403


# ------------------------------------------------------------------ the service


def test_attach_list_get_delete(iso, ws):
    s = iso.create(req(ws, idle_timeout_seconds=600))
    try:
        assert re.fullmatch(r"[0-9a-f-]{36}", s.session_id) and s.info.created_at is not None
        listed = {x.session_id: x for x in iso.list()}
        assert listed[s.session_id].status == "active"
        assert 0 < listed[s.session_id].idle_remaining_seconds <= 600
        again = iso.attach(s.session_id)
        assert again.session_id == s.session_id
        assert (again.info.profile, again.info.workspace.path, again.info.idle_timeout_seconds) == ("strict", ws, 600)
        out(again.run("echo via-attach > /tmp/a"))
        assert out(s.run("cat /tmp/a")) == "via-attach", "one session behind both handles"
        st = s.get()
        assert st.status == "active" and st.share_net is True and st.uid == 0
    finally:
        s.delete()
    assert s.session_id not in {x.session_id for x in iso.list()}
    with pytest.raises(SandboxApiException) as e:
        s.get()
    assert e.value.status_code == 404


def test_run_once_and_the_session_context_manager(iso, ws):
    before = {x.session_id for x in iso.list()}
    ex = iso.run_once("echo once $$; ls -A /tmp", workspace=ws, opts=IsolatedRunOpts(timeout_seconds=30))
    assert ex.exit_code == 0 and stdout_text(ex).startswith("once "), describe(ex)
    assert {x.session_id for x in iso.list()} == before, "run_once deletes its session"
    with iso.session(req(ws)) as s:
        sid = s.session_id
        assert sid in {x.session_id for x in iso.list()}
    assert sid not in {x.session_id for x in iso.list()}


def test_a_session_without_bash_uses_sh(module_sandbox):
    sb = module_sandbox(BUSYBOX)
    with sb.isolation.session(req("/workspace")) as s:
        assert out(s.run("echo $0; ps | wc -l")).split()[0] == "/bin/sh"
        assert out(s.run("X=1")) == "" and out(s.run("echo $X")) == "1"


# ------------------------------------------------------------------ errors


def test_unknown_session_is_a_404_json_error(sb, iso):
    missing = str(uuid.uuid4())
    with pytest.raises(SandboxApiException) as e:
        iso.attach(missing)
    assert e.value.status_code == 404
    url, headers = isolated_url(sb, f"/session/{missing}")
    for method, path, body in [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/run", {"code": "true"}),
        ("POST", "/run", {"code": "true", "background": True}),
        ("GET", "/runs/x", None),
        ("GET", "/files/info?path=/", None),
        ("GET", "/files/download?path=/etc/hostname", None),
    ]:
        r = httpx.request(method, url + path, headers=headers, json=body, timeout=30)
        assert assert_error_json(r, 404)["code"] == "SESSION_NOT_FOUND", (method, path)


def test_unknown_run_is_a_404_json_error(sb, session):
    url, headers = isolated_url(sb, f"/session/{session.session_id}/runs/{uuid.uuid4()}")
    r = httpx.get(url, headers=headers, timeout=30)
    assert assert_error_json(r, 404)["code"] == "RUN_NOT_FOUND"
    r = httpx.get(url + "/logs", headers=headers, timeout=30)
    assert assert_error_json(r, 404)["code"] == "RUN_NOT_FOUND"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"workspace": {"path": "relative"}},
        {"workspace": {"path": "/w/../etc"}},
        {"workspace": {"path": "/w", "mode": "writable"}},
        {"overlays": [{"path": "/w", "mode": "rw", "persist": True}]},
        {"overlays": [{"path": "/w"}, {"path": "/w"}]},
        {"workspace": {"path": "/w"}, "profile": "paranoid"},
        {"workspace": {"path": "/w"}, "idle_timeout_seconds": -1},
        {"workspace": {"path": "/w"}, "uid": -1},
        {"workspace": {"path": "/w"}, "env_passthrough": {"mode": "some", "keys": []}},
        {"workspace": {"path": "/w"}, "sharenet": False},
        {"workspace": {"path": "/w"}, "binds": [{"source": "/does-not-exist-anywhere", "dest": "/mnt/x"}]},
        {"workspace": {"path": "/etc/hostname"}},
        {"workspace": {"path": "/proc/sys"}},
        {"workspace": {"path": "/w"}, "extra_writable": ["/dev/shm"]},
    ],
)
def test_bad_options_are_400_json_errors(sb, iso, body):
    before = len(iso.list())
    url, headers = isolated_url(sb, "/session")
    r = httpx.post(url, headers=headers, json=body, timeout=30)
    assert_error_json(r, 400)
    assert len(iso.list()) == before, "a refused create leaves no session"


@pytest.mark.backend("ns", why="a vm guest has no user namespace: every uid is its own")
def test_a_uid_the_sandbox_does_not_map_is_a_400(sb, iso):
    before = len(iso.list())
    url, headers = isolated_url(sb, "/session")
    r = httpx.post(url, headers=headers, json={"workspace": {"path": "/w"}, "uid": 4000000}, timeout=30)
    assert_error_json(r, 400)
    assert len(iso.list()) == before, "a refused create leaves no session"


def test_userns_uid_mode_is_not_supported(iso, ws):
    with pytest.raises(SandboxApiException) as e:
        iso.create(req(ws, uid_mode="userns"))
    assert e.value.status_code == 501


def test_bad_run_requests(sb, session):
    url, headers = isolated_url(sb, f"/session/{session.session_id}/run")
    for body in [{"code": ""}, {"code": "true", "envs": {"1BAD": "x"}}, {"code": "true", "timeout_seconds": -1}, {"cmd": "x"}]:
        assert_error_json(httpx.post(url, headers=headers, json=body, timeout=30), 400)


def test_diff_and_commit_are_not_supported(sb, session):
    url, headers = isolated_url(sb, f"/session/{session.session_id}")
    assert assert_error_json(httpx.get(url + "/diff", headers=headers, timeout=30), 501)["code"] == "NOT_SUPPORTED"
    assert assert_error_json(httpx.post(url + "/commit", headers=headers, timeout=30), 501)["code"] == "NOT_SUPPORTED"


# ------------------------------------------------------------------ lifetime and cleanup

# Pids (in the sandbox) whose innermost pid is 1 in a namespace below the sandbox's: session inits.
SESSION_INITS = (
    r"for p in /proc/[0-9]*; do grep -qE '^NSpid:\s+[0-9]+\s+1$' $p/status 2>/dev/null && echo ${p#/proc/}; done; true"
)
# Mount namespaces of the sandbox's processes (those it may inspect).
MOUNT_NAMESPACES = "for p in /proc/[0-9]*; do readlink $p/ns/mnt 2>/dev/null; done | sort -u"


def test_delete_leaves_no_process_or_mount(sb, iso, ws):
    inits_before, mnt_before = sh(sb, SESSION_INITS), sh(sb, MOUNT_NAMESPACES)
    s = iso.create(req(ws))
    marker = f"cleanup-{uuid.uuid4().hex[:8]}"
    s.run_background(f"exec -a {marker} sleep 1000")
    out(s.run(f"(exec -a {marker}-fg sleep 1000 &) ; echo x > /tmp/f"))
    wait_until(lambda: sh(sb, PS).count(marker) == 2, 30, what="both of the session's processes")
    assert len(sh(sb, SESSION_INITS).split()) == len(inits_before.split()) + 1
    assert len(sh(sb, MOUNT_NAMESPACES).split()) > len(mnt_before.split()), "the session has a mount namespace"
    s.delete()
    # Delete returns once the session's pid namespace is gone: nothing left to wait for.
    assert marker not in sh(sb, PS)
    assert sh(sb, SESSION_INITS) == inits_before
    assert sh(sb, MOUNT_NAMESPACES) == mnt_before
    # The sandbox's own mount table never had the session's mounts.
    assert ws not in sh(sb, "cat /proc/self/mountinfo")


@pytest.mark.backend("ns", why="a vm's uppers are on its scratch disk, inside the guest, out of the host's and the sandbox's sight")
def test_delete_removes_the_persistent_uppers(sb, iso, ws, pvisor_server):
    """Seen from the host: the sandbox's disk, in its worker's mount namespace."""
    worker = subprocess.run(["pgrep", "-f", f"pvisor-worker sbx {sb.id}"], capture_output=True, text=True).stdout.split()
    isolated = Path(f"/proc/{worker[0]}/root{pvisor_server.data_dir}/sandboxes/{sb.id}/disk/isolated") if worker else None
    if isolated is None or not isolated.is_dir():
        pytest.skip("no sandbox disk of its own here (persistent uppers live on the session's tmpfs)")
    before = set(os.listdir(isolated))
    s = iso.create(req(ws))
    out(s.run("head -c 100000 /dev/zero > big"))
    assert set(os.listdir(isolated)) == before | {s.session_id}
    s.delete()
    assert set(os.listdir(isolated)) == before


def test_a_session_whose_init_is_killed_is_dead(sb, iso, ws):
    inits_before = set(sh(sb, SESSION_INITS).split())
    s = iso.create(req(ws))
    (init,) = set(sh(sb, SESSION_INITS).split()) - inits_before
    sh(sb, f"kill -9 {init}")
    wait_until(lambda: s.get().status == "dead", 30, what="the session to be reported dead")
    assert s.session_id in {x.session_id for x in iso.list() if x.status == "dead"}
    url, headers = isolated_url(sb, f"/session/{s.session_id}/run")
    assert assert_error_json(httpx.post(url, headers=headers, json={"code": "true"}, timeout=30), 409)["code"] == (
        "SESSION_NOT_ACTIVE"
    )
    s.delete()
    assert s.session_id not in {x.session_id for x in iso.list()}


def test_idle_sessions_are_collected(iso, ws):
    s = iso.create(req(ws, idle_timeout_seconds=1))
    assert s.get().idle_remaining_seconds in (0, 1)

    def gone():
        try:
            s.get()
            return False
        except SandboxApiException as e:
            return e.status_code == 404

    wait_until(gone, 30, what="the idle session to be collected")


def test_sessions_end_with_their_sandbox(module_sandbox):
    sb = module_sandbox(DEBIAN)
    s = sb.isolation.create(req("/w"))
    out(s.run("true"))
    sb.kill()
    with pytest.raises(SandboxApiException):
        s.get()
