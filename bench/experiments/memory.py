"""Experiment 4: memory charged to each whole side.

Each side runs in its own product cgroup (same memory and CPU ceilings, no
swap) holding everything of that side: pvisor: broker, workers, sandboxes;
peer: dockerd, containerd, shims, docker-proxy, containers, opensandbox-server.
Rounds alternate sides; every round starts fresh: clean page cache
(`sync; echo 1 > drop_caches`, so each side pays for the file pages it
touches), new cgroup, service started inside it. Phases:

  empty        service up, no sandbox
  idle1        1 idle sandbox (created, checked first command done)
  idle4        4 idle sandboxes
  hold_same    each of the 4 runs `hold`: 64 MiB of identical deterministic data
  hold_unique  each rewrites its 64 MiB with instance-unique data, verified word by word

Memory merging (issue 13): with --merge (the default) a third side,
`pvisor-merge`, is pvisor with `serve --memory-merge` (every sandbox opted into
KSM; the broker turns the host's ksmd on at start and restores the host's
settings at its stop, so the other sides run with KSM off). In its hold_same
phase the harness first waits (bounded by --merge-wait) until ksmd has merged
what it can (host `pages_sharing` within 1% of its value a full scan earlier),
and records how long that took (the samples of that wait belong to no
phase, nor do those between hold_same and the end of the unique rewrites). For every side the CPU time ksmd spent
(/proc/<ksmd>/stat utime+stime) is recorded per phase.

Charged memory (memory.usage_in_bytes on v1, memory.current on v2) is sampled
every 500 ms; a phase's value is the median of its samples in the final 2 s of
the phase's quiet wait (`--phase-seconds`; a mark ends it before the next
creates or uploads begin: before 2026-12-08 the window ran into them, so
empty, idle1 and idle4 included the next phase's start). Reported: medians over rounds with min–max, and the amortized
per-sandbox increment over the empty service ((idle4 − empty) / 4).
`hold` (bench/peer/hold/hold.c, static) is uploaded with the SDK's file API and
started as a background command, identically on both sides.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import threading
import time
import traceback
import uuid
from datetime import timedelta

from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts

from lib.cgroups import ProductCgroup
from lib.common import RESOURCE, checked_first_command, log, sha256_file, verify_deleted
from lib.sides import opened_sides, workdir
from lib.stats import median

PHASES = ("empty", "idle1", "idle4", "hold_same", "hold_unique")
MiB = 2 ** 20
KSM = "/sys/kernel/mm/ksm"
MERGE_SIDE = "pvisor-merge"


def ksm_counter(name: str) -> int:
    try:
        with open(f"{KSM}/{name}") as f:
            return int(f.read())
    except OSError:
        return 0


def ksmd_cpu_s() -> float:
    """CPU seconds ksmd has used since boot (utime + stime), 0 without ksmd."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.split(" ", 2)[1] == "(ksmd)":
            fields = stat.rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def wait_merged(timeout: float) -> float:
    """Waits until ksmd has merged what it can: host pages_sharing settled
    (within 1% of its value one full scan earlier, and above zero). Returns
    the seconds it took (the timeout if it never settled)."""
    t0 = time.monotonic()
    prev_scan, prev = ksm_counter("full_scans"), -1
    while time.monotonic() - t0 < timeout:
        time.sleep(0.5)
        scan = ksm_counter("full_scans")
        if scan == prev_scan:
            continue
        now = ksm_counter("pages_sharing")
        if now > 0 and prev >= 0 and abs(now - prev) <= 0.01 * now:
            return round(time.monotonic() - t0, 2)
        prev_scan, prev = scan, now
    return timeout

GAMMA = 0x9E3779B97F4A7C15
SHARED_SEED = 0x5EED5EED5EED5EED
M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _fnv1a(s: str) -> int:
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def expected_line(kind: str, seed: int, words: int) -> str:
    first = _mix64((seed + GAMMA) & M64)
    last = _mix64((seed + words * GAMMA) & M64)
    return f"{kind} {words} {first:016x} {last:016x}"


def add_args(p) -> None:
    p.add_argument("--rounds", type=int, default=5, help="rounds per side (sides alternate)")
    p.add_argument("--phase-seconds", type=float, default=6.0, help="length of each phase after its action")
    p.add_argument("--hold-mib", type=int, default=64)
    p.add_argument("--mem-limit-mib", type=int, default=6144, help="product cgroup memory ceiling (both sides)")
    p.add_argument("--cpus", type=float, default=2.0, help="product cgroup CPU ceiling (both sides)")
    p.add_argument("--no-drop-caches", action="store_true")
    p.add_argument("--merge", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also run pvisor with --memory-merge as side {MERGE_SIDE!r}")
    p.add_argument("--merge-wait", type=float, default=120.0,
                   help="longest wait for ksmd to merge the identical data (merge side only)")


class Sampler(threading.Thread):
    def __init__(self, cg: ProductCgroup, t0: float, interval: float = 0.5):
        super().__init__(daemon=True)
        self.cg, self.t0, self.interval = cg, t0, interval
        self.phase = "start"
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        nxt = time.monotonic()
        while not self.halt.is_set():
            try:
                self.samples.append((round(time.monotonic() - self.t0, 3), self.cg.usage(), self.phase))
            except OSError:
                pass
            nxt += self.interval
            self.halt.wait(max(0.0, nxt - time.monotonic()))


def until(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise TimeoutError(what)


CURRENT = {"sandbox": None, "step": None}


def cat(sb: SandboxSync, path: str) -> str:
    CURRENT.update(sandbox=sb.id, step=f"cat {path}")
    ex = sb.commands.run(f"cat {path} 2>/dev/null || true")
    return "".join(m.text for m in ex.logs.stdout).strip()


def one_round(svc, cg: ProductCgroup, args, hold_bytes: bytes, rng: random.Random) -> dict:
    rec = {"side": svc.name, "ok": False, "phases": {}, "marks": [], "ksmd_cpu_marks": [],
           "pages_sharing_marks": []}
    svc.cgroup = cg
    if hasattr(svc, "dockerd"):
        svc.dockerd.cgroup = cg
    if not args.no_drop_caches:
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
    t0 = time.monotonic()
    sampler = Sampler(cg, t0)
    sampler.start()
    boxes = []

    def phase(name):
        sampler.phase = name
        rec["marks"].append((round(time.monotonic() - t0, 3), name))
        rec["ksmd_cpu_marks"].append(ksmd_cpu_s())
        rec["pages_sharing_marks"].append(ksm_counter("pages_sharing"))

    def settle():
        time.sleep(args.phase_seconds)
        # A phase's window is the last 2 s before the next mark: the mark goes here, so what
        # comes next (the next creates, the hold uploads) is never measured as this phase.
        phase("between")

    try:
        if hasattr(svc, "dockerd"):
            svc.dockerd.start()
        svc.start()
        phase("empty")
        settle()

        def create():
            CURRENT.update(sandbox=None, step="create")
            sb = SandboxSync.create(args.image, connection_config=svc.connection(), timeout=timedelta(minutes=30),
                                    resource=RESOURCE)
            boxes.append(sb)
            checked_first_command(sb)

        create()
        phase("idle1")
        settle()
        for _ in range(3):
            create()
        phase("idle4")
        settle()
        tokens = []
        words = args.hold_mib * MiB // 8
        for sb in boxes:
            tok = uuid.UUID(int=rng.getrandbits(128)).hex
            tokens.append(tok)
            CURRENT.update(sandbox=sb.id, step="upload hold")
            sb.files.write_file("/tmp/hold", hold_bytes, mode=755)
            CURRENT.update(sandbox=sb.id, step="start hold")
            sb.commands.run(f"/tmp/hold {args.hold_mib} {tok} /tmp", opts=RunCommandOpts(background=True))
        want = expected_line("identical", SHARED_SEED, words)
        for sb in boxes:
            got = until(lambda: cat(sb, "/tmp/hold.ready"), 120, "hold.ready")
            if got != want:
                raise AssertionError(f"hold (identical) in {sb.id}: {got!r} != {want!r}")
        if svc.name == MERGE_SIDE or getattr(svc, "merging", False):
            phase("merging")
            rec["merge_wait_s"] = wait_merged(args.merge_wait)
            log(f"  {svc.name}: ksmd merged in {rec['merge_wait_s']} s "
                f"(pages_sharing {ksm_counter('pages_sharing')})")
        phase("hold_same")
        settle()
        # Its own mark: hold_same ends before any rewrite begins (the rewrites
        # unmerge pages on the merge side while the harness waits for them).
        phase("rewriting")
        for sb in boxes:
            CURRENT.update(sandbox=sb.id, step="signal hold")
            ex = sb.commands.run("kill -USR1 $(cat /tmp/hold.pid)")
            if ex.exit_code != 0:
                raise AssertionError(f"signalling hold in {sb.id} failed: exit {ex.exit_code}")
        for sb, tok in zip(boxes, tokens):
            got = until(lambda: cat(sb, "/tmp/hold.unique"), 120, "hold.unique")
            want = expected_line("ok", _fnv1a(tok), words)
            if got != want:
                raise AssertionError(f"hold (unique) in {sb.id}: {got!r} != {want!r}")
        phase("hold_unique")
        settle()
        phase("teardown")
        for sb in boxes:
            sb.kill()
            verify_deleted(svc.base_url, sb.id)
        boxes.clear()
        rec["ok"] = True
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc(limit=5)
        rec["failed_at"] = dict(CURRENT)
        log(f"{svc.name}: round FAILED at {CURRENT}: {rec['error']}")
        if hasattr(svc, "diagnostics"):
            try:
                rec["diagnostics"] = svc.diagnostics([sb.id for sb in boxes])
            except Exception as d:
                rec["diagnostics"] = f"unavailable: {d}"
    finally:
        sampler.halt.set()
        sampler.join()
        for sb in boxes:
            try:
                sb.kill()
            except Exception:
                pass
        svc.stop()
        if hasattr(svc, "dockerd"):
            svc.dockerd.stop()
        rec["samples"] = sampler.samples
        rec["pids_left"] = len(cg.pids())
        cg.destroy()
    marks = rec["marks"]
    cpu = rec["ksmd_cpu_marks"]
    if len(cpu) >= 2:
        rec["ksmd_cpu_round_s"] = round(cpu[-1] - cpu[0], 3)
    for i, (t, name) in enumerate(marks):
        if i + 1 >= len(marks):
            continue
        rec.setdefault("ksmd_cpu_s", {})[name] = round(cpu[i + 1] - cpu[i], 3)
        rec.setdefault("pages_sharing", {})[name] = rec["pages_sharing_marks"][i + 1]
        if name not in PHASES:
            continue
        end = marks[i + 1][0]
        window = [u for (ts, u, ph) in rec["samples"] if ph == name and end - 2.0 <= ts <= end]
        rec["phases"][name] = median(window) if window else None
        rec.setdefault("window_samples", {})[name] = len(window)
    return rec


def run(args) -> dict:
    from lib.peer import build_hold
    rng = random.Random(args.seed)
    work = workdir(args, "memory")
    hold = build_hold()
    res = {"experiment": "memory", "seed": args.seed, "image": args.image, "rounds": args.rounds,
           "phase_seconds": args.phase_seconds, "hold_mib": args.hold_mib, "resource": RESOURCE,
           "drop_caches": not args.no_drop_caches, "hold_sha256": sha256_file(hold),
           "results": {}}
    with opened_sides(args, work, [args.image]) as sides:
        if args.merge:
            from lib.pvisor_side import PvisorService
            merge = PvisorService(work / MERGE_SIDE, [args.image], pvisor=sides["pvisor"].pvisor,
                                  serve_args=["--memory-merge"])
            merge.name = MERGE_SIDE
            sides[MERGE_SIDE] = merge
        names = list(sides)
        if "peer" in sides:
            sides["peer"].dockerd.stop()  # restarted inside its product cgroup each round
        res["sides"] = {n: s.describe() for n, s in sides.items()}
        res["results"] = {n: [] for n in names}
        first = rng.randrange(len(names))
        hold_bytes = hold.read_bytes()
        for r in range(args.rounds):
            order = names[(first + r) % len(names):] + names[:(first + r) % len(names)]
            for n in order:
                cg = ProductCgroup(f"pvbench-{n}", args.mem_limit_mib * MiB, args.cpus)
                res["cgroup"] = cg.describe()
                rec = one_round(sides[n], cg, args, hold_bytes, rng)
                rec["round"] = r
                res["results"][n].append(rec)
                log(f"  round {r} {n}: " + "  ".join(
                    f"{p} {rec['phases'].get(p, float('nan')) / MiB:.1f}" if rec["phases"].get(p) else f"{p} –"
                    for p in PHASES) + " MiB")
    res["summary"] = summarize(res["results"])
    return res


def summarize(results: dict) -> dict:
    """A phase counts in every round that completed it (the next phase began),
    also in a round that failed later: failures are reported, not dropped."""
    out = {}
    for n, rounds in results.items():
        s = {"rounds": len(rounds), "failed": sum(1 for r in rounds if not r["ok"]), "phases": {}}
        for p in PHASES:
            v = [r["phases"][p] for r in rounds if r["phases"].get(p) is not None]
            s["phases"][p] = {"n": len(v), "median": median(v) if v else None, "min": min(v) if v else None,
                              "max": max(v) if v else None, "values": v}
        both = [r for r in rounds if r["phases"].get("empty") and r["phases"].get("idle4")]
        inc = [(r["phases"]["idle4"] - r["phases"]["empty"]) / 4 for r in both]
        one = [r for r in rounds if r["phases"].get("empty") and r["phases"].get("idle1")]
        inc1 = [r["phases"]["idle1"] - r["phases"]["empty"] for r in one]
        s["per_sandbox_idle4"] = {"n": len(inc), "median": median(inc) if inc else None,
                                  "min": min(inc, default=None), "max": max(inc, default=None), "values": inc}
        s["increment_idle1"] = {"median": median(inc1) if inc1 else None, "values": inc1}
        s["ksmd_cpu_s"] = {}
        rr = [r["ksmd_cpu_round_s"] for r in rounds if r.get("ksmd_cpu_round_s") is not None]
        s["ksmd_cpu_round_s"] = {"median": median(rr) if rr else None, "values": rr}
        for p in PHASES + ("merging",):
            v = [r["ksmd_cpu_s"][p] for r in rounds if (r.get("ksmd_cpu_s") or {}).get(p) is not None]
            s["ksmd_cpu_s"][p] = {"median": median(v) if v else None, "values": v}
        w = [r["merge_wait_s"] for r in rounds if r.get("merge_wait_s") is not None]
        s["merge_wait_s"] = {"median": median(w) if w else None, "values": w}
        out[n] = s
    return out


def resummarize(res: dict) -> None:
    res["summary"] = summarize(res["results"])


LABELS = {"empty": "empty service", "idle1": "service + 1 idle sandbox", "idle4": "service + 4 idle sandboxes",
          "hold_same": "4 × 64 MiB identical data", "hold_unique": "4 × 64 MiB unique data (verified)"}


def report(res: dict, out) -> str:
    from lib.svg import dots_boxes, timeseries
    summ = res["summary"]
    names = [n for n in ("pvisor", "peer") if n in summ]
    merge = summ.get(MERGE_SIDE)

    def cell(d):
        if d["median"] is None or d["min"] is None:
            return "–"
        n = f", n={d['n']}" if d.get("n") is not None and d["n"] != res["rounds"] else ""
        return f"{d['median'] / MiB:.1f} ({d['min'] / MiB:.1f}–{d['max'] / MiB:.1f}{n})"

    lines = [f"### Memory (cgroup-charged, MiB; median (min–max) of {res['rounds']} fresh rounds per side; "
             f"image `{res['image']}`; phase = median of its final 2 s, sampled every 500 ms)", "",
             *([f"Phase windows {res['windows']}.", ""] if res.get("windows") else []),
             "| phase | " + " | ".join(names) + (" | pvisor / peer |" if len(names) == 2 else " |"),
             "|---|" + "---:|" * len(names) + ("---:|" if len(names) == 2 else "")]
    for p in PHASES:
        row = f"| {LABELS[p]} | " + " | ".join(cell(summ[n]["phases"][p]) for n in names) + " |"
        if len(names) == 2:
            a, b = summ["pvisor"]["phases"][p]["median"], summ["peer"]["phases"][p]["median"]
            row += f" {a / b:.3f} |" if a and b else " – |"
        lines.append(row)
    row = "| amortized increment per idle sandbox ((idle4 − empty) / 4) | " + " | ".join(
        cell(summ[n]["per_sandbox_idle4"]) for n in names) + " |"
    if len(names) == 2:
        a, b = summ["pvisor"]["per_sandbox_idle4"]["median"], summ["peer"]["per_sandbox_idle4"]["median"]
        row += f" {a / b:.3f} |" if a and b else " – |"
    lines.append(row)
    if merge:
        lines += ["", f"#### Memory merging: pvisor `serve --memory-merge` (side `{MERGE_SIDE}`, same run, same rounds)", "",
                  "| phase | pvisor, merging off | pvisor, merging on | on / off | on / peer | ksmd CPU s in phase (on) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for p in PHASES:
            on, off = merge["phases"][p]["median"], summ["pvisor"]["phases"][p]["median"]
            peer = summ["peer"]["phases"][p]["median"] if "peer" in summ else None
            cpu = merge["ksmd_cpu_s"][p]["median"]
            lines.append(f"| {LABELS[p]} | {cell(summ['pvisor']['phases'][p])} | {cell(merge['phases'][p])} | "
                         + (f"{on / off:.3f}" if on and off else "–") + " | "
                         + (f"{on / peer:.3f}" if on and peer else "–") + " | "
                         + (f"{cpu:.2f}" if cpu is not None else "–") + " |")
        w = merge["merge_wait_s"]
        mc = merge["ksmd_cpu_s"]["merging"]
        lines += ["", f"Time from the last `hold.ready` until ksmd's merging settled (before the hold_same "
                  f"phase's {res['phase_seconds']} s): median {w['median']} s, rounds {w['values']}; ksmd CPU "
                  f"in that wait: median {mc['median']} s, rounds {mc['values']}. ksmd CPU over a whole round: "
                  + ", ".join(f"{n} {summ[n]['ksmd_cpu_round_s']['median']} s"
                              for n in names + [MERGE_SIDE]) + " (KSM is off while the other sides run)."]
        if merge["failed"]:
            for r in res["results"][MERGE_SIDE]:
                if not r["ok"]:
                    lines.append(f"- {MERGE_SIDE} round {r['round']} failed: {r.get('error')}")
    cg = res.get("cgroup", {})
    lines += ["", f"Failed rounds: " + ", ".join(f"{n}: {summ[n]['failed']} of {summ[n]['rounds']}" for n in names)
              + " (a failed round's phases that completed before the failure are included; n is shown where a "
              f"cell has fewer than {res['rounds']} rounds). Product cgroup per side: memory ceiling "
              f"{cg.get('memory_limit', 0) / MiB:.0f} MiB, "
              f"{cg.get('cpus')} CPUs, no swap; page cache dropped before every round: {res['drop_caches']}.", ""]
    for n in names:
        for r in res["results"][n]:
            if not r["ok"]:
                step = (r.get("failed_at") or {}).get("step")
                lines.append(f"- {n} round {r['round']} failed" + (f" at `{step}`" if step else "")
                             + f": {r.get('error')}")
    panels = [{"label": p, "paired": True,
               "sides": [(n, [r["phases"][p] / MiB if r["phases"].get(p) else None
                              for r in res["results"][n]]) for n in names]} for p in PHASES]
    dots_boxes(out / "memory.svg", "Memory charged to each side's product cgroup, by phase", "MiB", panels,
               note="dots: rounds (lines join rounds with the same index); boxes: quartiles, whiskers: min-max")
    plotted = names + ([MERGE_SIDE] if merge else [])
    for n in plotted:
        series = [{"label": f"{n} round {r['round']}", "side": n,
                   "points": [(t, u / MiB) for t, u, _ in r["samples"]]} for r in res["results"][n]]
        marks = list(res["results"][n][0]["marks"]) if res["results"][n] else []
        timeseries(out / f"memory-timeline-{n}.svg", f"{n}: charged memory over each round (500 ms samples)",
                   "MiB", series, markers=marks, note="t = 0: round start (before the service starts); "
                   "phase markers from round 0")
    lines += ["", "![memory](memory.svg)", ""] + [f"![memory timeline {n}](memory-timeline-{n}.svg)" for n in plotted] + [""]
    return "\n".join(lines)


def targets(res: dict) -> list[str]:
    from lib.report import target_row
    s = res["summary"]
    if "peer" not in s or "pvisor" not in s:
        return []
    rows = []
    a, b = s["pvisor"]["phases"]["idle1"]["median"], s["peer"]["phases"]["idle1"]["median"]
    if a and b:
        rows.append(target_row("memory: service + 1 idle sandbox", a / b, 0.2))
    a, b = s["pvisor"]["per_sandbox_idle4"]["median"], s["peer"]["per_sandbox_idle4"]["median"]
    if a and b:
        rows.append(target_row("memory: amortized increment, 4 idle sandboxes", a / b, 0.5))
    m = s.get(MERGE_SIDE)
    if m:
        a, b = m["phases"]["hold_same"]["median"], s["peer"]["phases"]["hold_same"]["median"]
        if a and b:
            rows.append(target_row("memory: 4 × 64 MiB identical, merging on vs peer", a / b, 0.25))
        a, b = m["phases"]["hold_unique"]["median"], s["pvisor"]["phases"]["hold_unique"]["median"]
        if a and b:
            rows.append(target_row("memory: 4 × 64 MiB unique, merging on vs off", a / b, 1.0))
    return rows
