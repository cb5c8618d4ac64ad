"""Experiment: the code interpreter (pvisor only; the yardstick is `python3 -c` in the same sandbox).

R rounds, each in a fresh sandbox of `--image` (python:3.11-slim) wrapped by the
official `opensandbox-code-interpreter` SDK (`CodeInterpreterSync.create`, with its
readiness check):
- first run: the first `codes.run("1+1")` after `CodeInterpreterSync.create` (it
  starts the default python context's driver);
- warm runs: `--code-warm` (20) more `codes.run("1+1")` in that context;
- yardstick: as many `commands.run('python3 -c "print(1+1)"')` in the same sandbox,
  alternating with the warm runs.
Every sample is checked (result text "2", stdout "2"). Clocks: time.perf_counter
around the SDK call, client side. Reported: P50 and P90 of each, and the create →
ready time of the interpreter.

Target (issue 11): warm run P50 <= 5 ms. Not a gate.
"""
from __future__ import annotations

import time
from datetime import timedelta

from opensandbox import SandboxSync

from lib.common import RESOURCE, log, rm_tree
from lib.pvisor_side import PvisorService
from lib.sides import workdir
from lib.stats import median, quantile

WARM_TARGET_MS = 5.0
YARDSTICK = 'python3 -c "print(1+1)"'


def add_args(p) -> None:
    p.add_argument("--code-rounds", type=int, default=10)
    p.add_argument("--code-warm", type=int, default=20)


def timed(f):
    t = time.perf_counter()
    v = f()
    return v, (time.perf_counter() - t) * 1e3


def check_run(ex) -> None:
    texts = [r.text for r in ex.result]
    if ex.error is not None or texts != ["2"]:
        raise AssertionError(f"codes.run('1+1') gave results {texts}, error {ex.error}")


def check_cmd(ex) -> None:
    out = "".join(m.text for m in ex.logs.stdout).strip()
    if ex.exit_code != 0 or out != "2":
        raise AssertionError(f"{YARDSTICK} exited {ex.exit_code} with stdout {out!r}")


def one_round(svc: PvisorService, image: str, warm: int) -> dict:
    from code_interpreter import CodeInterpreterSync

    row = {"ok": False}
    sb = SandboxSync.create(image, connection_config=svc.connection(), timeout=timedelta(minutes=10),
                            resource=RESOURCE)
    try:
        interp, row["ready_ms"] = timed(lambda: CodeInterpreterSync.create(sb))
        try:
            ex, row["first_ms"] = timed(lambda: interp.codes.run("1+1"))
            check_run(ex)
            row["warm_ms"], row["yardstick_ms"] = [], []
            for _ in range(warm):
                ex, ms = timed(lambda: interp.codes.run("1+1"))
                check_run(ex)
                row["warm_ms"].append(ms)
                ex, ms = timed(lambda: sb.commands.run(YARDSTICK))
                check_cmd(ex)
                row["yardstick_ms"].append(ms)
            row["ok"] = True
        finally:
            interp.close()
    except Exception as e:  # noqa: BLE001 - a failed sample is recorded, never dropped
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        sb.kill()
        sb.close()
    return row


def run(args) -> dict:
    work = workdir(args, "code")
    image = args.image
    res = {"experiment": "code", "seed": args.seed, "resource": RESOURCE, "image": image,
           "rounds_requested": args.code_rounds, "warm_per_round": args.code_warm}
    try:
        svc = PvisorService(work / "svc", [image])
        svc.start()
        try:
            res["service"] = svc.describe()
            rounds = []
            for r in range(args.code_rounds):
                row = one_round(svc, image, args.code_warm)
                if row["ok"]:
                    log(f"  round {r}: ready {row['ready_ms']:.0f} ms, first {row['first_ms']:.1f} ms, "
                        f"warm P50 {median(row['warm_ms']):.2f} ms, python3 -c P50 {median(row['yardstick_ms']):.1f} ms")
                else:
                    log(f"  round {r}: FAILED {row['error']}")
                rounds.append(row)
            res["rounds"] = rounds
            resummarize(res)
        finally:
            svc.close()
    finally:
        if not args.keep_workdir:
            rm_tree(work)
    return res


def resummarize(res: dict) -> None:
    good = [r for r in res["rounds"] if r["ok"]]
    res["pvisor_failures"] = len(res["rounds"]) - len(good)
    if not good:
        res["summary"] = None
        return
    first = [r["first_ms"] for r in good]
    warm = [ms for r in good for ms in r["warm_ms"]]
    yard = [ms for r in good for ms in r["yardstick_ms"]]
    ready = [r["ready_ms"] for r in good]
    res["summary"] = {
        name: {"p50": median(xs), "p90": quantile(xs, 0.9), "n": len(xs)}
        for name, xs in (("ready", ready), ("first", first), ("warm", warm), ("yardstick", yard))
    }


def targets(res: dict) -> list[str]:
    s = res.get("summary")
    if not s:
        return []
    warm = s["warm"]["p50"]
    return [f"| warm `codes.run(\"1+1\")` P50 | {warm:.2f} ms | {WARM_TARGET_MS:.0f} ms | "
            f"{'met' if warm <= WARM_TARGET_MS else 'missed'} |"]


def report(res: dict, out) -> str:
    s = res.get("summary")
    lines = [f"### Code interpreter in {res['image']} ({len(res['rounds'])} rounds, "
             f"{res['warm_per_round']} warm runs each)", ""]
    if not s:
        lines += ["Every round failed:", ""] + [f"- {r.get('error')}" for r in res["rounds"]] + [""]
        return "\n".join(lines) + "\n"
    lines += ["| measurement | P50 (ms) | P90 (ms) | samples |", "|---|---:|---:|---:|"]
    for key, label in (("ready", "`CodeInterpreterSync.create` (readiness check)"),
                       ("first", "first `codes.run(\"1+1\")` (starts the driver)"),
                       ("warm", "warm `codes.run(\"1+1\")`"),
                       ("yardstick", f"yardstick: `commands.run('{YARDSTICK}')`")):
        lines.append(f"| {label} | {s[key]['p50']:.2f} | {s[key]['p90']:.2f} | {s[key]['n']} |")
    lines += ["", f"Warm run / yardstick (P50): {s['warm']['p50'] / s['yardstick']['p50']:.2f}.", ""]
    failed = [r for r in res["rounds"] if not r["ok"]]
    if failed:
        lines += [f"{len(failed)} failed round(s):", ""] + [f"- {r['error']}" for r in failed] + [""]
    lines += ["#### Targets", "", "| target | measured | limit | verdict |", "|---|---:|---:|---|",
              *targets(res), ""]
    return "\n".join(lines) + "\n"
