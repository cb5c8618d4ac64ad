"""Data plane: files (upload/download/range/info/search/mv/permissions/replace/delete) and directories."""

from __future__ import annotations

import hashlib
import io
import os
import uuid
from datetime import datetime, timezone

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

from e2e_util import BUSYBOX, DEBIAN, dataplane, sh

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def bb(module_sandbox):
    return module_sandbox(BUSYBOX)


@pytest.fixture
def d(bb):
    """A fresh directory per test, on the overlay root (not /tmp)."""
    path = f"/root/e2e-{uuid.uuid4().hex[:8]}"
    bb.files.create_directories([WriteEntry(path=path, mode=755)])
    return path


@pytest.fixture(scope="module")
def blob() -> bytes:
    return os.urandom(5 * MiB + 123)


def expect_404(fn, *args, **kwargs):
    with pytest.raises(SandboxApiException) as ei:
        fn(*args, **kwargs)
    assert ei.value.status_code == 404, f"expected 404, got {ei.value.status_code}: {ei.value}"


def test_text_round_trip(bb, d):
    text = "héllo wörld ✓\nsecond line\n\n\ttabbed\n"
    bb.files.write_file(f"{d}/hello.txt", text)
    assert bb.files.read_file(f"{d}/hello.txt") == text
    assert sh(bb, f"cat {d}/hello.txt | wc -c") == str(len(text.encode()))


def test_write_creates_parents(bb, d):
    bb.files.write_file(f"{d}/a/b/c/deep.txt", "deep")
    assert sh(bb, f"cat {d}/a/b/c/deep.txt") == "deep"


def test_overwrite_truncates(bb, d):
    bb.files.write_file(f"{d}/o.txt", "a long original content\n")
    bb.files.write_file(f"{d}/o.txt", "short")
    assert bb.files.read_file(f"{d}/o.txt") == "short"


def test_empty_file(bb, d):
    bb.files.write_file(f"{d}/empty", b"")
    assert bb.files.read_bytes(f"{d}/empty") == b""
    assert bb.files.get_file_info([f"{d}/empty"])[f"{d}/empty"].size == 0


@pytest.mark.deadline(60)
def test_binary_5mib_round_trip(bb, d, blob):
    path = f"{d}/blob.bin"
    bb.files.write_file(path, blob)
    got = bb.files.read_bytes(path)
    assert len(got) == len(blob)
    assert got == blob
    inside = sh(bb, f"sha256sum {path}").split()[0]
    assert inside == hashlib.sha256(blob).hexdigest(), "the sandbox sees different bytes"
    streamed = b"".join(bb.files.read_bytes_stream(path, chunk_size=256 * 1024))
    assert streamed == blob


def test_write_from_stream_and_multiple_files(bb, d):
    data = os.urandom(300_000)
    bb.files.write_files([
        WriteEntry(path=f"{d}/s1.bin", data=io.BytesIO(data)),
        WriteEntry(path=f"{d}/s2.txt", data="second", mode=644),
        WriteEntry(path=f"{d}/sub/s3.bin", data=b"\x00\x01\x02"),
    ])
    assert bb.files.read_bytes(f"{d}/s1.bin") == data
    assert bb.files.read_file(f"{d}/s2.txt") == "second"
    assert bb.files.read_bytes(f"{d}/sub/s3.bin") == b"\x00\x01\x02"
    infos = bb.files.get_file_info([f"{d}/s1.bin", f"{d}/s2.txt"])
    assert infos[f"{d}/s1.bin"].mode == 755 and infos[f"{d}/s2.txt"].mode == 644


def test_read_range_sdk(bb, d, blob):
    path = f"{d}/range.bin"
    bb.files.write_file(path, blob[: MiB])
    assert bb.files.read_bytes(path, range_header="bytes=100-199") == blob[100:200]
    assert bb.files.read_bytes(path, range_header=f"bytes={MiB - 10}-") == blob[MiB - 10: MiB]
    assert bb.files.read_bytes(path, range_header="bytes=-16") == blob[MiB - 16: MiB]


def test_read_range_raw(bb, d, blob):
    path = f"{d}/range-raw.bin"
    size = 4096
    bb.files.write_file(path, blob[:size])
    url, headers = dataplane(bb)
    get = lambda rng: httpx.get(f"{url}/files/download", params={"path": path},
                                headers={**headers, "Range": rng}, timeout=30)
    r = get("bytes=10-19")
    assert r.status_code == 206, f"{r.status_code} {r.text[:200]}"
    assert r.content == blob[10:20]
    assert r.headers.get("content-range") == f"bytes 10-19/{size}", r.headers
    r = get(f"bytes={size - 5}-{size + 100}")
    assert r.status_code == 206 and r.content == blob[size - 5: size]
    r = get(f"bytes={size}-")
    assert r.status_code == 416, f"range beyond the end: {r.status_code} {r.content[:100]!r}"
    r = get(f"bytes={size + 1000}-{size + 2000}")
    assert r.status_code == 416
    r = httpx.get(f"{url}/files/download", params={"path": path}, headers=headers, timeout=30)
    assert r.status_code == 200 and r.content == blob[:size]


def test_read_lines_sdk(bb, d):
    """offset/limit are the 1-based first line and a line count (SDK 1.1.1, upstream's spec)."""
    path = f"{d}/lines.txt"
    bb.files.write_file(path, "".join(f"line {i}\n" for i in range(1, 11)))
    assert bb.files.read_file(path, offset=3, limit=2) == "line 3\nline 4\n"
    assert bb.files.read_file(path, offset=1, limit=1) == "line 1\n"
    assert bb.files.read_bytes(path, offset=10, limit=5) == b"line 10\n"
    assert b"".join(bb.files.read_bytes_stream(path, offset=9, limit=1)) == b"line 9\n"
    # Past the end: nothing, not an error.
    assert bb.files.read_file(path, offset=11, limit=3) == ""
    assert bb.files.read_file(path, offset=1000, limit=1) == ""
    # One of them alone: to the end, or the first lines.
    assert bb.files.read_file(path, offset=9) == "line 9\nline 10\n"
    assert bb.files.read_file(path, limit=2) == "line 1\nline 2\n"


def test_read_lines_crlf_no_trailing_newline_and_binary(bb, d):
    crlf = f"{d}/crlf.txt"
    bb.files.write_file(crlf, b"a\r\nb\r\nc\r\n")
    assert bb.files.read_bytes(crlf, offset=2, limit=1) == b"b\r\n"
    last = f"{d}/last.txt"
    bb.files.write_file(last, "first\nsecond\nthird")
    assert bb.files.read_file(last, offset=3, limit=1) == "third"
    assert bb.files.read_file(last, offset=2, limit=5) == "second\nthird"
    empty = f"{d}/empty.txt"
    bb.files.write_file(empty, b"")
    assert bb.files.read_bytes(empty, offset=1, limit=1) == b""
    # Binary: split at 0x0a bytes, every byte passed as it is.
    data = bytes(range(256)) * 3
    binary = f"{d}/blob.bin"
    bb.files.write_file(binary, data)
    lines = data.split(b"\n")
    assert bb.files.read_bytes(binary, offset=2, limit=1) == lines[1] + b"\n"
    assert bb.files.read_bytes(binary, offset=4) == lines[3]
    # A long line is not cut.
    long = f"{d}/long.txt"
    big = "x" * (3 * MiB)
    bb.files.write_file(long, f"short\n{big}\nend\n")
    assert bb.files.read_file(long, offset=2, limit=1) == big + "\n"


def test_read_lines_raw(bb, d):
    path = f"{d}/lines-raw.txt"
    bb.files.write_file(path, "1\n2\n3\n")
    url, headers = dataplane(bb)
    get = lambda **kw: httpx.get(f"{url}/files/download", params={"path": path, **kw.pop("params", {})},
                                 headers={**headers, **kw.pop("headers", {})}, timeout=30)
    r = get(params={"offset": 2, "limit": 1})
    assert r.status_code == 200 and r.content == b"2\n", f"{r.status_code} {r.text[:200]}"
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    for bad in ({"offset": 0, "limit": 1}, {"offset": 1, "limit": 0}, {"offset": -1}, {"limit": "x"}):
        r = get(params=bad)
        assert r.status_code == 400, f"{bad}: {r.status_code} {r.text[:200]}"
        assert r.json()["code"] and r.json()["message"], r.text
    # Lines and a byte range are mutually exclusive.
    r = get(params={"offset": 1, "limit": 1}, headers={"Range": "bytes=0-1"})
    assert r.status_code == 400, f"{r.status_code} {r.text[:200]}"
    # The Range header alone still works, and so does the whole file.
    r = get(headers={"Range": "bytes=2-3"})
    assert r.status_code == 206 and r.content == b"2\n" and r.headers["content-range"] == "bytes 2-3/6"
    r = get()
    assert r.status_code == 200 and r.content == b"1\n2\n3\n"
    r = httpx.get(f"{url}/files/download", params={"path": f"{d}/missing", "offset": 1, "limit": 1},
                  headers=headers, timeout=30)
    assert r.status_code == 404, f"{r.status_code} {r.text[:200]}"
    r = httpx.get(f"{url}/files/download", params={"path": d, "offset": 1, "limit": 1}, headers=headers, timeout=30)
    assert r.status_code == 400, f"{r.status_code} {r.text[:200]}"


def test_file_info(bb, d):
    t0 = datetime.now(timezone.utc)
    path = f"{d}/info.txt"
    bb.files.write_file(path, "12345")
    infos = bb.files.get_file_info([path, d])
    fi = infos[path]
    assert fi.path == path
    assert fi.size == 5
    assert fi.entry_type in (None, "file")
    assert fi.mode == 755, "write_file's default mode is 755"
    assert fi.owner == "root" and fi.group == "root"
    assert fi.modified_at.tzinfo is not None
    assert abs((fi.modified_at - t0).total_seconds()) < 60
    di = infos[d]
    assert di.entry_type in (None, "directory")
    assert di.path == d


def test_file_info_missing_is_404(bb, d):
    expect_404(bb.files.get_file_info, [f"{d}/nope"])
    expect_404(bb.files.get_file_info, [d, f"{d}/nope"])
    expect_404(bb.files.read_bytes, f"{d}/nope")


def test_permissions(bb, d):
    path = f"{d}/perm.txt"
    bb.files.write_file(path, "secret", mode=644)
    assert bb.files.get_file_info([path])[path].mode == 644
    bb.files.set_permissions([SetPermissionEntry(path=path, mode=600)])
    assert bb.files.get_file_info([path])[path].mode == 600
    assert sh(bb, f"stat -c %a {path}") == "600"


def test_write_with_mode(bb, d):
    bb.files.write_file(f"{d}/m.sh", "#!/bin/sh\necho run-me\n", mode=700)
    assert sh(bb, f"stat -c %a {d}/m.sh") == "700"
    assert sh(bb, f"{d}/m.sh") == "run-me"


def test_search(bb, d):
    for rel in ("a.py", "b.txt", "sub/c.py", "sub/deeper/d.py", "sub/e.md"):
        bb.files.write_file(f"{d}/{rel}", rel)
    found = {e.path for e in bb.files.search(SearchEntry(path=d, pattern="*.py"))}
    assert f"{d}/a.py" in found
    assert not any(p.endswith((".txt", ".md")) for p in found), found
    assert found <= {f"{d}/a.py", f"{d}/sub/c.py", f"{d}/sub/deeper/d.py"}, found
    every = {e.path for e in bb.files.search(SearchEntry(path=d, pattern="**"))}
    assert {f"{d}/a.py", f"{d}/b.txt", f"{d}/sub/c.py", f"{d}/sub/deeper/d.py", f"{d}/sub/e.md"} <= every
    assert bb.files.search(SearchEntry(path=d, pattern="*.nomatch")) == []
    entry = next(e for e in bb.files.search(SearchEntry(path=d, pattern="b.txt")) if e.path == f"{d}/b.txt")
    assert entry.size == len("b.txt")


def test_move(bb, d):
    bb.files.write_file(f"{d}/src.txt", "moving")
    bb.files.create_directories([WriteEntry(path=f"{d}/dst")])
    bb.files.move_files([MoveEntry(src=f"{d}/src.txt", dest=f"{d}/dst/renamed.txt")])
    assert bb.files.read_file(f"{d}/dst/renamed.txt") == "moving"
    expect_404(bb.files.get_file_info, [f"{d}/src.txt"])
    # Directories move too.
    bb.files.move_files([MoveEntry(src=f"{d}/dst", dest=f"{d}/dst2")])
    assert bb.files.read_file(f"{d}/dst2/renamed.txt") == "moving"


def test_move_missing_source_fails(bb, d):
    with pytest.raises(SandboxApiException) as ei:
        bb.files.move_files([MoveEntry(src=f"{d}/none", dest=f"{d}/x")])
    assert 400 <= ei.value.status_code < 500


def test_replace(bb, d):
    path = f"{d}/r.txt"
    bb.files.write_file(path, "foo bar foo\nfoo\n", mode=640)
    bb.files.replace_contents([ContentReplaceEntry(path=path, old_content="foo", new_content="bazz")])
    assert bb.files.read_file(path) == "bazz bar bazz\nbazz\n"
    assert bb.files.get_file_info([path])[path].mode == 640, "replace must preserve the mode"
    res = bb.files.replace_contents_detailed(
        [ContentReplaceEntry(path=path, old_content="bazz", new_content="q")]
    )
    assert [(x.path, x.replaced_count) for x in res] == [(path, 3)]
    assert bb.files.read_file(path) == "q bar q\nq\n"


def test_delete_files(bb, d):
    bb.files.write_file(f"{d}/del1", "1")
    bb.files.write_file(f"{d}/del2", "2")
    bb.files.delete_files([f"{d}/del1", f"{d}/del2"])
    expect_404(bb.files.get_file_info, [f"{d}/del1"])
    assert sh(bb, f"ls -A {d}") == ""


def test_directories(bb, d):
    base = f"{d}/tree"
    bb.files.create_directories([WriteEntry(path=f"{base}/a/b", mode=755), WriteEntry(path=f"{base}/priv", mode=700)])
    bb.files.write_file(f"{base}/top.txt", "t")
    bb.files.write_file(f"{base}/a/b/leaf.txt", "l")
    assert sh(bb, f"stat -c %a {base}/priv") == "700"
    assert bb.files.get_file_info([f"{base}/priv"])[f"{base}/priv"].mode == 700

    listed = {e.path: e for e in bb.files.list_directory(DirectoryListEntry(path=base))}
    assert set(listed) == {f"{base}/a", f"{base}/priv", f"{base}/top.txt"}, set(listed)
    assert listed[f"{base}/a"].entry_type in (None, "directory")
    deep = {e.path for e in bb.files.list_directory(DirectoryListEntry(path=base, depth=3))}
    assert {f"{base}/a/b", f"{base}/a/b/leaf.txt", f"{base}/top.txt"} <= deep

    bb.files.delete_directories([base])
    expect_404(bb.files.get_file_info, [base])
    assert sh(bb, f"test -e {base} && echo yes || echo no") == "no"


def test_list_directory_depth_zero_and_symlinked_root(bb, d):
    base = f"{d}/lst"
    bb.files.create_directories([WriteEntry(path=f"{base}/sub", mode=755)])
    bb.files.write_file(f"{base}/sub/f.txt", "f")
    sh(bb, f"ln -s {base}/sub {base}/link")
    # depth=0: the root's own level only, which a listing never includes: nothing.
    assert bb.files.list_directory(DirectoryListEntry(path=base, depth=0)) == []
    listed = {e.path: e for e in bb.files.list_directory(DirectoryListEntry(path=base, depth=5))}
    # A symlink inside is an entry and is not followed.
    assert set(listed) == {f"{base}/sub", f"{base}/sub/f.txt", f"{base}/link"}, set(listed)
    assert listed[f"{base}/link"].entry_type in (None, "symlink")
    # A symlink as the root is refused with 400, not listed through.
    with pytest.raises(SandboxApiException) as ei:
        bb.files.list_directory(DirectoryListEntry(path=f"{base}/link"))
    assert ei.value.status_code == 400, ei.value
    url, headers = dataplane(bb)
    r = httpx.get(f"{url}/directories/list", params={"path": f"{base}/link"}, headers=headers, timeout=30)
    assert r.status_code == 400 and "symbolic link" in r.json()["message"], f"{r.status_code} {r.text[:200]}"
    r = httpx.get(f"{url}/directories/list", params={"path": base, "depth": -1}, headers=headers, timeout=30)
    assert r.status_code == 400, f"{r.status_code} {r.text[:200]}"
    r = httpx.get(f"{url}/directories/list", params={"path": f"{base}/sub/f.txt"}, headers=headers, timeout=30)
    assert r.status_code == 400, f"{r.status_code} {r.text[:200]}"


def test_files_visible_to_commands_and_back(bb, d):
    sh(bb, f"echo from-shell > {d}/shell.txt")
    assert bb.files.read_file(f"{d}/shell.txt") == "from-shell\n"
    bb.files.write_file(f"{d}/api.txt", "from-api")
    assert sh(bb, f"cat {d}/api.txt") == "from-api"


def test_tmp_is_tmpfs(bb):
    mounts = sh(bb, "cat /proc/mounts")
    assert any(line.split()[1] == "/tmp" and line.split()[2] == "tmpfs" for line in mounts.splitlines()), mounts


def test_owner_and_group(module_sandbox):
    deb = module_sandbox(DEBIAN)
    deb.files.write_file("/home/app/owned.txt", "mine", owner="app", group="app", mode=600)
    fi = deb.files.get_file_info(["/home/app/owned.txt"])["/home/app/owned.txt"]
    assert (fi.owner, fi.group, fi.mode) == ("app", "app", 600)
    assert sh(deb, "stat -c %U:%G /home/app/owned.txt") == "app:app"
    assert sh(deb, "cat /home/app/owned.txt", uid=1000, gid=1000) == "mine"
