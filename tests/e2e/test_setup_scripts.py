"""The set-up scripts from a clone in a private home (issue 21): unprivileged workers, agents and
image servers open the release binaries, so `scripts/common.sh` puts them where other users can
reach them. From a checkout behind a 0700 directory (root's home) `DIST` is under the cache, one
directory per checkout; elsewhere it stays `target/dist` in the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from e2e_util import REPO_ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a check as user nobody (needs root)")


@pytest.fixture
def open_tmp():
    """A directory every user can reach (pytest's own tmp_path is under a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="pvisor-setup-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def _checkout(root: Path) -> Path:
    """A stand-in checkout under `root` whose scripts/common.sh is the real one."""
    repo = root / "clone"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "common.sh").symlink_to(REPO_ROOT / "scripts" / "common.sh")
    return repo


def _dist(repo: Path, cache: Path) -> Path:
    out = subprocess.run(["bash", "-c", 'source "$1/scripts/common.sh"; mkdir -p "$DIST"; echo "$DIST"', "_",
                          str(repo)], env={**os.environ, "PVISOR_CACHE": str(cache)}, capture_output=True,
                         text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _nobody_can_list(d: Path) -> bool:
    return subprocess.run(["runuser", "-u", "nobody", "--", "ls", str(d)], capture_output=True).returncode == 0


def test_a_checkout_in_a_private_home_gets_its_binaries_under_the_cache(open_tmp):
    home = open_tmp / "home"
    home.mkdir()
    home.chmod(0o700)
    cache = open_tmp / "cache"
    cache.mkdir(mode=0o755)
    repo = _checkout(home)
    dist = _dist(repo, cache)
    assert not _nobody_can_list(repo), "the premise: other users cannot reach into the checkout"
    assert dist.parent.parent == cache and dist.parent.name == "dist", dist
    assert _nobody_can_list(dist), f"{dist} is not reachable by other users"
    assert _dist(repo, cache) == dist, "one directory per checkout, the same every time"


def test_a_reachable_checkout_keeps_target_dist(open_tmp):
    cache = open_tmp / "cache"
    cache.mkdir(mode=0o755)
    repo = _checkout(open_tmp)
    dist = _dist(repo, cache)
    assert dist == repo / "target" / "dist"
    assert _nobody_can_list(dist)
