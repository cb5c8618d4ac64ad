"""Lifecycle hooks on create (issue 23, item 5): `lifecycle.preStart` and
`lifecycle.periodic` as the official SDK 1.1.1 sends them (OpenSandbox OSEP-0020).

The pre-start hook runs inside the sandbox before its entrypoint, and the
create answers after it: the first command sees what it did. A hook that
fails is the create's answer (400 `PRESTART_FAILED`, `PRESTART_TIMEOUT` past
its timeout; the SDK reads a create's error body only for some statuses, 400
among them) and nothing of the sandbox is left. Periodic hooks run on
their schedule inside the sandbox for its life: a failing or timed-out run
changes nothing else, runs of one hook never overlap, and they go on across a
broker restart (they need no broker). Bad hooks are 400 `LIFECYCLE_*` before
any state. `GET` does not show the hooks (the reference's does not either).
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import Host, LifecycleHook, PeriodicLifecycleHook, SandboxLifecycle, Volume
from opensandbox.sync.sandbox import SandboxSync

from conftest import _make_conn, _start_server
from e2e_util import (
    BUSYBOX,
    SMALL,
    assert_error_json,
    create_body,
    list_all_ids,
    run,
    sandbox_dirs,
    sh,
    wait_until,
)

SETTLE = 60.0  # seconds a periodic hook gets for a few runs


def hooks(pre_start: LifecycleHook | None = None, periodic: list[PeriodicLifecycleHook] | None = None):
    kw = {}
    if pre_start is not None:
        kw["pre_start"] = pre_start
    if periodic is not None:
        kw["periodic"] = periodic
    return SandboxLifecycle(**kw)


def shell(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def every_second(name: str, script: str, timeout_seconds: int = 60) -> PeriodicLifecycleHook:
    return PeriodicLifecycleHook(name=name, schedule="@every 1s", command=shell(script),
                                 timeout_seconds=timeout_seconds)


def lines(sb: SandboxSync, path: str) -> list[str]:
    ex = run(sb, f"cat {path} 2>/dev/null || true")
    return [m.text for m in ex.logs.stdout]


def state(base_url: str, sid: str) -> dict:
    r = httpx.get(f"{base_url}/v1/sandboxes/{sid}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------------- preStart


def test_pre_start_runs_before_the_entrypoint_and_the_first_command_sees_it(sandbox, base_url):
    pre = LifecycleHook(command=shell("echo prepared $GREETING > /tmp/pre; echo ran >> /tmp/pre-runs"),
                        timeout_seconds=30)
    sb = sandbox(BUSYBOX, env={"GREETING": "hello"}, lifecycle=hooks(pre_start=pre),
                 entrypoint=shell("cat /tmp/pre > /tmp/entrypoint-saw; exec sleep 3600"))
    # The create answered after the hook: the very first command sees its file.
    assert sh(sb, "cat /tmp/pre") == "prepared hello", "the hook ran with the sandbox's env"
    # The entrypoint started after it, too.
    wait_until(lambda: lines(sb, "/tmp/entrypoint-saw") == ["prepared hello"], 30, what="the entrypoint's copy")
    assert lines(sb, "/tmp/pre-runs") == ["ran"], "the hook ran exactly once"
    assert state(base_url, sb.id)["status"]["state"] == "Running"


def test_get_does_not_show_the_hooks(sandbox, base_url, manager):
    periodic = [PeriodicLifecycleHook(name="noop", schedule="@hourly", command=["true"])]
    sb = sandbox(BUSYBOX, lifecycle=hooks(pre_start=LifecycleHook(command=["true"]), periodic=periodic))
    got = state(base_url, sb.id)
    assert "lifecycle" not in got, got
    assert manager.get_sandbox_info(sb.id).status.state == "Running"


def _no_new_sandbox(http, pvisor_server, before_ids, before_dirs):
    assert list_all_ids(http) == before_ids, "a failed create left a sandbox listed"
    # The state dir goes a moment after the answer at most: the teardown is awaited.
    assert sandbox_dirs(pvisor_server) == before_dirs, "a failed create left its directory"


def test_a_failing_pre_start_fails_the_create_and_leaves_nothing(http, conn, pvisor_server):
    before_ids, before_dirs = list_all_ids(http), sandbox_dirs(pvisor_server)
    pre = LifecycleHook(command=shell("echo fetching; echo 'restore: no backup found' >&2; exit 1"))
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL), timeout=timedelta(minutes=5),
                           lifecycle=hooks(pre_start=pre))
    e = ei.value
    assert (e.status_code, e.error.code) == (400, "PRESTART_FAILED"), (e.status_code, e.error)
    assert "exited with status 1" in e.error.message, e.error.message
    assert "restore: no backup found" in e.error.message, "the hook's output is in the answer"
    _no_new_sandbox(http, pvisor_server, before_ids, before_dirs)


def test_a_pre_start_past_its_timeout_fails_the_create_and_leaves_nothing(http, pvisor_server):
    before_ids, before_dirs = list_all_ids(http), sandbox_dirs(pvisor_server)
    body = create_body(lifecycle={"preStart": {"command": shell("echo waiting; exec sleep 600"),
                                               "timeoutSeconds": 2}})
    err = assert_error_json(http.post("/v1/sandboxes", json=body), 400)
    assert err["code"] == "PRESTART_TIMEOUT", err
    assert "did not finish within 2 s" in err["message"], err
    _no_new_sandbox(http, pvisor_server, before_ids, before_dirs)


def test_a_pre_start_program_that_does_not_exist_fails_the_create(http, pvisor_server):
    before_ids, before_dirs = list_all_ids(http), sandbox_dirs(pvisor_server)
    body = create_body(lifecycle={"preStart": {"command": ["/no/such/restore-tool"]}})
    err = assert_error_json(http.post("/v1/sandboxes", json=body), 400)
    assert err["code"] == "PRESTART_FAILED" and "did not start" in err["message"], err
    _no_new_sandbox(http, pvisor_server, before_ids, before_dirs)


# ------------------------------------------------------------------------- periodic


def test_periodic_hooks_run_repeatedly(sandbox):
    sb = sandbox(BUSYBOX, lifecycle=hooks(periodic=[every_second("count", "echo tick >> /tmp/count")]))
    wait_until(lambda: len(lines(sb, "/tmp/count")) >= 3, SETTLE, what="three runs")
    n = len(lines(sb, "/tmp/count"))
    wait_until(lambda: len(lines(sb, "/tmp/count")) > n, SETTLE, what="the runs to go on")


def test_failing_and_timed_out_periodic_runs_change_nothing_else(sandbox, base_url, manager):
    periodic = [
        every_second("failing", "echo run >> /tmp/failing; echo 'sync: remote unreachable' >&2; exit 3"),
        every_second("stuck", "echo start >> /tmp/stuck; sleep 30; echo end >> /tmp/stuck", timeout_seconds=1),
        every_second("slow", "echo start >> /tmp/slow; sleep 2.5; echo end >> /tmp/slow", timeout_seconds=30),
    ]
    sb = sandbox(BUSYBOX, lifecycle=hooks(periodic=periodic))
    wait_until(lambda: len(lines(sb, "/tmp/failing")) >= 3, SETTLE, what="failing runs to go on")
    wait_until(lambda: lines(sb, "/tmp/stuck").count("start") >= 3, SETTLE, what="runs after timeouts")
    wait_until(lambda: lines(sb, "/tmp/slow").count("end") >= 2, SETTLE, what="slow runs")
    # A run past its timeout was killed: none of them reached its end.
    assert "end" not in lines(sb, "/tmp/stuck")
    # Runs of one hook never overlap: a firing while the last run goes is skipped.
    slow = lines(sb, "/tmp/slow")
    for i, line in enumerate(slow):
        assert line == ("start" if i % 2 == 0 else "end"), f"overlapping runs: {slow}"
    # The sandbox is as it was; the failures are in its runtime log, with their reason.
    assert state(base_url, sb.id)["status"]["state"] == "Running"
    text = manager.get_diagnostic_logs(sb.id, "runtime").content
    assert 'periodic hook "failing" exited with status 3' in text, text[-2000:]
    assert "sync: remote unreachable" in text, "with the end of its output"
    assert 'periodic hook "stuck" did not finish within 1 s' in text, text[-2000:]


# -------------------------------------------------------------------- bad hook specs


def _periodic(**hook) -> dict:
    h = {"name": "sync", "schedule": "@every 30s", "command": ["sync"]}
    h.update(hook)
    return {"periodic": [h]}


BAD_HOOKS = [
    ({"preStart": {"command": []}}, "LIFECYCLE_COMMAND_EMPTY", "lifecycle.preStart.command"),
    ({"preStart": {"command": ["  "]}}, "LIFECYCLE_COMMAND_EMPTY", "lifecycle.preStart.command"),
    ({"preStart": {"command": "sh -c true"}}, "LIFECYCLE_INVALID", "must be an array of strings"),
    ({"preStart": {"command": ["true"], "timeoutSeconds": 0}}, "LIFECYCLE_TIMEOUT_OUT_OF_RANGE", "outside 1-10800"),
    ({"preStart": {"command": ["true"], "timeoutSeconds": 10801}}, "LIFECYCLE_TIMEOUT_OUT_OF_RANGE", "1-10800"),
    ({"preStart": {"command": ["true"], "failurePolicy": "Abort"}}, "LIFECYCLE_INVALID", "failurePolicy"),
    (_periodic(timeoutSeconds=301), "LIFECYCLE_TIMEOUT_OUT_OF_RANGE", "outside 1-300"),
    (_periodic(schedule="every 30 seconds"), "LIFECYCLE_SCHEDULE_INVALID", "lifecycle.periodic[0].schedule"),
    (_periodic(schedule="@every 500ms"), "LIFECYCLE_SCHEDULE_INVALID", "whole number of seconds"),
    (_periodic(schedule="0 0 30 2 *"), "LIFECYCLE_SCHEDULE_INVALID", "never fires"),
    (_periodic(schedule="TZ=Asia/Shanghai 0 3 * * *"), "LIFECYCLE_SCHEDULE_INVALID", "UTC"),
    (_periodic(name="  "), "LIFECYCLE_NAME_INVALID", "lifecycle.periodic[0].name"),
    ({"periodic": [_periodic()["periodic"][0], _periodic(name=" sync ")["periodic"][0]]},
     "LIFECYCLE_NAME_DUPLICATE", "lifecycle.periodic[1].name"),
    (_periodic(schedule=None), "LIFECYCLE_INVALID", "schedule is required"),
    ({"preTerminate": {"command": ["flush"]}}, "LIFECYCLE_UNSUPPORTED", "only preStart and periodic"),
    ("hooks", "LIFECYCLE_INVALID", "must be an object"),
]


@pytest.mark.parametrize("lifecycle,code,message", BAD_HOOKS, ids=lambda x: str(x)[:50])
def test_bad_hooks_are_400_before_any_sandbox(http, pvisor_server, lifecycle, code, message):
    before_ids, before_dirs = list_all_ids(http), sandbox_dirs(pvisor_server)
    err = assert_error_json(http.post("/v1/sandboxes", json=create_body(lifecycle=lifecycle)), 400)
    assert err["code"] == code, err
    assert message in err["message"], err
    assert list_all_ids(http) == before_ids
    assert sandbox_dirs(pvisor_server) == before_dirs


def test_a_bad_schedule_through_the_sdk(conn):
    periodic = [PeriodicLifecycleHook(name="sync", schedule="@every 5", command=["sync"])]
    with pytest.raises(SandboxApiException) as ei:
        SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL), lifecycle=hooks(periodic=periodic))
    assert (ei.value.status_code, ei.value.error.code) == (400, "LIFECYCLE_SCHEDULE_INVALID"), ei.value.error


# ------------------------------------------------- long pre-start hooks, held by a gate
#
# A pre-start hook that waits for a file the test makes in a host directory (a volume): the
# test decides when it ends, so nothing here depends on how long anything takes.


@pytest.fixture(scope="module")
def gates():
    d = Path(tempfile.mkdtemp(prefix="pvisor-e2e-hooks-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def small_server(tmp_path_factory, gates):
    """One create at a time and a short start budget (4 s): a create past it only waits for its
    hook and gives its slot to the next create. Host volumes under `gates`."""
    srv = _start_server(tmp_path_factory, "hooks", ["busybox.tar"], {},
                        ["--warm-workers", "1", "--max-concurrent-creates", "1", "--ready-timeout-secs", "4",
                         "--allow-host-path", str(gates)])
    yield srv
    srv.stop()


class Gate:
    """A host directory mounted at /gate: the hook says it started, then waits to be let go."""

    def __init__(self, root: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="gate-", dir=root))
        self.dir.chmod(0o777)  # the sandbox's root is an unprivileged host uid
        self.started = self.dir / "started"

    def volume(self) -> dict:
        return {"name": "gate", "host": {"path": str(self.dir)}, "mountPath": "/gate", "readOnly": False}

    def sdk_volume(self) -> Volume:
        return Volume(name="gate", host=Host(path=str(self.dir)), mount_path="/gate", read_only=False)

    def hook(self, timeout_seconds: int = 120) -> dict:
        script = "touch /gate/started; while [ ! -e /gate/open ]; do sleep 0.1; done; echo let go"
        return {"command": shell(script), "timeoutSeconds": timeout_seconds}

    def open(self) -> None:
        (self.dir / "open").touch()


def test_a_long_pre_start_gives_its_create_slot_to_the_next_create(small_server, gates):
    conn = _make_conn(small_server.addr)
    gate = Gate(gates)
    done: dict = {}

    def slow_create():
        try:
            hook = gate.hook()
            done["slow"] = SandboxSync.create(
                BUSYBOX, connection_config=conn, resource=dict(SMALL), timeout=timedelta(minutes=5),
                volumes=[gate.sdk_volume()],
                lifecycle=hooks(pre_start=LifecycleHook(command=hook["command"],
                                                        timeout_seconds=hook["timeoutSeconds"])))
        except Exception as e:  # noqa: BLE001 - reported below
            done["slow"] = e

    slow = threading.Thread(target=slow_create)
    slow.start()
    try:
        # Its hook runs: the slow create holds the only create slot.
        wait_until(gate.started.exists, SETTLE, what="the slow create's hook to start")
        # This create gets the slot once the slow one spent its start budget (4 s) and is
        # served while the slow one still waits for its hook, which cannot end before the gate opens.
        quick = SandboxSync.create(BUSYBOX, connection_config=conn, resource=dict(SMALL),
                                   timeout=timedelta(minutes=5))
        try:
            assert slow.is_alive() and "slow" not in done, done
            assert sh(quick, "echo served") == "served"
        finally:
            quick.kill()
    finally:
        gate.open()
        slow.join(timeout=120)
    sb = done.get("slow")
    assert isinstance(sb, SandboxSync), f"the slow create failed: {sb!r}"
    try:
        assert sh(sb, "ls /gate") == "open\nstarted"
    finally:
        sb.kill()


def test_a_client_that_gives_up_on_a_long_create_leaves_a_listed_sandbox(small_server, gates):
    """The create goes on without its client: its sandbox is registered (and can be found and
    deleted), not a worker nobody knows of."""
    gate = Gate(gates)
    mark = uuid.uuid4().hex
    body = create_body(metadata={"hooks-test": mark}, volumes=[gate.volume()],
                       lifecycle={"preStart": gate.hook()})
    with httpx.Client(base_url=small_server.url, timeout=60) as http:
        with pytest.raises(httpx.ReadTimeout):
            # The hook waits for the gate: this client gives up first.
            http.post("/v1/sandboxes", json=body, timeout=2)
        assert gate.started.exists(), "the hook ran"
        gate.open()

        def found():
            r = http.get("/v1/sandboxes", params={"metadata": f"hooks-test={mark}"})
            items = r.json()["items"]
            return items[0] if items else None

        sb = wait_until(found, SETTLE, what="the abandoned create's sandbox")
        assert sb["status"]["state"] == "Running", sb
        assert http.delete(f"/v1/sandboxes/{sb['id']}").status_code == 204


@pytest.mark.deadline(240)
def test_hooks_go_on_across_a_broker_restart(tmp_path_factory):
    from test_durability import kill9, record, server

    srv = server(tmp_path_factory, "hooks-durable")
    try:
        conn = _make_conn(srv.addr)
        sb = SandboxSync.create(
            BUSYBOX, connection_config=conn, resource=dict(SMALL), timeout=timedelta(minutes=20),
            lifecycle=hooks(pre_start=LifecycleHook(command=shell("echo ran >> /tmp/pre-runs")),
                            periodic=[every_second("count", "echo tick >> /tmp/count")]))
        wait_until(lambda: len(lines(sb, "/tmp/count")) >= 2, SETTLE, what="runs before the restart")
        assert record(srv, sb.id)["origin"]["lifecycle"]["periodic"][0]["name"] == "count", "kept on disk"
        kill9(srv)
        srv.start()
        again = SandboxSync.connect(sb.id, connection_config=_make_conn(srv.addr))
        n = len(lines(again, "/tmp/count"))
        wait_until(lambda: len(lines(again, "/tmp/count")) >= n + 2, SETTLE, what="runs after the restart")
        # Re-adoption does not start the sandbox again: the pre-start hook ran once.
        assert lines(again, "/tmp/pre-runs") == ["ran"]
        assert state(srv.url, sb.id)["status"]["state"] == "Running"
        again.kill()
    finally:
        srv.stop()
