"""Server-proxy mode (use_server_proxy=True): every data-plane call goes through
/v1/sandboxes/{id}/proxy/44772/... on the lifecycle server."""

from __future__ import annotations

import hashlib
import os
import time

import httpx
import pytest
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.filesystem import DirectoryListEntry, SearchEntry, WriteEntry

from e2e_util import BUSYBOX, EXECD_PORT, PS, dataplane, describe, run, sh, stdout_text, wait_until

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def psb(module_sandbox, proxy_conn):
    return module_sandbox(BUSYBOX, conn=proxy_conn)


def test_endpoint_is_the_server_proxy(psb, server):
    ep = psb.get_endpoint(EXECD_PORT)
    assert ep.endpoint == f"{server}/v1/sandboxes/{psb.id}/proxy/{EXECD_PORT}", ep.endpoint


def test_proxy_commands(psb):
    ex = run(psb, "echo proxied; echo err >&2; exit 5")
    assert ex.exit_code == 5, describe(ex)
    assert stdout_text(ex) == "proxied"
    assert [m.text for m in ex.logs.stderr] == ["err"]
    assert stdout_text(run(psb, "seq 1 2000")).split("\n") == [str(i) for i in range(1, 2001)]
    assert sh(psb, 'echo "$X $(pwd)"', envs={"X": "env"}, working_directory="/tmp") == "env /tmp"


def test_proxy_timeout(psb):
    t0 = time.monotonic()
    ex = run(psb, "sleep 30", timeout_ms=1000)
    assert time.monotonic() - t0 < 10
    assert ex.exit_code != 0 and ex.error is not None, describe(ex)


def test_proxy_background(psb):
    ex = run(psb, "echo proxy-bg; sleep 30", background=True)
    assert psb.commands.get_command_status(ex.id).running is True
    wait_until(lambda: "proxy-bg" in psb.commands.get_background_command_logs(ex.id).content, 5,
               what="background logs through the proxy")
    psb.commands.interrupt(ex.id)
    wait_until(lambda: psb.commands.get_command_status(ex.id).running is False, 5)
    assert "proxy-bg; sleep 30" not in sh(psb, PS)


@pytest.mark.deadline(60)
def test_proxy_files(psb):
    blob = os.urandom(5 * MiB + 7)
    psb.files.write_file("/root/proxy.bin", blob)
    assert psb.files.read_bytes("/root/proxy.bin") == blob
    assert sh(psb, "sha256sum /root/proxy.bin").split()[0] == hashlib.sha256(blob).hexdigest()
    assert psb.files.read_bytes("/root/proxy.bin", range_header="bytes=1000-1999") == blob[1000:2000]
    psb.files.write_file("/root/pdir/t.txt", "text ✓")
    assert psb.files.read_file("/root/pdir/t.txt") == "text ✓"
    info = psb.files.get_file_info(["/root/proxy.bin"])["/root/proxy.bin"]
    assert info.size == len(blob)
    assert {e.path for e in psb.files.list_directory(DirectoryListEntry(path="/root/pdir"))} == {"/root/pdir/t.txt"}
    assert [e.path for e in psb.files.search(SearchEntry(path="/root/pdir", pattern="*.txt"))] == ["/root/pdir/t.txt"]
    psb.files.create_directories([WriteEntry(path="/root/pdir/new/sub")])
    psb.files.delete_directories(["/root/pdir"])
    with pytest.raises(SandboxApiException) as ei:
        psb.files.get_file_info(["/root/pdir"])
    assert ei.value.status_code == 404


def test_proxy_range_raw(psb):
    psb.files.write_file("/root/r.txt", "0123456789")
    url, headers = dataplane(psb)
    r = httpx.get(f"{url}/files/download", params={"path": "/root/r.txt"},
                  headers={**headers, "Range": "bytes=2-5"}, timeout=30)
    assert r.status_code == 206 and r.content == b"2345"
    r = httpx.get(f"{url}/files/download", params={"path": "/root/r.txt"},
                  headers={**headers, "Range": "bytes=20-"}, timeout=30)
    assert r.status_code == 416


def test_proxy_sessions_and_metrics(psb):
    sid = psb.commands.create_session()
    try:
        psb.commands.run_in_session(sid, "cd /etc; export V=sess")
        assert stdout_text(psb.commands.run_in_session(sid, 'echo "$(pwd) $V"')) == "/etc sess"
    finally:
        try:
            psb.commands.delete_session(sid)
        except SandboxApiException:
            pass
    m = psb.get_metrics()
    assert m.cpu_count > 0 and m.memory_total_in_mib > 0


def test_proxy_requires_token(psb):
    url, headers = dataplane(psb)
    r = httpx.get(f"{url}/ping", timeout=30)
    assert r.status_code == 401, r.text
    r = httpx.get(f"{url}/ping", headers=headers, timeout=30)
    assert 200 <= r.status_code < 300
