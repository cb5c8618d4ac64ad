"""Experiment 5: the image pool (pvisor only; the yardsticks are the host and
pvisor itself).

- import: each test image into a pool of its own and all four into one pool,
  with `pvisor image import --json`: speed in MB/s of uncompressed layer data,
  and `pvisor image du --json` of each pool (combined pool vs the sum of the
  four single-image pools).
- cold/warm: R rounds of: restart the service (image servers start afresh,
  so the FUSE page cache is empty) and drop the host page cache (pack files
  are read from disk); create a python:3.11-slim sandbox; time, inside it
  with `date +%s%N`, the first `python3 -c pass` (cold), then K more (warm).
  "Shared" rounds repeat this in a fresh sandbox without the restart and the
  cache drop: another sandbox of the image ran before (the usual case).
  The tool workload (`grep -r` over /usr/lib/python3.11, then `python3 -c
  'import json, email, http.client'`) runs the same way in a fresh sandbox,
  cold then warm, and directly on the host in a plain copy of the image's
  tree on the host's disk (`chroot`, no namespaces, no FUSE, no overlay),
  cold (after dropping the page cache) then warm.
- create vs image size: steady SDK creates of busybox (2 MB of files) and
  pvisor/python-tools (113 MB), alternating, after one untimed create each;
  same entrypoint (`sleep infinity`) for both, so only the image differs.
"""
from __future__ import annotations

import json
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from opensandbox import SandboxSync

from lib.common import IMAGE_FILES, IMAGES, RESOURCE, log, rm_tree
from lib.pvisor_side import PvisorService, snapshot_binaries
from lib.sides import workdir
from lib.stats import median

PY = "python:3.11-slim"
TIMED = "s=$(date +%s%N); {cmd} >/dev/null 2>&1; e=$(date +%s%N); echo $(( (e - s) / 1000 ))"
TOOL = "grep -r zzqqxxnotthere /usr/lib/python3.11; python3 -c 'import json, email, http.client'"


def add_args(p) -> None:
    p.add_argument("--imagefs-rounds", type=int, default=5)
    p.add_argument("--imagefs-warm", type=int, default=5)
    p.add_argument("--imagefs-creates", type=int, default=10)


def drop_caches() -> None:
    subprocess.run(["sync"])
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def pool_cmd(pvisor: Path, *args) -> list[dict]:
    out = subprocess.run([str(pvisor), "image", *map(str, args), "--json"], check=True, capture_output=True,
                         text=True).stdout
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def imports(pvisor: Path, work: Path) -> dict:
    res = {}
    for name in [*IMAGE_FILES, "all four"]:
        d = work / f"pool-{name.replace('/', '_').replace(':', '_').replace(' ', '_')}"
        files = [IMAGES / f for f in (IMAGE_FILES.values() if name == "all four" else [IMAGE_FILES[name]])]
        t = time.perf_counter()
        events = pool_cmd(pvisor, "import", *files, "--data-dir", d)
        wall = time.perf_counter() - t
        done = [e for e in events if e.get("event") == "done" and not e.get("reused")]
        layer_bytes = sum(e["stats"]["layer_bytes"] for e in done)
        seconds = sum(e["stats"]["seconds"] for e in done)
        du = pool_cmd(pvisor, "du", "--data-dir", d)[0]
        res[name] = {"wall_s": wall, "layer_bytes": layer_bytes, "index_s": seconds,
                     "mb_per_s": layer_bytes / 1e6 / seconds if seconds else None, "du": du,
                     "images": [{k: e[k] for k in ("id", "names", "stats")} for e in done]}
        log(f"import {name}: {layer_bytes / 1e6:.0f} MB of layers in {seconds:.2f} s; "
            f"pool {du['allocated_bytes'] / 2**20:.1f} MiB")
        rm_tree(d)
    return res


def timed(sb, cmd: str) -> float:
    ex = sb.commands.run(TIMED.format(cmd=cmd))
    text = "".join(m.text for m in ex.logs.stdout).strip()
    if ex.exit_code != 0 or not text.isdigit():
        raise AssertionError(f"timed command failed: exit={ex.exit_code} out={text!r}")
    return int(text) / 1e3


def host_timed(cmd: str) -> float:
    t = time.perf_counter()
    subprocess.run(["sh", "-c", f"{cmd} >/dev/null 2>&1"])
    return (time.perf_counter() - t) * 1e3


def cold_warm(svc: PvisorService, cmd: str, rounds: int, warm: int, fresh: bool = True) -> dict:
    rows = []
    for r in range(rounds):
        if fresh:
            svc.restart()
            drop_caches()
        sb = SandboxSync.create(PY, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                resource=RESOURCE)
        try:
            cold = timed(sb, cmd)
            warms = [timed(sb, cmd) for _ in range(warm)]
        finally:
            sb.kill()
        rows.append({"cold_ms": cold, "warm_ms": warms, "warm_median_ms": median(warms)})
        log(f"  round {r}: cold {cold:.1f} ms, warm {median(warms):.1f} ms")
    return {"rounds": rows, "cold_median_ms": median([x["cold_ms"] for x in rows]),
            "warm_median_ms": median([x["warm_median_ms"] for x in rows])}


def host_copy(svc: PvisorService, dest: Path) -> Path:
    """A plain copy of python:3.11-slim's tree on the host's disk, taken
    through a sandbox's image server mount."""
    sb = SandboxSync.create(PY, connection_config=svc.connection(), timeout=timedelta(minutes=10), resource=RESOURCE)
    try:
        mounts = [l.split()[1] for l in Path("/proc/mounts").read_text().splitlines()
                  if l.split()[2] == "fuse.pvisor" and l.split()[1].startswith(str(svc.data / "mnt"))]
        src = next(m for m in mounts if Path(m, "usr/bin/python3").exists())
        subprocess.run(["cp", "-a", f"{src}/.", str(dest)], check=True)
    finally:
        sb.kill()
    return dest


def host_cold_warm(root: Path, cmd: str, rounds: int, warm: int) -> dict:
    rows = []
    chrooted = f"chroot {root} /bin/sh -c \"{cmd}\""
    for _ in range(rounds):
        drop_caches()
        cold = host_timed(chrooted)
        warms = [host_timed(chrooted) for _ in range(warm)]
        rows.append({"cold_ms": cold, "warm_ms": warms, "warm_median_ms": median(warms)})
    return {"rounds": rows, "cold_median_ms": median([x["cold_ms"] for x in rows]),
            "warm_median_ms": median([x["warm_median_ms"] for x in rows])}


def creates(svc: PvisorService, n: int) -> dict:
    svc.restart()
    out = {"busybox:latest": [], "pvisor/python-tools:latest": [], "first": {}}
    for image in ("busybox:latest", "pvisor/python-tools:latest"):
        t = time.perf_counter()
        sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                resource=RESOURCE, entrypoint=["sleep", "infinity"])
        out["first"][image] = (time.perf_counter() - t) * 1e3
        sb.kill()
    for i in range(n):
        for image in (["busybox:latest", "pvisor/python-tools:latest"][::1 if i % 2 == 0 else -1]):
            t = time.perf_counter()
            sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                    resource=RESOURCE, entrypoint=["sleep", "infinity"])
            out[image].append((time.perf_counter() - t) * 1e3)
            sb.kill()
    out["median_ms"] = {k: median(v) for k, v in out.items() if isinstance(v, list)}
    log(f"creates: {out['median_ms']} (first after restart: {out['first']})")
    return out


def run(args) -> dict:
    work = workdir(args, "imagefs")
    res = {"experiment": "imagefs", "seed": args.seed, "resource": RESOURCE}
    try:
        pvisor = snapshot_binaries(work)
        res["imports"] = imports(pvisor, work)
        svc = PvisorService(work / "svc", [PY, "busybox:latest", "pvisor/python-tools:latest"], pvisor=pvisor)
        try:
            log("python3 -c pass, cold and warm")
            res["python_pass"] = cold_warm(svc, "python3 -c pass", args.imagefs_rounds, args.imagefs_warm)
            log("python3 -c pass in a fresh sandbox of an image already served")
            res["python_pass_shared"] = cold_warm(svc, "python3 -c pass", args.imagefs_rounds, args.imagefs_warm,
                                                  fresh=False)
            log("tool workload in a sandbox")
            res["tool_sandbox"] = cold_warm(svc, TOOL, args.imagefs_rounds, args.imagefs_warm)
            log("tool workload on the host, in a plain copy of the image")
            root = host_copy(svc, work / "host-copy")
            res["tool_host"] = host_cold_warm(root, TOOL, args.imagefs_rounds, args.imagefs_warm)
            log("python3 -c pass on the host, in the plain copy")
            res["python_pass_host"] = host_cold_warm(root, "python3 -c pass", args.imagefs_rounds, args.imagefs_warm)
            rm_tree(root)
            res["creates"] = creates(svc, args.imagefs_creates)
        finally:
            svc.close()
    finally:
        if not args.keep_workdir:
            rm_tree(work)
    return res


def targets(res: dict) -> list[str]:
    MiB = 2 ** 20
    imp = res["imports"]
    singles = sum(imp[n]["du"]["allocated_bytes"] for n in IMAGE_FILES)
    combined = imp["all four"]["du"]["allocated_bytes"]
    # Speed of the whole inventory, and of the slowest image with over 10 MB of
    # layers (busybox's 2 MB are dominated by fixed costs: fsyncs, catalog).
    speed = imp["all four"]["mb_per_s"]
    slowest = min(v["mb_per_s"] for v in imp.values() if v["mb_per_s"] and v["layer_bytes"] > 10e6)
    pp, ts, th = res["python_pass"], res["tool_sandbox"], res["tool_host"]
    ps, ph = res["python_pass_shared"], res["python_pass_host"]
    cr = res["creates"]["median_ms"]
    rows = [
        ("combined pool / four single-image pools", f"{combined / MiB:.1f} / {singles / MiB:.1f} MiB = "
         f"{combined / singles:.2f}", "≤ 0.75", combined / singles <= 0.75),
        ("import speed, all four (slowest image ≥ 10 MB)", f"{speed:.0f} MB/s ({slowest:.0f} MB/s)", "≥ 50 MB/s",
         min(speed, slowest) >= 50),
        ("cold / warm `python3 -c pass`, fresh sandbox", f"{ps['cold_median_ms']:.1f} / {ps['warm_median_ms']:.1f} ms = "
         f"{ps['cold_median_ms'] / ps['warm_median_ms']:.2f}", "≤ 2", ps['cold_median_ms'] <= 2 * ps['warm_median_ms']),
        ("the same, first sandbox after a server start and a host cache drop",
         f"{pp['cold_median_ms']:.1f} / {pp['warm_median_ms']:.1f} ms = {pp['cold_median_ms'] / pp['warm_median_ms']:.2f}"
         f" (host copy, cache dropped: {ph['cold_median_ms'] / ph['warm_median_ms']:.2f})", "≤ 2",
         pp['cold_median_ms'] <= 2 * pp['warm_median_ms']),
        ("cold `python3 -c pass`, sandbox / host copy (both caches dropped)",
         f"{pp['cold_median_ms']:.1f} / {ph['cold_median_ms']:.1f} ms = {pp['cold_median_ms'] / ph['cold_median_ms']:.2f}",
         "≤ 1.5", pp['cold_median_ms'] <= 1.5 * ph['cold_median_ms']),
        ("tool workload sandbox / host, cold", f"{ts['cold_median_ms']:.0f} / {th['cold_median_ms']:.0f} ms = "
         f"{ts['cold_median_ms'] / th['cold_median_ms']:.2f}", "≤ 1.5", ts['cold_median_ms'] <= 1.5 * th['cold_median_ms']),
        ("tool workload sandbox / host, warm", f"{ts['warm_median_ms']:.0f} / {th['warm_median_ms']:.0f} ms = "
         f"{ts['warm_median_ms'] / th['warm_median_ms']:.2f}", "≤ 1.5", ts['warm_median_ms'] <= 1.5 * th['warm_median_ms']),
        ("create python-tools / busybox (steady P50)", f"{cr['pvisor/python-tools:latest']:.1f} / "
         f"{cr['busybox:latest']:.1f} ms", "≈ 1 (no growth with size)",
         cr['pvisor/python-tools:latest'] <= 1.25 * cr['busybox:latest']),
    ]
    return [f"| {a} | {b} | {c} | {'met' if ok else 'NOT met'} |" for a, b, c, ok in rows]


def report(res: dict, out) -> str:
    MiB = 2 ** 20
    lines = ["### Import and pool size (`pvisor image import --json`, `pvisor image du --json`)", "",
             "| pool | layer data (MB) | indexing (s) | MB/s | allocated (MiB) | files (MiB) | deduplicated (MiB) "
             "| compressed (MiB) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, v in res["imports"].items():
        du = v["du"]
        lines.append(f"| {name} | {v['layer_bytes'] / 1e6:.1f} | {v['index_s']:.2f} | {v['mb_per_s'] or 0:.0f} | "
                     f"{du['allocated_bytes'] / MiB:.2f} | {du['logical_bytes'] / MiB:.1f} | "
                     f"{du['deduplicated_bytes'] / MiB:.1f} | {du['compressed_bytes'] / MiB:.1f} |")
    lines += ["", "### In a sandbox (median over rounds; each round a fresh service, host page cache dropped)", "",
              "| workload | cold (ms) | warm (ms) |", "|---|---:|---:|"]
    for key, label in (("python_pass", "`python3 -c pass`, sandbox (fresh server, host cache dropped)"),
                       ("python_pass_shared", "`python3 -c pass`, fresh sandbox of an image in use"),
                       ("python_pass_host", "`python3 -c pass`, host: chroot into a plain copy (host cache dropped)"),
                       ("tool_sandbox", "tool workload, sandbox (fresh server, host cache dropped)"),
                       ("tool_host", "tool workload, host: chroot into a plain copy (host cache dropped)")):
        v = res[key]
        lines.append(f"| {label} | {v['cold_median_ms']:.1f} | {v['warm_median_ms']:.1f} |")
    cr = res["creates"]
    lines += ["", f"Tool workload: `{TOOL}`.", "",
              "### Create latency vs image size (SDK create, steady, P50)", "",
              "| image | first after restart (ms) | steady P50 (ms) |", "|---|---:|---:|"]
    for image in ("busybox:latest", "pvisor/python-tools:latest"):
        lines.append(f"| {image} | {cr['first'].get(image, 0):.1f} | {cr['median_ms'][image]:.1f} |")
    lines += ["", "#### Targets", "", "| target | measured | limit | verdict |", "|---|---:|---:|---|",
              *targets(res), ""]
    return "\n".join(lines) + "\n"
