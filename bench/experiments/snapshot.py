"""Experiment: snapshots (pvisor only; the yardstick is pvisor's own create).

- snapshot time: R rounds of: a fresh busybox sandbox writes `--snapshot-mib`
  (100) MiB of random data to /root/big (and a small file to /tmp), then
  the SDK's `create_snapshot` and polling `get_snapshot` every 20 ms until
  Ready; measured: POST to Ready (wall, client side), and the time the
  sandbox was frozen (the broker's `captured ... frozen_ms` log line).
- restore create: N SDK creates alternating a normal create of busybox and a
  restore of the last snapshot (`snapshot_id`), each after one untimed
  create, each sandbox killed after its first command succeeded; reported
  P50 of both and the ratio restore / normal.

Targets (issue 10): snapshot of a sandbox that wrote 100 MiB <= 1 s; restore
create P50 within 1.5x a normal create. Not a gate.
"""
from __future__ import annotations

import re
import time
from datetime import timedelta

from opensandbox import SandboxSync

from lib.common import RESOURCE, log, rm_tree
from lib.pvisor_side import PvisorService, snapshot_binaries
from lib.sides import workdir
from lib.stats import median, quantile

IMAGE = "busybox:latest"


def add_args(p) -> None:
    p.add_argument("--snapshot-rounds", type=int, default=5)
    p.add_argument("--snapshot-mib", type=int, default=100)
    p.add_argument("--snapshot-creates", type=int, default=10)


def create(svc, **kw) -> tuple[SandboxSync, float]:
    t = time.perf_counter()
    sb = SandboxSync.create(kw.pop("image", None), connection_config=svc.connection(),
                            timeout=timedelta(minutes=10), resource=RESOURCE, **kw)
    ms = (time.perf_counter() - t) * 1e3
    ex = sb.commands.run("true")
    if ex.exit_code != 0:
        raise AssertionError(f"first command failed in {sb.id}")
    return sb, ms


def frozen_ms(svc: PvisorService, sid: str) -> float | None:
    text = svc.log.read_text(errors="replace")
    m = None
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        if sid in line and "captured" in line:
            m = re.search(r"frozen_ms=(\d+)", line)
    return float(m.group(1)) if m else None


def snapshot_round(svc: PvisorService, mib: int) -> dict:
    from opensandbox.sync import SandboxManagerSync

    sb, _ = create(svc, image=IMAGE)
    try:
        ex = sb.commands.run(f"head -c {mib * 2**20} /dev/urandom > /root/big && echo t > /tmp/t && sync")
        if ex.exit_code != 0:
            raise AssertionError("writing the data failed")
        with SandboxManagerSync.create(connection_config=svc.connection()) as m:
            t = time.perf_counter()
            info = sb.create_snapshot()
            while True:
                s = m.get_snapshot(info.id)
                if s.status.state == "Ready":
                    break
                if s.status.state == "Failed":
                    raise AssertionError(f"snapshot failed: {s.status.message}")
                time.sleep(0.02)
            wall = (time.perf_counter() - t) * 1e3
    finally:
        sb.kill()
    return {"snapshot_id": info.id, "ready_ms": wall, "frozen_ms": frozen_ms(svc, info.id)}


def run(args) -> dict:
    work = workdir(args, "snapshot")
    res = {"experiment": "snapshot", "seed": args.seed, "resource": RESOURCE, "mib": args.snapshot_mib}
    try:
        pvisor = snapshot_binaries(work)
        # No network (snapshot_binaries does not copy pvisor-netd; a snapshot does not capture it).
        svc = PvisorService(work / "svc", [IMAGE], pvisor=pvisor, serve_args=["--default-egress", "none"])
        svc.start()
        try:
            rounds = []
            for r in range(args.snapshot_rounds):
                row = snapshot_round(svc, args.snapshot_mib)
                log(f"  round {r}: Ready after {row['ready_ms']:.0f} ms, frozen {row['frozen_ms']} ms")
                rounds.append(row)
            res["snapshots"] = rounds
            sid = rounds[-1]["snapshot_id"]
            times = {"normal": [], "restore": []}
            for kind in ("normal", "restore"):  # untimed first create of each
                sb, _ = create(svc, **({"image": IMAGE} if kind == "normal" else {"snapshot_id": sid}))
                sb.kill()
            for i in range(args.snapshot_creates * 2):
                kind = ("normal", "restore")[i % 2]
                sb, ms = create(svc, **({"image": IMAGE} if kind == "normal" else {"snapshot_id": sid}))
                sb.kill()
                times[kind].append(ms)
            res["creates_ms"] = times
            res["normal_p50_ms"] = median(times["normal"])
            res["restore_p50_ms"] = median(times["restore"])
            res["restore_p90_ms"] = quantile(times["restore"], 0.9)
            res["ready_median_ms"] = median([r["ready_ms"] for r in rounds])
            frozen = [r["frozen_ms"] for r in rounds if r["frozen_ms"] is not None]
            res["frozen_median_ms"] = median(frozen) if frozen else None
            log(f"snapshot Ready P50 {res['ready_median_ms']:.0f} ms; create P50 normal "
                f"{res['normal_p50_ms']:.0f} ms, restore {res['restore_p50_ms']:.0f} ms")
        finally:
            svc.close()
    finally:
        if not args.keep_workdir:
            rm_tree(work)
    return res


def targets(res: dict) -> list[str]:
    ready = res["ready_median_ms"]
    ratio = res["restore_p50_ms"] / res["normal_p50_ms"]
    return [
        f"| snapshot of a sandbox that wrote {res['mib']} MiB, POST to Ready (P50) | {ready:.0f} ms | 1000 ms | "
        f"{'met' if ready <= 1000 else 'missed'} |",
        f"| restore create P50 / normal create P50 | {ratio:.2f}x | 1.5x | {'met' if ratio <= 1.5 else 'missed'} |",
    ]


def report(res: dict, out) -> str:
    lines = [f"### Snapshot of a busybox sandbox that wrote {res['mib']} MiB of random data", "",
             "| round | POST to Ready (ms) | frozen (ms) |", "|---:|---:|---:|"]
    for i, r in enumerate(res["snapshots"]):
        lines.append(f"| {i} | {r['ready_ms']:.0f} | {r['frozen_ms'] if r['frozen_ms'] is not None else '-'} |")
    lines += ["", "### SDK create: normal vs restore (alternating, steady)", "",
              "| create | P50 (ms) |", "|---|---:|",
              f"| busybox:latest | {res['normal_p50_ms']:.1f} |",
              f"| restore of the last snapshot | {res['restore_p50_ms']:.1f} |", "",
              "#### Targets", "", "| target | measured | limit | verdict |", "|---|---:|---:|---|",
              *targets(res), ""]
    return "\n".join(lines) + "\n"
