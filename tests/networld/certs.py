"""The test CA and the servers' certificate, made with the `openssl` CLI.

One leaf certificate names every test name (and *.wild.test) and every web address,
signed by a CA made for this world only; clients trust `ca.pem` from the state dir.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from . import addresses as A


class CertError(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CertError(f"openssl {' '.join(args)}: {r.stderr.strip()}")


def make(state: Path) -> None:
    """Writes ca.pem, ca.key, server.pem, server.key into `state` (once)."""
    if all((state / f).is_file() for f in ("ca.pem", "server.pem", "server.key")):
        return
    names = sorted(A.RECORDS) + ["*.wild.test", "*.c.wild.test"]
    san = ",".join([f"DNS:{n}" for n in names] + [f"IP:{ip}" for ip in A.WEB_HOSTS])
    (state / "leaf.ext").write_text(
        f"basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={san}\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=pvisor networld test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=state)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=allowed.test", "-keyout", "server.key",
             "-out", "server.csr", cwd=state)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "30", "-extfile", "leaf.ext", "-out", "server.pem", cwd=state)
