"""Experiment: the vm backend under the project's own VMM in the KVM test host (issue 20).

Runs inside `scripts/kvm-host.sh` (a QEMU TCG guest with nested SVM: real KVM, so the worker's
own VMM boots the Linux guest), or on any host with hardware virtualization; it refuses to run
elsewhere. Everything in the KVM test host runs under TCG, so only ratios measured side by side
in one run are time figures; memory figures (cgroup charges, RSS, PSS) are real.

- memory: the memory experiment's rounds (bench/experiments/memory.py: empty, 1 idle, 4 idle,
  4 x 64 MiB identical data, the same rewritten unique) for the sides
    ns           pvisor serve --backend ns            (the namespace jail, same run)
    vm           pvisor serve --backend vm            (own VMM, 512 MiB guests)
    vm-template  ... --backend vm --vm-templates      (clones of a booted template, memory file
                                                       mapped copy-on-write)
    vm-merge     ... --backend vm --memory-merge      (guest RAM MADV_MERGEABLE, ksmd on)
- density: `--density` (50) idle sandboxes per side (ns, vm, vm-template), charged memory at
  the end; amortized per sandbox = (N idle − empty) / N.
- vmm_rss: the worker (= the VMM) of one idle vm sandbox: RSS and PSS excluding guest memory.
- time: SDK create (= agent ready) and create → first checked command, P50, for
    own-vmm      the worker's own VMM (cold boot)
    qemu-kvm     QEMU `-M microvm` under KVM with the same kernel, initramfs and disks
                 (`PVISOR_VM_ENGINE=qemu-kvm`, the devices served by the worker over vhost-user)
    template     creates restored from a --vm-templates template (after its capture)
    restore      creates restored from a snapshot of a running sandbox (`snapshotId`)
    ns           the namespace jail
  in rotating order, `--time-rounds` rounds after one warm-up sample per arm.

Targets (issue 20): service + 1 idle vm sandbox ≤ 60 MiB; ≤ 30 MiB per idle vm sandbox at 4 and
≤ 15 MiB from a template; 4 × 64 MiB identical ≤ 150 MiB (templates or merging); VMM ≤ 5 MiB RSS
excluding guest memory; own VMM ≤ 0.5× QEMU microvm cold; template restore ≤ 0.2× cold boot.
The seed's microVM daemon's published figures stand beside them (anchors.md).
"""
from __future__ import annotations

import json
import random
import shutil
import time
import traceback
from datetime import timedelta
from pathlib import Path

import httpx
from opensandbox import SandboxSync

from experiments import memory
from experiments.startup import one_sample
from experiments.vm import hardware_virt, worker_memory
from lib.cgroups import ProductCgroup
from lib.common import RESOURCE, checked_first_command, log, sha256_file, verify_deleted
from lib.pvisor_side import PvisorService, snapshot_binaries
from lib.sides import workdir
from lib.stats import median, quantile

MiB = 2 ** 20
BACKEND_KEY = "pvisor.io/backend"
# Creates under TCG take seconds: the SDK's own 30 s request timeout is too short for some.
REQUEST_TIMEOUT_S = 180
READY_TIMEOUT_S = "120"
MEMORY_SIDES = {
    "ns": ["--backend", "ns"],
    "vm": ["--backend", "vm"],
    "vm-template": ["--backend", "vm", "--vm-templates"],
    "vm-merge": ["--backend", "vm", "--memory-merge"],
}
DENSITY_SIDES = ("ns", "vm", "vm-template")
TIME_ARMS = ("own-vmm", "qemu-kvm", "template", "restore", "ns")
# The seed's microVM daemon, published (shared/docs/anchors.md): per idle VM at 4 with its
# page pool 68.41 MiB.
SEED = {"idle1": 92.83, "per_idle4": 88.46, "hold_same": 422.93}
TARGETS = {"idle1": 60.0, "per_idle4": 30.0, "per_idle4_template": 15.0, "hold_same": 150.0, "vmm_rss": 5.0,
           "own_over_qemu": 0.5, "template_over_cold": 0.2}


def add_args(p) -> None:
    # The memory experiment's phase knobs and the vm experiment's RSS rounds and guest kernel.
    memory.add_args(p)
    import experiments.vm
    experiments.vm.add_args(p)
    p.add_argument("--vmhost-rounds", type=int, default=1, help="vmhost: memory rounds per side")
    p.add_argument("--density", type=int, default=50, help="vmhost: idle sandboxes of the density part")
    p.add_argument("--time-rounds", type=int, default=10, help="vmhost: rounds of the time part")
    p.add_argument("--vmhost-parts", default="time,vmm_rss,memory,density",
                   help="vmhost: which parts to run, comma-separated")
    p.add_argument("--vmhost-arms", default=",".join(TIME_ARMS),
                   help="vmhost: the arms of the time part, comma-separated (e.g. without qemu-kvm)")
    p.add_argument("--qemu", default=shutil.which("qemu-system-x86_64") or "",
                   help="vmhost: the QEMU of the qemu-kvm arm (needs KVM support)")


def service(work: Path, name: str, image: str, pvisor: Path, serve_args: list[str], env: dict | None = None):
    svc = PvisorService(work / name, [image], pvisor=pvisor, serve_args=serve_args,
                        env={"PVISOR_READY_TIMEOUT_SECS": READY_TIMEOUT_S, **(env or {})},
                        request_timeout_s=REQUEST_TIMEOUT_S)
    svc.name = name
    return svc


# ---------------------------------------------------------------- memory and density

def memory_part(args, work: Path, pvisor: Path) -> dict:
    from lib.peer import build_hold
    hold = build_hold().read_bytes()
    rng = random.Random(args.seed)
    res = {"rounds": args.vmhost_rounds, "results": {n: [] for n in MEMORY_SIDES}}
    sides = {n: service(work, n, args.image, pvisor, a) for n, a in MEMORY_SIDES.items()}
    for n, s in sides.items():
        s.merging = "--memory-merge" in MEMORY_SIDES[n]
    mem_args = _memory_args(args)
    names = list(sides)
    for r in range(args.vmhost_rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            cg = ProductCgroup(f"pvbench-{n}", args.mem_limit_mib * MiB, args.cpus)
            log(f"vmhost/memory: round {r} side {n}")
            rec = memory.one_round(sides[n], cg, mem_args, hold, rng)
            rec["round"] = r
            res["results"][n].append(rec)
            log(f"  {n}: " + "  ".join(f"{p} {rec['phases'][p] / MiB:.1f}" if rec["phases"].get(p) else f"{p} –"
                                       for p in memory.PHASES) + " MiB" + ("" if rec["ok"] else f" FAILED {rec['error']}"))
    res["summary"] = memory.summarize(res["results"])
    return res


def _memory_args(args):
    import argparse
    return argparse.Namespace(image=args.image, phase_seconds=args.phase_seconds, hold_mib=args.hold_mib,
                              no_drop_caches=args.no_drop_caches, merge_wait=args.merge_wait)


def density_part(args, work: Path, pvisor: Path) -> dict:
    res = {"n": args.density, "sides": {}}
    for n in DENSITY_SIDES:
        svc = service(work, f"density-{n}", args.image, pvisor, MEMORY_SIDES[n])
        cg = ProductCgroup(f"pvbench-density-{n}", args.mem_limit_mib * MiB, args.cpus)
        svc.cgroup = cg
        rec = {"ok": False, "created": 0}
        boxes = []
        try:
            svc.start()
            time.sleep(args.phase_seconds)
            rec["empty"] = _settled_usage(cg)
            t0 = time.monotonic()
            for i in range(args.density):
                sb = SandboxSync.create(args.image, connection_config=svc.connection(), timeout=timedelta(hours=2),
                                        resource=RESOURCE)
                boxes.append(sb)
                checked_first_command(sb)
                rec["created"] = i + 1
                if i + 1 in (4, 10, 25):
                    time.sleep(args.phase_seconds)
                    rec[f"idle{i + 1}"] = _settled_usage(cg)
            rec["create_s"] = round(time.monotonic() - t0, 1)
            time.sleep(args.phase_seconds)
            rec["idleN"] = _settled_usage(cg)
            rec["per_sandbox"] = (rec["idleN"] - rec["empty"]) / args.density
            rec["ok"] = True
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=4)
            log(f"vmhost/density {n}: FAILED after {rec['created']}: {rec['error']}")
        finally:
            for sb in boxes:
                try:
                    sb.kill()
                except Exception:
                    pass
            svc.stop()
            rec["pids_left"] = len(cg.pids())
            cg.destroy()
        log(f"vmhost/density {n}: " + (f"{rec['per_sandbox'] / MiB:.2f} MiB per idle sandbox at {args.density}"
                                       if rec["ok"] else "failed"))
        res["sides"][n] = rec
    return res


def _settled_usage(cg: ProductCgroup) -> int:
    """The median of 5 samples 0.4 s apart."""
    xs = []
    for _ in range(5):
        xs.append(cg.usage())
        time.sleep(0.4)
    return int(median(xs))


# ---------------------------------------------------------------- VMM RSS

def vmm_rss_part(args, work: Path, pvisor: Path) -> dict:
    svc = service(work, "rss", args.image, pvisor, ["--backend", "vm"])
    try:
        svc.start()
        return {"vm": [worker_memory(svc, args.image, {BACKEND_KEY: "vm"}) for _ in range(args.rss_rounds)],
                "ns": [worker_memory(svc, args.image, {BACKEND_KEY: "ns"}) for _ in range(args.rss_rounds)]}
    finally:
        svc.stop()


# ---------------------------------------------------------------- time

def time_part(args, work: Path, pvisor: Path) -> dict:
    rng = random.Random(args.seed)
    own = service(work, "own-vmm", args.image, pvisor, ["--backend", "vm", "--warm-workers", "2"])
    qemu = service(work, "qemu-kvm", args.image, pvisor, ["--backend", "vm", "--warm-workers", "2"],
                   env={"PVISOR_VM_ENGINE": "qemu-kvm", "PVISOR_QEMU": args.qemu})
    tpl = service(work, "template", args.image, pvisor, ["--backend", "vm", "--vm-templates", "--warm-workers", "2"])
    chosen = tuple(a for a in TIME_ARMS if a in args.vmhost_arms.split(","))
    # Not started unless its arm runs: its warm workers are QEMUs.
    services = [own, tpl] + ([qemu] if "qemu-kvm" in chosen else [])
    res = {"rounds": args.time_rounds, "qemu": args.qemu, "samples": {a: [] for a in TIME_ARMS}}
    try:
        for s in services:
            s.start()
        # The template's capture happens at its first create (reported apart), the snapshot once.
        res["template_capture"] = one_sample(tpl, args.image)
        snap = take_snapshot(own, args.image)
        res["snapshot"] = {k: v for k, v in snap.items() if k != "sandbox"}
        arms = {
            "own-vmm": lambda: one_sample(own, args.image),
            "qemu-kvm": lambda: one_sample(qemu, args.image),
            "template": lambda: one_sample(tpl, args.image),
            "restore": lambda: restore_sample(own, snap["snapshot_id"]),
            "ns": lambda: one_sample(own, args.image, extensions={BACKEND_KEY: "ns"}),
        }
        res["arms"] = list(chosen)
        res["warmup"] = {a: arms[a]() for a in chosen}
        first = rng.randrange(len(chosen))
        for i in range(args.time_rounds):
            order = chosen[(first + i) % len(chosen):] + chosen[:(first + i) % len(chosen)]
            for a in order:
                rec = arms[a]()
                rec.update(index=i, position=order.index(a))
                res["samples"][a].append(rec)
            log(f"vmhost/time round {i}: " + "  ".join(
                f"{a} {res['samples'][a][-1].get('create_ms', float('nan')):.0f}/"
                f"{res['samples'][a][-1].get('first_command_ms', float('nan')):.0f}" for a in chosen) + " ms")
        if snap.get("sandbox") is not None:
            snap["sandbox"].kill()
    finally:
        for s in services:
            s.stop()
    res["summary"] = time_summary(res["samples"])
    return res


def take_snapshot(svc, image: str) -> dict:
    """A running sandbox that wrote a marker, and a snapshot of it (ready)."""
    sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(hours=1), resource=RESOURCE)
    checked_first_command(sb)
    sb.commands.run("echo snapshotted > /root/marker")
    t0 = time.perf_counter()
    r = httpx.post(f"{svc.base_url}/v1/sandboxes/{sb.id}/snapshots", json={"name": "bench"}, timeout=600)
    r.raise_for_status()
    sid = r.json()["id"]
    deadline = time.monotonic() + 600
    while True:
        state = httpx.get(f"{svc.base_url}/v1/snapshots/{sid}", timeout=60).json()["status"]["state"]
        if state.lower() == "ready":
            break
        if state.lower() == "failed" or time.monotonic() > deadline:
            raise RuntimeError(f"snapshot {sid}: {state}")
        time.sleep(0.2)
    return {"sandbox": sb, "snapshot_id": sid, "snapshot_ms": (time.perf_counter() - t0) * 1e3}


def restore_sample(svc, snapshot_id: str) -> dict:
    """A create from the snapshot: timed to the SDK's return and to the first checked command,
    which also finds the source's marker."""
    rec = {"side": "restore", "ok": False}
    sb = None
    try:
        t0 = time.perf_counter()
        sb = SandboxSync.create(None, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                resource=RESOURCE, snapshot_id=snapshot_id)
        t1 = time.perf_counter()
        checked_first_command(sb)
        t2 = time.perf_counter()
        marker = "".join(m.text for m in sb.commands.run("cat /root/marker").logs.stdout)
        if marker != "snapshotted":
            raise AssertionError(f"restored sandbox lacks the source's marker: {marker!r}")
        rec.update(create_ms=(t1 - t0) * 1e3, first_command_ms=(t2 - t0) * 1e3)
        sb.kill()
        verify_deleted(svc.base_url, sb.id)
        rec["ok"] = True
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"restore: sample FAILED: {rec['error']}")
        if sb is not None:
            try:
                sb.kill()
            except Exception:
                pass
    return rec


def time_summary(samples: dict) -> dict:
    out = {}
    metrics = ("create_ms", "first_command_ms")
    for a, recs in samples.items():
        ok = [r for r in recs if r["ok"]]
        out[a] = {"n": len(recs), "failed": len(recs) - len(ok),
                  **{m: {"p50": median([r[m] for r in ok]), "p90": quantile([r[m] for r in ok], 0.9)} if ok else None
                     for m in metrics}}

    def ratio(a: str, b: str) -> dict:
        """P50 of arm a over arm b per figure; None where either has no successful sample."""
        return {m: out[a][m]["p50"] / out[b][m]["p50"] if out[a][m] and out[b][m] else None for m in metrics}

    out["own_over_qemu"] = ratio("own-vmm", "qemu-kvm")
    out["template_over_cold"] = ratio("template", "own-vmm")
    out["restore_over_cold"] = ratio("restore", "own-vmm")
    return out


# ---------------------------------------------------------------- experiment interface

def run(args) -> dict:
    present, why = hardware_virt()
    if not present:
        raise RuntimeError(f"vmhost runs where hardware virtualization exists (the KVM test host: "
                           f"scripts/kvm-host.sh bench/run vmhost ...): {why}")
    parts = [p.strip() for p in args.vmhost_parts.split(",") if p.strip()]
    work = workdir(args, "vmhost")
    pvisor = snapshot_binaries(work)
    res = {"experiment": "vmhost", "seed": args.seed, "image": args.image, "resource": RESOURCE,
           "hardware_virt": why, "parts": parts, "guest_kernel": args.guest_kernel,
           "guest_kernel_sha256": sha256_file(Path(args.guest_kernel)) if args.guest_kernel else None,
           "used_peer": False}
    # Each part's result is kept as it ends: an emulated host that dies in a later part (its
    # kernel has, under TCG) loses only that part.
    partial = Path(args.out) / "vmhost.partial.json"
    partial.parent.mkdir(parents=True, exist_ok=True)
    for part, fn in (("time", time_part), ("vmm_rss", vmm_rss_part), ("memory", memory_part),
                     ("density", density_part)):
        if part in parts:
            log(f"vmhost: {part}")
            res[part] = fn(args, work, pvisor)
            partial.write_text(json.dumps(res, indent=1, default=str) + "\n")
    partial.unlink(missing_ok=True)
    res["pvisor_failures"] = failures(res)
    if not args.keep_workdir:
        shutil.rmtree(work, ignore_errors=True)
    return res


def failures(res: dict) -> int:
    n = sum(not r["ok"] for recs in res.get("time", {}).get("samples", {}).values() for r in recs)
    n += sum(not r["ok"] for recs in res.get("vmm_rss", {}).values() for r in recs)
    n += sum(not r["ok"] for recs in res.get("memory", {}).get("results", {}).values() for r in recs)
    n += sum(not r["ok"] for r in res.get("density", {}).get("sides", {}).values())
    return n


def _mib(v) -> str:
    return "–" if v is None else f"{v / MiB:.1f}"


def report(res: dict, out) -> str:
    from lib.report import fmt
    lines = [f"Hardware virtualization: {res['hardware_virt']}. Everything here runs in the KVM test host "
             "(scripts/kvm-host.sh: QEMU TCG with nested SVM), so times are emulated: only ratios of arms measured "
             "side by side count; memory figures are real. Image "
             f"`{res['image']}`, {RESOURCE['cpu']} vCPU / {RESOURCE['memory']} per sandbox.", ""]
    t = res.get("time")
    if t:
        s = t["summary"]
        lines += [f"### Time: create (= agent ready) and create → first checked command ({t['rounds']} rounds, "
                  "rotating order, one warm-up each)", "",
                  "| arm | create P50 / P90 (ms) | first command P50 / P90 (ms) | failed |", "|---|---:|---:|---:|"]
        def p(x, m):
            return f"{fmt(x[m]['p50'])} / {fmt(x[m]['p90'])}" if x[m] else "–"

        def r3(v):
            return "–" if v is None else f"{v:.3f}"

        for a in TIME_ARMS:
            x = s[a]
            if x["n"] == 0:
                lines.append(f"| {a} | not run | not run | – |")
                continue
            lines.append(f"| {a} | {p(x, 'create_ms')} | {p(x, 'first_command_ms')} | {x['failed']} of {x['n']} |")
        lines += ["", f"Ratios of P50s: own VMM / QEMU microvm (KVM) create {r3(s['own_over_qemu']['create_ms'])}, "
                  f"first command {r3(s['own_over_qemu']['first_command_ms'])}; template restore / cold boot "
                  f"{r3(s['template_over_cold']['create_ms'])} / {r3(s['template_over_cold']['first_command_ms'])}; "
                  f"snapshot restore / cold boot {r3(s['restore_over_cold']['create_ms'])} / "
                  f"{r3(s['restore_over_cold']['first_command_ms'])}. Template capture (first create of the "
                  f"template server): {fmt(t['template_capture'].get('create_ms'))} ms; snapshot taken in "
                  f"{fmt(t['snapshot'].get('snapshot_ms'))} ms. QEMU: `{t['qemu']}`.", ""]
    rss = res.get("vmm_rss")
    if rss:
        lines += ["### The worker of one idle sandbox (the VMM, for vm), excluding guest memory", "",
                  "| backend | Rss total (MiB) | Rss excl. guest (MiB) | Pss excl. guest (MiB) | threads |",
                  "|---|---:|---:|---:|---:|"]
        for b, recs in rss.items():
            ok = [r for r in recs if r["ok"]]
            if not ok:
                lines.append(f"| {b} | – | – | – | – |")
                continue
            lines.append(f"| {b} | {median([r['total_rss_kib'] / 1024 for r in ok]):.2f} | "
                         f"{median([r['excl_guest_kib'] / 1024 for r in ok]):.2f} | "
                         f"{median([r['excl_guest_pss_kib'] / 1024 for r in ok]):.2f} | {ok[0]['threads']} |")
        lines.append("")
    m = res.get("memory")
    if m:
        s = m["summary"]
        lines += [f"### Memory charged to each side's cgroup (MiB; median of {m['rounds']} round(s))", ""]
        if m.get("windows"):
            lines += [f"Phase windows {m['windows']}.", ""]
        lines += ["| phase | " + " | ".join(MEMORY_SIDES) + " | seed microVM daemon |",
                  "|---|" + "---:|" * (len(MEMORY_SIDES) + 1)]
        seed_col = {"idle1": SEED["idle1"], "hold_same": SEED["hold_same"]}
        for p in memory.PHASES:
            lines.append(f"| {memory.LABELS[p]} | " + " | ".join(_mib(s[n]["phases"][p]["median"]) for n in MEMORY_SIDES)
                         + f" | {seed_col.get(p, '–')} |")
        lines.append("| amortized per idle sandbox at 4 | " + " | ".join(
            _mib(s[n]["per_sandbox_idle4"]["median"]) for n in MEMORY_SIDES) + f" | {SEED['per_idle4']} |")
        for n in MEMORY_SIDES:
            for r in m["results"][n]:
                if not r["ok"]:
                    lines.append(f"- {n} round {r['round']} failed: {r.get('error')}")
        lines.append("")
    d = res.get("density")
    if d:
        lines += [f"### Density: {d['n']} idle sandboxes", "",
                  "| side | empty (MiB) | 4 / 10 / 25 idle (MiB) | all idle (MiB) | per idle sandbox (MiB) | create time (s) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for n, r in d["sides"].items():
            lines.append(f"| {n} | {_mib(r.get('empty'))} | {_mib(r.get('idle4'))} / {_mib(r.get('idle10'))} / "
                         f"{_mib(r.get('idle25'))} | {_mib(r.get('idleN'))} | {_mib(r.get('per_sandbox'))} | "
                         f"{r.get('create_s', '–')} |" + ("" if r["ok"] else f" failed after {r['created']}: {r['error']}"))
        lines.append("")
    return "\n".join(lines)


def targets(res: dict) -> list[str]:
    rows = []

    def row(name, value, limit, unit=""):
        if value is None:
            rows.append(f"| {name} | – | ≤ {limit:g}{unit} | no figure |")
        else:
            rows.append(f"| {name} | {value:.3f}{unit} | ≤ {limit:g}{unit} | {'met' if value <= limit else 'NOT met'} |")

    m = res.get("memory", {}).get("summary")
    if m:
        v = m["vm"]["phases"]["idle1"]["median"]
        row("vm: service + 1 idle vm sandbox (MiB)", v / MiB if v else None, TARGETS["idle1"])
        v = m["vm"]["per_sandbox_idle4"]["median"]
        row("vm: per idle vm sandbox at 4 (MiB)", v / MiB if v else None, TARGETS["per_idle4"])
        v = m["vm-template"]["per_sandbox_idle4"]["median"]
        row("vm: per idle vm sandbox at 4, from a template (MiB)", v / MiB if v else None, TARGETS["per_idle4_template"])
        best = [m[n]["phases"]["hold_same"]["median"] for n in ("vm-template", "vm-merge")
                if m[n]["phases"]["hold_same"]["median"]]
        row("vm: 4 × 64 MiB identical, templates or merging, best (MiB)", min(best) / MiB if best else None,
            TARGETS["hold_same"])
    rss = res.get("vmm_rss", {}).get("vm")
    if rss:
        ok = [r["excl_guest_kib"] / 1024 for r in rss if r["ok"]]
        row("vm: VMM RSS excluding guest memory, Linux guest, worst (MiB)", max(ok) if ok else None, TARGETS["vmm_rss"])
    t = res.get("time", {}).get("summary")
    if t:
        row("vm: own VMM / QEMU microvm (KVM), create P50", t["own_over_qemu"]["create_ms"], TARGETS["own_over_qemu"])
        row("vm: template restore / cold boot, create P50", t["template_over_cold"]["create_ms"],
            TARGETS["template_over_cold"])
    return rows
