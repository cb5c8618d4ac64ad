"""Template creates: SDK create from a template vs a plain create of the same settings (pvisor only).

One pvisor; one template (`SandboxManagerSync.create_template`) of the run's image with the
resource request the startup experiment uses and the SDK's default entrypoint
(`tail -f /dev/null`), so both arms ask for the same sandbox. N seeded pairs; each pair is one
plain create (`SandboxSync.create`) and one create from the template
(`SandboxSync.create_from_template`), in alternating order. Before every sample the harness
settles for --template-settle-ms (default 500 ms: past the 200 ms after which pvisor starts the
replacement warm worker and warm sandbox, so both arms start from a full stock) plus a seeded
random 0-100 ms. Clocks per sample as the startup experiment: SDK create return, and the first
checked command; each sample then deletes its sandbox and checks GET -> 404. A template
sample records whether it got a sandbox started ahead (its Created event says so), and the
report gives its figures over all template samples and over those hits.

The peer has no part: OpenSandbox's reference server answers template calls with 501 on the
Docker runtime (they need its Kubernetes fast-sandbox runtime).
"""
from __future__ import annotations

import random
import time
import traceback
from datetime import timedelta

import httpx
from opensandbox import SandboxSync
from opensandbox.models.templates import CreateTemplateRequest
from opensandbox.sync import SandboxManagerSync

from lib.common import SDK_RETRIES, RESOURCE, checked_first_command, log, retries_since, verify_deleted
from lib.sides import opened_sides, workdir
from lib.stats import five, median

METRICS = ("create_ms", "first_command_ms")
ARMS = ("plain", "template")


def add_args(p) -> None:
    p.add_argument("--template-pairs", type=int, default=20)
    p.add_argument("--template-warmup", type=int, default=3, help="warm-up pairs, reported apart")
    p.add_argument("--template-settle-ms", type=int, default=500)


def started_ahead(svc, sid: str) -> bool:
    r = httpx.get(f"{svc.base_url}/v1/sandboxes/{sid}/diagnostics/events", params={"scope": "lifecycle"}, timeout=30)
    return r.status_code == 200 and "started ahead" in r.json().get("content", "")


def one_sample(svc, arm: str, image: str, template_id: str) -> dict:
    rec = {"arm": arm, "ok": False}
    sb = None
    mark = len(SDK_RETRIES.events)
    try:
        t0 = time.perf_counter()
        if arm == "plain":
            sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                                    resource=RESOURCE)
        else:
            sb = SandboxSync.create_from_template(template_id, connection_config=svc.connection(),
                                                  timeout=timedelta(minutes=10))
        t1 = time.perf_counter()
        rec["sandbox_id"] = sb.id
        checked_first_command(sb)
        t2 = time.perf_counter()
        rec.update(create_ms=(t1 - t0) * 1e3, first_command_ms=(t2 - t0) * 1e3)
        if arm == "template":
            rec["started_ahead"] = started_ahead(svc, sb.id)
        sb.kill()
        verify_deleted(svc.base_url, sb.id)
        rec["ok"] = True
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc(limit=4)
        log(f"{arm}: sample FAILED: {rec['error']}")
        if sb is not None:
            try:
                sb.kill()
            except Exception:
                pass
    rec["sdk_transport_retries"] = retries_since(mark)
    return rec


def run(args) -> dict:
    rng = random.Random(args.seed)
    work = workdir(args, "template")
    res = {"experiment": "template", "seed": args.seed, "image": args.image, "pairs": args.template_pairs,
           "warmup": args.template_warmup, "settle_ms": args.template_settle_ms, "resource": RESOURCE,
           "pvisor_failures": 0}
    with opened_sides(args, work, [args.image]) as sides:
        svc = sides["pvisor"]
        res["sides"] = {"pvisor": svc.describe()}
        svc.start()
        m = SandboxManagerSync.create(connection_config=svc.connection())
        try:
            tpl = m.create_template(CreateTemplateRequest(image=args.image, publish="none",
                                                          resource_limits=dict(RESOURCE)))
        finally:
            m.close()
        res["template"] = tpl.model_dump(mode="json")
        samples = {a: [] for a in ARMS}
        warmup = {a: [] for a in ARMS}
        first = rng.randrange(2)
        for i in range(args.template_warmup + args.template_pairs):
            order = ARMS if (first + i) % 2 == 0 else ARMS[::-1]
            for arm in order:
                time.sleep(args.template_settle_ms / 1e3 + rng.uniform(0, 0.1))
                rec = one_sample(svc, arm, args.image, tpl.template_id)
                rec.update(index=i, position=order.index(arm))
                (warmup if i < args.template_warmup else samples)[arm].append(rec)
            log(f"  pair {i}: " + "  ".join(
                f"{a} {(warmup if i < args.template_warmup else samples)[a][-1].get('create_ms', float('nan')):.1f}/"
                f"{(warmup if i < args.template_warmup else samples)[a][-1].get('first_command_ms', float('nan')):.1f} ms"
                for a in ARMS))
        svc.stop()
    res["samples"], res["warmup_samples"] = samples, warmup
    res["pvisor_failures"] = sum(1 for a in ARMS for r in samples[a] if not r["ok"])
    res["summary"] = summarize(samples)
    return res


def summarize(samples: dict) -> dict:
    out = {}
    groups = {"plain": [r for r in samples["plain"] if r["ok"]],
              "template": [r for r in samples["template"] if r["ok"]],
              "template, started ahead": [r for r in samples["template"] if r["ok"] and r.get("started_ahead")]}
    for name, recs in groups.items():
        out[name] = {"n": len(recs), "p50": {m: median([r[m] for r in recs]) for m in METRICS},
                     "five": {m: five([r[m] for r in recs]) for m in METRICS}}
    out["failed"] = {a: sum(1 for r in samples[a] if not r["ok"]) for a in ARMS}
    out["started_ahead"] = len(groups["template, started ahead"])
    return out


def report(res: dict, out) -> str:
    from lib.report import fmt
    s = res["summary"]
    lines = [f"### Template creates ({res['pairs']} pairs, image `{res['image']}`, resource "
             f"{res['resource']['cpu']} CPU / {res['resource']['memory']}, settle {res['settle_ms']} ms)", "",
             "| arm | samples | SDK create P50 (ms) | create → first checked command P50 (ms) |",
             "|---|---:|---:|---:|"]
    for name in ("plain", "template", "template, started ahead"):
        g = s[name]
        lines.append(f"| {name} | {g['n']} | {fmt(g['p50']['create_ms'])} | {fmt(g['p50']['first_command_ms'])} |")
    p, t = s["plain"]["p50"]["create_ms"], s["template"]["p50"]["create_ms"]
    ratio = f"{t / p:.2f}" if p and t else "n/a"
    lines += ["", f"Template / plain SDK create P50: {ratio}. Template samples that got a sandbox started "
                  f"ahead: {s['started_ahead']} of {s['template']['n']}. Failed samples: "
                  f"plain {s['failed']['plain']}, template {s['failed']['template']}.", ""]
    for name in ("plain", "template", "template, started ahead"):
        f = s[name]["five"]["create_ms"]
        if f.get("n"):
            lines.append(f"- {name} SDK create min / q1 / median / q3 / max: "
                         + " / ".join(fmt(f[k]) for k in ("min", "q1", "median", "q3", "max")) + " ms")
    return "\n".join(lines) + "\n"
