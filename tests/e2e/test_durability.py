"""Sandboxes outlive the broker (issue 12, "Durability").

A broker killed with SIGKILL or stopped cleanly comes back on the same data
dir with every sandbox as it was: its files, a running background command,
metadata, expiry and endpoint token. A worker that died meanwhile is reported
Failed with a reason and cleaned up; a worker enforces its sandbox's expiry
while no broker runs; `--stop-sandboxes-on-exit` keeps the old behaviour; a
host restart (a new boot id, faked through PVISOR_TEST_BOOT_ID) terminates
what ran (HOST_RESTARTED) but keeps snapshots and volumes; a killed image
server fails its live sandboxes instead of leaving them silently broken.
Then fault injection: the broker killed at random points of create, command,
upload, snapshot and delete (seeded; the seed is printed).
"""
from __future__ import annotations

import json
import os
import platform
import random
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import PlatformSpec
from opensandbox.sync import SandboxManagerSync
from opensandbox.sync.sandbox import SandboxSync

from conftest import SUITE_BACKEND, _make_conn, _start_server, pvisor_bin
from e2e_util import AHEAD, BUSYBOX, dataplane, run, sandbox_dirs, sh, wait_until

SMALL = {"cpu": "1", "memory": "128Mi"}
SETTLE = 30.0  # seconds a process or file may take to go away


def server(tmp_path_factory, name: str, args: list[str] | None = None, env: dict[str, str] | None = None):
    return _start_server(tmp_path_factory, name, ["busybox.tar"], env or {}, ["--warm-workers", "1", *(args or [])])


def kill9(srv) -> None:
    """SIGKILL of the broker alone (its workers are in sessions of their own)."""
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=10)
    srv.stop()  # closes the log


def record(srv, sid: str) -> dict:
    return json.loads((srv.data_dir / "state" / "sandboxes" / f"{sid}.json").read_text())


def worker_pid(srv, sid: str) -> int:
    return record(srv, sid)["worker"]["proc"]["pid"]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def state_of(srv, sid: str) -> dict:
    r = httpx.get(f"{srv.url}/v1/sandboxes/{sid}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def pvisor_procs(name: str) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "-C", name], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def cgroup_prefix(data_dir: Path) -> str:
    """The broker's cgroup name prefix (FNV-1a of the canonical data dir, as server.rs)."""
    h = 0xCBF29CE484222325
    for b in os.fsencode(os.path.realpath(data_dir)):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"pvisor-{h & 0xFFFFFFFF:08x}-"


def memory_base() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


def memory_group_of(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if "memory" in ctrls.split(","):
                parts = [p for p in path.split("/") if p.startswith("pvisor-")]
                return parts[-1] if parts else None
    except OSError:
        pass
    return None


def ahead_dirs(srv) -> set[str]:
    """Warm workers' disks made ahead, by slot (`<sandboxes>/.ahead-<slot>`)."""
    d = srv.data_dir / "sandboxes"
    return {p.name[len(AHEAD):] for p in d.glob(f"{AHEAD}*")} if d.is_dir() else set()


def ids_listed(srv) -> dict[str, str]:
    r = httpx.get(f"{srv.url}/v1/sandboxes", params={"pageSize": 200}, timeout=10)
    assert r.status_code == 200, r.text
    return {i["id"]: i["status"]["state"] for i in r.json()["items"]}


@pytest.fixture(scope="module")
def durable(tmp_path_factory):
    srv = server(tmp_path_factory, "durable")
    yield srv
    srv.stop()


def delete_all(srv) -> None:
    for sid in ids_listed(srv):
        httpx.delete(f"{srv.url}/v1/sandboxes/{sid}", timeout=30)


@pytest.mark.deadline(240)
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_sandbox_survives_the_broker(durable, how):
    conn = _make_conn(durable.addr)
    arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL, timeout=timedelta(minutes=20),
                            metadata={"team": "durable"}, resource_requests={"memory": "64Mi"},
                            platform=PlatformSpec(os="linux", arch=arch),
                            extensions={"poolRef": "default", "team.example.com/k": "v"})
    try:
        sh(sb, "echo kept > /root/f")
        bg = run(sb, "sleep 7777", background=True)
        _, headers = dataplane(sb)
        before = state_of(durable, sb.id)
        pid = worker_pid(durable, sb.id)
        if how == "sigkill":
            kill9(durable)
        else:
            assert durable.stop() == 0
        assert alive(pid), "the worker ended with the broker"
        durable.start()
        conn = _make_conn(durable.addr)
        after = state_of(durable, sb.id)
        assert after["status"]["state"] == "Running", after
        assert before["resourceRequests"] == {"memory": "64Mi"} and before["allocation"]["poolRef"] == "default"
        for k in ("expiresAt", "createdAt", "metadata", "entrypoint", "platform", "resourceRequests", "extensions",
                  "allocation"):
            assert after[k] == before[k], k
        again = SandboxSync.connect(sb.id, connection_config=conn)
        try:
            assert sh(again, "cat /root/f") == "kept"
            assert again.commands.get_command_status(bg.id).running is True
            assert "sleep 7777" in sh(again, "ps")
            url, new_headers = dataplane(again)
            assert new_headers == headers, "the endpoint token changed"
            # The old token opens the new broker's data plane.
            r = httpx.get(f"{url}/ping", headers=headers, timeout=10)
            assert r.status_code == 200, r.text
            r = httpx.get(f"{url}/ping", headers={"X-EXECD-ACCESS-TOKEN": "nope"}, timeout=10)
            assert r.status_code in (401, 403), r.text
        finally:
            again.kill()
            again.close()
    finally:
        sb.close()
    assert httpx.get(f"{durable.url}/v1/sandboxes/{sb.id}", timeout=10).status_code == 404


@pytest.mark.deadline(240)
def test_paused_sandbox_stays_paused_across_a_restart(durable):
    conn = _make_conn(durable.addr)
    sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    try:
        sh(sb, "echo paused > /root/p")
        sb.pause()
        assert state_of(durable, sb.id)["status"]["state"] == "Paused"
        kill9(durable)
        durable.start()
        assert state_of(durable, sb.id)["status"]["state"] == "Paused"
        r = httpx.post(f"{durable.url}/v1/sandboxes/{sb.id}/resume", timeout=30)
        assert r.status_code == 202, r.text
        again = SandboxSync.connect(sb.id, connection_config=_make_conn(durable.addr))
        assert sh(again, "cat /root/p") == "paused"
        again.close()
    finally:
        delete_all(durable)
        sb.close()


@pytest.mark.deadline(240)
def test_worker_killed_while_the_broker_is_down(durable):
    conn = _make_conn(durable.addr)
    victim = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    bystander = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    try:
        sh(bystander, "echo still > /root/b")
        pid = worker_pid(durable, victim.id)
        kill9(durable)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid), SETTLE, what="the worker to die")
        durable.start()
        info = state_of(durable, victim.id)
        assert info["status"]["state"] == "Failed", info
        assert info["status"]["reason"] == "WORKER_EXITED", info
        assert "broker was down" in info["status"]["message"], info
        # Cleaned up like any failed sandbox: nothing of it on the host.
        assert victim.id not in sandbox_dirs(durable)
        assert not (durable.data_dir / "state" / "sandboxes" / f"{victim.id}.json").read_text().count('"worker":{')
        # The other sandbox is untouched.
        again = SandboxSync.connect(bystander.id, connection_config=_make_conn(durable.addr))
        assert sh(again, "cat /root/b") == "still"
        again.close()
        assert httpx.delete(f"{durable.url}/v1/sandboxes/{victim.id}", timeout=10).status_code == 204
        assert httpx.get(f"{durable.url}/v1/sandboxes/{victim.id}", timeout=10).status_code == 404
    finally:
        delete_all(durable)
        victim.close()
        bystander.close()


@pytest.mark.deadline(240)
def test_expiry_is_enforced_while_the_broker_is_down(durable):
    conn = _make_conn(durable.addr)
    short = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL, timeout=timedelta(seconds=6))
    renewed = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL, timeout=timedelta(seconds=6))
    try:
        renewed.renew(timedelta(minutes=10))
        expires = state_of(durable, renewed.id)["expiresAt"]
        short_pid, renewed_pid = worker_pid(durable, short.id), worker_pid(durable, renewed.id)
        kill9(durable)
        # No broker: the worker ends its own sandbox at the deadline.
        wait_until(lambda: not alive(short_pid), 60, what="the expired sandbox's worker to end it")
        # The renewed one got its new deadline: still there after the old one passed.
        time.sleep(1)
        assert alive(renewed_pid), "the renew did not reach the worker"
        durable.start()
        assert httpx.get(f"{durable.url}/v1/sandboxes/{short.id}", timeout=10).status_code == 404
        assert short.id not in sandbox_dirs(durable)
        info = state_of(durable, renewed.id)
        assert info["status"]["state"] == "Running" and info["expiresAt"] == expires, info
    finally:
        delete_all(durable)
        short.close()
        renewed.close()


@pytest.mark.deadline(240)
@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_stop_sandboxes_on_exit(tmp_path_factory, how):
    srv = server(tmp_path_factory, f"stop-{how}", ["--stop-sandboxes-on-exit"])
    try:
        sb = SandboxSync.create(BUSYBOX, connection_config=_make_conn(srv.addr), resource=SMALL)
        pid = worker_pid(srv, sb.id)
        if how == "sigkill":
            kill9(srv)
        else:
            srv.stop()
        wait_until(lambda: not alive(pid), SETTLE, what="the worker to end with the broker")
        srv.start()
        assert httpx.get(f"{srv.url}/v1/sandboxes/{sb.id}", timeout=10).status_code == 404
        assert sandbox_dirs(srv) == set()
        sb.close()
    finally:
        srv.stop()


@pytest.mark.deadline(300)
def test_host_restart_terminates_sandboxes_and_keeps_snapshots_and_volumes(tmp_path_factory):
    srv = server(tmp_path_factory, "reboot", env={"PVISOR_TEST_BOOT_ID": "boot-one"})
    try:
        conn = _make_conn(srv.addr)
        sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        sh(sb, "echo snap > /root/s")
        snap = sb.create_snapshot("before-reboot")
        with SandboxManagerSync.create(connection_config=conn) as m:
            wait_until(lambda: m.get_snapshot(snap.id).status.state == "Ready", 120, what="the snapshot")
        r = subprocess.run([str(pvisor_bin()), "volume", "create", "kept", "--data-dir", str(srv.data_dir)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        pid = worker_pid(srv, sb.id)
        kill9(srv)
        srv.env["PVISOR_TEST_BOOT_ID"] = "boot-two"
        srv.start()
        info = state_of(srv, sb.id)
        assert info["status"]["state"] == "Terminated", info
        assert info["status"]["reason"] == "HOST_RESTARTED", info
        assert not alive(pid), "a process of the previous boot runs on"
        assert sandbox_dirs(srv) == set()
        with SandboxManagerSync.create(connection_config=_make_conn(srv.addr)) as m:
            assert m.get_snapshot(snap.id).status.state == "Ready"
        assert (srv.data_dir / "volumes" / "kept").is_dir()
        restored = SandboxSync.create(None, snapshot_id=snap.id, connection_config=_make_conn(srv.addr),
                                      resource=SMALL)
        assert sh(restored, "cat /root/s") == "snap"
        restored.kill()
        restored.close()
        assert httpx.delete(f"{srv.url}/v1/sandboxes/{sb.id}", timeout=10).status_code == 204
        sb.close()
    finally:
        srv.stop()


@pytest.mark.deadline(240)
def test_killed_image_server_fails_its_sandboxes(durable):
    conn = _make_conn(durable.addr)
    sb = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
    try:
        assert sh(sb, "echo ok") == "ok"
        recs = [json.loads(p.read_text()) for p in (durable.data_dir / "run").glob("imaged-*.json")]
        assert recs, "the image server is recorded"
        for rec in recs:
            os.kill(rec["proc"]["pid"], signal.SIGKILL)

        def failed():
            s = state_of(durable, sb.id)["status"]
            return s if s["state"] == "Failed" else None

        st = wait_until(failed, SETTLE, what="the sandbox to be reported Failed")
        assert st["reason"] == "IMAGE_SERVER_EXITED", st
        # The image serves new sandboxes again (a new server).
        fresh = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        assert sh(fresh, "cat /etc/passwd").startswith("root:")
        fresh.kill()
        fresh.close()
    finally:
        delete_all(durable)
        sb.close()


# ---------------------------------------------------------------- fault injection

OPS = ["create", "command", "upload", "snapshot", "delete"]


def ours(srv, name: str) -> set[int]:
    """Processes called `name` whose output goes to this broker's run dir."""
    run_dir = str(srv.data_dir / "run")
    found = set()
    for pid in pvisor_procs(name):
        for fd in (1, 2):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(run_dir):
                    found.add(pid)
                    break
            except OSError:
                pass
    return found


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def leaks(srv) -> list[str]:
    """What is on the host beyond what the broker reports live: sandbox dirs,
    records, worker processes, cgroups, mounts."""
    out = []
    listed = ids_listed(srv)
    live = {i for i, s in listed.items() if s in ("Running", "Paused")}
    recorded = set()
    for p in (srv.data_dir / "state" / "sandboxes").glob("*.json"):
        rec = json.loads(p.read_text())
        if rec["id"] not in listed:
            out.append(f"a record of no listed sandbox: {rec['id']}")
        if rec.get("worker"):
            recorded.add(rec["worker"]["proc"]["pid"])
    workers = ours(srv, "pvisor-worker")
    warm = {p for p in workers if _ppid(p) == srv.proc.pid and p not in recorded}
    stray = workers - recorded - warm
    if stray:
        out.append(f"worker processes of no sandbox: {stray}")
    extra_dirs = sandbox_dirs(srv) - live
    if extra_dirs:
        out.append(f"sandbox dirs of no live sandbox: {extra_dirs}")
    # A disk made ahead belongs to a live warm worker (its slot names its log).
    slots = {Path(os.readlink(f"/proc/{p}/fd/1")).stem for p in warm}
    if ahead_dirs(srv) - slots:
        out.append(f"disks made ahead of no warm worker: {ahead_dirs(srv) - slots}")
    base = memory_base()
    if base is not None:
        prefix = cgroup_prefix(srv.data_dir)
        groups = {d.name for d in base.glob(f"{prefix}*")}
        used = {memory_group_of(p) for p in workers | ours(srv, "pvisor-imaged")}
        if groups - used:
            out.append(f"cgroups without a process: {groups - used}")
    # Files in the run dir: each live worker's socket and log, each live image server's record and log.
    expected = set()
    for pid in workers:
        log = Path(os.readlink(f"/proc/{pid}/fd/1")).name
        expected |= {log, log.replace(".log", ".sock")}
    for p in (srv.data_dir / "run").glob("imaged-*.json"):
        expected |= {p.name, p.name.replace(".json", ".log")}
    extra_files = {p.name for p in (srv.data_dir / "run").iterdir()} - expected
    if extra_files:
        out.append(f"run dir files of nothing live: {extra_files}")
    mnt = str(srv.data_dir / "mnt") + "/"
    mounted = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if line.split()[4].startswith(mnt)}
    served = {json.loads(p.read_text())["mountpoint"] for p in (srv.data_dir / "run").glob("imaged-*.json")}
    if mounted - served:
        out.append(f"mounts of no image server: {mounted - served}")
    return out


@pytest.mark.deadline(600)
def test_broker_killed_at_random_points(tmp_path_factory):
    seed = int(os.environ.get("PVISOR_FAULT_SEED", random.randrange(1 << 30)))
    rounds = int(os.environ.get("PVISOR_FAULT_ROUNDS", "10"))
    print(f"\nfault injection seed {seed} ({rounds} rounds; rerun with PVISOR_FAULT_SEED={seed})")
    rng = random.Random(seed)
    srv = server(tmp_path_factory, "faults")
    try:
        conn = _make_conn(srv.addr)
        bystander = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
        sh(bystander, "echo bystander > /root/b")
        bystander_id = bystander.id
        bystander.close()
        target = None
        for n in range(rounds):
            op = rng.choice(OPS)
            delay = rng.uniform(0.0, 0.12)
            conn = _make_conn(srv.addr)
            if op != "create" and target is None:
                target = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL)
            result: dict[str, object] = {}

            def act():
                try:
                    if op == "create":
                        s = SandboxSync.create(BUSYBOX, connection_config=conn, resource=SMALL,
                                               ready_timeout=timedelta(seconds=10))
                        result["created"] = s.id
                        s.close()
                    elif op == "command":
                        result["out"] = sh(target, f"echo round-{n}")
                    elif op == "upload":
                        target.files.write_file(f"/root/up-{n}", f"upload-{n}")
                        result["uploaded"] = f"/root/up-{n}"
                    elif op == "snapshot":
                        result["snapshot"] = target.create_snapshot(f"r{n}").id
                    elif op == "delete":
                        target.kill()
                        result["deleted"] = target.id
                except Exception as e:  # noqa: BLE001 - the broker is being killed
                    result["error"] = repr(e)

            t = threading.Thread(target=act)
            t.start()
            time.sleep(delay)
            kill9(srv)
            t.join(timeout=60)
            print(f"round {n}: {op} killed after {delay:.2f}s -> {result}")
            srv.start()
            conn = _make_conn(srv.addr)
            assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
            # The bystander is untouched.
            b = SandboxSync.connect(bystander_id, connection_config=conn)
            assert sh(b, "cat /root/b") == "bystander"
            b.close()
            # What was acknowledged is there.
            if "created" in result:
                assert state_of(srv, result["created"])["status"]["state"] == "Running"
            if "uploaded" in result and target is not None:
                again = SandboxSync.connect(target.id, connection_config=conn)
                assert again.files.read_file(str(result["uploaded"])) == f"upload-{n}"
                again.close()
            if "snapshot" in result:
                r = httpx.get(f"{srv.url}/v1/snapshots/{result['snapshot']}", timeout=10)
                assert r.status_code == 200 and r.json()["status"]["state"] in ("Ready", "Failed", "Creating"), r.text
            if "deleted" in result:
                assert httpx.get(f"{srv.url}/v1/sandboxes/{result['deleted']}", timeout=10).status_code == 404
            if target is not None:
                code = httpx.get(f"{srv.url}/v1/sandboxes/{target.id}", timeout=10)
                if code.status_code == 404 or code.json()["status"]["state"] != "Running":
                    target.close()
                    target = None
                else:
                    target.close()
                    target = SandboxSync.connect(target.id, connection_config=conn)
            # Nothing beyond what is reported live (teardowns may still be finishing).
            deadline = time.monotonic() + 10
            while (problems := leaks(srv)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not problems, f"seed {seed} round {n}: {problems}"
    finally:
        try:
            delete_all(srv)
        finally:
            srv.stop()


# ---------------------------------------------------------------- an unprivileged broker

from test_nonroot import as_user, delegated  # noqa: E402,F401 - the fixture (a user, delegated cgroups)


def _serve_as(pw, groups, data: Path, port: int, log, import_first: bool) -> subprocess.Popen:
    binary = pvisor_bin()
    imp = f"{binary} image import {Path(os.environ.get('PVISOR_TEST_IMAGES', '/var/cache/pvisor/test-images')) / 'busybox.tar'} --data-dir {data} && " if import_first else ""
    user_cmd = f"{imp}exec {binary} serve --backend {SUITE_BACKEND} --listen 127.0.0.1:{port} --data-dir {data} --warm-workers 1"
    return subprocess.Popen(
        as_user(pw, groups, user_cmd),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


@pytest.mark.deadline(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="setting up a user and delegated cgroups needs root")
def test_unprivileged_broker_sandbox_survives_sigkill(delegated, tmp_path):
    from e2e_util import wait_healthy

    pw, groups, data = delegated
    logp = tmp_path / "server.log"
    log = open(logp, "ab")
    port = free_port_()
    proc = _serve_as(pw, groups, data, port, log, True)
    sid = None
    try:
        wait_healthy(port, proc, logp.read_text, timeout=120)
        sb = SandboxSync.create(BUSYBOX, connection_config=_make_conn(f"127.0.0.1:{port}"), resource=SMALL)
        sid = sb.id
        sh(sb, "echo unprivileged > /root/f")
        sb.close()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        port = free_port_()
        proc = _serve_as(pw, groups, data, port, log, False)
        wait_healthy(port, proc, logp.read_text)
        again = SandboxSync.connect(sid, connection_config=_make_conn(f"127.0.0.1:{port}"))
        assert sh(again, "cat /root/f") == "unprivileged"
        again.kill()
        again.close()
        sid = None
    finally:
        if sid is not None and proc.poll() is None:
            httpx.delete(f"http://127.0.0.1:{port}/v1/sandboxes/{sid}", timeout=30)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()


def free_port_() -> int:
    from conftest import free_port

    return free_port()
