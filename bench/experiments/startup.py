"""Experiment 1: startup.

Two scenarios, each with N seeded, randomized pairs of fresh sandboxes (one
per side; which side goes first alternates, the first pair's order is drawn
from the seed, and a seeded random pause of 50-250 ms precedes every sample):

- first_after_restart: the side's service is restarted right before its sample
  (pvisor: the broker; peer: opensandbox-server, dockerd keeps running);
- steady: services stay up; W warm-up samples per side first (reported apart).

Clocks per sample (perf_counter, in the harness): SDK create return, and
completion of the first checked command; additional wait = the difference.
Every sample then deletes the sandbox and checks GET -> 404.
"""
from __future__ import annotations

import random
import time
import traceback
from datetime import timedelta

from opensandbox import SandboxSync

from lib.common import SDK_RETRIES, RESOURCE, checked_first_command, log, retries_since, verify_deleted
from lib.sides import opened_sides, workdir
from lib.stats import summarize_sides

METRICS = ("create_ms", "first_command_ms", "additional_wait_ms")
SCENARIOS = ("first_after_restart", "steady")


def add_args(p) -> None:
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steady scenario: warm-up samples per side")


def one_sample(svc, image: str, extensions: dict | None = None) -> dict:
    """One fresh sandbox: create, checked first command, delete, check gone. `extensions` go
    into the create request when given (the vm experiment picks pvisor's backend with them)."""
    rec = {"side": svc.name, "ok": False}
    sb = None
    mark = len(SDK_RETRIES.events)
    try:
        t0 = time.perf_counter()
        sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                resource=RESOURCE, **({"extensions": extensions} if extensions else {}))
        t1 = time.perf_counter()
        rec["sandbox_id"] = sb.id
        checked_first_command(sb)
        t2 = time.perf_counter()
        rec.update(create_ms=(t1 - t0) * 1e3, first_command_ms=(t2 - t0) * 1e3, additional_wait_ms=(t2 - t1) * 1e3)
        sb.kill()
        t3 = time.perf_counter()
        rec["delete_ms"] = (t3 - t2) * 1e3
        verify_deleted(svc.base_url, sb.id)
        rec["ok"] = True
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc(limit=4)
        log(f"{svc.name}: sample FAILED: {rec['error']}")
        if sb is not None:
            try:
                sb.kill()
            except Exception:
                pass
    rec["sdk_transport_retries"] = retries_since(mark)
    return rec


def run(args) -> dict:
    rng = random.Random(args.seed)
    work = workdir(args, "startup")
    res = {"experiment": "startup", "seed": args.seed, "image": args.image, "pairs": args.pairs,
           "warmup": args.warmup, "resource": RESOURCE, "scenarios": {}}
    with opened_sides(args, work, [args.image]) as sides:
        names = list(sides)
        res["sides"] = {n: s.describe() for n, s in sides.items()}
        first = rng.randrange(len(names))
        for scenario in SCENARIOS:
            log(f"startup/{scenario}: {args.pairs} pairs")
            sc = {"warmup": {n: [] for n in names}, "samples": {n: [] for n in names}, "order": []}
            if scenario == "steady":
                for s in sides.values():
                    s.start()
                for _ in range(args.warmup):
                    for n in names:
                        sc["warmup"][n].append(one_sample(sides[n], args.image))
            for i in range(args.pairs):
                order = names[(first + i) % len(names):] + names[:(first + i) % len(names)]
                sc["order"].append(order)
                for n in order:
                    svc = sides[n]
                    if scenario == "first_after_restart":
                        svc.restart() if svc.proc else svc.start()
                    pause = rng.uniform(0.05, 0.25)
                    time.sleep(pause)
                    rec = one_sample(svc, args.image)
                    rec.update(index=i, pause_s=pause, position=order.index(n))
                    sc["samples"][n].append(rec)
                log(f"  pair {i}: " + "  ".join(
                    f"{n} {sc['samples'][n][-1].get('create_ms', float('nan')):.0f}/"
                    f"{sc['samples'][n][-1].get('first_command_ms', float('nan')):.0f} ms" for n in names))
            for s in sides.values():
                s.stop()
            sc["summary"] = summarize(sc["samples"], args.seed)
            res["scenarios"][scenario] = sc
    return res


def summarize(samples: dict, seed: int) -> dict:
    return summarize_sides(samples, METRICS, seed, center="p50")


LABELS = {"create_ms": "SDK create", "first_command_ms": "create → first checked command",
          "additional_wait_ms": "additional wait (first command − create)"}


def report(res: dict, out) -> str:
    from lib.report import ci_text, fmt, ratio_cell
    from lib.svg import dots_boxes
    lines = [f"### Startup ({res['pairs']} pairs per scenario, image `{res['image']}`, "
             f"resource {res['resource']['cpu']} CPU / {res['resource']['memory']})", ""]
    for scenario, sc in res["scenarios"].items():
        summ = sc["summary"]
        names = [n for n in ("pvisor", "peer") if n in summ]
        lines += [f"**{scenario}**", "",
                  "| figure | " + " | ".join(f"{n} P50 (ms) [95% CI]" for n in names)
                  + (" | pvisor / peer [95% CI] |" if "paired" in summ else " |"),
                  "|---|" + "---:|" * len(names) + ("---:|" if "paired" in summ else "")]
        for m in METRICS:
            cells = []
            for n in names:
                ci = summ["paired"][m][f"ci95_median_{'a' if n == 'pvisor' else 'b'}"] if "paired" in summ else None
                cells.append(f"{fmt(summ[n]['p50'][m])}" + (f" [{ci_text(ci)}]" if ci else ""))
            row = f"| {LABELS[m]} | " + " | ".join(cells) + " |"
            if "paired" in summ:
                row += f" {ratio_cell(summ['paired'][m])} |"
            lines.append(row)
        fails = ", ".join(f"{n}: {summ[n]['failed']} of {summ[n]['n']}" for n in names)
        retr = ", ".join(f"{n}: {summ[n].get('sdk_transport_retries', 0)}" for n in names)
        lines += ["", f"Failed samples: {fails}. Retries inside the SDK's transport during the samples "
                  f"(e.g. /ping while the sandbox comes up; the harness itself never retries): {retr}.", ""]
        errs = [(n, r["index"], r["error"]) for n in names for r in sc["samples"][n] if not r["ok"]]
        lines += [f"- {n} pair {i} failed: {e}" for n, i, e in errs] + ([""] if errs else [])
        panels = [{"label": LABELS[m].split(" (")[0], "paired": True,
                   "sides": [(n, [r.get(m) if r["ok"] else None for r in sc["samples"][n]]) for n in names]}
                  for m in METRICS]
        fname = f"startup-{scenario}.svg"
        dots_boxes(out / fname, f"Startup, {scenario.replace('_', ' ')}: per-sample wall time", "ms", panels,
                   note="dots: samples; lines join the pair; boxes: quartiles, whiskers: min-max")
        lines += [f"![startup {scenario}]({fname})", ""]
    return "\n".join(lines)


def targets(res: dict) -> list[str]:
    from lib.report import target_row
    st = res["scenarios"].get("steady", {}).get("summary", {}).get("paired")
    if not st or not st.get("complete_pairs"):
        return []
    return [target_row("steady SDK create P50", st["create_ms"]["ratio_a_over_b"], 0.1,
                       st["create_ms"]["ci95_ratio_a_over_b"]),
            target_row("steady create → first command P50", st["first_command_ms"]["ratio_a_over_b"], 0.1,
                       st["first_command_ms"]["ci95_ratio_a_over_b"])]
