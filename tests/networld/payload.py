"""The deterministic payload served by GET /bytes/N: generated, never read from disk.

Byte i of every payload is BLOCK[i % len(BLOCK)], so a client can check what it got
with `digest(n)` without the server keeping anything but one 1 MiB block.
"""
from __future__ import annotations

import hashlib

BLOCK_SIZE = 1 << 20


def _block() -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < BLOCK_SIZE:
        out += hashlib.sha256(b"pvisor-networld-%d" % counter).digest()
        counter += 1
    return bytes(out[:BLOCK_SIZE])


BLOCK = _block()


def chunks(n: int):
    """The payload of n bytes as memoryviews of BLOCK."""
    view = memoryview(BLOCK)
    while n > 0:
        k = min(n, BLOCK_SIZE)
        yield view[:k]
        n -= k


def digest(n: int) -> str:
    """sha256 hex of the n-byte payload."""
    h = hashlib.sha256()
    for c in chunks(n):
        h.update(c)
    return h.hexdigest()
