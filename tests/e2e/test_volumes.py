"""Volumes on create (issue 10, api-surface.md §2), through the official SDK.

A server of this module's own allows one temporary host prefix
(`--allow-host-path`); the suite's main server allows none, so every host
volume is refused there. Covers host volumes rw and ro (a remount as sandbox
root refused), the allowlist refusals (outside the prefix, `..`, a symlink
inside the prefix pointing out), named volumes with subPath, shared by two
sandboxes and deleted with their sandbox, the `pvisor volume` CLI, and the
same with an unprivileged broker.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.sandboxes import PVC, Host, Volume

from conftest import SUITE_BACKEND, SandboxFactory, _make_conn, _start_server, free_port, images_dir, pvisor_bin
from e2e_util import BUSYBOX, DEBIAN, SMALL, list_all_ids, run, sh, stdout_text, wait_healthy, wait_until

MARKER = "opensandbox-e2e-marker"
PVC_MARKER = "pvc-marker-data"
PVC_SUB_MARKER = "pvc-subpath-marker"
PVC_NAME = "opensandbox-e2e-pvc-test"


@pytest.fixture(scope="module")
def prefix():
    """The allowed host prefix, seeded as the reference's e2e harness does."""
    d = Path(tempfile.mkdtemp(prefix="pvisor-e2e-hostvol-", dir="/tmp"))
    d.chmod(0o755)
    (d / "host-volume-test").mkdir()
    (d / "host-volume-test" / "marker.txt").write_text(MARKER + "\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def vol_server(tmp_path_factory, prefix):
    srv = _start_server(tmp_path_factory, "pvisor-volumes", ["busybox.tar", "debian-bookworm-slim.tar"], {},
                        ["--backend", "ns", "--allow-host-path", str(prefix)])
    yield srv
    srv.stop()


@pytest.fixture
def vsb(vol_server):
    f = SandboxFactory(_make_conn(vol_server.addr))
    yield f
    f.cleanup()


@pytest.fixture
def vhttp(vol_server):
    with httpx.Client(base_url=vol_server.url, timeout=60) as c:
        yield c


def cli(srv, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(pvisor_bin()), "volume", *args, "--data-dir", str(srv.data_dir)],
                       capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, f"pvisor volume {' '.join(args)}: {r.returncode} {r.stdout} {r.stderr}"
    return r


def mountpoint(srv, name: str) -> Path:
    info = json.loads(cli(srv, "inspect", "--json", name).stdout)
    assert [i["Name"] for i in info] == [name]
    return Path(info[0]["Mountpoint"])


def host_vol(path, mount="/mnt/host", ro=False, name="hv", sub=None) -> Volume:
    return Volume(name=name, host=Host(path=str(path)), mount_path=mount, read_only=ro, sub_path=sub)


def pvc_vol(claim, mount="/mnt/pvc", ro=False, name="pv", sub=None, create=True, delete=False) -> Volume:
    return Volume(name=name, pvc=PVC(claim_name=claim, create_if_not_exists=create,
                                     delete_on_sandbox_termination=delete),
                  mount_path=mount, read_only=ro, sub_path=sub)


def create_raw(http: httpx.Client, volumes: list[dict]) -> httpx.Response:
    return http.post("/v1/sandboxes", json={"image": {"uri": BUSYBOX}, "entrypoint": ["sleep", "600"],
                                             "resourceLimits": SMALL, "volumes": volumes})


# ------------------------------------------------------------------ host volumes


def test_host_volume_rw(vsb, prefix):
    """01b: the marker is read, a write lands on the host, owned as host root would own it."""
    sb = vsb(volumes=[host_vol(prefix / "host-volume-test")])
    ex = run(sb, "cat /mnt/host/marker.txt")
    assert ex.exit_code == 0 and [m.text for m in ex.logs.stdout] == [MARKER], stdout_text(ex)
    sh(sb, "test -d /mnt/host && echo written-in-sandbox > /mnt/host/out.txt && mkdir /mnt/host/sub")
    assert sh(sb, "cat /mnt/host/out.txt").strip() == "written-in-sandbox"
    out = prefix / "host-volume-test" / "out.txt"
    assert out.read_text() == "written-in-sandbox\n"
    if os.geteuid() == 0:
        # The directory is host root's (0755): sandbox root could write it
        # only through the idmapped mount, and what it wrote is host root's.
        st = out.stat()
        assert (st.st_uid, st.st_gid) == (0, 0), (st.st_uid, st.st_gid)
        assert sh(sb, "stat -c %u:%g /mnt/host/marker.txt").strip() == "0:0"


def test_host_volume_ro_cannot_be_remounted(vsb, prefix):
    """01c: writes fail, and sandbox root cannot remount the volume read-write or unmount it."""
    sb = vsb(volumes=[host_vol(prefix / "host-volume-test", mount="/mnt/ro", ro=True)])
    assert sh(sb, "cat /mnt/ro/marker.txt").strip() == MARKER
    ex = run(sb, "touch /mnt/ro/nope")
    assert ex.exit_code != 0, "write to a read-only volume succeeded"
    ex = run(sb, "id -u; mount -o remount,rw /mnt/ro")
    assert stdout_text(ex).splitlines()[:1] == ["0"] and ex.exit_code != 0, "remount rw succeeded"
    ex = run(sb, "umount /mnt/ro")
    assert ex.exit_code != 0, "unmount succeeded"
    assert run(sb, "touch /mnt/ro/nope").exit_code != 0, "writable after the remount attempt"
    assert not (prefix / "host-volume-test" / "nope").exists()
    opts = [l.split()[3] for l in sh(sb, "cat /proc/mounts").splitlines() if l.split()[1] == "/mnt/ro"]
    assert opts and all("ro" in o.split(",") for o in opts), opts


def test_host_subpath_and_file(vsb, prefix):
    """subPath is created beneath the path; a file is mounted as a file."""
    (prefix / "single.txt").write_text("one file\n")
    sb = vsb(volumes=[host_vol(prefix, mount="/data/sub", sub="made/by/subpath"),
                      host_vol(prefix / "single.txt", mount="/etc/single.txt", name="f", ro=True)])
    sh(sb, "echo x > /data/sub/x")
    assert (prefix / "made" / "by" / "subpath" / "x").read_text() == "x\n"
    assert sh(sb, "cat /etc/single.txt").strip() == "one file"


def test_mount_point_resolved_inside_the_root(vsb, prefix):
    """An image symlink at the mount path leads inside the sandbox root, never to the host's side."""
    # debian:bookworm-slim has /etc/localtime -> /usr/share/zoneinfo/Etc/UTC (absolute)
    # and /bin -> usr/bin; the mount must land at the sandbox's own targets.
    (prefix / "tz").write_text("not a zone\n")
    host_zone = Path("/usr/share/zoneinfo/Etc/UTC")
    before = host_zone.read_bytes() if host_zone.exists() else None
    sb = vsb(DEBIAN, volumes=[host_vol(prefix / "tz", mount="/etc/localtime", name="tz", ro=True),
                              host_vol(prefix / "host-volume-test", mount="/bin/pvisor-vol", name="b", ro=True)])
    assert sh(sb, "readlink /etc/localtime").strip() == "/usr/share/zoneinfo/Etc/UTC"
    assert sh(sb, "cat /usr/share/zoneinfo/Etc/UTC").strip() == "not a zone"
    assert sh(sb, "cat /usr/bin/pvisor-vol/marker.txt").strip() == MARKER
    assert not Path("/usr/bin/pvisor-vol").exists(), "a mount point was made on the host"
    if before is not None:
        assert host_zone.read_bytes() == before


# ------------------------------------------------------------------ refusals


def test_allowlist_refusals(vhttp, prefix, tmp_path):
    (prefix / "escape").unlink(missing_ok=True)
    (prefix / "escape").symlink_to("/")
    (prefix / "up").unlink(missing_ok=True)
    (prefix / "up").symlink_to("../..")
    before = list_all_ids(vhttp)
    cases = [
        ({"path": "/etc"}, None, "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": f"{prefix}-sibling"}, None, "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": f"{prefix}/../etc"}, None, "VOLUME::INVALID_HOST_PATH"),
        ({"path": f"{prefix}/escape"}, None, "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": f"{prefix}/escape/etc"}, None, "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": f"{prefix}/up"}, None, "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": str(prefix)}, "escape", "VOLUME::HOST_PATH_NOT_ALLOWED"),
        ({"path": str(prefix)}, "../x", "VOLUME::INVALID_SUB_PATH"),
        ({"path": "relative"}, None, "VOLUME::INVALID_HOST_PATH"),
    ]
    for host, sub, code in cases:
        v = {"name": "v", "mountPath": "/mnt/v", "readOnly": False, "host": host}
        if sub is not None:
            v["subPath"] = sub
        r = create_raw(vhttp, [v])
        assert r.status_code == 400 and r.json()["code"] == code, (host, sub, r.status_code, r.text)
    assert list_all_ids(vhttp) == before
    assert not Path("/x").exists() and not (prefix.parent / "x").exists()


def test_validation_codes(vhttp):
    pvc = {"claimName": "ok"}
    oss = {"bucket": "b", "endpoint": "e", "accessKeyId": "k", "accessKeySecret": "s", "version": "2.0"}
    cases = [
        ([{"name": "a", "mountPath": "/a", "pvc": pvc}, {"name": "a", "mountPath": "/b", "pvc": pvc}],
         "VOLUME::DUPLICATE_NAME"),
        ([{"name": "Bad_Name", "mountPath": "/a", "pvc": pvc}], "VOLUME::INVALID_NAME"),
        ([{"name": "a", "mountPath": "rel", "pvc": pvc}], "VOLUME::INVALID_MOUNT_PATH"),
        ([{"name": "a", "mountPath": "/a", "subPath": "/abs", "pvc": pvc}], "VOLUME::INVALID_SUB_PATH"),
        ([{"name": "a", "mountPath": "/a"}], "VOLUME::INVALID_BACKEND"),
        ([{"name": "a", "mountPath": "/a", "pvc": pvc, "host": {"path": "/tmp"}}], "VOLUME::INVALID_BACKEND"),
        ([{"name": "a", "mountPath": "/a", "ossfs": oss}], "VOLUME::UNSUPPORTED_BACKEND"),
        ([{"name": "a", "mountPath": "/a", "nfs": {"server": "x"}}], "VOLUME::UNSUPPORTED_BACKEND"),
        ([{"name": "a", "mountPath": "/a", "pvc": {"claimName": "No_Such"}}], "VOLUME::INVALID_PVC_NAME"),
        ([{"name": "a", "mountPath": "/a", "pvc": {"claimName": "pvisor-missing", "createIfNotExists": False}}],
         "VOLUME::PVC_NOT_FOUND"),
    ]
    for vols, code in cases:
        r = create_raw(vhttp, vols)
        assert r.status_code == 400 and r.json()["code"] == code, (vols, r.status_code, r.text)


@pytest.mark.backend("vm", why="needs a host where vm sandboxes run (the KVM test host)")
def test_volumes_are_refused_on_vm(vhttp, vol_server, prefix):
    """A vm sandbox cannot mount volumes yet: host and named volumes are refused with 400
    `VOLUME::UNSUPPORTED_BACKEND` before anything is made (no sandbox, no named volume)."""
    before = list_all_ids(vhttp)
    cases = [[{"name": "hv", "mountPath": "/mnt/host", "host": {"path": str(prefix / "host-volume-test")}}],
             [{"name": "pv", "mountPath": "/mnt/pvc", "pvc": {"claimName": "pvisor-vm-refused"}}]]
    for vols in cases:
        r = vhttp.post("/v1/sandboxes", json={"image": {"uri": BUSYBOX}, "entrypoint": ["sleep", "600"],
                                               "resourceLimits": SMALL, "volumes": vols,
                                               "extensions": {"pvisor.io/backend": "vm"}})
        assert r.status_code == 400 and r.json()["code"] == "VOLUME::UNSUPPORTED_BACKEND", (vols, r.text)
        assert "vm" in r.json()["message"], r.text
    assert list_all_ids(vhttp) == before
    assert "pvisor-vm-refused" not in cli(vol_server, "ls").stdout


def test_default_server_denies_every_host_path(http):
    """No --allow-host-path: an empty allowlist denies all (the reference's #750)."""
    r = create_raw(http, [{"name": "v", "mountPath": "/mnt/v", "readOnly": True, "host": {"path": "/tmp"}}])
    assert r.status_code == 400 and r.json()["code"] == "VOLUME::HOST_PATH_NOT_ALLOWED", r.text


# ------------------------------------------------------------------ named volumes


def test_named_volume_subpath_and_sharing(vsb, vol_server):
    """01d-01f: the seeded volume read and written; subPath shows only its subtree; two sandboxes share data."""
    cli(vol_server, "create", PVC_NAME)
    mp = mountpoint(vol_server, PVC_NAME)
    assert mp == vol_server.data_dir / "volumes" / PVC_NAME / "_data"
    (mp / "marker.txt").write_text(PVC_MARKER + "\n")
    (mp / "datasets" / "train").mkdir(parents=True, exist_ok=True)
    (mp / "datasets" / "train" / "marker.txt").write_text(PVC_SUB_MARKER + "\n")

    a = vsb(volumes=[pvc_vol(PVC_NAME)])
    ex = run(a, "cat /mnt/pvc/marker.txt")
    assert ex.exit_code == 0 and [m.text for m in ex.logs.stdout] == [PVC_MARKER]
    sh(a, "echo from-a > /mnt/pvc/shared.txt")

    b = vsb(volumes=[pvc_vol(PVC_NAME, mount="/mnt/train", sub="datasets/train", ro=True),
                     pvc_vol(PVC_NAME, mount="/mnt/all", name="all")])
    names = sh(b, "ls /mnt/train").split()
    assert "marker.txt" in names and "datasets" not in names, names
    assert sh(b, "cat /mnt/train/marker.txt").strip() == PVC_SUB_MARKER
    assert run(b, "touch /mnt/train/x").exit_code != 0
    assert sh(b, "cat /mnt/all/shared.txt").strip() == "from-a"
    sh(b, "echo from-b > /mnt/all/back.txt")
    assert sh(a, "cat /mnt/pvc/back.txt").strip() == "from-b"
    assert (mp / "back.txt").read_text() == "from-b\n"


def test_delete_on_sandbox_termination(vsb, vol_server):
    # Created by this create: deleted with the sandbox.
    sb = vsb(volumes=[pvc_vol("pvisor-e2e-ephemeral", delete=True)])
    sh(sb, "echo tmp > /mnt/pvc/f")
    assert cli(vol_server, "inspect", "pvisor-e2e-ephemeral", check=False).returncode == 0
    sb.kill()
    wait_until(lambda: cli(vol_server, "inspect", "pvisor-e2e-ephemeral", check=False).returncode != 0,
               timeout=30, what="the volume to be deleted with its sandbox")
    assert not (vol_server.data_dir / "volumes" / "pvisor-e2e-ephemeral").exists()
    # Existing before the create: kept, whatever the flag says.
    cli(vol_server, "create", "pvisor-e2e-kept")
    sb = vsb(volumes=[pvc_vol("pvisor-e2e-kept", delete=True)])
    sh(sb, "echo keep > /mnt/pvc/f")
    sb.kill()  # the delete answers once the sandbox is torn down
    assert (mountpoint(vol_server, "pvisor-e2e-kept") / "f").read_text() == "keep\n"


def test_volume_cli(vsb, vol_server):
    cli(vol_server, "create", "pvisor-e2e-cli")
    assert "pvisor-e2e-cli" in cli(vol_server, "ls").stdout
    listed = json.loads(cli(vol_server, "ls", "--json").stdout)
    assert "pvisor-e2e-cli" in [v["Name"] for v in listed]
    info = json.loads(cli(vol_server, "inspect", "--json", "pvisor-e2e-cli").stdout)[0]
    assert info["Driver"] == "local" and Path(info["Mountpoint"]).is_dir()
    assert cli(vol_server, "create", "Bad_Name", check=False).returncode != 0

    sb = vsb(volumes=[pvc_vol("pvisor-e2e-cli", create=False)])
    r = cli(vol_server, "rm", "pvisor-e2e-cli", check=False)
    assert r.returncode != 0 and "in use" in r.stderr, (r.returncode, r.stderr)
    assert sh(sb, "ls -d /mnt/pvc").strip() == "/mnt/pvc"
    sb.kill()
    wait_until(lambda: cli(vol_server, "rm", "pvisor-e2e-cli", check=False).returncode == 0,
               timeout=30, what="rm once the sandbox is gone")
    assert "pvisor-e2e-cli" not in cli(vol_server, "ls").stdout
    r = cli(vol_server, "inspect", "pvisor-e2e-cli", check=False)
    assert r.returncode != 0 and "no such volume" in r.stderr


def test_vm_backend_refuses_volumes(vhttp):
    body = {"image": {"uri": BUSYBOX}, "entrypoint": ["sleep", "1"], "resourceLimits": SMALL,
            "extensions": {"pvisor.io/backend": "vm"},
            "volumes": [{"name": "a", "mountPath": "/a", "pvc": {"claimName": "x"}}]}
    r = vhttp.post("/v1/sandboxes", json=body)
    # Where vm cannot run at all, BACKEND_UNAVAILABLE comes first.
    assert r.status_code == 400, r.text
    assert r.json()["code"] in ("VOLUME::UNSUPPORTED_BACKEND", "BACKEND_UNAVAILABLE"), r.text


# ------------------------------------------------------------------ unprivileged broker

try:
    from test_nonroot import as_user, delegated  # noqa: F401  (the fixture)
except ImportError:  # pragma: no cover
    delegated = None


@pytest.mark.skipif(os.geteuid() != 0, reason="setting up a user and delegated cgroups needs root")
def test_unprivileged_broker_volumes(delegated, tmp_path):  # noqa: F811
    """An unprivileged broker mounts host and named volumes; its sandbox root is the user."""
    pw, groups, data = delegated
    allowed = Path(tempfile.mkdtemp(prefix="pvisor-nonroot-vol-", dir="/tmp"))
    try:
        allowed.chmod(0o755)
        os.chown(allowed, pw.pw_uid, pw.pw_gid)
        (allowed / "marker.txt").write_text(MARKER + "\n")
        os.chown(allowed / "marker.txt", pw.pw_uid, pw.pw_gid)
        binary = pvisor_bin()
        port = free_port()
        user_cmd = (
            f"{binary} image import {images_dir() / 'busybox.tar'} --data-dir {data} && "
            f"exec {binary} serve --backend {SUITE_BACKEND} --listen 127.0.0.1:{port} --data-dir {data} --allow-host-path {allowed}"
        )
        log = open(tmp_path / "server.log", "wb")
        proc = subprocess.Popen(
            as_user(pw, groups, user_cmd),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        f = SandboxFactory(_make_conn(f"127.0.0.1:{port}"))
        try:
            wait_healthy(port, proc, lambda: (tmp_path / "server.log").read_text())
            sb = f(volumes=[host_vol(allowed, mount="/mnt/rw"), host_vol(allowed, mount="/mnt/ro", name="ro", ro=True),
                            pvc_vol("nonroot-vol", delete=True)])
            assert sh(sb, "cat /mnt/rw/marker.txt").strip() == MARKER
            sh(sb, "echo w > /mnt/rw/w.txt && echo p > /mnt/pvc/p.txt")
            assert (allowed / "w.txt").stat().st_uid == pw.pw_uid
            assert run(sb, "touch /mnt/ro/x").exit_code != 0
            assert run(sb, "mount -o remount,rw /mnt/ro").exit_code != 0
            assert run(sb, "touch /mnt/ro/x").exit_code != 0
            assert (data / "volumes" / "nonroot-vol" / "_data" / "p.txt").read_text() == "p\n"
            sb.kill()
            wait_until(lambda: not (data / "volumes" / "nonroot-vol").exists(), timeout=30,
                       what="the named volume deleted with its sandbox")
        finally:
            f.cleanup()
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
            log.close()
    finally:
        shutil.rmtree(allowed, ignore_errors=True)
