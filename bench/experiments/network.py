"""Experiment 7: the sandbox network (issue 9, "Numbers").

Against the private internet of tests/networld (set up by the harness, torn down at the
end if it built it), the same stdlib client (bench/lib/netclient.py) runs in three
places in the same run:

  pvisor   a python:3.11-slim sandbox of `pvisor serve --net-dns 198.51.100.53`, with the
           policy deny-all + allow allowed.test (so every connection goes through a rule)
  docker   a python:3.11-slim container on Docker's bridge (a private dockerd: Debian's
           docker.io, bridge networking, NAT), unless --pvisor-only or Docker is unusable
  host     the host's own root namespace (the wire without any sandbox)

Figures:
- download: `--downloads` (5) HTTP downloads of 100 MiB (`GET /bytes/104857600`, generated
  by the server, never from disk) from 203.0.113.10; the first one's body is sha256-checked
  and not timed. Median Mbit/s. Target: pvisor >= 1 Gbit/s.
- connect: `--connects` (1,000) sequential TCP connects to allowed.test:5432 (by name in the
  sandbox, resolved once through its resolver; by IP elsewhere), each closed at once. P50
  and P90 µs. Target: pvisor P50 - docker P50 (host P50 without docker) <= 1 ms.
- create: SDK create P50 with networking on (policy given) vs a second `pvisor serve
  --default-egress none`, `--creates` (30) samples each after 2 warm-ups, alternating.
  Target: on - none <= 3 ms.
- netd memory: with `--idle` (3) idle sandboxes up, RSS and PSS (/proc/PID/smaps_rollup)
  of every pvisor-netd beneath the broker (the warm workers' included: they start theirs
  ahead of a create), median. Target: RSS <= 2 MiB.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

from opensandbox import SandboxSync
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

from lib.common import BENCH, IMAGE_FILES, IMAGES, REPO, RESOURCE, log
from lib.pvisor_side import PvisorService
from lib.sides import workdir
from lib.stats import five, median, quantile

sys.path.insert(0, str(REPO / "tests"))
from networld import addresses as NW  # noqa: E402

IMAGE = "python:3.11-slim"
CLIENT = BENCH / "lib/netclient.py"
THROUGHPUT_TARGET_MBIT = 1000.0
CONNECT_ADDED_TARGET_US = 1000.0
CREATE_ADDED_TARGET_MS = 3.0
NETD_RSS_TARGET_MIB = 2.0


def add_args(p) -> None:
    p.add_argument("--downloads", type=int, default=5, help="network: timed 100 MiB downloads per side")
    p.add_argument("--download-mib", type=int, default=100, help="network: size of each download")
    p.add_argument("--connects", type=int, default=1000, help="network: sequential connects per side")
    p.add_argument("--creates", type=int, default=30, help="network: SDK creates per arm (on / none)")
    p.add_argument("--idle", type=int, default=3, help="network: idle sandboxes whose netd memory is read")


def bench_policy() -> NetworkPolicy:
    return NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="allowed.test")])


# ---------------------------------------------------------------- the three places


class HostPlace:
    name = "host"
    target = NW.WEB_A

    def client(self, *args) -> dict:
        r = subprocess.run([sys.executable, str(CLIENT), *map(str, args)], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"host client {args}: {r.stderr[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        pass


class SandboxPlace:
    name = "pvisor"
    target = "allowed.test"

    def __init__(self, svc: PvisorService):
        self.sb = SandboxSync.create(IMAGE, connection_config=svc.connection(), resource=RESOURCE,
                                     network_policy=bench_policy())
        self.sb.files.write_file("/tmp/netclient.py", CLIENT.read_text())

    def client(self, *args) -> dict:
        ex = self.sb.commands.run("python3 /tmp/netclient.py " + shlex.join(map(str, args)))
        text = "".join(m.text for m in ex.logs.stdout).strip()
        if ex.exit_code != 0 or not text:
            err = "".join(m.text for m in ex.logs.stderr)
            raise RuntimeError(f"sandbox client {args}: exit {ex.exit_code}: {err[-2000:]}")
        return json.loads(text.splitlines()[-1])

    def close(self) -> None:
        try:
            self.sb.kill()
        finally:
            self.sb.close()


class DockerPlace:
    name = "docker"
    target = NW.WEB_A

    def __init__(self, work: Path):
        from lib.peer import Dockerd, NetGuard, ensure_apt

        ensure_apt({"/usr/sbin/dockerd": "docker.io", "/usr/sbin/iptables": "iptables"})
        self.net = NetGuard()
        self.dockerd = Dockerd(work, network=True)
        self.ctr = None
        try:
            self.dockerd.start()
            self.dockerd.load(IMAGES / IMAGE_FILES[IMAGE])
            self.ctr = self.dockerd.docker("run", "-d", "--network", "bridge", "--memory", "512m", "--cpus", "1",
                                           IMAGE, "sleep", "infinity", capture=True).strip()
            if not self.ctr:
                raise RuntimeError("docker run gave no container id")
            self.dockerd.docker("cp", CLIENT, f"{self.ctr}:/tmp/netclient.py")
        except BaseException:
            self.close()
            raise

    def client(self, *args) -> dict:
        from lib.peer import DOCKER

        r = subprocess.run([DOCKER, "exec", self.ctr, "python3", "/tmp/netclient.py", *map(str, args)],
                           env=self.dockerd.env(), capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"docker client {args}: {r.stderr[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        try:
            self.dockerd.stop()
        finally:
            self.net.restore()


# ---------------------------------------------------------------- measurements


def measure_place(place, args) -> dict:
    size = args.download_mib << 20
    rec: dict = {"ok": False}
    try:
        first = place.client("download", place.target, NW.HTTP_PORT, size, "verify")
        from networld import payload

        if first.get("sha256") != payload.digest(size):
            raise RuntimeError(f"{place.name}: the download's sha256 does not match the payload")
        secs = [place.client("download", place.target, NW.HTTP_PORT, size)["seconds"] for _ in range(args.downloads)]
        rec["download_seconds"] = secs
        rec["download_mbit"] = [size * 8 / s / 1e6 for s in secs]
        us = place.client("connects", place.target, NW.TCP_ECHO_PORT, args.connects)["us"]
        rec["connect_us"] = us
        rec["connect"] = {"p50": quantile(us, 0.5), "p90": quantile(us, 0.9), "five": five(us)}
        rec.pop("connect_us")  # the summary is enough; 1,000 numbers per side bloat the JSON
        rec["download"] = {"median_mbit": median(rec["download_mbit"]), "five": five(rec["download_mbit"])}
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - recorded, reported
        rec["error"] = f"{type(e).__name__}: {e}"
        log(f"{place.name}: {rec['error']}")
        traceback.print_exc()
    return rec


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        for c in children.get(p, []):
            out.append(c)
            stack.append(c)
    return out


def netd_memory(svc: PvisorService, count: int) -> dict:
    boxes = []
    try:
        for _ in range(count):
            boxes.append(SandboxSync.create(IMAGE, connection_config=svc.connection(), resource=RESOURCE,
                                            network_policy=bench_policy()))
        time.sleep(2)  # idle
        rows = []
        for pid in descendants(svc.proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != "pvisor-netd":
                    continue
                roll = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
            except OSError:
                continue
            kib = {ln.split()[0].rstrip(":"): int(ln.split()[1]) for ln in roll[1:] if len(ln.split()) >= 2}
            rows.append({"pid": pid, "rss_kib": kib.get("Rss", 0), "pss_kib": kib.get("Pss", 0)})
        return {"sandboxes": count, "netd": rows, "ok": len(rows) >= count,
                "rss_kib_median": median([r["rss_kib"] for r in rows]) if rows else None,
                "pss_kib_median": median([r["pss_kib"] for r in rows]) if rows else None,
                **({} if len(rows) >= count else {"error": f"found {len(rows)} pvisor-netd for {count} sandboxes"})}
    except Exception as e:  # noqa: BLE001 - recorded
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        for sb in boxes:
            try:
                sb.kill()
            except Exception:  # noqa: BLE001
                pass
            sb.close()


def create_arms(on: PvisorService, none: PvisorService, n: int) -> dict:
    samples = {"on": [], "none": []}
    errors = []
    arms = [("on", on, {"network_policy": bench_policy()}), ("none", none, {})]
    for i in range(n + 2):
        for name, svc, kw in arms if i % 2 == 0 else arms[::-1]:
            t0 = time.perf_counter()
            try:
                sb = SandboxSync.create(IMAGE, connection_config=svc.connection(), resource=RESOURCE, **kw)
            except Exception as e:  # noqa: BLE001
                errors.append(f"{name}: {type(e).__name__}: {e}")
                continue
            ms = (time.perf_counter() - t0) * 1000
            try:
                sb.kill()
            finally:
                sb.close()
            if i >= 2:
                samples[name].append(ms)
    out = {"samples_ms": samples, "errors": errors, "ok": not errors}
    for name, xs in samples.items():
        out[name] = {"p50": median(xs) if xs else None, "five": five(xs) if xs else None}
    if samples["on"] and samples["none"]:
        out["added_p50_ms"] = out["on"]["p50"] - out["none"]["p50"]
    return out


def run(args) -> dict:
    from networld import world

    why = world.missing_requirements()
    if why:
        raise RuntimeError(f"the private internet cannot be built: {why}")
    was_up = world.status() == "up"
    world.up()
    work = workdir(args, "network")
    res: dict = {"seed": args.seed, "download_bytes": args.download_mib << 20, "places": {}, "pvisor_failures": 0}
    places = [HostPlace()]
    services = []
    try:
        on = PvisorService(work / "pvisor", [IMAGE], serve_args=["--net-dns", NW.DNS])
        services.append(on)
        none = PvisorService(work / "pvisor-none", [IMAGE], pvisor=on.pvisor, serve_args=["--default-egress", "none"])
        services.append(none)
        on.start()
        none.start()
        res["pvisor"] = on.describe()
        if not args.pvisor_only:
            try:
                places.append(DockerPlace(work / "docker"))
            except Exception as e:  # noqa: BLE001 - the comparison falls back to the host
                res["docker_unusable"] = f"{type(e).__name__}: {e}"
                log(f"docker side unusable, comparing with the host only: {res['docker_unusable']}")
        else:
            res["docker_unusable"] = "--pvisor-only"
        try:
            places.append(SandboxPlace(on))
        except Exception as e:  # noqa: BLE001
            res["places"]["pvisor"] = {"ok": False, "error": f"sandbox create: {type(e).__name__}: {e}"}
        for place in places:
            log(f"network: {place.name}: {args.downloads} × {args.download_mib} MiB, {args.connects} connects")
            res["places"][place.name] = measure_place(place, args)
        log(f"network: create on vs none, {args.creates} each")
        res["create"] = create_arms(on, none, args.creates)
        log(f"network: netd memory of {args.idle} idle sandboxes")
        res["netd_memory"] = netd_memory(on, args.idle)
    finally:
        for p in places:
            try:
                p.close()
            except Exception as e:  # noqa: BLE001
                log(f"closing {p.name}: {e}")
        for s in services:
            s.close()
        if not was_up:
            world.down()
        if not args.keep_workdir:
            from lib.common import rm_tree
            rm_tree(work)
    res["pvisor_failures"] = (0 if res["places"].get("pvisor", {}).get("ok") else 1) \
        + (0 if res.get("create", {}).get("ok") else 1) + (0 if res.get("netd_memory", {}).get("ok") else 1)
    return res


# ---------------------------------------------------------------- report


def _f(v, digits=1) -> str:
    return "–" if v is None else (f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}f}")


def yardstick(res: dict) -> str:
    why = res.get("docker_unusable")
    if why:
        return f"Yardsticks: the host's own namespace (Docker not compared: {why})."
    return ("Yardsticks: a python:3.11-slim container on Docker's bridge (Debian docker.io, private dockerd, NAT) "
            "and the host's own namespace, the same client in each, same run.")


def report(res: dict, out) -> str:
    places = res["places"]
    names = [n for n in ("pvisor", "docker", "host") if n in places]
    lines = [f"### Through the network ({res['download_bytes'] >> 20} MiB download, sequential connects)", "",
             "| figure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def cell(n, f):
        p = places[n]
        return f(p) if p.get("ok") else f"failed: {p.get('error', '?')[:80]}"

    lines.append("| download, median Mbit/s | " + " | ".join(cell(n, lambda p: _f(p["download"]["median_mbit"]))
                                                          for n in names) + " |")
    lines.append("| download, min–max Mbit/s | " + " | ".join(
        cell(n, lambda p: f"{_f(p['download']['five']['min'])}–{_f(p['download']['five']['max'])}") for n in names) + " |")
    lines.append("| connect P50, µs | " + " | ".join(cell(n, lambda p: _f(p["connect"]["p50"])) for n in names) + " |")
    lines.append("| connect P90, µs | " + " | ".join(cell(n, lambda p: _f(p["connect"]["p90"])) for n in names) + " |")
    c = res.get("create", {})
    lines += ["", "### Create with networking on vs `--default-egress none`", ""]
    if c.get("on", {}).get("p50") is not None and c.get("none", {}).get("p50") is not None:
        lines += ["| arm | SDK create P50 ms | n |", "|---|---:|---:|",
                  f"| on (policy deny + allow allowed.test) | {_f(c['on']['p50'])} | {len(c['samples_ms']['on'])} |",
                  f"| none | {_f(c['none']['p50'])} | {len(c['samples_ms']['none'])} |",
                  f"| added | {_f(c.get('added_p50_ms'))} | |"]
    if c.get("errors"):
        lines += ["", f"{len(c['errors'])} failed creates; first: `{c['errors'][0][:200]}`"]
    m = res.get("netd_memory", {})
    lines += ["", "### pvisor-netd of an idle sandbox", ""]
    if m.get("netd"):
        lines += [f"RSS median {_f(m['rss_kib_median'] / 1024, 2)} MiB, PSS median {_f(m['pss_kib_median'] / 1024, 2)} "
                  f"MiB over {len(m['netd'])} processes ({m['sandboxes']} idle sandboxes)."]
    if m.get("error"):
        lines += [f"Not measured: {m['error']}"]
    return yardstick(res) + "\n\n" + "\n".join(lines) + "\n"


def targets(res: dict) -> list[str]:
    rows = []
    p = res["places"].get("pvisor", {})
    if p.get("ok"):
        v = p["download"]["median_mbit"]
        rows.append(f"| network: 100 MiB download through a sandbox | {_f(v)} Mbit/s | ≥ {THROUGHPUT_TARGET_MBIT:g} | "
                    f"{'met' if v >= THROUGHPUT_TARGET_MBIT else 'NOT met'} |")
        base = res["places"].get("docker") if res["places"].get("docker", {}).get("ok") else res["places"].get("host")
        if base and base.get("ok"):
            added = p["connect"]["p50"] - base["connect"]["p50"]
            which = "docker" if base is res["places"].get("docker") else "host"
            rows.append(f"| network: connect P50 added vs {which} | {_f(added)} µs | ≤ {CONNECT_ADDED_TARGET_US:g} | "
                        f"{'met' if added <= CONNECT_ADDED_TARGET_US else 'NOT met'} |")
    c = res.get("create", {})
    if c.get("added_p50_ms") is not None:
        v = c["added_p50_ms"]
        rows.append(f"| network: create P50, on − none | {_f(v, 2)} ms | ≤ {CREATE_ADDED_TARGET_MS:g} | "
                    f"{'met' if v <= CREATE_ADDED_TARGET_MS else 'NOT met'} |")
    m = res.get("netd_memory", {})
    if m.get("rss_kib_median") is not None:
        v = m["rss_kib_median"] / 1024
        rows.append(f"| network: idle pvisor-netd RSS | {_f(v, 2)} MiB | ≤ {NETD_RSS_TARGET_MIB:g} | "
                    f"{'met' if v <= NETD_RSS_TARGET_MIB else 'NOT met'} |")
    return rows
