"""An unprivileged broker for e2e tests: one place that sets the scene.

`Delegation` makes a system user (test_nonroot.USER), delegates it cgroups
(`test_nonroot.delegate`: v1, a group of each controller beneath this process's own; v2, a
subtree as systemd's `Delegate=yes` gives one), and opens /dev/fuse and /dev/net/tun to
it (Debian's udev makes both 0666; these hosts have no udev and leave them 0600);
`close()` undoes that. `start_unprivileged(...)` starts a `PvisorServer` (conftest)
as that user inside those groups, on a data dir it owns, and returns it with its
delegation. test_network.py and test_hostile_tenant.py use it; test_nonroot,
test_volumes, test_limits, test_memory_merge and test_durability start theirs
with test_nonroot.as_user (the same prefix).
"""
from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PvisorServer, _start_server
from test_nonroot import USER, delegate, user_prefix


class Delegation:
    """A system user with delegated cgroups and /dev/fuse, /dev/net/tun opened to it."""

    DEVICES = ["/dev/fuse", "/dev/net/tun"]

    def __init__(self, tag: str = "u"):
        if os.geteuid() != 0:
            pytest.skip("setting up a user and delegated cgroups needs root")
        if subprocess.run(["id", USER], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--system", "--no-create-home", USER], check=True)
        self.pw = pwd.getpwnam(USER)
        self.groups: list[Path] = delegate(self.pw, tag)
        self.modes = {d: os.stat(d).st_mode & 0o7777 for d in self.DEVICES if os.path.exists(d)}
        for d in self.modes:
            os.chmod(d, 0o666)

    def prefix(self) -> list[str]:
        """What runs a command as the user inside the delegated groups."""
        return user_prefix(self.pw, self.groups)

    def close(self) -> None:
        for d, mode in self.modes.items():
            os.chmod(d, mode)
        for g in self.groups:
            for sub in sorted(g.glob("**/"), key=lambda p: -len(p.parts)):
                for _ in range(50):
                    try:
                        sub.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)


def start_unprivileged(tmp_path_factory, name: str, archives: list[str], env: dict[str, str] | None = None,
                       args: list[str] | None = None, tag: str = "u") -> tuple[PvisorServer, Delegation]:
    """A broker running as the delegated user; stop the server, then close the delegation."""
    deleg = Delegation(tag)
    try:
        srv = _start_server(tmp_path_factory, name, archives, env or {}, args, prefix=deleg.prefix(),
                            data_owner=(deleg.pw.pw_uid, deleg.pw.pw_gid))
    except BaseException:
        deleg.close()
        raise
    assert f"Uid:\t{deleg.pw.pw_uid}" in Path(f"/proc/{srv.proc.pid}/status").read_text(), "broker runs as the user"
    return srv, deleg
