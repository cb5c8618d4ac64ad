"""The Debian package scripts/package.sh builds: its contents, its control data, and its
systemd unit as `systemd-analyze verify` sees it (offline, against the unpacked package).

PVISOR_DEB names the .deb (scripts/test.sh passes the one package.sh printed); without it the
tests skip, visibly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEB = os.environ.get("PVISOR_DEB", "")
pytestmark = pytest.mark.skipif(not DEB, reason="PVISOR_DEB is not set: build the package with scripts/package.sh")
BINARIES = ("pvisor", "pvisor-worker", "pvisor-imaged", "pvisor-agent", "pvisor-netd")
UNIT = "usr/lib/systemd/system/pvisor.service"


def has_interpreter(path: Path) -> bool:
    """True when the 64-bit ELF file has a PT_INTERP program header (is dynamically linked)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    return any(int.from_bytes(data[phoff + i * phentsize:phoff + i * phentsize + 4], "little") == 3
               for i in range(phnum))


def dpkg_deb(*args: str) -> str:
    return subprocess.run(["dpkg-deb", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deb-root")
    dpkg_deb("-x", DEB, str(root))
    dpkg_deb("-e", DEB, str(root / "DEBIAN"))
    return root


def test_contents(unpacked):
    listing = dpkg_deb("-c", DEB)
    entries = {line.split()[-1] if "->" not in line else line.split()[-3]: line for line in listing.splitlines()}
    for b in BINARIES:
        line = entries.get(f"./usr/lib/pvisor/{b}")
        assert line and line.startswith("-rwxr-xr-x"), f"{b}: {line}"
    assert "-> ../lib/pvisor/pvisor" in entries["./usr/bin/pvisor"]
    assert (unpacked / "usr/bin/pvisor").resolve() == (unpacked / "usr/lib/pvisor/pvisor")
    assert f"./{UNIT}" in entries, sorted(entries)
    assert "./etc/pvisor/pvisor.env" in entries
    for static in ("pvisor-agent", "pvisor-netd"):  # the agent runs inside any image
        assert not has_interpreter(unpacked / "usr/lib/pvisor" / static), f"{static} is not statically linked"
    assert has_interpreter(unpacked / "usr/lib/pvisor/pvisor")


def test_control(unpacked):
    info = dpkg_deb("-I", DEB)
    assert re.search(r"^ Package: pvisor$", info, re.M), info
    assert re.search(r"^ Architecture: amd64$", info, re.M), info
    depends = re.search(r"^ Depends: (.*)$", info, re.M)
    assert depends and "adduser" in depends[1] and "fuse3" in depends[1] and "libc6" in depends[1], info
    conffiles = (unpacked / "DEBIAN/conffiles").read_text().split()
    assert "/etc/pvisor/pvisor.env" in conffiles
    postinst = (unpacked / "DEBIAN/postinst").read_text()
    assert "adduser --system" in postinst and "/var/lib/pvisor" in postinst
    assert "#DEBHELPER#" not in postinst, "cargo-deb fills in the systemd fragment"
    assert "deb-systemd-helper" in postinst, "the unit is enabled on install"
    subprocess.run(["sh", "-n", str(unpacked / "DEBIAN/postinst")], check=True)
    subprocess.run(["sh", "-n", str(unpacked / "DEBIAN/postrm")], check=True)


def test_unit(unpacked):
    unit = (unpacked / UNIT).read_text()
    for line in ("User=pvisor", "Delegate=yes", "EnvironmentFile=/etc/pvisor/pvisor.env", "KillMode=process"):
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    assert re.search(r"^ExecStart=/usr/lib/pvisor/pvisor serve ", unit, re.M)
    env = (unpacked / "etc/pvisor/pvisor.env").read_text()
    assert re.search(r"^PVISOR_DATA_DIR=/var/lib/pvisor$", env, re.M)
    assert re.search(r"^PVISOR_LISTEN=127\.0\.0\.1:8080$", env, re.M)


def test_systemd_analyze_verify(unpacked):
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.fail("systemd-analyze is missing (Debian package systemd)", pytrace=False)
    # Offline, in a root of the package's files plus the host's own units (the targets the unit
    # orders itself after), so the binaries it names are checked where the package puts them.
    root = unpacked.parent / "verify-root"
    shutil.copytree(unpacked, root, symlinks=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True,
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("pvisor.service"))
    r = subprocess.run([tool, "verify", f"--root={root}", f"/{UNIT}"], capture_output=True, text=True)
    assert r.returncode == 0, f"systemd-analyze verify exited {r.returncode}:\n{r.stdout}{r.stderr}"
    problems = [l for l in (r.stdout + r.stderr).splitlines() if "pvisor.service" in l]
    assert problems == [], problems
