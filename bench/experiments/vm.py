"""Experiment 6: the vm backend (issue 8, "Numbers").

- first_exit: test-guest create to first exit, `--runs` (100) samples from
  `vmm/examples/vm_bench.rs first-exit`: open /dev/kvm, VM, memfd RAM
  (`--vm-memory-mib`, 32), irqchip, PIT, devices, vCPU set-up, the vCPU
  thread and its seccomp filter, first KVM_RUN up to the exit's dispatch
  (pvisor_vmm::bench::time_to_first_exit). P50, P90, min, max.
- rss: the VMM process's resident memory while a guest runs, total and
  excluding guest memory. `vm_bench hold` builds a VM whose guest writes into
  every page of `--rss-touch-mib` of its RAM and halts; while it is halted the
  harness reads /proc/PID/smaps_rollup (total Rss) and /proc/PID/smaps and
  subtracts the Rss of the guest-RAM memfd mapping (`memfd:pvisor-guest-ram`).
  Two guest sizes (128 MiB with 64 touched, 512 MiB with 256 touched), so a
  VMM cost that grows with guest size would show. `--rss-rounds` (5) fresh
  processes each. Target: excluding guest memory <= 10 MiB.
- sdk: where hardware virtualization exists (a vmx or svm CPU flag and no
  kvm_pvm module), SDK create (returns once the agent answered) and create ->
  first checked command of the vm backend side by side with the ns backend on
  the same `pvisor serve` (per create, extensions {"pvisor.io/backend": ...})
  and, unless --pvisor-only, OpenSandbox on Docker; `--vm-pairs` (20) rounds
  in rotating order after `--vm-warmup` samples per arm; then the resident memory
  of the worker of one live sandbox per backend, excluding guest memory
  (`--rss-rounds` times; target <= 10 MiB for vm). Elsewhere (PVM here: no
  stock Linux guest boots) it is skipped, and the report and log say so.

The QEMU TCG test engine is never used: its timings are not performance figures.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from opensandbox import SandboxSync

from lib.common import REPO, RESOURCE, checked_first_command, log, sha256_file, verify_deleted
from lib.sides import opened_sides, workdir
from lib.stats import five, median, paired_bootstrap, quantile

# (guest RAM MiB, MiB the guest touches) per RSS configuration.
RSS_CONFIGS = ((128, 64), (512, 256))
GUEST_RAM_MAPPING = "memfd:pvisor-guest-ram"
RSS_TARGET_MIB = 10.0
AGENT_READY_TARGET_MS = 50.0
BACKEND_KEY = "pvisor.io/backend"
SDK_METRICS = ("create_ms", "first_command_ms")


def add_args(p) -> None:
    p.add_argument("--runs", type=int, default=100, help="vm: first-exit samples")
    p.add_argument("--vm-memory-mib", type=int, default=32, help="vm: guest RAM of the first-exit guest")
    p.add_argument("--rss-rounds", type=int, default=5, help="vm: fresh VMM processes per RSS configuration")
    p.add_argument("--vm-pairs", type=int, default=20, help="vm: SDK rounds (hardware virtualization only)")
    p.add_argument("--vm-warmup", type=int, default=3, help="vm: SDK warm-up samples per arm")
    p.add_argument("--guest-kernel", default=os.environ.get("PVISOR_GUEST_KERNEL"),
                   help="vm: guest vmlinux for the SDK part (default $PVISOR_GUEST_KERNEL)")
    p.add_argument("--vm-sdk-anyway", action="store_true",
                   help="vm: run the SDK part even without hardware virtualization (a harness check, "
                        "not figures; vm creates are expected to fail)")


# ---------------------------------------------------------------- host checks

def hardware_virt() -> tuple[bool, str]:
    """(present, why): hardware virtualization as issue 8 and host-facts.md define it."""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    has_flag = bool(flags & {"vmx", "svm"})
    pvm = Path("/sys/module/kvm_pvm").is_dir()
    if pvm:
        return False, ("/dev/kvm is PVM (kvm_pvm loaded: software virtualization with shadow paging)"
                       + ("" if has_flag else ", no vmx/svm CPU flag")
                       + "; no stock Linux guest boots under it (docs/host-facts.md)")
    if not has_flag:
        return False, "no vmx/svm CPU flag: no hardware virtualization"
    if not Path("/dev/kvm").exists():
        return False, "vmx/svm present but no /dev/kvm"
    return True, f"{'vmx' if 'vmx' in flags else 'svm'} CPU flag, /dev/kvm, no kvm_pvm"


# ---------------------------------------------------------------- the VMM binary

def build_vm_bench() -> Path:
    """`cargo build --release -p pvisor-vmm --example vm_bench`; the binary's path from cargo's
    own artifact messages (so CARGO_TARGET_DIR is honoured). PVISOR_VM_BENCH_BIN skips the build."""
    if os.environ.get("PVISOR_VM_BENCH_BIN"):
        return Path(os.environ["PVISOR_VM_BENCH_BIN"])
    log("vm: cargo build --release -p pvisor-vmm --example vm_bench")
    out = subprocess.run(["cargo", "build", "--release", "-p", "pvisor-vmm", "--example", "vm_bench",
                          "--message-format=json-render-diagnostics"], cwd=REPO, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "vm_bench" \
                and msg.get("executable"):
            return Path(msg["executable"])
    raise RuntimeError("cargo built no vm_bench executable")


def first_exit(binary: Path, runs: int, memory_mib: int) -> dict:
    log(f"vm/first_exit: {runs} runs, {memory_mib} MiB guest RAM")
    out = subprocess.run([str(binary), "first-exit", "--runs", str(runs), "--memory-mib", str(memory_mib)],
                         check=True, capture_output=True, text=True).stdout
    samples = [us / 1e3 for us in json.loads(out.strip().splitlines()[-1])["samples_us"]]
    return {"runs": runs, "memory_mib": memory_mib, "samples_ms": samples, "summary": summary_ms(samples)}


def summary_ms(xs: list[float]) -> dict:
    return {"n": len(xs), "p50": quantile(xs, 0.5), "p90": quantile(xs, 0.9), "min": min(xs), "max": max(xs)}


# ---------------------------------------------------------------- RSS

def parse_smaps(text: str) -> list[dict]:
    """Mappings of /proc/PID/smaps: {"range", "perms", "path", "rss_kib", "pss_kib", ...}."""
    maps = []
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and not head[0].endswith(":"):
            maps.append({"range": head[0], "perms": head[1] if len(head) > 1 else "",
                         "path": head[5].strip() if len(head) > 5 else "", "rss_kib": 0, "pss_kib": 0,
                         "shmem_kib": 0, "anon_kib": 0})
        elif maps and line.startswith(("Rss:", "Pss:", "Anonymous:", "Shared_Dirty:", "Shared_Clean:")):
            key, value = line.split(":", 1)
            kib = int(value.split()[0])
            if key == "Rss":
                maps[-1]["rss_kib"] = kib
            elif key == "Pss":
                maps[-1]["pss_kib"] = kib
            elif key == "Anonymous":
                maps[-1]["anon_kib"] = kib
    return maps


def category(m: dict, binary: Path) -> str:
    path = m["path"]
    if GUEST_RAM_MAPPING in path:
        return "guest RAM (memfd)"
    if path == "[heap]":
        return "heap"
    if path.startswith("[stack"):
        return "main stack"
    if path in ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]"):
        return "vdso/vvar"
    if path == str(binary) or path.endswith("/" + binary.name):
        return "VMM binary"
    if path.startswith("/"):
        return "shared libraries and other files"
    if path.startswith("anon_inode:"):
        return "KVM and other anon inodes (vCPU run pages)"
    return "anonymous (thread stacks, allocator arenas)"


def measure_pid(pid: int, binary: Path, need_guest: bool) -> dict:
    """Resident memory of one process: total Rss and Pss (smaps_rollup), the guest-RAM memfd
    mapping's share (smaps), the rest by kind of mapping, its thread count."""
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    maps = parse_smaps(Path(f"/proc/{pid}/smaps").read_text())
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Threads:")))
    total_kib = int(next(ln.split()[1] for ln in rollup.splitlines() if ln.startswith("Rss:")))
    total_pss_kib = int(next(ln.split()[1] for ln in rollup.splitlines() if ln.startswith("Pss:")))
    guest = [m for m in maps if GUEST_RAM_MAPPING in m["path"]]
    if need_guest and not guest:
        raise RuntimeError(f"no {GUEST_RAM_MAPPING} mapping in /proc/{pid}/smaps")
    by_cat: dict[str, int] = {}
    for m in maps:
        c = category(m, binary)
        by_cat[c] = by_cat.get(c, 0) + m["rss_kib"]
    guest_kib = sum(m["rss_kib"] for m in guest)
    return {"pid": pid, "total_rss_kib": total_kib, "guest_rss_kib": guest_kib,
            "smaps_sum_kib": sum(m["rss_kib"] for m in maps), "excl_guest_kib": total_kib - guest_kib,
            "total_pss_kib": total_pss_kib, "excl_guest_pss_kib": total_pss_kib - sum(m["pss_kib"] for m in guest),
            "threads": threads, "guest_mappings": len(guest), "by_category_kib": by_cat}


def rss_sample(binary: Path, memory_mib: int, touch_mib: int) -> dict:
    """One fresh VMM process holding a guest halted after touching `touch_mib`."""
    proc = subprocess.Popen([str(binary), "hold", "--memory-mib", str(memory_mib), "--touch-mib", str(touch_mib)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rec = {"memory_mib": memory_mib, "touch_mib": touch_mib, "ok": False}
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vm_bench hold ended early: {proc.stderr.read()[-2000:]}")
        ready = json.loads(line)
        pid = ready["pid"]
        rec["ready_ms"] = ready["ready_ms"]
        rec.update(measure_pid(pid, binary, need_guest=True), ok=True)
        proc.stdin.close()
        tail = proc.stdout.read()
        proc.wait(timeout=30)
        rec["end"] = tail.strip()
        if proc.returncode != 0:
            rec.update(ok=False, error=f"vm_bench hold exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"vm/rss: sample FAILED: {rec['error']}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rec


def rss(binary: Path, rounds: int) -> dict:
    res = {}
    for memory_mib, touch_mib in RSS_CONFIGS:
        log(f"vm/rss: {rounds} rounds, {memory_mib} MiB guest RAM, {touch_mib} MiB touched")
        samples = [rss_sample(binary, memory_mib, touch_mib) for _ in range(rounds)]
        ok = [s for s in samples if s["ok"]]
        res[f"{memory_mib}"] = {
            "memory_mib": memory_mib, "touch_mib": touch_mib, "samples": samples, "failed": len(samples) - len(ok),
            "total_mib": five([s["total_rss_kib"] / 1024 for s in ok]),
            "guest_mib": five([s["guest_rss_kib"] / 1024 for s in ok]),
            "excl_guest_mib": five([s["excl_guest_kib"] / 1024 for s in ok]),
            "excl_guest_pss_mib": five([s["excl_guest_pss_kib"] / 1024 for s in ok]),
        }
    return res


# ---------------------------------------------------------------- SDK, hardware virtualization only

def sdk(args) -> dict:
    present, why = hardware_virt()
    if not present and not args.vm_sdk_anyway:
        msg = f"SKIP vm/sdk: SDK create -> agent ready and create -> first command on the vm backend: {why}"
        log(msg)
        return {"skipped": why}
    if os.environ.get("PVISOR_VM_ENGINE"):
        # The QEMU TCG test engine: its timings are not performance figures.
        raise RuntimeError(f"vm/sdk: PVISOR_VM_ENGINE={os.environ['PVISOR_VM_ENGINE']} selects a test engine whose "
                           "timings are not performance figures; unset it to benchmark the vm backend")
    if not args.guest_kernel or not Path(args.guest_kernel).is_file():
        # Expected to be there wherever this part runs: a failure, not a skip.
        raise RuntimeError(f"vm/sdk: hardware virtualization is present ({why}) but no guest kernel: "
                           f"--guest-kernel / PVISOR_GUEST_KERNEL = {args.guest_kernel!r}")
    return sdk_rounds(args, hardware=why if present else None)


def sdk_rounds(args, hardware) -> dict:
    from experiments.startup import one_sample
    rng = random.Random(args.seed)
    work = workdir(args, "vm")
    res = {"hardware_virt": hardware, "harness_check_only": hardware is None, "image": args.image,
           "pairs": args.vm_pairs, "warmup": args.vm_warmup, "guest_kernel": args.guest_kernel,
           "guest_kernel_sha256": sha256_file(Path(args.guest_kernel))}
    with opened_sides(args, work, [args.image], pvisor_args=["--guest-kernel", args.guest_kernel]) as sides:
        arms = {"pvisor-vm": (sides["pvisor"], {BACKEND_KEY: "vm"}), "pvisor-ns": (sides["pvisor"], {BACKEND_KEY: "ns"})}
        if "peer" in sides:
            arms["peer"] = (sides["peer"], None)
        names = list(arms)
        res["sides"] = {n: s.describe() for n, s in sides.items()}
        for s in sides.values():
            s.start()
        res["warmup_samples"] = {n: [one_sample(arms[n][0], args.image, extensions=arms[n][1])
                                     for _ in range(args.vm_warmup)] for n in names}
        samples = {n: [] for n in names}
        first = rng.randrange(len(names))
        for i in range(args.vm_pairs):
            order = names[(first + i) % len(names):] + names[:(first + i) % len(names)]
            for n in order:
                time.sleep(rng.uniform(0.05, 0.25))
                rec = one_sample(arms[n][0], args.image, extensions=arms[n][1])
                rec.update(index=i, position=order.index(n))
                samples[n].append(rec)
            log(f"  round {i}: " + "  ".join(f"{n} {samples[n][-1].get('create_ms', float('nan')):.0f}/"
                                             f"{samples[n][-1].get('first_command_ms', float('nan')):.0f} ms"
                                             for n in names))
        res["worker_memory"] = {n: [worker_memory(sides["pvisor"], args.image, arms[n][1])
                                    for _ in range(args.rss_rounds)] for n in names if n.startswith("pvisor-")}
        for s in sides.values():
            s.stop()
    res["samples"] = samples
    res["summary"] = sdk_summary(samples, args.seed)
    return res


def children_of(parent: int) -> list[int]:
    """By each process's PPid, not /proc/PID/task/*/children (CONFIG_PROC_CHILDREN, which the
    KVM test host's kernel lacks)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        if any(line.split() == ["PPid:", str(parent)] for line in status.splitlines()):
            pids.append(int(d.name))
    return pids


def broker_workers(broker_pid: int) -> list[int]:
    """The broker's pvisor-worker children (warm ones included)."""
    pids = children_of(broker_pid)
    out = []
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/exe").endswith("/pvisor-worker"):
                out.append(pid)
        except OSError:
            continue
    return out


def runs_a_sandbox(pid: int) -> bool:
    """Whether a worker has a sandbox's init among its children (a warm one has only its
    pvisor-netd)."""
    def comm(p: int) -> str:
        try:
            return Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            return ""
    return any(comm(c) not in ("", "pvisor-netd") for c in children_of(pid))


def worker_memory(svc, image: str, extensions: dict) -> dict:
    """The resident memory of the worker of one live sandbox of this backend (after its checked
    first command), excluding guest memory. A vm sandbox's worker is the one mapping a guest-RAM
    memfd; an ns sandbox's the one with a child besides its netd (its sandbox's init); warm workers
    have neither."""
    backend = extensions[BACKEND_KEY]
    rec = {"backend": backend, "ok": False}
    sb = None
    try:
        sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                resource=RESOURCE, extensions=extensions)
        checked_first_command(sb)
        workers = broker_workers(svc.proc.pid)
        if backend == "vm":
            mine = [p for p in workers
                    if GUEST_RAM_MAPPING in Path(f"/proc/{p}/maps").read_text(errors="replace")]
        else:
            mine = [p for p in workers if runs_a_sandbox(p)]
        if len(mine) != 1:
            raise RuntimeError(f"expected one {backend} sandbox worker among {workers}, found {mine}")
        rec.update(measure_pid(mine[0], Path(os.readlink(f"/proc/{mine[0]}/exe")), need_guest=backend == "vm"),
                   ok=True)
        sb.kill()
        verify_deleted(svc.base_url, sb.id)
        sb = None
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"vm/sdk: worker memory ({backend}) FAILED: {rec['error']}")
    finally:
        if sb is not None:
            try:
                sb.kill()
            except Exception:
                pass
    return rec


def sdk_summary(samples: dict, seed: int) -> dict:
    out = {}
    for n, recs in samples.items():
        ok = [r for r in recs if r["ok"]]
        out[n] = {"n": len(recs), "failed": len(recs) - len(ok),
                  **{m: {"p50": median([r[m] for r in ok]), "p90": quantile([r[m] for r in ok], 0.9)}
                     for m in SDK_METRICS}}
    for other in ("pvisor-ns", "peer"):
        if other not in samples:
            continue
        pairs = [(a, b) for a, b in zip(samples["pvisor-vm"], samples[other]) if a["ok"] and b["ok"]]
        out[f"vm_over_{other}"] = {m: paired_bootstrap([a[m] for a, _ in pairs], [b[m] for _, b in pairs], seed=seed)
                                   for m in SDK_METRICS}
    return out


# ---------------------------------------------------------------- experiment interface

def run(args) -> dict:
    binary = build_vm_bench()
    res = {"experiment": "vm", "seed": args.seed, "vm_bench": str(binary), "vm_bench_sha256": sha256_file(binary),
           "engine": "pvisor-vmm on /dev/kvm (never the QEMU TCG test engine)"}
    res["hardware_virt"] = dict(zip(("present", "why"), hardware_virt()))
    res["first_exit"] = first_exit(binary, args.runs, args.vm_memory_mib)
    res["rss"] = rss(binary, args.rss_rounds)
    res["sdk"] = sdk(args)
    sd = res["sdk"]
    res["pvisor_failures"] = sum(c["failed"] for c in res["rss"].values())
    if not sd.get("harness_check_only"):
        res["pvisor_failures"] += sum(s["failed"] for n, s in sd.get("summary", {}).items() if n.startswith("pvisor-"))
        res["pvisor_failures"] += sum(not r["ok"] for recs in sd.get("worker_memory", {}).values() for r in recs)
    # A peer only takes part in the SDK part.
    res["used_peer"] = "peer" in res["sdk"].get("samples", {})
    return res


def report(res: dict, out) -> str:
    from lib.report import fmt
    from lib.svg import dots_boxes
    fe = res["first_exit"]
    s = fe["summary"]
    lines = [f"Engine: {res['engine']}. Hardware virtualization: "
             f"{'yes' if res['hardware_virt']['present'] else 'no'} ({res['hardware_virt']['why']}).", "",
             f"### Test-guest create → first exit ({fe['runs']} runs, {fe['memory_mib']} MiB guest RAM)", "",
             "Open /dev/kvm, VM, memfd RAM and memory slot, irqchip, PIT, devices, vCPU set-up, vCPU thread "
             "with its seccomp filter, first KVM_RUN up to the exit's dispatch (teardown not included).", "",
             "| P50 (ms) | P90 (ms) | min (ms) | max (ms) |", "|---:|---:|---:|---:|",
             f"| {fmt(s['p50'], 2)} | {fmt(s['p90'], 2)} | {fmt(s['min'], 2)} | {fmt(s['max'], 2)} |", ""]
    dots_boxes(out / "vm-first-exit.svg", "vm: open /dev/kvm → first exit of a test guest", "ms",
               [{"label": "first exit", "sides": [("pvisor", fe["samples_ms"])]}],
               note=f"{fe['runs']} runs; dots: samples; box: quartiles, whiskers: min-max")
    lines += ["![first exit](vm-first-exit.svg)", ""]

    lines += ["### VMM resident memory while a test guest runs", "",
              "A fresh `vm_bench hold` process per round; its guest writes one byte into every page of the touched "
              "range and halts; read from /proc/PID/smaps_rollup and /proc/PID/smaps while it is halted. "
              f"\"Excluding guest memory\" subtracts the Rss of the `{GUEST_RAM_MAPPING}` mapping. This is the VMM "
              "core (KVM, memory, devices, one vCPU thread); the worker's gRPC server and device event loop "
              "are not in it.", "",
              "| guest RAM / touched | total RSS (MiB), median [min–max] | guest RAM RSS (MiB) | "
              "RSS excluding guest memory (MiB), median [min–max] | target | rounds (failed) |",
              "|---|---:|---:|---:|---|---:|"]
    for c in res["rss"].values():
        t, g, x = c["total_mib"], c["guest_mib"], c["excl_guest_mib"]
        if not x.get("n"):
            lines.append(f"| {c['memory_mib']} / {c['touch_mib']} MiB | – | – | – | ≤ {RSS_TARGET_MIB:g} MiB, "
                         f"no sample | {len(c['samples'])} ({c['failed']}) |")
            continue
        verdict = "met" if x["max"] <= RSS_TARGET_MIB else "NOT met"
        lines.append(f"| {c['memory_mib']} / {c['touch_mib']} MiB | {t['median']:.2f} [{t['min']:.2f}–{t['max']:.2f}] "
                     f"| {g['median']:.2f} | {x['median']:.2f} [{x['min']:.2f}–{x['max']:.2f}] | "
                     f"≤ {RSS_TARGET_MIB:g} MiB, {verdict} | {len(c['samples'])} ({c['failed']}) |")
    pss = [f"{c['memory_mib']} MiB guest: {c['excl_guest_pss_mib']['median']:.2f} MiB" for c in res["rss"].values()
           if c.get("excl_guest_pss_mib", {}).get("n")]
    if pss:
        lines += ["", "Rss counts every resident page of the shared libraries in full; Pss shares them out among "
                  "the processes mapping them. Pss excluding guest memory, median: " + "; ".join(pss) + "."]
    first_ok = next((smp for c in res["rss"].values() for smp in c["samples"] if smp["ok"]), None)
    if first_ok:
        lines += ["", f"Where the rest lives (first round of {first_ok['memory_mib']} MiB, {first_ok['threads']} "
                  "threads, KiB of Rss):", "", "| mappings | Rss (KiB) |", "|---|---:|"]
        for cat, kib in sorted(first_ok["by_category_kib"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {cat} | {kib:,} |")
    errs = [smp["error"] for c in res["rss"].values() for smp in c["samples"] if not smp["ok"]]
    lines += [""] + [f"- rss sample failed: {e}" for e in errs] + ([""] if errs else [])

    lines += ["### SDK create → agent ready, create → first command (vm backend)", ""]
    sd = res["sdk"]
    if "skipped" in sd:
        lines += [f"**Skipped:** {sd['skipped']}. This part runs only where hardware virtualization exists "
                  "(a vmx or svm CPU flag and no kvm_pvm module); the QEMU TCG test engine's timings are not "
                  "performance figures and are not reported.", ""]
        return "\n".join(lines)
    if sd.get("harness_check_only"):
        lines += ["**Harness check only (`--vm-sdk-anyway` without hardware virtualization): not figures.**", ""]
    summ = sd["summary"]
    arms = list(sd["samples"])
    lines += [f"{sd['pairs']} rounds in rotating order after {sd['warmup']} warm-up sample(s) per arm, image "
              f"`{sd['image']}`; vm and ns on one `pvisor serve`, chosen per create by `extensions` "
              f"`{BACKEND_KEY}`.", "",
              "| arm | SDK create = agent ready, P50 / P90 (ms) | create → first command, P50 / P90 (ms) | failed |",
              "|---|---:|---:|---:|"]
    for n in arms:
        a = summ[n]
        lines.append(f"| {n} | {fmt(a['create_ms']['p50'])} / {fmt(a['create_ms']['p90'])} | "
                     f"{fmt(a['first_command_ms']['p50'])} / {fmt(a['first_command_ms']['p90'])} | "
                     f"{a['failed']} of {a['n']} |")
    for other in ("pvisor-ns", "peer"):
        b = summ.get(f"vm_over_{other}")
        if b and b["create_ms"].get("pairs"):
            lines.append("")
            lines.append(f"vm / {other} (paired, {b['create_ms']['pairs']} rounds): create "
                         f"{b['create_ms']['ratio_a_over_b']:.3f} [{b['create_ms']['ci95_ratio_a_over_b'][0]:.3f}–"
                         f"{b['create_ms']['ci95_ratio_a_over_b'][1]:.3f}], first command "
                         f"{b['first_command_ms']['ratio_a_over_b']:.3f}.")
    wm = sd.get("worker_memory", {})
    if wm:
        lines += ["", "Worker of one live sandbox (after its checked first command), from /proc/PID/smaps_rollup and "
                  f"smaps; the guest-RAM memfd mapping subtracted (vm). "
                  f"{len(next(iter(wm.values())))} sample(s) per arm:", "",
                  "| arm | worker Rss total (MiB) | Rss excluding guest memory (MiB) | Pss excluding guest (MiB) | "
                  "threads | samples (failed) |", "|---|---:|---:|---:|---:|---:|"]
        for n, recs in wm.items():
            ok = [r for r in recs if r["ok"]]
            cell = (lambda k: f"{median([r[k] / 1024 for r in ok]):.2f}") if ok else (lambda k: "–")
            lines.append(f"| {n} | {cell('total_rss_kib')} | {cell('excl_guest_kib')} | {cell('excl_guest_pss_kib')} "
                         f"| {ok[0]['threads'] if ok else '–'} | {len(recs)} ({len(recs) - len(ok)}) |")
        lines += [f"- {n} worker memory failed: {r['error']}" for n, recs in wm.items() for r in recs if not r["ok"]][:6]
    errs = [(n, r.get("index"), r["error"]) for n in arms for r in sd["samples"][n] if not r["ok"]]
    lines += [""] + [f"- {n} round {i} failed: {e}" for n, i, e in errs[:20]]
    if len(errs) > 20:
        lines.append(f"- … {len(errs) - 20} more in vm.json")
    return "\n".join(lines) + "\n"


def targets(res: dict) -> list[str]:
    rows = []
    worst = [c["excl_guest_mib"]["max"] for c in res["rss"].values() if c["excl_guest_mib"].get("n")]
    if worst:
        w = max(worst)
        rows.append(f"| vm: VMM RSS excluding guest memory, worst round (MiB) | {w:.2f} | ≤ {RSS_TARGET_MIB:g} | "
                    f"{'met' if w <= RSS_TARGET_MIB else 'NOT met'} |")
    sd = res["sdk"]
    if "skipped" in sd:
        rows.append("| vm: SDK create → agent ready P50 (ms) | skipped: no hardware virtualization | "
                    f"≤ {AGENT_READY_TARGET_MS:g} | – |")
    elif not sd.get("harness_check_only"):
        ok = [r["excl_guest_kib"] / 1024 for r in sd.get("worker_memory", {}).get("pvisor-vm", []) if r["ok"]]
        if ok:
            rows.append(f"| vm: worker RSS excluding guest memory, worst sample (MiB) | {max(ok):.2f} | "
                        f"≤ {RSS_TARGET_MIB:g} | {'met' if max(ok) <= RSS_TARGET_MIB else 'NOT met'} |")
        v = sd["summary"]["pvisor-vm"]["create_ms"]["p50"]
        rows.append(f"| vm: SDK create → agent ready P50 (ms) | {v:.1f} | ≤ {AGENT_READY_TARGET_MS:g} | "
                    f"{'met' if v <= AGENT_READY_TARGET_MS else 'NOT met'} |")
    return rows
