"""Just enough of the DNS wire format (RFC 1035) for the test resolver and for
probes: parse a query, build an A answer / NODATA / NXDOMAIN, build a query and
read the A records of an answer. Stdlib only, so it also runs inside sandboxes.
"""
from __future__ import annotations

import socket
import struct

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
RCODE_NOERROR = 0
RCODE_FORMERR = 1
RCODE_NXDOMAIN = 3


class DnsError(ValueError):
    """A message that is not a well-formed DNS message."""


def _read_name(msg: bytes, off: int) -> tuple[str, int]:
    labels: list[str] = []
    end = None
    for _ in range(128):  # bounds compression loops
        if off >= len(msg):
            raise DnsError("name runs past the message")
        n = msg[off]
        if n & 0xC0 == 0xC0:
            if off + 1 >= len(msg):
                raise DnsError("truncated pointer")
            if end is None:
                end = off + 2
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        if n == 0:
            return ".".join(labels), (end if end is not None else off + 1)
        if n > 63 or off + 1 + n > len(msg):
            raise DnsError("bad label")
        labels.append(msg[off + 1:off + 1 + n].decode("ascii", "replace"))
        off += 1 + n
    raise DnsError("name too long or looping")


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        if label:
            raw = label.encode("ascii")
            out += bytes([len(raw)]) + raw
    return out + b"\0"


def parse_query(msg: bytes) -> tuple[int, int, str, int, int, int]:
    """(id, flags, qname lowercased, qtype, qclass, end of the question)."""
    if len(msg) < 12:
        raise DnsError("shorter than a header")
    qid, flags, qd = struct.unpack("!HHH", msg[:6])
    if qd != 1:
        raise DnsError(f"{qd} questions")
    name, off = _read_name(msg, 12)
    if off + 4 > len(msg):
        raise DnsError("truncated question")
    qtype, qclass = struct.unpack("!HH", msg[off:off + 4])
    return qid, flags, name.lower(), qtype, qclass, off + 4


def answer(query: bytes, records: dict[str, str], ttl: int) -> bytes:
    """The response to `query`: A records from `records`, NODATA for their other
    types, NXDOMAIN for any other name, FORMERR for garbage with a header."""
    try:
        qid, flags, name, qtype, qclass, qend = parse_query(query)
    except DnsError:
        if len(query) < 2:
            return b""
        return query[:2] + struct.pack("!HHHHH", 0x8000 | RCODE_FORMERR, 0, 0, 0, 0)
    rd = flags & 0x0100
    question = query[12:qend]
    addr = records.get(name.rstrip("."))
    if addr is None:
        return struct.pack("!HHHHHH", qid, 0x8480 | rd | RCODE_NXDOMAIN, 1, 0, 0, 0) + question
    if qtype != TYPE_A or qclass != CLASS_IN:
        return struct.pack("!HHHHHH", qid, 0x8480 | rd, 1, 0, 0, 0) + question
    rr = b"\xc0\x0c" + struct.pack("!HHIH", TYPE_A, CLASS_IN, ttl, 4) + socket.inet_aton(addr)
    return struct.pack("!HHHHHH", qid, 0x8480 | rd, 1, 1, 0, 0) + question + rr


def build_query(name: str, qid: int = 0x1234, qtype: int = TYPE_A) -> bytes:
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def parse_answer(msg: bytes) -> tuple[int, int, list[tuple[str, int]]]:
    """(id, rcode, [(A address, ttl)]) of a response."""
    if len(msg) < 12:
        raise DnsError("shorter than a header")
    qid, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    off = 12
    for _ in range(qd):
        _, off = _read_name(msg, off)
        off += 4
    out = []
    for _ in range(an):
        _, off = _read_name(msg, off)
        if off + 10 > len(msg):
            raise DnsError("truncated record")
        rtype, _rclass, ttl, rdlen = struct.unpack("!HHIH", msg[off:off + 10])
        off += 10
        if rtype == TYPE_A and rdlen == 4:
            out.append((socket.inet_ntoa(msg[off:off + 4]), ttl))
        off += rdlen
    return qid, flags & 0xF, out


def resolve(server: str, name: str, port: int = 53, timeout: float = 3.0) -> tuple[int, list[tuple[str, int]]]:
    """Asks `server` over UDP; (rcode, [(address, ttl)])."""
    q = build_query(name)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.connect((server, port))  # like a resolver: only the server's own address may answer
        s.send(q)
        data = s.recv(4096)
    qid, rcode, addrs = parse_answer(data)
    if qid != 0x1234:
        raise DnsError(f"answer id {qid:#x} does not match")
    return rcode, addrs
