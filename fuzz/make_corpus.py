#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/.

The seeds are small, real inputs: minimal layer tarballs (plain, gzip, zstd;
whiteouts, opaque directories, links, devices, PAX xattrs, GNU long names),
an OCI manifest, index and config, a docker-archive, DNS queries and
answers, egress policies, and Ethernet frames (ARP, TCP SYN, UDP DNS, ICMP
echo) with correct checksums. Deterministic: running it again rewrites the
same bytes. Crash inputs found later are added next to them by hand
(`fuzz/corpus/<target>/crash-*`), never regenerated.
"""

import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = b"%%pvisor-fuzz-layer%%"


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def tar(entries, fmt=tarfile.USTAR_FORMAT):
    """entries: (name, kind, extra) with kind file/dir/sym/hard/chr/fifo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, kind, extra in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            ti.uid = ti.gid = 0
            ti.mode = 0o755 if kind == "dir" else 0o644
            data = None
            if kind == "file":
                data = extra or b""
                ti.size = len(data)
            elif kind == "dir":
                ti.type = tarfile.DIRTYPE
            elif kind == "sym":
                ti.type, ti.linkname = tarfile.SYMTYPE, extra
            elif kind == "hard":
                ti.type, ti.linkname = tarfile.LNKTYPE, extra
            elif kind == "chr":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                ti.type = tarfile.FIFOTYPE
            elif kind == "pax":
                data = b"x"
                ti.size = 1
                ti.pax_headers = extra
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return trim(buf.getvalue())


def trim(archive):
    """Drops tarfile's padding to 10 KiB records: the entries, then the two
    zero blocks that end an archive."""
    end = len(archive.rstrip(b"\0"))
    return archive[: (end + 511) // 512 * 512] + b"\0" * 1024


def gz(b):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as g:
        g.write(b)
    return out.getvalue()


def zst(b):
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=b, stdout=subprocess.PIPE, check=True).stdout


BASE = tar([
    ("etc", "dir", None),
    ("etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\n"),
    ("etc/hostname", "file", b"fuzz\n"),
    ("bin", "dir", None),
    ("bin/busybox", "file", b"\x7fELF" + b"\0" * 60),
    ("bin/sh", "hard", "bin/busybox"),
    ("bin/ls", "sym", "busybox"),
    ("dev", "dir", None),
    ("dev/null", "chr", None),
    ("run", "dir", None),
    ("run/pipe", "fifo", None),
    ("var/lib/data", "file", b"nested parents are implied\n"),
    ("usr/share/doc", "dir", None),
    ("usr/share/doc/a", "file", b"a" * 100),
])
UPPER = tar([
    ("etc/.wh.hostname", "file", b""),
    ("usr/share/doc/.wh..wh..opq", "file", b""),
    ("usr/share/doc/b", "file", b"b"),
    ("bin/ls", "file", b"replaced a symlink\n"),
    ("./root/", "dir", None),
])
PAX = tar([
    ("x" * 120 + "/" + "long-name-" * 12, "file", b"long"),
    ("attrs", "pax", {"SCHILY.xattr.user.k": "v", "SCHILY.xattr.security.capability": "\x01\x00\x00\x02", "mtime": "1.5"}),
], fmt=tarfile.PAX_FORMAT)
GNU = tar([("g" * 150, "file", b"gnu long name"), ("l", "sym", "t" * 150)], fmt=tarfile.GNU_FORMAT)


def sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def layers():
    put("image_layers", "base.tar", BASE)
    put("image_layers", "base.tar.gz", gz(BASE))
    put("image_layers", "base.tar.zst", zst(BASE))
    put("image_layers", "two-layers-whiteouts", BASE + SEP + UPPER)
    put("image_layers", "gzip-then-zstd", gz(BASE) + SEP + zst(UPPER))
    put("image_layers", "pax-xattrs", PAX)
    put("image_layers", "gnu-long-names", GNU)


CONFIG = json.dumps({
    "architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo hi"], "Env": ["PATH=/bin", "A=b=c"],
               "WorkingDir": "/root", "User": "0:0"},
    "rootfs": {"type": "layers", "diff_ids": [sha(BASE)]},
}).encode()


def docker_archive():
    buf = io.BytesIO()
    manifest = json.dumps([{"Config": "config.json", "RepoTags": ["fuzz:latest"], "Layers": ["l1/layer.tar"]}])
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in [("manifest.json", manifest.encode()), ("config.json", CONFIG), ("l1/layer.tar", BASE)]:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 1700000000
            t.addfile(ti, io.BytesIO(data))
    return trim(buf.getvalue())


def imports():
    put("image_import", "one-layer", CONFIG + SEP + BASE)
    put("image_import", "two-layers-gzip-zstd", CONFIG + SEP + gz(BASE) + SEP + zst(UPPER))
    put("image_import", "pax-and-gnu", b"{}" + SEP + PAX + SEP + GNU)
    put("image_import", "no-layers", b'{"config":null}')
    put("image_import", "docker-archive.tar", docker_archive())


def manifests():
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(b"l"), "size": 1}
    config = {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(CONFIG), "size": len(CONFIG)}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config, "layers": [layer]}
    entry = lambda os_, arch: {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha(arch.encode()),
                               "size": 500, "platform": {"os": os_, "architecture": arch}}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [entry("linux", "arm64"), entry("linux", "amd64"), entry("unknown", "unknown")]}
    docker = dict(manifest, mediaType="application/vnd.docker.distribution.manifest.v2+json",
                  config=dict(config, mediaType="application/vnd.docker.container.image.v1+json"))
    untyped = {"schemaVersion": 2, "config": config, "layers": []}
    for i, (name, doc) in enumerate([("oci-manifest", manifest), ("oci-index", index), ("docker-manifest", docker),
                                     ("untyped", untyped)]):
        put("image_manifest", name, bytes([i]) + json.dumps(doc).encode())
    put("image_manifest", "config", b"\x05" + CONFIG)
    for i, ref in enumerate(["busybox", "docker.io/library/busybox:1.36", "localhost:5000/org/app:v1",
                             "[::1]:5000/a/b", "ghcr.io/o/r@" + sha(b"x")]):
        put("image_manifest", f"ref-{i}", b"\x00" + ref.encode())


def qname(name):
    out = b""
    for label in name.split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def dns_query(qid, name, qtype):
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname(name) + struct.pack(">HH", qtype, 1)


def dns_answer(qid, name):
    q = qname(name) + struct.pack(">HH", 1, 1)
    cname = b"\xc0\x0c" + struct.pack(">HHIH", 5, 1, 300, 6) + b"\x03cdn\xc0\x10"
    a = b"\xc0\x2b" + struct.pack(">HHIH", 1, 1, 60, 4) + bytes([93, 184, 216, 34])
    return struct.pack(">HHHHHH", qid, 0x8180, 1, 2, 0, 0) + q + cname + a


def dns():
    put("dns", "query-a", dns_query(0x1234, "example.com", 1))
    put("dns", "query-aaaa", dns_query(7, "WWW.Example.COM", 28))
    put("dns", "query-https", dns_query(9, "a.b.c.d", 65))
    put("dns", "answer-cname-a", dns_answer(0x1234, "www.example.com"))
    put("dns", "nxdomain", struct.pack(">HHHHHH", 1, 0x8183, 1, 0, 0, 0) + qname("x.test") + struct.pack(">HH", 1, 1))
    put("dns", "truncated", struct.pack(">HHHHHH", 2, 0x8380, 1, 0, 0, 0) + qname("big.test") + struct.pack(">HH", 1, 1))


def policies():
    ip = bytes([93, 184, 216, 34])
    full = {"defaultAction": "deny", "egress": [
        {"action": "allow", "target": "example.com"}, {"action": "allow", "target": "*.pypi.org"},
        {"action": "deny", "target": "10.0.0.0/8"}, {"action": "allow", "target": "10.1.2.3"},
        {"action": "allow", "target": "2001:db8::/32"}, {"action": "deny", "target": "Example.ORG."}]}
    put("egress_policy", "policy", json.dumps(full).encode() + ip)
    put("egress_policy", "allow-all", b'{"defaultAction":"allow"}' + bytes([10, 1, 2, 3]))
    put("egress_policy", "patch", json.dumps([{"action": "deny", "target": "*.example.com"},
                                              {"action": "allow", "target": "1.1.1.1"}]).encode() + ip)
    put("egress_policy", "delete", json.dumps(["example.com", "10.0.0.0/8", "nope"]).encode() + ip)
    put("egress_policy", "empty", b"   " + bytes([127, 0, 0, 1]))


GATEWAY_MAC = bytes([0x02, 0x70, 0x76, 0, 0, 0x02])
GUEST_MAC = bytes([0x02, 0x70, 0x76, 0, 0, 0x64])
GUEST, GATEWAY, DNS, REMOTE = bytes([10, 0, 2, 100]), bytes([10, 0, 2, 2]), bytes([10, 0, 2, 3]), bytes([93, 184, 216, 34])


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f">{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def eth(payload, ethertype=0x0800, dst=GATEWAY_MAC):
    return dst + GUEST_MAC + struct.pack(">H", ethertype) + payload


def ipv4(proto, src, dst, l4):
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 1, 0x4000, 64, proto, 0, src, dst)
    h = h[:10] + struct.pack(">H", csum(h)) + h[12:]
    return h + l4


def l4_csum(proto, src, dst, l4):
    return csum(src + dst + struct.pack(">BBH", 0, proto, len(l4)) + l4)


def udp(src, dst, sport, dport, payload):
    u = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    c = l4_csum(17, src, dst, u) or 0xFFFF
    return eth(ipv4(17, src, dst, u[:6] + struct.pack(">H", c) + u[8:]))


def tcp(src, dst, sport, dport, flags, seq=1000, ack=0):
    t = struct.pack(">HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 64240, 0, 0)
    c = l4_csum(6, src, dst, t)
    return eth(ipv4(6, src, dst, t[:16] + struct.pack(">H", c) + t[18:]))


def icmp_echo(src, dst, data):
    i = struct.pack(">BBHHH", 8, 0, 0, 0x77, 1) + data
    i = i[:2] + struct.pack(">H", csum(i)) + i[4:]
    return eth(ipv4(1, src, dst, i))


def arp(target):
    a = struct.pack(">HHBBH", 1, 0x0800, 6, 4, 1) + GUEST_MAC + GUEST + b"\0" * 6 + target
    return eth(a, 0x0806, b"\xff" * 6)


def frames():
    fs = {
        "arp-gateway": arp(GATEWAY),
        "arp-neighbour": arp(bytes([10, 0, 2, 50])),
        "tcp-syn": tcp(GUEST, REMOTE, 40000, 443, 0x02),
        "tcp-syn-dns": tcp(GUEST, DNS, 40001, 53, 0x02),
        "tcp-ack": tcp(GUEST, REMOTE, 40000, 443, 0x10, 1001, 5),
        "udp-dns-a": udp(GUEST, DNS, 5353, 53, dns_query(1, "example.com", 1)),
        "udp-dns-aaaa": udp(GUEST, DNS, 5354, 53, dns_query(2, "example.org", 28)),
        "udp-other": udp(GUEST, REMOTE, 5000, 443, b"quic?"),
        "icmp-echo": icmp_echo(GUEST, REMOTE, b"ping" * 8),
        "icmp-echo-gateway": icmp_echo(GUEST, GATEWAY, b"pong"),
    }
    for name, f in fs.items():
        put("netd_frames", name, f)
    framed = lambda *xs: b"".join(struct.pack(">H", len(x)) + x for x in xs)
    put("netd_stack", "arp-then-syn", framed(fs["arp-gateway"], fs["tcp-syn"], fs["tcp-ack"]))
    put("netd_stack", "dns", framed(fs["udp-dns-a"], fs["udp-dns-aaaa"], fs["udp-dns-a"]))
    put("netd_stack", "mixed", framed(*fs.values()))
    put("netd_stack", "dns-over-tcp", framed(fs["arp-gateway"], fs["tcp-syn-dns"]))


def multipart(parts):
    out = b""
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += b"--pvisorfuzzboundary\r\nContent-Disposition: " + disp.encode() + b"\r\n"
        if filename:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + data + b"\r\n"
    return out + b"--pvisorfuzzboundary--\r\n"


def uploads():
    meta = lambda path, mode=None: json.dumps({"path": path, "mode": mode, "owner": None, "group": None}).encode()
    put("multipart_upload", "one-file", b"\x00" + multipart([("metadata", "metadata", meta("/tmp/a.txt", 644)),
                                                              ("file", "a.txt", b"hello\n")]))
    put("multipart_upload", "two-files-pieces", b"\x07" + multipart([
        ("metadata", "metadata", meta("/tmp/a", 755)), ("file", "a", b"#!/bin/sh\necho a\n"),
        ("metadata", "metadata", meta("/tmp/b")), ("file", "b", b"\0\1\2" * 50)]))
    put("multipart_upload", "refused", b"\x81" + multipart([("metadata", None, meta("/x", 600)),
                                                             ("other", None, b"skipped"), ("file", "x", b"x" * 300)]))
    put("multipart_upload", "bad-mode", b"\x03" + multipart([("metadata", None, meta("/x", 888)), ("file", "x", b"")]))
    put("multipart_upload", "file-first", b"\x05" + multipart([("file", "x", b"x"), ("metadata", None, meta("/x"))]))


if __name__ == "__main__":
    uploads()
    layers()
    imports()
    manifests()
    dns()
    policies()
    frames()
