"""Experiment: throughput: create → checked command → delete cycles per second, C clients.

For each client count C (`--clients`, default 1,4,16) and each side: C threads, each with its
own SDK connection, loop for `--cycle-seconds` (after `--cycle-warmup` seconds of the same
load, not counted): create a sandbox, run the checked first command, delete it. A cycle counts
when all three succeeded; an error (any exception, a wrong command output) is counted and the
thread goes on. Cycles/s = completed cycles / the counted window. The side going first
alternates with C; every sandbox left by an error is deleted at the end and checked gone.

Everything — clients, service and sandboxes — shares this machine's cores, as an agent
framework on one machine would.
"""
from __future__ import annotations

import random
import threading
import time
import traceback
from datetime import timedelta

import httpx
from opensandbox import SandboxSync

from lib.common import RESOURCE, checked_first_command, connection, log
from lib.sides import opened_sides, workdir

TARGET_CLIENTS = 16
TARGET_CYCLES_PER_S = 100.0


def add_args(p) -> None:
    p.add_argument("--clients", default="1,4,16", help="throughput: client counts, comma-separated")
    p.add_argument("--cycle-seconds", type=float, default=20.0, help="throughput: counted window per run")
    p.add_argument("--cycle-warmup", type=float, default=3.0, help="throughput: uncounted seconds first")


def one_run(svc, image: str, clients: int, warmup: float, seconds: float) -> dict:
    start = threading.Event()
    stop_at = [0.0]
    window = [0.0, 0.0]
    counts = [{"cycles": 0, "errors": 0, "cycle_ms": []} for _ in range(clients)]
    errors: list[str] = []
    leftovers: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        conn = connection(svc.domain())
        rec = counts[i]
        start.wait()
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            sb = None
            try:
                sb = SandboxSync.create(image, connection_config=conn, timeout=timedelta(minutes=10),
                                        resource=RESOURCE)
                checked_first_command(sb)
                sb.kill()
                sb = None
                t1 = time.perf_counter()
                if window[0] <= t0 and t1 <= window[1]:
                    rec["cycles"] += 1
                    rec["cycle_ms"].append((t1 - t0) * 1e3)
            except Exception as e:  # counted, and the client goes on
                rec["errors"] += 1
                with lock:
                    errors.append(f"{type(e).__name__}: {e}"[:300])
                    if len(errors) <= 3:
                        log(traceback.format_exc(limit=3))
                if sb is not None:
                    with lock:
                        leftovers.append(sb.id)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    now = time.perf_counter()
    window[0], window[1] = now + warmup, now + warmup + seconds
    stop_at[0] = window[1]
    start.set()
    for t in threads:
        t.join()
    # Counted: cycles wholly inside the window (one that straddles either edge is not).
    not_gone = []
    with httpx.Client(timeout=30) as http:
        for sid in leftovers:
            http.delete(f"{svc.base_url}/v1/sandboxes/{sid}")
            if http.get(f"{svc.base_url}/v1/sandboxes/{sid}").status_code != 404:
                not_gone.append(f"{sid}: not gone after delete")
    cycles = sum(c["cycles"] for c in counts)
    lat = sorted(x for c in counts for x in c["cycle_ms"])
    return {"side": svc.name, "clients": clients, "seconds": seconds, "cycles": cycles,
            "cycles_per_s": cycles / seconds, "errors": sum(c["errors"] for c in counts) + len(not_gone),
            "error_samples": (not_gone + errors)[:10],
            "cycle_ms_p50": lat[len(lat) // 2] if lat else None,
            "cycle_ms_p95": lat[min(len(lat) - 1, int(len(lat) * 0.95))] if lat else None}


def run(args) -> dict:
    work = workdir(args, "throughput")
    client_counts = [int(c) for c in str(args.clients).split(",") if c.strip()]
    res = {"experiment": "throughput", "seed": args.seed, "image": args.image, "resource": RESOURCE,
           "clients": client_counts, "cycle_seconds": args.cycle_seconds, "cycle_warmup": args.cycle_warmup,
           "runs": []}
    rng = random.Random(args.seed)
    with opened_sides(args, work, [args.image]) as sides:
        names = list(sides)
        res["sides"] = {n: s.describe() for n, s in sides.items()}
        for s in sides.values():
            s.start()
        first = rng.randrange(len(names))
        for k, c in enumerate(client_counts):
            order = names[(first + k) % len(names):] + names[:(first + k) % len(names)]
            for n in order:
                time.sleep(1.0)  # the previous run's deletes settle
                r = one_run(sides[n], args.image, c, args.cycle_warmup, args.cycle_seconds)
                res["runs"].append(r)
                log(f"  {n} {c} client(s): {r['cycles_per_s']:.1f} cycles/s, {r['errors']} error(s), "
                    f"cycle P50 {r['cycle_ms_p50'] or float('nan'):.0f} ms")
        for s in sides.values():
            s.stop()
    res["pvisor_failures"] = sum(r["errors"] for r in res["runs"] if r["side"] == "pvisor")
    return res


def report(res: dict, out) -> str:
    from lib.report import fmt
    names = [n for n in ("pvisor", "peer") if any(r["side"] == n for r in res["runs"])]
    by = {(r["side"], r["clients"]): r for r in res["runs"]}
    lines = [f"### Throughput: create → checked command → delete, {fmt(res['cycle_seconds'], 0)} s counted per run "
             f"after {fmt(res['cycle_warmup'], 0)} s of warm-up; image `{res['image']}`", "",
             "| clients | " + " | ".join(f"{n} cycles/s (errors; cycle P50 ms)" for n in names)
             + (" | pvisor / peer |" if len(names) == 2 else " |"),
             "|---:|" + "---:|" * len(names) + ("---:|" if len(names) == 2 else "")]
    for c in res["clients"]:
        cells = []
        for n in names:
            r = by.get((n, c))
            cells.append(f"{r['cycles_per_s']:.1f} ({r['errors']}; {fmt(r['cycle_ms_p50'], 0)})" if r else "–")
        ratio = ""
        if len(names) == 2 and by.get(("pvisor", c)) and by.get(("peer", c)) and by[("peer", c)]["cycles_per_s"]:
            ratio = f" {by[('pvisor', c)]['cycles_per_s'] / by[('peer', c)]['cycles_per_s']:.1f}× |"
        lines.append(f"| {c} | " + " | ".join(cells) + (" |" + ratio if len(names) == 2 else " |"))
    errs = [(r["side"], r["clients"], e) for r in res["runs"] for e in r["error_samples"]]
    if errs:
        lines += ["", "Errors (first of each run):", ""] + [f"- {n}, {c} clients: {e}" for n, c, e in errs[:20]]
    return "\n".join(lines + [""])


def targets(res: dict) -> list[str]:
    r = next((r for r in res["runs"] if r["side"] == "pvisor" and r["clients"] == TARGET_CLIENTS), None)
    if r is None:
        return []
    ok = r["cycles_per_s"] >= TARGET_CYCLES_PER_S and r["errors"] == 0
    return [f"| throughput: cycles/s with {TARGET_CLIENTS} clients, 0 errors | {r['cycles_per_s']:.1f}/s, "
            f"{r['errors']} errors | ≥ {TARGET_CYCLES_PER_S:g}/s, 0 | {'met' if ok else 'NOT met'} |"]
