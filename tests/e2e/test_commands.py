"""Data plane: commands (foreground SSE, background, timeout, uid/gid), sessions, metrics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException, SandboxException

from e2e_util import (
    PS,
    BUSYBOX,
    DEBIAN,
    dataplane,
    describe,
    run,
    sh,
    stderr_text,
    stdout_text,
    wait_until,
)


@pytest.fixture(scope="module")
def bb(module_sandbox):
    return module_sandbox(BUSYBOX)


@pytest.fixture(scope="module")
def deb(module_sandbox):
    return module_sandbox(DEBIAN)


# ------------------------------------------------------------------- foreground


def test_stdout(bb):
    ex = run(bb, "echo hello")
    assert ex.exit_code == 0, describe(ex)
    assert ex.id, "the init event must carry the execution id"
    assert [m.text for m in ex.logs.stdout] == ["hello"], describe(ex)
    assert ex.logs.stderr == []
    assert ex.error is None and ex.complete is not None
    assert ex.logs.stdout[0].timestamp > 1_600_000_000_000, "timestamps are unix milliseconds"


def test_exit_code(bb):
    ex = run(bb, "exit 3")
    assert ex.exit_code == 3, describe(ex)
    assert ex.error is not None and ex.error.value == "3", describe(ex)
    ex = run(bb, "false")
    assert ex.exit_code == 1, describe(ex)
    ex = run(bb, "echo before; exit 42")
    assert (ex.exit_code, stdout_text(ex)) == (42, "before"), describe(ex)


def test_stderr(bb):
    ex = run(bb, "echo out; echo oops >&2; echo err2 1>&2")
    assert ex.exit_code == 0, describe(ex)
    assert stdout_text(ex) == "out"
    assert stderr_text(ex) == "oops\nerr2"
    assert all(m.is_error for m in ex.logs.stderr)


def test_unicode_and_blank_lines(bb):
    ex = run(bb, "printf 'h\\303\\251llo \\342\\234\\223\\n\\nlast\\n'")
    assert ex.exit_code == 0, describe(ex)
    # One event per line; the SDK's text rendering drops empty events, so check events.
    assert "\n".join(m.text.rstrip("\n") for m in ex.logs.stdout) == "héllo ✓\n\nlast", describe(ex)


def test_no_trailing_newline(bb):
    assert sh(bb, "printf abc") == "abc"


def test_envs(bb):
    ex = run(bb, 'echo "$FOO|$BAR"', envs={"FOO": "bar baz", "BAR": "x=y;z"})
    assert ex.exit_code == 0, describe(ex)
    assert stdout_text(ex) == "bar baz|x=y;z"
    # envs do not leak into later commands
    assert sh(bb, 'echo "[$FOO]"') == "[]"


def test_cwd(bb):
    assert sh(bb, "pwd", working_directory="/tmp") == "/tmp"
    assert sh(bb, "mkdir -p /tmp/cwd-test/sub && echo ok") == "ok"
    assert sh(bb, "pwd", working_directory="/tmp/cwd-test/sub") == "/tmp/cwd-test/sub"


def test_cwd_expands_home_and_variables(deb):
    """~, $NAME and ${NAME} in a working directory, as the SDK documents."""
    assert sh(deb, "pwd", working_directory="~") == "/root"
    assert sh(deb, "pwd", working_directory="~/") == "/root"
    assert sh(deb, "mkdir -p /tmp/cwd-exp/sub && echo ok") == "ok"
    assert sh(deb, "pwd", working_directory="$HOME") == "/root"
    assert sh(deb, "pwd", working_directory="${HOME}/../tmp") == "/tmp"
    assert sh(deb, "pwd", working_directory="$BASE/sub", envs={"BASE": "/tmp/cwd-exp"}) == "/tmp/cwd-exp/sub"
    assert sh(deb, "pwd", working_directory="${BASE}/sub", envs={"BASE": "/tmp/cwd-exp"}) == "/tmp/cwd-exp/sub"
    # ~ is the home of the user the command runs as.
    assert sh(deb, "pwd", working_directory="~", uid=1000) == "/home/app"
    # Background commands too.
    ex = run(deb, "pwd > /tmp/cwd-exp/bg", working_directory="$BASE", envs={"BASE": "/tmp/cwd-exp"}, background=True)
    wait_until(lambda: sh(deb, "cat /tmp/cwd-exp/bg 2>/dev/null") == "/tmp/cwd-exp", timeout=10)
    # A variable that is not set is an error, not an empty string.
    with pytest.raises(SandboxApiException) as ei:
        run(deb, "echo should-not-run", working_directory="$E2E_NOT_SET/tmp")
    assert ei.value.status_code == 400, ei.value
    assert "E2E_NOT_SET" in str(ei.value), ei.value


def test_session_cwd_expands(deb):
    sid = deb.commands.create_session(working_directory="~")
    try:
        assert stdout_text(deb.commands.run_in_session(sid, "pwd")) == "/root"
        deb.commands.run_in_session(sid, "export E2E_DIR=/usr/share; mkdir -p '/tmp/a b'")
        # Run cwds are expanded by the session's shell: its own variables count.
        ex = deb.commands.run_in_session(sid, "pwd", working_directory="$E2E_DIR")
        assert stdout_text(ex) == "/usr/share", describe(ex)
        ex = deb.commands.run_in_session(sid, "pwd", working_directory="${HOME}/../tmp/a b")
        assert stdout_text(ex) == "/tmp/a b", describe(ex)
        ex = deb.commands.run_in_session(sid, "echo ran", working_directory="$E2E_NOT_SET_EITHER")
        assert ex.exit_code == 1 and "ran" not in stdout_text(ex), describe(ex)
        assert "E2E_NOT_SET_EITHER" in stderr_text(ex), describe(ex)
    finally:
        _drop_session(deb, sid)
    with pytest.raises(SandboxApiException) as ei:
        deb.commands.create_session(working_directory="$E2E_NOT_SET/x")
    assert ei.value.status_code == 400, ei.value


def test_cwd_missing_is_an_error(bb):
    try:
        ex = run(bb, "echo should-not-run", working_directory="/no/such/dir")
    except SandboxApiException as e:
        assert 400 <= e.status_code < 500, e
        return
    assert ex.exit_code != 0 and "should-not-run" not in stdout_text(ex), describe(ex)


def test_2000_lines_in_order(bb):
    ex = run(bb, "seq 1 2000")
    assert ex.exit_code == 0, describe(ex)
    lines = stdout_text(ex).split("\n")
    assert len(lines) == 2000
    assert lines == [str(i) for i in range(1, 2001)]


def test_interleaved_stdout_stderr_counts(bb):
    ex = run(bb, "i=0; while [ $i -lt 300 ]; do echo o$i; echo e$i >&2; i=$((i+1)); done")
    assert ex.exit_code == 0, describe(ex)
    assert stdout_text(ex).split("\n") == [f"o{i}" for i in range(300)]
    assert stderr_text(ex).split("\n") == [f"e{i}" for i in range(300)]


@pytest.mark.deadline(60)
def test_1mib_single_line(bb):
    ex = run(bb, "head -c 1048576 /dev/zero | tr '\\0' a")
    assert ex.exit_code == 0, describe(ex, limit=2)
    text = "".join(m.text for m in ex.logs.stdout)
    assert len(text) == 1048576, f"got {len(text)} chars in {len(ex.logs.stdout)} events"
    assert text == "a" * 1048576


@pytest.mark.deadline(60)
def test_1mib_multiline(bb):
    line = "a" * 63
    ex = run(bb, f"yes {line} | head -c 1048576")
    assert ex.exit_code == 0, describe(ex, limit=2)
    lines = stdout_text(ex).split("\n")
    assert len(lines) == 16384
    assert lines == [line] * 16384
    assert sum(len(m.text) for m in ex.logs.stdout) + 16384 >= 1048576


def test_command_timeout(bb):
    t0 = time.monotonic()
    ex = run(bb, "echo started; sleep 30; echo not-reached", timeout_ms=1000)
    elapsed = time.monotonic() - t0
    assert elapsed < 10, f"timeout 1000 ms but the command took {elapsed:.1f}s"
    assert "not-reached" not in stdout_text(ex)
    assert ex.error is not None and ex.exit_code != 0, describe(ex)
    ps = sh(bb, PS)
    assert "sleep 30" not in ps, f"the timed-out command's process group must be killed:\n{ps}"


def test_background_status_logs_interrupt(bb):
    ex = run(bb, "echo bg-start; sleep 30; echo bg-end", background=True)
    assert ex.id, describe(ex)
    st = bb.commands.get_command_status(ex.id)
    assert st.running is True, st
    assert st.exit_code is None, st
    logs = wait_until(lambda: (l := bb.commands.get_background_command_logs(ex.id)) and "bg-start" in l.content and l,
                      5, what="background output in logs")
    assert "bg-end" not in logs.content
    bb.commands.interrupt(ex.id)
    st = wait_until(lambda: (s := bb.commands.get_command_status(ex.id)) and s.running is False and s,
                    5, what="interrupted command to stop")
    assert st.exit_code != 0, st
    assert "sleep 30" not in sh(bb, PS)


def test_background_completes_with_exit_code(bb):
    ex = run(bb, "echo done-1; echo done-2 >&2; exit 7", background=True)
    st = wait_until(lambda: (s := bb.commands.get_command_status(ex.id)) and s.running is False and s,
                    5, what="background command to finish")
    assert st.exit_code == 7, st
    assert st.started_at is not None and st.finished_at is not None
    assert st.finished_at >= st.started_at
    content = bb.commands.get_background_command_logs(ex.id).content
    assert "done-1" in content and "done-2" in content, content


def test_background_logs_cursor(bb):
    ex = run(bb, "seq 1 5; sleep 30", background=True)
    try:
        logs = wait_until(lambda: (l := bb.commands.get_background_command_logs(ex.id)) and "5" in l.content.split() and l,
                          5, what="5 lines of background output")
        assert logs.content.split() == ["1", "2", "3", "4", "5"]
        assert logs.cursor is not None, "EXECD-COMMANDS-TAIL-CURSOR header missing"
        again = bb.commands.get_background_command_logs(ex.id, cursor=logs.cursor)
        assert again.content == "", f"cursor {logs.cursor} should skip what was read: {again.content!r}"
    finally:
        bb.commands.interrupt(ex.id)


def test_background_env_and_cwd(bb):
    ex = run(bb, 'echo "$BGV $(pwd)"', background=True, envs={"BGV": "v1"}, working_directory="/tmp")
    wait_until(lambda: bb.commands.get_command_status(ex.id).running is False, 5)
    assert bb.commands.get_background_command_logs(ex.id).content.strip() == "v1 /tmp"


def test_status_of_unknown_command_is_404(bb):
    with pytest.raises(SandboxApiException) as ei:
        bb.commands.get_command_status("no-such-command-id")
    assert ei.value.status_code == 404


def test_concurrent_commands(bb):
    def one(i):
        ex = run(bb, f"sleep 0.2; echo n{i}")
        return ex.exit_code, stdout_text(ex)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    assert results == [(0, f"n{i}") for i in range(8)]
    assert time.monotonic() - t0 < 5, "commands of one sandbox must run concurrently"


def test_commands_run_in_bash_where_the_image_has_it(deb):
    """As the reference execd: `bash -c` where the image has bash (Debian's /bin/sh is dash)."""
    assert sh(deb, "echo {1..3}") == "1 2 3"
    ex = run(deb, "[[ 1 == 1 ]]")
    assert ex.exit_code == 0, describe(ex)
    assert sh(deb, 'a=(x y z); echo "${#a[@]} ${a[1]}"') == "3 y"
    assert sh(deb, 'test -n "$BASH_VERSION" && basename "$0"') == "bash"
    # A failed redirection is status 1 in bash (2 in dash).
    ex = run(deb, "cat < /no/such/file")
    assert ex.exit_code == 1, describe(ex)
    # pipefail, a bash option agents set.
    ex = run(deb, "set -o pipefail; false | true")
    assert ex.exit_code == 1, describe(ex)
    # Other users get bash too.
    assert sh(deb, "echo {a,b}", uid=1000) == "a b"
    # Background commands as well.
    ex = run(deb, "echo {4..6} > /tmp/bg-bash", background=True)
    wait_until(lambda: sh(deb, "cat /tmp/bg-bash 2>/dev/null") == "4 5 6", timeout=10)


def test_commands_fall_back_to_sh_without_bash(bb):
    """busybox has no bash: commands run in /bin/sh (ash), no brace expansion."""
    assert sh(bb, "command -v bash || echo none") == "none"
    assert sh(bb, 'echo "$0"') == "/bin/sh"
    assert sh(bb, "echo {1..3}") == "{1..3}"


def test_sessions_run_in_bash_where_the_image_has_it(deb):
    sid = deb.commands.create_session()
    try:
        ex = deb.commands.run_in_session(sid, "echo {1..3}; [[ -d / ]] && echo yes")
        assert stdout_text(ex) == "1 2 3\nyes", describe(ex)
    finally:
        _drop_session(deb, sid)


def test_set_env_reaches_later_commands_and_new_sessions(deb):
    """commands.set_env appends to the file $EXECD_ENVS names; everything started later sees it."""
    assert sh(deb, 'echo "$EXECD_ENVS"') == "/opt/opensandbox/.env"
    old = deb.commands.create_session()
    try:
        deb.commands.set_env("E2E_SET_ENV", "a b  $HOME \\n")
        deb.commands.set_env("E2E_QUOTED", 'it\'s "x"\tdone')
        deb.commands.set_env("E2E_TWICE", "first")
        deb.commands.set_env("E2E_TWICE", "second")
        show = 'printf "%s|%s|%s" "$E2E_SET_ENV" "$E2E_QUOTED" "$E2E_TWICE"'
        want = 'a b  $HOME \\n|it\'s "x"\tdone|second'
        assert sh(deb, show) == want
        # Other users, background commands and new sessions see it too.
        assert sh(deb, show, uid=1000) == want
        ex = run(deb, f"{show} > /tmp/set-env-bg", background=True)
        wait_until(lambda: sh(deb, "cat /tmp/set-env-bg 2>/dev/null") == want, timeout=10)
        sid = deb.commands.create_session()
        try:
            assert stdout_text(deb.commands.run_in_session(sid, show)) == want
        finally:
            _drop_session(deb, sid)
        # A session started before keeps its environment (its own `export`s stay its own).
        assert stdout_text(deb.commands.run_in_session(old, 'echo "[$E2E_TWICE]"')) == "[]"
        # The request's own envs win over the file.
        assert sh(deb, 'echo "$E2E_TWICE"', envs={"E2E_TWICE": "request"}) == "request"
    finally:
        _drop_session(deb, old)


def test_uid_gid(deb):
    ex = run(deb, "id -u; id -g; id -un; touch /tmp/owned-by-app; stat -c %u:%g /tmp/owned-by-app",
             uid=1000, gid=1000)
    assert ex.exit_code == 0, describe(ex)
    assert stdout_text(ex).split("\n") == ["1000", "1000", "app", "1000:1000"]
    assert sh(deb, "id -u") == "0", "default user is root"


def test_uid_only(deb):
    assert sh(deb, "id -u", uid=1000) == "1000"


def test_uid_cannot_write_root_files(deb):
    ex = run(deb, "echo x > /etc/e2e-forbidden", uid=1000, gid=1000)
    assert ex.exit_code != 0, describe(ex)
    assert sh(deb, "test -e /etc/e2e-forbidden && echo yes || echo no") == "no"


# ------------------------------------------------------------------- sessions


def _drop_session(sb, sid):
    """Best-effort cleanup; deletion itself is checked by test_session_delete."""
    try:
        sb.commands.delete_session(sid)
    except SandboxException:
        pass


def test_session_state_persists(deb):
    sid = deb.commands.create_session(working_directory="/tmp")
    try:
        assert stdout_text(deb.commands.run_in_session(sid, "pwd")) == "/tmp"
        ex = deb.commands.run_in_session(sid, "cd /etc && export E2E_SESSION_VAR=persisted")
        assert ex.exit_code == 0, describe(ex)
        ex = deb.commands.run_in_session(sid, 'pwd; echo "$E2E_SESSION_VAR"')
        assert stdout_text(ex) == "/etc\npersisted", describe(ex)
        ex = deb.commands.run_in_session(sid, "false")
        assert ex.exit_code == 1, describe(ex)
        ex = deb.commands.run_in_session(sid, "echo still-alive >&2")
        assert ex.exit_code == 0 and stderr_text(ex) == "still-alive", describe(ex)
        ex = deb.commands.run_in_session(sid, "pwd", working_directory="/usr")
        assert stdout_text(ex) == "/usr", describe(ex)
    finally:
        _drop_session(deb, sid)


def test_sessions_are_independent(deb):
    a = deb.commands.create_session()
    b = deb.commands.create_session()
    try:
        deb.commands.run_in_session(a, "export E2E_ONLY_A=1; cd /var")
        ex = deb.commands.run_in_session(b, 'echo "[$E2E_ONLY_A] $(pwd)"')
        assert stdout_text(ex) != "[1] /var" and stdout_text(ex).startswith("[] "), describe(ex)
    finally:
        _drop_session(deb, a)
        _drop_session(deb, b)


def test_session_delete(deb):
    sid = deb.commands.create_session()
    deb.commands.run_in_session(sid, "true")
    deb.commands.delete_session(sid)
    with pytest.raises(SandboxApiException) as ei:
        deb.commands.run_in_session(sid, "echo gone")
    assert ei.value.status_code == 404
    assert ei.value.error.code == "SESSION_NOT_FOUND", ei.value.error
    with pytest.raises(SandboxApiException) as ei:
        deb.commands.delete_session(sid)
    assert (ei.value.status_code, ei.value.error.code) == (404, "SESSION_NOT_FOUND")


def test_session_multiline_output(deb):
    sid = deb.commands.create_session()
    try:
        ex = deb.commands.run_in_session(sid, "seq 1 500")
        assert stdout_text(ex).split("\n") == [str(i) for i in range(1, 501)]
    finally:
        _drop_session(deb, sid)


# ------------------------------------------------------------------- metrics


def test_metrics_sdk(bb):
    m = bb.get_metrics()
    assert m.cpu_count > 0
    assert 0 <= m.cpu_used_percentage <= 100 * max(m.cpu_count, 1)
    assert m.memory_total_in_mib > 0
    assert 0 <= m.memory_used_in_mib <= m.memory_total_in_mib
    assert abs(m.timestamp - time.time() * 1000) < 60_000, m.timestamp


def test_metrics_raw(bb):
    url, headers = dataplane(bb)
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    for field in ("cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"):
        assert isinstance(body.get(field), (int, float)), f"{field} in {body}"
    assert isinstance(body["timestamp"], int)


def test_ping_raw(bb):
    url, headers = dataplane(bb)
    r = httpx.get(f"{url}/ping", headers=headers, timeout=10)
    assert 200 <= r.status_code < 300, r.text


def test_command_stream_raw_content_type(bb):
    url, headers = dataplane(bb)
    with httpx.stream("POST", f"{url}/command", json={"command": "echo raw"}, headers=headers,
                      timeout=httpx.Timeout(10, read=30)) as r:
        assert r.status_code == 200
        assert "text/event-stream" in r.headers.get("content-type", ""), r.headers
        body = r.read().decode()
    assert '"raw"' in body and '"init"' in body and '"timestamp"' in body, body


def test_client_disconnect_mid_command(sandbox):
    """A client that drops a foreground /command stream (Ctrl-C) must not hurt the sandbox."""
    sb = sandbox(BUSYBOX)
    url, headers = dataplane(sb)
    with httpx.stream("POST", f"{url}/command", json={"command": "echo started; sleep 5"},
                      headers={**headers, "Accept": "text/event-stream"}, timeout=30) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    time.sleep(0.5)
    assert sh(sb, "echo still-ok") == "still-ok"
    assert sb.get_info().status.state == "Running"
