"""pvisor benchmark harness: pvisor against the official OpenSandbox server on
Docker (the peer), driven by the same unmodified OpenSandbox SDK.

Experiments are subcommands (bench/README.md explains each):
  startup   SDK create and create → first checked command (restart and steady)
  burst     ten creates released by one barrier
  throughput  create → checked command → delete cycles/s with 1, 4 and 16 clients
  disk      allocated bytes of the image inventory
  memory    cgroup-charged memory of each whole side, by phase
  imagefs   the image pool (pvisor only)
  snapshot  snapshot of a sandbox that wrote 100 MiB, restore create vs normal create (pvisor only)
  code      the code interpreter: first and warm codes.run("1+1") vs python3 -c (pvisor only)
  template  SDK create from a template (a sandbox started ahead) vs a plain create (pvisor only)
  vm        the vm backend: test-guest first exit, VMM RSS without guest memory, and (hardware
            virtualization only) SDK create on vm vs ns
  network   the sandbox network against tests/networld: 100 MiB download, connect P50,
            create with networking on vs none, idle pvisor-netd memory (vs Docker's bridge)
  vmhost    the vm backend under the project's own VMM in the KVM test host (run it there:
            scripts/kvm-host.sh bench/run vmhost ...): memory beside ns, templates and merging,
            density, VMM RSS, create time vs QEMU microvm under KVM, template and snapshot restores
  all       every experiment, one after the other, plus summary.md

`startup --pvisor-only` is the CI smoke mode (no Docker, a few seconds).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import common  # noqa: E402
from lib.common import IMAGE_FILES, REPO, environment, log  # noqa: E402

EXPERIMENTS = ("startup", "burst", "throughput", "disk", "memory", "imagefs", "vm", "network", "snapshot", "code",
               "template", "vmhost")
# Experiments `all` leaves out: vmhost runs only where hardware virtualization exists (the KVM
# test host of scripts/kvm-host.sh).
NOT_IN_ALL = ("vmhost",)
# Experiments with no peer side (their yardsticks are the host and pvisor itself).
PVISOR_ONLY = ("imagefs", "snapshot", "code", "template", "vmhost")
# Experiments whose peer takes part only in some parts; their result says whether it did
# (`used_peer`). vm: only its SDK part has a peer, and that part needs hardware virtualization.
PEER_OPTIONAL = ("vm",)
# Experiments whose yardstick is not the OpenSandbox server (network: a plain Docker container
# and the host); their module's yardstick(res) says what was compared.
OWN_YARDSTICK = ("network",)


def module(name: str):
    import importlib
    return importlib.import_module(f"experiments.{name}")


def peer_env() -> dict:
    from lib.common import out
    from lib.peer import PEER_VENV, SERVER_VERSION
    return {"opensandbox_server": SERVER_VERSION, "peer_venv": str(PEER_VENV),
            "dockerd": out(["dockerd", "--version"]), "containerd": out(["containerd", "--version"]),
            "runc": (out(["runc", "--version"]).splitlines() or [""])[0], "go": out(["go", "version"])}


def run_one(name: str, args) -> dict:
    mod = module(name)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    load0 = open("/proc/loadavg").read().split()[:3]
    log(f"== {name}")
    if name in PVISOR_ONLY:
        args = argparse.Namespace(**{**vars(args), "pvisor_only": True})
    res = mod.run(args)
    used_peer = not getattr(args, "pvisor_only", False) and res.get("used_peer", True) and name not in OWN_YARDSTICK
    res["env"] = environment({"loadavg_at_start": load0, "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
                              "duration_s": round(time.time() - t0, 1),
                              **({"peer": peer_env()} if used_peer else {})})
    res["argv"] = sys.argv[1:]
    if used_peer:
        from lib.peer import STANDIN_NOTE
        res["peer_substitution"] = STANDIN_NOTE
    (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(render(name, res, out))
    return res


def render(name: str, res: dict, out: Path) -> str:
    """NAME.md and the plots, from a result (fresh, or reloaded by `report`)."""
    pvisor_only = "peer_substitution" not in res
    md = module(name).report(res, out)
    if not pvisor_only or name in OWN_YARDSTICK:
        md += "\n" + targets_md(name, res)
    md = header(name, res, pvisor_only) + md
    (out / f"{name}.md").write_text(md)
    return md


def pvisor_failed(res: dict) -> int:
    """Failed pvisor samples in a result (peer failures are reported, not fatal)."""
    n = 0
    for sc in res.get("scenarios", {}).values():
        n += sum(1 for r in sc["samples"].get("pvisor", []) if not r["ok"])
    n += sum(1 for b in (res.get("bursts") or {}).get("pvisor", []) if not b["ok"])
    n += sum(1 for r in res.get("results", {}).get("pvisor", []) if not r["ok"])
    n += res.get("pvisor_failures", 0)
    return n


def header(name: str, res: dict, pvisor_only: bool) -> str:
    env = res["env"]
    lines = [f"# pvisor benchmark: {name}", "",
             f"Run {env['time_utc']} on {env['os']}, kernel {env['kernel']}, {env['nproc']} × {env['cpu']}, "
             f"{env['mem_total_kib'] // 1024} MiB RAM; load average at start {' '.join(env['loadavg_at_start'])}, "
             f"at end {' '.join(env['loadavg_at_end'])}; git {env['git_head'][:12]}"
             f"{' (dirty tree)' if env['git_dirty'] else ''}; seed {res.get('seed')}.", ""]
    if name in OWN_YARDSTICK:
        pass  # the experiment's report opens with its yardsticks
    elif name in PVISOR_ONLY:
        lines += ["pvisor only by design: the yardsticks are the host and pvisor's own warm runs.", ""]
    elif name in PEER_OPTIONAL and pvisor_only:
        lines += ["pvisor only: the peer takes part only in this experiment's SDK part, which did not run with "
                  "one (skipped, or --pvisor-only).", ""]
    elif pvisor_only:
        lines += ["pvisor only (smoke mode); no peer.", ""]
    else:
        pe = env.get("peer", {})
        if name == "disk":
            lines += [f"Peer: {pe.get('dockerd')} ({pe.get('containerd')}), overlay2; dockerd alone (no server, "
                      "no networking) for the image store.", ""]
        else:
            lines += [f"Peer: opensandbox-server {pe.get('opensandbox_server')} on {pe.get('dockerd')} "
                      f"({pe.get('containerd')}, runc {pe.get('runc')}), overlay2, bridge networking, "
                      "ports published on 127.0.0.1.", ""]
        if name != "disk":
            lines += [f"**Substitution:** {res['peer_substitution']}", ""]
    if name != "disk" and name not in PVISOR_ONLY and name not in OWN_YARDSTICK \
            and not (name in PEER_OPTIONAL and pvisor_only):
        lines += [f"Both sides driven by the unmodified OpenSandbox Python SDK {env['opensandbox_sdk']}, one shared "
                  "SDK transport per service start; SDK telemetry "
                  + ("on." if env.get("sdk_metrics") else "off on both sides (`disable_metrics`)."), ""]
    return "\n".join(lines) + "\n"


def targets_md(name: str, res: dict) -> str:
    rows = module(name).targets(res) if hasattr(module(name), "targets") else []
    if not rows:
        return ""
    title = "#### Targets (same run)" if name in OWN_YARDSTICK else "#### Targets (ratio pvisor / peer, same run)"
    return "\n".join([title, "",
                      "| target | measured | limit | verdict |", "|---|---:|---:|---|", *rows, ""]) + "\n"


def run_all(args) -> int:
    out = Path(args.out)
    results = {}
    for name in (e for e in EXPERIMENTS if e not in NOT_IN_ALL):
        a = argparse.Namespace(**vars(args))
        try:
            results[name] = run_one(name, a)
        except Exception as e:
            log(f"{name} FAILED: {type(e).__name__}: {e}")
            results[name] = None
            import traceback
            traceback.print_exc()
    write_summary(out, results)
    ok = all(r is not None and not pvisor_failed(r) for r in results.values())
    return 0 if ok else 1


def rereport(args) -> int:
    """Re-render NAME.md, the plots and summary.md from the JSON files in a results dir."""
    out = Path(args.dir)
    results = {}
    for name in EXPERIMENTS:
        f = out / f"{name}.json"
        if not f.exists():
            continue
        res = json.loads(f.read_text())
        mod = module(name)
        if hasattr(mod, "resummarize"):
            mod.resummarize(res)
            f.write_text(json.dumps(res, indent=1, default=str) + "\n")
        render(name, res, out)
        results[name] = res
    if len(results) > 1:
        write_summary(out, results)
    log(f"re-rendered {', '.join(results)} in {out}")
    return 0


def write_summary(out: Path, results: dict) -> None:
    lines = ["# pvisor benchmark: summary", ""]
    rows = []
    for name, res in results.items():
        if res is not None and hasattr(module(name), "targets"):
            rows += module(name).targets(res)
    lines += ["| target | measured | limit | verdict |", "|---|---:|---:|---|", *rows, "",
              "Details: " + ", ".join(f"[{n}]({n}.md)" for n, r in results.items() if r is not None), ""]
    (out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="experiment", required=True)

    def common_args(p):
        p.add_argument("--seed", type=int, default=20261130)
        p.add_argument("--out", default=str(REPO / "bench/out"))
        p.add_argument("--workdir", default="/var/tmp", help="where the per-run work dir is created")
        p.add_argument("--keep-workdir", action="store_true")
        p.add_argument("--image", default="python:3.11-slim", help="sandbox image (startup, burst, memory)")
        p.add_argument("--image-file", default=None, help=argparse.SUPPRESS)  # accepted for compatibility
        p.add_argument("--sdk-metrics", action="store_true",
                       help="leave the SDK's per-create telemetry POST on (off by default, on both sides)")

    for name in EXPERIMENTS:
        p = sub.add_parser(name, help=module(name).__doc__.strip().splitlines()[0])
        common_args(p)
        p.add_argument("--pvisor-only", action="store_true", help="no peer (smoke mode)")
        module(name).add_args(p)
    p = sub.add_parser("all", help="every experiment, then summary.md")
    common_args(p)
    p.add_argument("--pvisor-only", action="store_true")
    for name in EXPERIMENTS:
        if name not in NOT_IN_ALL:
            module(name).add_args(p)
    p = sub.add_parser("report", help="re-render the Markdown and plots of a results dir from its JSON")
    p.add_argument("dir")
    args = ap.parse_args()
    if args.experiment == "report":
        return rereport(args)
    common.SDK_METRICS = args.sdk_metrics
    if getattr(args, "image", None) and args.image not in IMAGE_FILES:
        ap.error(f"--image must be one of {', '.join(IMAGE_FILES)}")
    if args.experiment == "all":
        return run_all(args)
    res = run_one(args.experiment, args)
    bad = pvisor_failed(res)
    if bad:
        log(f"{bad} pvisor sample(s) failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
