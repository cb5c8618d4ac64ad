"""Opening and closing the two sides, and the per-run work dir."""
from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from .common import log, rm_tree
from .pvisor_side import PvisorService


def workdir(args, name: str) -> Path:
    base = Path(getattr(args, "workdir", None) or "/var/tmp")
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"pvisor-bench-{name}-", dir=base))


@contextmanager
def opened_sides(args, work: Path, images: list[str], warm_workers=None, pvisor_args=()):
    """Yields {name: service}. pvisor always (`pvisor_args` appended to `pvisor serve`);
    the peer unless --pvisor-only."""
    sides = {}
    try:
        log("pvisor: importing", ", ".join(images))
        sides["pvisor"] = PvisorService(work / "pvisor", images, warm_workers=warm_workers,
                                         serve_args=pvisor_args)
        if not getattr(args, "pvisor_only", False):
            from .peer import PeerService
            log("peer: dockerd, image load, stand-in execd image")
            sides["peer"] = PeerService(work / "peer", images)
        yield sides
    finally:
        for s in sides.values():
            try:
                s.close()
            except Exception as e:  # keep closing the others
                log(f"closing {s.name}: {e}")
        if not getattr(args, "keep_workdir", False):
            rm_tree(work)
