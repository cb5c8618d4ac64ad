#!/usr/bin/env python3
"""Build pvisor's local test container images (standard library only).

Called by build-test-images.sh, which fetches the inputs (three mmdebstrap
tarballs: minbase, +python3, +nodejs; the busybox-static binary; two
directories of pinned wheels). This module turns them into layer tars (sorted entries, relative paths, numeric
ids, whiteouts) and writes docker-archive tarballs (the `docker save` layout)
plus one OCI image-layout tarball.

Subcommands:
  build   build every layer and archive into --out
  verify  check the archives in a directory: manifests, configs, diff_ids,
          OCI digests/sizes, layer entry ordering
"""

import argparse
import base64
import configparser
import fnmatch
import gzip
import hashlib
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import zipfile

REG, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
CHR, BLK, FIFO = tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE
WH = ".wh."
OPQ = ".wh..wh..opq"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZ = "application/vnd.oci.image.layer.v1.tar+gzip"
CHUNK = 1 << 20


def log(*a):
    print("mkarchive:", *a, file=sys.stderr, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)


def norm(name):
    """'./usr/bin/' -> 'usr/bin'; the root itself -> ''."""
    n = posixpath.normpath("/" + name).lstrip("/")
    return "" if n == "." else n


class Entry:
    """One filesystem object. Hard links are resolved: every member of a link
    group is a REG entry sharing `group` (and content); write_layer turns the
    second and later members (in sorted order) back into LNKTYPE entries."""

    __slots__ = ("path", "type", "mode", "uid", "gid", "mtime", "linkname",
                 "devmajor", "devminor", "xattrs", "data", "src", "group", "_digest")

    def __init__(self, path, type, mode, uid=0, gid=0, mtime=0, linkname="",
                 devmajor=0, devminor=0, xattrs=None, data=None, src=None, group=None):
        self.path, self.type, self.mode = path, type, mode
        self.uid, self.gid, self.mtime = uid, gid, mtime
        self.linkname, self.devmajor, self.devminor = linkname, devmajor, devminor
        self.xattrs = xattrs or {}
        self.data, self.src, self.group = data, src, group
        self._digest = None

    def copy(self, **kw):
        e = Entry(self.path, self.type, self.mode, self.uid, self.gid, self.mtime,
                  self.linkname, self.devmajor, self.devminor, dict(self.xattrs),
                  self.data, self.src, self.group)
        for k, v in kw.items():
            setattr(e, k, v)
        return e

    @property
    def size(self):
        if self.type != REG:
            return 0
        return len(self.data) if self.data is not None else self.src[1].size

    def open(self):
        if self.data is not None:
            return io.BytesIO(self.data)
        tf, ti = self.src
        return tf.extractfile(ti)

    def read(self):
        with self.open() as f:
            return f.read()

    def digest(self):
        if self._digest is None:
            h = hashlib.sha256()
            if self.type == REG:
                with self.open() as f:
                    while True:
                        b = f.read(CHUNK)
                        if not b:
                            break
                        h.update(b)
            self._digest = h.hexdigest()
        return self._digest

    def key(self):
        """What counts as 'changed' for layer diffs (mtime deliberately not)."""
        return (self.type, self.mode, self.uid, self.gid, self.linkname,
                self.devmajor, self.devminor, tuple(sorted(self.xattrs.items())),
                self.digest() if self.type == REG else None)


def dir_entry(path, mode=0o755, uid=0, gid=0, mtime=0):
    return Entry(path, DIR, mode, uid, gid, mtime)


def file_entry(path, data, mode=0o644, uid=0, gid=0, mtime=0):
    if isinstance(data, str):
        data = data.encode()
    return Entry(path, REG, mode, uid, gid, mtime, data=data)


def whiteout(path, mtime):
    d, b = posixpath.split(path)
    return Entry(posixpath.join(d, WH + b), REG, 0, 0, 0, mtime, data=b"")


def opaque_marker(dirpath, mtime):
    return Entry(posixpath.join(dirpath, OPQ), REG, 0, 0, 0, mtime, data=b"")


# --------------------------------------------------------------------------
# Trees ("views"): dict path -> Entry, path '' (the root) never stored.

def read_rootfs_tar(path, drop_devices=True):
    """Read an mmdebstrap tarball into a view. Device nodes are dropped (the
    runtime provides /dev)."""
    tf = tarfile.open(path, "r:")
    view = {}
    dropped = 0
    for ti in tf:
        name = norm(ti.name)
        if not name:
            continue
        xattrs = {k: v for k, v in ti.pax_headers.items()
                  if k.startswith(("SCHILY.xattr.", "LIBARCHIVE.xattr."))}
        if ti.islnk():
            target = norm(ti.linkname)
            t = view[target]
            if t.group is None:
                t.group = target
            view[name] = t.copy(path=name)
            continue
        if ti.type in (CHR, BLK) and drop_devices:
            dropped += 1
            continue
        if ti.type in (REG, tarfile.AREGTYPE, tarfile.CONTTYPE):
            e = Entry(name, REG, ti.mode, ti.uid, ti.gid, int(ti.mtime), xattrs=xattrs, src=(tf, ti))
        elif ti.type in (DIR, SYM, CHR, BLK, FIFO):
            e = Entry(name, ti.type, ti.mode, ti.uid, ti.gid, int(ti.mtime), ti.linkname,
                      ti.devmajor, ti.devminor, xattrs)
        else:
            raise SystemExit(f"{path}: unsupported tar entry type {ti.type!r} for {ti.name}")
        view[name] = e
    if dropped:
        log(f"{os.path.basename(path)}: dropped {dropped} device nodes")
    return view


def children(view, d):
    pre = d + "/" if d else ""
    return sorted(p for p in view if p.startswith(pre) and "/" not in p[len(pre):])


def remove_subtree(view, p, keep_self=False):
    pre = p + "/"
    for k in [k for k in view if k.startswith(pre)]:
        del view[k]
    if not keep_self:
        view.pop(p, None)


def apply_layer(view, layer):
    """Return a new view = view + layer (dict path -> Entry incl. whiteouts),
    with overlayfs/docker semantics: opaque markers hide lower content of their
    directory, .wh.<name> hides <name>, other entries replace what's there."""
    v = dict(view)
    for p in layer:
        d, b = posixpath.split(p)
        if b == OPQ:
            remove_subtree(v, d, keep_self=True)
    for p in layer:
        d, b = posixpath.split(p)
        if b.startswith(WH) and b != OPQ:
            remove_subtree(v, posixpath.join(d, b[len(WH):]))
    for p, e in layer.items():
        if posixpath.basename(p).startswith(WH):
            continue
        old = v.get(p)
        if old is not None and old.type == DIR and e.type != DIR:
            remove_subtree(v, p)
        v[p] = e
    return v


def diff_views(old, new, mtime):
    """Layer that turns `old` into `new`: new or changed paths (type, mode,
    owner, content, link target, xattrs) plus whiteouts for vanished paths."""
    layer = {}
    for p, e in new.items():
        o = old.get(p)
        if o is None or o.key() != e.key():
            layer[p] = e
    # keep hard-link groups whole so LNKTYPE entries never point outside the layer
    groups = {e.group for e in layer.values() if e.group}
    if groups:
        for p, e in new.items():
            if e.group in groups:
                layer[p] = e
    for p in old:
        if p in new:
            continue
        parent = posixpath.dirname(p)
        if parent:
            np_, op_ = new.get(parent), old.get(parent)
            if np_ is None or np_.type != DIR or op_ is None or op_.type != DIR:
                continue  # the parent itself vanished or was replaced
        w = whiteout(p, mtime)
        layer[w.path] = w
    return layer


# --------------------------------------------------------------------------
# Layer tar writing

def write_layer(path, layer, ref_view, mtime):
    """Write `layer` (dict path -> Entry) as an uncompressed pax tar, adding
    parent directories (metadata from ref_view, else 0755 root) and sorting.
    Returns the diff_id hex (sha256 of the tar)."""
    ents = dict(layer)
    for p in list(ents):
        d = posixpath.dirname(p)
        while d and d not in ents:
            r = ref_view.get(d)
            ents[d] = r if (r is not None and r.type == DIR) else dir_entry(d, mtime=mtime)
            d = posixpath.dirname(d)
    first_of_group = {}
    h = hashlib.sha256()

    class HashingWriter(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self):
            return True

        def tell(self):
            return self.f.tell()

        def write(self, b):
            h.update(b)
            return self.f.write(b)

    with open(path, "wb") as raw:
        w = HashingWriter(raw)
        with tarfile.open(fileobj=w, mode="w:", format=tarfile.PAX_FORMAT) as tf:
            for p in sorted(ents):
                e = ents[p]
                ti = tarfile.TarInfo(p)
                ti.mode, ti.uid, ti.gid, ti.mtime = e.mode, e.uid, e.gid, e.mtime
                ti.uname = ti.gname = ""
                ti.pax_headers = dict(e.xattrs)
                fobj = None
                if e.type == REG and e.group:
                    first = first_of_group.get(e.group)
                    if first is None:
                        first_of_group[e.group] = p
                    else:
                        ti.type, ti.linkname = LNK, first
                        tf.addfile(ti)
                        continue
                ti.type = e.type
                if e.type == REG:
                    ti.size = e.size
                    fobj = e.open()
                elif e.type == SYM:
                    ti.linkname = e.linkname
                elif e.type in (CHR, BLK):
                    ti.devmajor, ti.devminor = e.devmajor, e.devminor
                tf.addfile(ti, fobj)
                if fobj is not None:
                    fobj.close()
    return h.hexdigest()


# --------------------------------------------------------------------------
# Layer contents

def busybox_layers(busybox, mtime):
    out = subprocess.run([busybox, "--list"], check=True, capture_output=True, text=True).stdout
    applets = sorted({a.strip() for a in out.split() if a.strip()} - {"busybox"})
    if "sh" not in applets:
        raise SystemExit(f"{busybox} has no 'sh' applet")
    with open(busybox, "rb") as f:
        data = f.read()
    l1 = {"bin": dir_entry("bin", mtime=mtime),
          "bin/busybox": file_entry("bin/busybox", data, 0o755, mtime=mtime)}
    for a in applets:
        l1["bin/" + a] = Entry("bin/" + a, SYM, 0o777, mtime=mtime, linkname="busybox")

    passwd = ("root:x:0:0:root:/root:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
              "app:x:1000:1000:app:/home/app:/bin/sh\n")
    group = "root:x:0:\nnobody:x:65534:\napp:x:1000:\n"
    l2 = [
        dir_entry("dev", mtime=mtime),
        dir_entry("etc", mtime=mtime),
        file_entry("etc/group", group, mtime=mtime),
        file_entry("etc/hostname", "busybox\n", mtime=mtime),
        file_entry("etc/passwd", passwd, mtime=mtime),
        dir_entry("home", mtime=mtime),
        dir_entry("home/app", 0o755, 1000, 1000, mtime),
        dir_entry("proc", 0o555, mtime=mtime),
        dir_entry("root", 0o700, mtime=mtime),
        dir_entry("sys", 0o555, mtime=mtime),
        dir_entry("tmp", 0o1777, mtime=mtime),
    ]
    return l1, {e.path: e for e in l2}, len(applets)


def add_line(view, path, line, mtime):
    e = view[path]
    text = e.read().decode()
    name = line.split(":", 1)[0] + ":"
    if any(l.startswith(name) for l in text.splitlines()):
        return None
    if text and not text.endswith("\n"):
        text += "\n"
    return e.copy(data=(text + line + "\n").encode(), src=None, group=None, mtime=mtime, _digest=None)


def slim_layer(view, mtime):
    """The 'slimming' layer: whiteouts for docs/man pages/apt lists/apt
    caches, an opaque (emptied) /usr/share/locale, and an `app` user."""
    layer = {}
    for d in ("usr/share/doc", "usr/share/man", "var/lib/apt/lists"):
        for c in children(view, d):
            w = whiteout(c, mtime)
            layer[w.path] = w
    for c in children(view, "var/cache/apt"):
        if fnmatch.fnmatch(posixpath.basename(c), "*.bin"):
            w = whiteout(c, mtime)
            layer[w.path] = w
    loc = view.get("usr/share/locale")
    if loc is not None and loc.type == DIR:
        layer["usr/share/locale"] = loc
        m = opaque_marker("usr/share/locale", mtime)
        layer[m.path] = m
    for path, line in (("etc/passwd", "app:x:1000:1000:app:/home/app:/bin/bash"),
                       ("etc/group", "app:x:1000:")):
        e = add_line(view, path, line, mtime)
        if e is not None:
            layer[path] = e
    layer["home/app"] = dir_entry("home/app", 0o755, 1000, 1000, mtime)
    return layer


def python_version(view):
    e = view.get("usr/bin/python3")
    if e is None or e.type != SYM or not e.linkname.startswith("python3."):
        raise SystemExit("python rootfs: usr/bin/python3 is not a python3.X symlink")
    return e.linkname[len("python"):]


def record_line(path_rel, data):
    dig = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path_rel},sha256={dig},{len(data)}"


def wheel_fits(whl, pyver):
    """Pure-Python, or CPython `pyver`'s own manylinux x86_64 build."""
    if whl.endswith("-none-any.whl"):
        return True
    cp = "cp" + pyver.replace(".", "")
    tags = whl[: -len(".whl")].split("-")[-3:]
    return tags[:2] == [cp, cp] and all(
        p.startswith("manylinux") and p.endswith("_x86_64") for p in tags[2].split("."))


def wheels_layer(wheel_dir, pyver, mtime):
    """Install wheels (pure-Python, or built for this CPython on manylinux x86_64)
    the way pip would (minus .pyc files) into /usr/local/lib/python3.X/dist-packages,
    console scripts into /usr/local/bin."""
    site = f"usr/local/lib/python{pyver}/dist-packages"
    layer = {}
    names = []

    def put(path, data, mode):
        if path in layer:
            raise SystemExit(f"wheel file collision: /{path}")
        layer[path] = file_entry(path, data, mode, mtime=mtime)

    wheels = sorted(f for f in os.listdir(wheel_dir) if f.endswith(".whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {wheel_dir}")
    for whl in wheels:
        if not wheel_fits(whl, pyver):
            raise SystemExit(f"{whl}: neither pure-Python nor a CPython {pyver} manylinux x86_64 wheel")
        with zipfile.ZipFile(os.path.join(wheel_dir, whl)) as z:
            infos = [i for i in z.infolist() if not i.is_dir()]
            dist_info = {i.filename.split("/", 1)[0] for i in infos
                         if i.filename.split("/", 1)[0].endswith(".dist-info")}
            if len(dist_info) != 1:
                raise SystemExit(f"{whl}: expected exactly one .dist-info dir")
            dist_info = dist_info.pop()
            added = []
            for i in sorted(infos, key=lambda i: i.filename):
                name = i.filename
                if name.endswith((".pyc", ".pyo")) or "/__pycache__/" in "/" + name:
                    continue
                data = z.read(i)
                mode = 0o755 if (i.external_attr >> 16) & 0o111 else 0o644
                top = name.split("/", 1)[0]
                if top.endswith(".data"):
                    kind, rest = name.split("/", 2)[1:]
                    if kind in ("purelib", "platlib"):
                        put(f"{site}/{rest}", data, mode)
                    elif kind == "scripts":
                        if data.startswith(b"#!python"):
                            data = b"#!/usr/bin/python3" + data[len(b"#!python"):]
                        put(f"usr/local/bin/{rest}", data, 0o755)
                    elif kind == "data":
                        put(f"usr/local/{rest}", data, mode)
                    else:
                        raise SystemExit(f"{whl}: unsupported .data kind {kind}")
                    continue
                put(f"{site}/{name}", data, mode)
            # console scripts, as pip generates them
            ep = f"{dist_info}/entry_points.txt"
            if ep in z.namelist():
                cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
                cp.optionxform = str
                cp.read_string(z.read(ep).decode())
                if cp.has_section("console_scripts"):
                    for script, target in sorted(cp.items("console_scripts")):
                        mod, _, attr = target.partition(":")
                        attr = attr.split("[")[0].strip()
                        head = attr.split(".")[0]
                        body = (f"#!/usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                                f"from {mod.strip()} import {head}\n"
                                f"if __name__ == '__main__':\n"
                                f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                                f"    sys.exit({attr}())\n").encode()
                        put(f"usr/local/bin/{script}", body, 0o755)
                        added.append((f"../../../bin/{script}", body))
            installer = b"pvisor-build-test-images\n"
            put(f"{site}/{dist_info}/INSTALLER", installer, 0o644)
            added.append((f"{dist_info}/INSTALLER", installer))
            rec_path = f"{site}/{dist_info}/RECORD"
            if rec_path in layer:
                rec = layer[rec_path].data.decode()
                if rec and not rec.endswith("\n"):
                    rec += "\n"
                rec += "".join(record_line(p, d) + "\n" for p, d in added)
                layer[rec_path] = file_entry(rec_path, rec, 0o644, mtime=mtime)
            names.append(dist_info[: -len(".dist-info")])
    return layer, names


# --------------------------------------------------------------------------
# Archives

def canon_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def iso(ts):
    import datetime
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Layer:
    def __init__(self, path, diff_id, created_by):
        self.path, self.diff_id, self.created_by = path, diff_id, created_by


def image_config(layers, env, cmd, mtime, workdir="", extra_history=()):
    created = iso(mtime)
    history = [{"created": created, "created_by": l.created_by, "comment": "pvisor test image"}
               for l in layers]
    for h in extra_history:
        history.append({"created": created, "created_by": h, "empty_layer": True})
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "author": "pvisor images/testdata/build-test-images.sh",
        "config": {
            "Env": list(env),
            "Cmd": list(cmd),
            "WorkingDir": workdir,
            "User": "",
            "Entrypoint": None,
            "Labels": {"org.pvisor.test-image": "true"},
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + l.diff_id for l in layers]},
        "history": history,
    }


class ArchiveWriter:
    """Deterministic tar writer: entries added in sorted order at close."""

    def __init__(self, path, mtime):
        self.path, self.mtime, self.items = path, mtime, {}

    def add_bytes(self, name, data):
        self.items[name] = ("bytes", data)

    def add_file(self, name, src):
        self.items[name] = ("file", src)

    def close(self):
        names = dict(self.items)
        for n in list(names):
            d = posixpath.dirname(n)
            while d and d not in names:
                names[d] = ("dir", None)
                d = posixpath.dirname(d)
        with tarfile.open(self.path, "w:", format=tarfile.PAX_FORMAT) as tf:
            for n in sorted(names):
                kind, v = names[n]
                ti = tarfile.TarInfo(n)
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = self.mtime, 0, 0, "", ""
                if kind == "dir":
                    ti.type, ti.mode = DIR, 0o755
                    tf.addfile(ti)
                elif kind == "bytes":
                    ti.mode, ti.size = 0o644, len(v)
                    tf.addfile(ti, io.BytesIO(v))
                else:
                    ti.mode, ti.size = 0o644, os.path.getsize(v)
                    with open(v, "rb") as f:
                        tf.addfile(ti, f)


def write_docker_archive(path, repo_tag, layers, config, mtime):
    cfg = canon_json(config)
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    aw = ArchiveWriter(path, mtime)
    aw.add_bytes(cfg_name, cfg)
    parent = ""
    layer_paths = []
    for l in layers:
        # v1-style layer id: chained over the parents, so a shared layer prefix
        # gets the same directory name in every archive
        lid = hashlib.sha256(f"{parent} {l.diff_id}".encode()).hexdigest()
        v1 = {"id": lid, "created": iso(mtime), "os": "linux"}
        if parent:
            v1["parent"] = parent
        aw.add_bytes(f"{lid}/VERSION", b"1.0")
        aw.add_bytes(f"{lid}/json", canon_json(v1))
        aw.add_file(f"{lid}/layer.tar", l.path)
        layer_paths.append(f"{lid}/layer.tar")
        parent = lid
    manifest = [{"Config": cfg_name, "RepoTags": [repo_tag], "Layers": layer_paths}]
    aw.add_bytes("manifest.json", canon_json(manifest))
    repo, tag = repo_tag.rsplit(":", 1)
    aw.add_bytes("repositories", canon_json({repo: {tag: parent}}))
    aw.close()


def write_oci_archive(path, ref_name, layers, config, mtime, workdir):
    aw = ArchiveWriter(path, mtime)

    def blob(data):
        d = hashlib.sha256(data).hexdigest()
        aw.add_bytes(f"blobs/sha256/{d}", data)
        return {"digest": "sha256:" + d, "size": len(data)}

    descs = []
    for l in layers:
        gz = os.path.join(workdir, l.diff_id + ".tar.gz")
        with open(l.path, "rb") as src, open(gz, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
                shutil.copyfileobj(src, g, CHUNK)
        d = sha256_file(gz)
        aw.add_file(f"blobs/sha256/{d}", gz)
        descs.append({"mediaType": OCI_LAYER_GZ, "digest": "sha256:" + d,
                      "size": os.path.getsize(gz)})
    cdesc = dict(blob(canon_json(config)), mediaType=OCI_CONFIG)
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cdesc, "layers": descs}
    mdesc = dict(blob(canon_json(manifest)), mediaType=OCI_MANIFEST)
    mdesc["platform"] = {"architecture": "amd64", "os": "linux"}
    mdesc["annotations"] = {"org.opencontainers.image.ref.name": ref_name}
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [mdesc]}
    aw.add_bytes("index.json", canon_json(index))
    aw.add_bytes("oci-layout", canon_json({"imageLayoutVersion": "1.0.0"}))
    aw.close()


# --------------------------------------------------------------------------

def cmd_build(a):
    t = a.epoch
    work = a.work
    os.makedirs(work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    produced = []

    def layer(name, entries, ref_view, created_by):
        p = os.path.join(work, name + ".tar")
        d = write_layer(p, entries, ref_view, t)
        log(f"layer {name}: {len(entries)} entries, {os.path.getsize(p)} bytes, sha256:{d[:12]}")
        return Layer(p, d, created_by)

    def out(name):
        produced.append(name)
        return os.path.join(a.out, name)

    # 1. busybox
    bb1, bb2, napplets = busybox_layers(a.busybox, t)
    bb = [layer("busybox-1", bb1, bb1, f"ADD busybox-static /bin/busybox + {napplets} applet symlinks"),
          layer("busybox-2", bb2, bb2, "ADD /etc/passwd /etc/group /etc/hostname, base dirs")]
    bb_cfg = image_config(bb, [PATH_ENV], ["sh"], t,
                          extra_history=[f'ENV {PATH_ENV}', 'CMD ["sh"]'])
    write_docker_archive(out("busybox.tar"), "busybox:latest", bb, bb_cfg, t)
    write_oci_archive(out("busybox-oci.tar"), "busybox-oci:latest", bb, bb_cfg, t, work)

    # 2. debian minbase + slimming layer
    base = read_rootfs_tar(a.minbase)
    deb1 = layer("debian-1", base, base, f"mmdebstrap --variant=minbase {a.suite}")
    slim = slim_layer(base, t)
    base_slim = apply_layer(base, slim)
    deb2 = layer("debian-2", slim, base_slim,
                 "slim: whiteout /usr/share/doc/* /usr/share/man/* /var/lib/apt/lists/* "
                 "/var/cache/apt/*.bin; opaque /usr/share/locale; add user app")
    nwh = sum(1 for p in slim if posixpath.basename(p).startswith(WH))
    log(f"debian slim layer: {nwh} whiteout/opaque entries")
    deb = [deb1, deb2]
    deb_cfg = image_config(deb, [PATH_ENV], ["bash"], t,
                           extra_history=[f'ENV {PATH_ENV}', 'CMD ["bash"]'])
    write_docker_archive(out(f"debian-{a.suite}-slim.tar"), f"debian:{a.suite}-slim", deb, deb_cfg, t)

    # 3. python: diff(slim(minbase), slim(minbase+python3))
    full = read_rootfs_tar(a.python)
    pyver = python_version(full)
    py_slim = apply_layer(full, slim_layer(full, t))
    pydiff = diff_views(base_slim, py_slim, t)
    nwh = sum(1 for p in pydiff if posixpath.basename(p).startswith(WH))
    log(f"python diff layer: {len(pydiff)} entries ({nwh} whiteouts)")
    py3 = layer("python-3", pydiff, py_slim, f"mmdebstrap --variant=minbase --include=python3 {a.suite} (diff, slimmed)")
    py = deb + [py3]
    py_env = [PATH_ENV, "LANG=C.UTF-8"]
    py_cfg = image_config(py, py_env, ["python3"], t,
                          extra_history=[f"ENV {e}" for e in py_env] + ['CMD ["python3"]'])
    write_docker_archive(out(f"python-{pyver}-slim.tar"), f"python:{pyver}-slim", py, py_cfg, t)

    # 4. python tools: numpy/pandas/matplotlib wheels, pure-Python wheels, release file
    sci, sci_dists = wheels_layer(a.sci_wheels, pyver, t)
    py_sci = layer("python-sci", sci, py_slim, "install wheels: " + " ".join(sci_dists))
    whl, dists = wheels_layer(a.wheels, pyver, t)
    py4 = layer("python-4", whl, py_slim, "install wheels: " + " ".join(dists))
    rel = {"etc/pvisor-release": file_entry(
        "etc/pvisor-release",
        f"PVISOR_IMAGE=python-tools\nBASE=debian:{a.suite}-slim\nPYTHON={pyver}\n"
        f"PACKAGES={' '.join(sci_dists + dists)}\n", mtime=t)}
    py5 = layer("python-5", rel, py_slim, "ADD /etc/pvisor-release")
    tools = py + [py_sci, py4, py5]
    tools_env = py_env + ["PVISOR_IMAGE=python-tools"]
    tools_cfg = image_config(tools, tools_env, ["python3"], t, workdir="/home/app",
                             extra_history=[f"ENV {e}" for e in tools_env] +
                             ["WORKDIR /home/app", 'CMD ["python3"]'])
    write_docker_archive(out(f"python-{pyver}-tools.tar"), "pvisor/python-tools:latest", tools, tools_cfg, t)

    # 5. node: diff(slim(minbase), slim(minbase+nodejs)); bash comes with minbase
    node_full = read_rootfs_tar(a.node)
    node_slim = apply_layer(node_full, slim_layer(node_full, t))
    nodediff = diff_views(base_slim, node_slim, t)
    log(f"node diff layer: {len(nodediff)} entries")
    node3 = layer("node-3", nodediff, node_slim, f"mmdebstrap --variant=minbase --include=nodejs {a.suite} (diff, slimmed)")
    node = deb + [node3]
    node_env = [PATH_ENV, "LANG=C.UTF-8"]
    node_cfg = image_config(node, node_env, ["node"], t, workdir="/home/app",
                            extra_history=[f"ENV {e}" for e in node_env] + ["WORKDIR /home/app", 'CMD ["node"]'])
    write_docker_archive(out(f"node-{a.suite}.tar"), "pvisor/node:latest", node, node_cfg, t)

    for n in produced:
        print(n)


# --------------------------------------------------------------------------
# Verification

def check_layer_tar(f, label):
    """Entry-level checks on a layer tar stream."""
    seen = set()
    names = []
    with tarfile.open(fileobj=f, mode="r|") as tf:
        for ti in tf:
            n = ti.name.rstrip("/")
            if ti.name.startswith(("/", "./")) or ".." in n.split("/"):
                raise SystemExit(f"{label}: bad entry name {ti.name!r}")
            d = posixpath.dirname(n)
            if d and d not in seen:
                raise SystemExit(f"{label}: {n} appears before its parent {d}")
            if ti.islnk() and ti.linkname not in seen:
                raise SystemExit(f"{label}: hard link {n} -> {ti.linkname} before its target")
            seen.add(n)
            names.append(n)
    if names != sorted(names):
        raise SystemExit(f"{label}: entries not sorted")
    return names


def cmd_verify(a):
    ok = True
    for fn in sorted(os.listdir(a.dir)):
        if not fn.endswith(".tar"):
            continue
        p = os.path.join(a.dir, fn)
        with tarfile.open(p) as tf:
            members = {m.name.rstrip("/"): m for m in tf.getmembers()}

            def read(n):
                return tf.extractfile(members[n]).read()

            def sha_member(n):
                h = hashlib.sha256()
                with tf.extractfile(members[n]) as f:
                    while True:
                        b = f.read(CHUNK)
                        if not b:
                            return h.hexdigest()
                        h.update(b)

            if "manifest.json" in members:
                man = json.loads(read("manifest.json"))
                assert len(man) == 1, fn
                cfg_raw = read(man[0]["Config"])
                assert hashlib.sha256(cfg_raw).hexdigest() + ".json" == man[0]["Config"], fn
                cfg = json.loads(cfg_raw)
                diff_ids = cfg["rootfs"]["diff_ids"]
                assert len(diff_ids) == len(man[0]["Layers"]), fn
                assert len([h for h in cfg["history"] if not h.get("empty_layer")]) == len(diff_ids), fn
                for lp, did in zip(man[0]["Layers"], diff_ids):
                    got = "sha256:" + sha_member(lp)
                    if got != did:
                        raise SystemExit(f"{fn}: {lp} sha256 {got} != diff_id {did}")
                    with tf.extractfile(members[lp]) as f:
                        n = check_layer_tar(f, f"{fn}:{lp}")
                    wh = sum(1 for x in n if posixpath.basename(x).startswith(WH))
                    print(f"  {fn}: {did[:19]} {members[lp].size:>10} bytes {len(n):>6} entries {wh:>4} whiteouts")
                print(f"OK docker-archive {fn}: {man[0]['RepoTags']} {len(diff_ids)} layers")
            elif "oci-layout" in members:
                assert json.loads(read("oci-layout"))["imageLayoutVersion"] == "1.0.0"
                idx = json.loads(read("index.json"))

                def blob(desc):
                    n = "blobs/sha256/" + desc["digest"].split(":", 1)[1]
                    assert members[n].size == desc["size"], (fn, n)
                    assert "sha256:" + sha_member(n) == desc["digest"], (fn, n)
                    return n

                for md in idx["manifests"]:
                    man = json.loads(read(blob(md)))
                    assert man["mediaType"] == OCI_MANIFEST
                    cfg = json.loads(read(blob(man["config"])))
                    diff_ids = cfg["rootfs"]["diff_ids"]
                    assert len(diff_ids) == len(man["layers"])
                    for ld, did in zip(man["layers"], diff_ids):
                        assert ld["mediaType"] == OCI_LAYER_GZ
                        n = blob(ld)
                        with tf.extractfile(members[n]) as f:
                            raw = gzip.decompress(f.read())
                        assert "sha256:" + hashlib.sha256(raw).hexdigest() == did, (fn, n)
                        check_layer_tar(io.BytesIO(raw), f"{fn}:{n}")
                    print(f"OK oci-layout {fn}: {md['annotations']['org.opencontainers.image.ref.name']}"
                          f" {len(diff_ids)} layers")
            else:
                print(f"FAIL {fn}: neither manifest.json nor oci-layout")
                ok = False
    if not ok:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--busybox", required=True)
    b.add_argument("--minbase", required=True, help="mmdebstrap --variant=minbase tarball")
    b.add_argument("--python", required=True, help="mmdebstrap --variant=minbase --include=python3 tarball")
    b.add_argument("--sci-wheels", required=True, help="directory of numpy/pandas/matplotlib wheels (cp3X manylinux)")
    b.add_argument("--node", required=True, help="mmdebstrap --variant=minbase --include=nodejs tarball")
    b.add_argument("--wheels", required=True, help="directory of pure-Python wheels")
    b.add_argument("--suite", required=True)
    b.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH")
    b.add_argument("--work", required=True, help="scratch directory for layer tars")
    b.add_argument("--out", required=True)
    v = sub.add_parser("verify")
    v.add_argument("dir")
    a = ap.parse_args()
    {"build": cmd_build, "verify": cmd_verify}[a.cmd](a)


if __name__ == "__main__":
    main()
