"""Repository files handed to an unprivileged user, wherever the checkout is.

A root user's clone naturally lives under /root (mode 0700): a non-root broker
started from it gets "Permission denied" on its own binary (issue 12, item 8).
Whatever the suite gives another user to run or read goes through here: used in
place when every parent directory lets others through, else copied once per
session into a world-traversable directory under /tmp (removed at exit).
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from pathlib import Path

_COPIES: dict[Path, Path] = {}
_DIR: Path | None = None


def reachable_by_others(path: Path, execute: bool = False) -> bool:
    """Whether a user with no relation to the owner can read (and run) `path`."""
    path = path.resolve()
    for d in path.parents:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH) and (not execute or bool(mode & stat.S_IXOTH))


def _copy_dir() -> Path:
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="pvisor-e2e-shared-", dir="/tmp"))
        _DIR.chmod(0o755)
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def for_others(path: Path, execute: bool = False) -> Path:
    """`path`, or a copy of it that any user can read (and run)."""
    path = path.resolve()
    if reachable_by_others(path, execute):
        return path
    if path not in _COPIES:
        sub = _copy_dir() / f"{len(_COPIES)}"
        sub.mkdir(mode=0o755)
        sub.chmod(0o755)
        dst = sub / path.name
        shutil.copy2(path, dst)
        dst.chmod(0o755 if execute else 0o644)
        _COPIES[path] = dst
    return _COPIES[path]


def binary_for_others(binary: Path) -> Path:
    """The pvisor binary with its siblings (worker, agent, image server, netd:
    the broker and worker find them next to themselves), runnable by anyone."""
    binary = binary.resolve()
    if reachable_by_others(binary, execute=True) and all(
        reachable_by_others(s, execute=True) for s in binary.parent.glob("pvisor*") if s.is_file()
    ):
        return binary
    if binary not in _COPIES:
        sub = _copy_dir() / f"dist-{len(_COPIES)}"
        sub.mkdir(mode=0o755)
        sub.chmod(0o755)
        for s in binary.parent.glob("pvisor*"):
            if s.is_file():
                shutil.copy2(s, sub / s.name)
                (sub / s.name).chmod(0o755)
        _COPIES[binary] = sub / binary.name
    return _COPIES[binary]
