"""Command line of the harness: up, down, status, check (every server and record from
the host's root namespace, curl included), env (shell exports for other tools)."""
from __future__ import annotations

import shutil
import subprocess

from . import addresses as A
from . import probe, world


def _curl_checks() -> list[str]:
    if shutil.which("curl") is None:
        return ["skip curl: not installed"]
    out = []
    for args, what in [
        (["http://allowed.test/", "--resolve", f"allowed.test:80:{A.WEB_A}"], "http"),
        (["https://allowed.test/", "--resolve", f"allowed.test:443:{A.WEB_A}", "--cacert", str(world.ca_path())], "https"),
    ]:
        r = subprocess.run(["curl", "-sS", "--max-time", "5", *args], capture_output=True, text=True)
        if r.returncode != 0 or f'"server": "{A.WEB_A}"' not in r.stdout:
            raise AssertionError(f"curl {what}: rc {r.returncode} {r.stdout!r} {r.stderr!r}")
        out.append(f"ok curl {what}://allowed.test/")
    return out


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "up":
        world.up()
        print(f"networld up: netns {A.NETNS}, link {A.LINK_HOST} <-> {A.LINK_INET}, dns {A.DNS}, "
              f"CA {world.ca_path()}")
    elif cmd == "down":
        world.down()
        left = world.leftovers()
        print("networld down" + (f"; LEFT OVER: {left}" if left else ", nothing left over"))
        return 1 if left else 0
    elif cmd == "status":
        print(world.status())
    elif cmd == "check":
        for line in probe.full_check(str(world.ca_path()), big="--no-big" not in argv) + _curl_checks():
            print(line)
    elif cmd == "env":
        print(f"NETWORLD_DNS={A.DNS}\nNETWORLD_CA={world.ca_path()}\nNETWORLD_LINK_HOST={A.LINK_HOST}")
    else:
        print(__doc__)
        return 2
    return 0
