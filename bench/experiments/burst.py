"""Experiment 2: burst of ten creates released by one async barrier.

Per burst: K tasks (async SDK, one event loop, one shared transport per
side) wait on one asyncio.Event; t0 = the moment it is set. Each task creates
a sandbox and runs the checked first command. Clocks: the last create return
and the last first-command completion, relative to t0. All instances stay
alive until every task is done (the common point); then all are deleted
concurrently and each is checked gone (GET -> 404).

W warm-up pairs, then N formal pairs of bursts; the side going first
alternates, the first pair's order is drawn from the seed.
"""
from __future__ import annotations

import asyncio
import random
import time
import traceback
from datetime import timedelta

import httpx
from opensandbox import Sandbox

from lib.common import SDK_RETRIES, RESOURCE, async_connection, checked_first_command_async, log, retries_since
from lib.sides import opened_sides, workdir
from lib.stats import summarize_sides

METRICS = ("last_create_ms", "last_first_command_ms")


def add_args(p) -> None:
    p.add_argument("--bursts", type=int, default=20, help="formal bursts per side")
    p.add_argument("--burst-size", type=int, default=10)
    p.add_argument("--burst-warmup", type=int, default=3, help="warm-up pairs of bursts")
    p.add_argument("--pvisor-warm-workers", type=int, default=None,
                   help="start pvisor with --warm-workers N for the burst (default: pvisor's default, 2)")


async def one_burst(svc, conn, image: str, k: int) -> dict:
    gate = asyncio.Event()
    t0 = 0.0
    inst = [{"i": i} for i in range(k)]
    boxes = [None] * k

    async def task(i):
        rec = inst[i]
        await gate.wait()
        try:
            sb = await Sandbox.create(image, connection_config=conn, timeout=timedelta(minutes=10), resource=RESOURCE)
            boxes[i] = sb
            rec["create_ms"] = (time.perf_counter() - t0) * 1e3
            rec["sandbox_id"] = sb.id
            await checked_first_command_async(sb)
            rec["first_command_ms"] = (time.perf_counter() - t0) * 1e3
            rec["ok"] = True
        except Exception as e:
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=4)

    mark = len(SDK_RETRIES.events)
    tasks = [asyncio.create_task(task(i)) for i in range(k)]
    await asyncio.sleep(0.1)  # every task is parked on the gate
    t0 = time.perf_counter()
    gate.set()
    await asyncio.gather(*tasks)
    # common point: every instance is alive (or failed); now delete them all
    td = time.perf_counter()
    kills = await asyncio.gather(*[sb.kill() for sb in boxes if sb is not None], return_exceptions=True)
    delete_ms = (time.perf_counter() - td) * 1e3
    gone_errors = [f"{type(e).__name__}: {e}" for e in kills if isinstance(e, Exception)]
    async with httpx.AsyncClient(timeout=30) as client:
        for sb in boxes:
            if sb is None:
                continue
            r = await client.get(f"{svc.base_url}/v1/sandboxes/{sb.id}")
            if r.status_code != 404:
                gone_errors.append(f"{sb.id} answers {r.status_code} after delete")
    ok = all(r.get("ok") for r in inst) and not gone_errors
    res = {"side": svc.name, "ok": ok, "instances": inst, "delete_all_ms": delete_ms, "delete_errors": gone_errors,
           "failed_instances": sum(1 for r in inst if not r.get("ok")), "sdk_transport_retries": retries_since(mark)}
    if all(r.get("ok") for r in inst):
        res["last_create_ms"] = max(r["create_ms"] for r in inst)
        res["last_first_command_ms"] = max(r["first_command_ms"] for r in inst)
    if not ok:
        log(f"{svc.name}: burst FAILED: {res['failed_instances']} instance(s), "
            + "; ".join([r.get('error', '') for r in inst if not r.get('ok')][:3] + gone_errors[:3]))
    return res


async def main_loop(args, sides: dict, res: dict) -> None:
    rng = random.Random(args.seed)
    names = list(sides)
    conns = {}
    for n, s in sides.items():
        s.start()
        conns[n] = async_connection(s.domain())
    first = rng.randrange(len(names))
    total = args.burst_warmup + args.bursts
    for i in range(total):
        formal = i >= args.burst_warmup
        order = names[(first + i) % len(names):] + names[:(first + i) % len(names)]
        for n in order:
            await asyncio.sleep(rng.uniform(0.5, 1.0))  # let the previous burst's teardown settle
            b = await one_burst(sides[n], conns[n], args.image, args.burst_size)
            b.update(index=i - args.burst_warmup if formal else i, position=order.index(n))
            res["bursts" if formal else "warmup"][n].append(b)
        log(f"  {'burst' if formal else 'warm-up'} {i - args.burst_warmup if formal else i}: " + "  ".join(
            f"{n} {res['bursts' if formal else 'warmup'][n][-1].get('last_create_ms', float('nan')):.0f}/"
            f"{res['bursts' if formal else 'warmup'][n][-1].get('last_first_command_ms', float('nan')):.0f} ms"
            for n in names))
    for s in sides.values():
        s.stop()


def run(args) -> dict:
    work = workdir(args, "burst")
    res = {"experiment": "burst", "seed": args.seed, "image": args.image, "burst_size": args.burst_size,
           "bursts": None, "warmup_pairs": args.burst_warmup, "resource": RESOURCE,
           "pvisor_warm_workers": args.pvisor_warm_workers if args.pvisor_warm_workers is not None else "default (2)"}
    with opened_sides(args, work, [args.image], warm_workers=args.pvisor_warm_workers) as sides:
        names = list(sides)
        res["sides"] = {n: s.describe() for n, s in sides.items()}
        res["bursts"] = {n: [] for n in names}
        res["warmup"] = {n: [] for n in names}
        log(f"burst: {args.burst_warmup} warm-up pairs + {args.bursts} pairs of {args.burst_size}")
        asyncio.run(main_loop(args, sides, res))
    res["summary"] = summarize(res["bursts"], args.seed)
    return res


def summarize(bursts: dict, seed: int) -> dict:
    return summarize_sides(bursts, METRICS, seed, center="median")


LABELS = {"last_create_ms": "all creates returned", "last_first_command_ms": "all first commands done"}


def report(res: dict, out) -> str:
    from lib.report import ci_text, fmt, ratio_cell
    from lib.svg import dots_boxes
    summ = res["summary"]
    names = [n for n in ("pvisor", "peer") if n in summ]
    lines = [f"### Burst ({res['burst_size']} concurrent creates, {summ[names[0]]['n']} bursts per side after "
             f"{res['warmup_pairs']} warm-up pairs; image `{res['image']}`; pvisor warm workers: "
             f"{res['pvisor_warm_workers']})", "",
             "| figure (from barrier release) | " + " | ".join(f"{n} median (ms) [95% CI]" for n in names)
             + (" | pvisor / peer [95% CI] |" if "paired" in summ else " |"),
             "|---|" + "---:|" * len(names) + ("---:|" if "paired" in summ else "")]
    for m in METRICS:
        cells = []
        for n in names:
            # No CI where no pair completed (a side whose every burst failed): the table says so below.
            ci = summ["paired"][m].get(f"ci95_median_{'a' if n == 'pvisor' else 'b'}") if "paired" in summ else None
            cells.append(fmt(summ[n]["median"][m]) + (f" [{ci_text(ci)}]" if ci else ""))
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |"
                     + (f" {ratio_cell(summ['paired'][m])} |" if "paired" in summ else ""))
    lines += ["", "Failed bursts: " + ", ".join(f"{n}: {summ[n]['failed']} of {summ[n]['n']}" for n in names)
              + " (a burst fails if any of its instances fails or is not gone after delete). Retries inside the "
              "SDK's transport during formal bursts (e.g. /ping while a sandbox comes up; the harness never retries): "
              + ", ".join(f"{n}: {summ[n]['sdk_transport_retries']}" for n in names) + ".", ""]
    failures = [(n, b["index"], r.get("error")) for n in names for b in res["bursts"][n] for r in b["instances"]
                if not r.get("ok")]
    if any(summ[n]["failed"] == summ[n]["n"] for n in names):
        lines += ["**" + ", ".join(n for n in names if summ[n]["failed"] == summ[n]["n"])
                  + ": every burst failed; its figures are empty (–).**", ""]
    if failures:
        lines += ["Failed instances:", ""] + [f"- {n} burst {i}: {e}" for n, i, e in failures[:20]] + [""]
    panels = [{"label": LABELS[m], "paired": True,
               "sides": [(n, [b.get(m) if b["ok"] else None for b in res["bursts"][n]]) for n in names]}
              for m in METRICS]
    dots_boxes(out / "burst.svg", f"Burst of {res['burst_size']}: time from barrier release", "ms", panels,
               note="dots: bursts; lines join the pair; boxes: quartiles, whiskers: min-max")
    lines += ["![burst](burst.svg)", ""]
    return "\n".join(lines)


def targets(res: dict) -> list[str]:
    from lib.report import target_row
    p = res["summary"].get("paired")
    if not p or not p.get("complete_pairs"):
        return []
    m = p["last_first_command_ms"]
    return [target_row(f"burst: all {res['burst_size']} first commands", m["ratio_a_over_b"], 0.2,
                       m["ci95_ratio_a_over_b"])]
