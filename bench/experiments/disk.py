"""Experiment 3: disk, the allocated size of the image inventory.

Inventories: each test image alone, and all four together. For each, R fresh
imports per side (the side going first alternates):
- pvisor: `pvisor image import` into a fresh data dir; measured: the image
  store (DATA/images) minus the same dir of an empty store;
- peer: a fresh dockerd (overlay2, no networking) on a fresh data-root,
  `docker load` of the same archives, dockerd stopped; measured: the whole
  data-root minus the data-root of a dockerd started and stopped empty.
Allocated = sum of st_blocks × 512 over every file, directory and symlink,
each inode counted once (hardlinks). Apparent bytes and inode counts are
recorded too. Reported: the median of the R imports.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from lib.common import IMAGE_FILES, IMAGES, free_port, log, rm_tree
from lib.pvisor_side import import_images, snapshot_binaries
from lib.sides import workdir
from lib.stats import median

INVENTORIES = {
    "busybox": ["busybox:latest"],
    "debian-bookworm-slim": ["debian:bookworm-slim"],
    "python-3.11-slim": ["python:3.11-slim"],
    "python-3.11-tools": ["pvisor/python-tools:latest"],
    "all four": list(IMAGE_FILES),
}


def add_args(p) -> None:
    p.add_argument("--disk-repeats", type=int, default=3)


def allocated(root: Path) -> dict:
    seen = set()
    blocks = apparent = inodes = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, None]:
            p = dirpath if name is None else os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if name is not None and os.path.isdir(p) and not os.path.islink(p):
                continue  # directories are counted once, as their own dirpath
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            blocks += st.st_blocks * 512
            apparent += st.st_size
            inodes += 1
    return {"allocated": blocks, "apparent": apparent, "inodes": inodes}


def pvisor_empty(pvisor: Path, d: Path) -> dict:
    port = free_port()
    p = subprocess.Popen([pvisor, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", d],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (d / "images").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    p.terminate()
    p.wait(timeout=30)
    return allocated(d / "images")


def pvisor_import(pvisor: Path, d: Path, images: list[str]) -> dict:
    t = time.perf_counter()
    import_images(pvisor, d, images)
    r = allocated(d / "images")
    r["import_s"] = time.perf_counter() - t
    return r


def docker_run(work: Path, images: list[str]) -> dict:
    from lib.peer import Dockerd
    d = Dockerd(work, network=False)
    t = time.perf_counter()
    d.start()
    try:
        for i in images:
            d.load(IMAGES / IMAGE_FILES[i])
        dt = time.perf_counter() - t
    finally:
        d.stop()
    subprocess.run(["sync"])
    r = allocated(d.data_root)
    r["import_s"] = dt
    return r


def run(args) -> dict:
    work = workdir(args, "disk")
    res = {"experiment": "disk", "seed": args.seed, "repeats": args.disk_repeats, "inventories": {},
           "method": "sum of st_blocks*512 over the tree, each inode once, minus an empty store's allocation"}
    peer = not args.pvisor_only
    try:
        pvisor = snapshot_binaries(work)
        if peer:
            from lib.peer import ensure_peer_tools
            ensure_peer_tools()
        base = {"pvisor": [], "peer": []}
        for r in range(args.disk_repeats):
            d = work / f"empty-pv-{r}"
            base["pvisor"].append(pvisor_empty(pvisor, d))
            rm_tree(d)
            if peer:
                d = work / f"empty-docker-{r}"
                base["peer"].append(docker_run(d, []))
                rm_tree(d)
        res["empty_store"] = base
        empty = {n: median([b["allocated"] for b in v]) for n, v in base.items() if v}
        for inv, images in INVENTORIES.items():
            rows = {"pvisor": [], "peer": []}
            for r in range(args.disk_repeats):
                order = ["pvisor", "peer"] if (r % 2 == 0) else ["peer", "pvisor"]
                for side in order:
                    if side == "peer" and not peer:
                        continue
                    d = work / f"{side}-{r}"
                    m = pvisor_import(pvisor, d, images) if side == "pvisor" else docker_run(d, images)
                    m["net_allocated"] = m["allocated"] - empty[side]
                    rows[side].append(m)
                    rm_tree(d)
            res["inventories"][inv] = {"images": images, "samples": rows,
                                       "median_net_allocated": {s: median([m["net_allocated"] for m in v])
                                                                for s, v in rows.items() if v}}
            log(f"disk {inv}: " + "  ".join(f"{s} {v / 2**20:.1f} MiB"
                                           for s, v in res["inventories"][inv]["median_net_allocated"].items()))
    finally:
        if not args.keep_workdir:
            rm_tree(work)
    res["archive_bytes"] = {i: (IMAGES / f).stat().st_size for i, f in IMAGE_FILES.items()}
    return res


def report(res: dict, out) -> str:
    from lib.svg import dots_boxes
    MiB = 2 ** 20
    sides = [s for s in ("pvisor", "peer") if any(v["samples"][s] for v in res["inventories"].values())]
    lines = [f"### Disk (allocated bytes of the image store, median of {res['repeats']} fresh imports, "
             "minus an empty store)", "",
             "| inventory | " + " | ".join(f"{s} (MiB)" for s in sides)
             + (" | pvisor / peer |" if len(sides) == 2 else " |"),
             "|---|" + "---:|" * len(sides) + ("---:|" if len(sides) == 2 else "")]
    for inv, v in res["inventories"].items():
        med = v["median_net_allocated"]
        cells = [f"{med[s] / MiB:.2f} ({min(m['net_allocated'] for m in v['samples'][s]) / MiB:.2f}–"
                 f"{max(m['net_allocated'] for m in v['samples'][s]) / MiB:.2f})" for s in sides]
        lines.append(f"| {inv} | " + " | ".join(cells) + " |"
                     + (f" {med['pvisor'] / med['peer']:.3f} |" if len(sides) == 2 else ""))
    emp = res["empty_store"]
    lines += ["", "Cells: median (min–max). Empty-store allocation subtracted: "
              + ", ".join(f"{s} {median([b['allocated'] for b in emp[s]]) / 1024:.0f} KiB" for s in sides if emp[s])
              + ". Import wall time (median, s): "
              + "; ".join(f"{inv}: " + ", ".join(f"{s} {median([m['import_s'] for m in v['samples'][s]]):.1f}"
                                                 for s in sides) for inv, v in res["inventories"].items()) + ".", ""]
    panels = [{"label": inv, "paired": False,
               "sides": [(s, [m["net_allocated"] / MiB for m in v["samples"][s]]) for s in sides]}
              for inv, v in res["inventories"].items()]
    dots_boxes(out / "disk.svg", "Image inventory: allocated bytes (net of an empty store)", "MiB", panels,
               note="dots: fresh imports; boxes: quartiles, whiskers: min-max")
    lines += ["![disk](disk.svg)", ""]
    return "\n".join(lines)
