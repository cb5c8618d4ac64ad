"""The official OpenSandbox CLI (`osb`, PyPI opensandbox-cli) against pvisor.

osb is configured the way its users configure it, by its environment variables
(OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY, OPEN_SANDBOX_PROTOCOL) with an empty home (no
~/.opensandbox/config.toml), and checked by its `-o json` output and exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BUSYBOX


@pytest.fixture(scope="module")
def osb(server, tmp_path_factory):
    exe = Path(sys.executable).with_name("osb")
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: the clients venv lacks opensandbox-cli", pytrace=False)
    home = tmp_path_factory.mktemp("osb-home")
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "OPEN_SANDBOX_DOMAIN": server.addr,
           "OPEN_SANDBOX_API_KEY": server.api_key, "OPEN_SANDBOX_PROTOCOL": "http",
           "OPEN_SANDBOX_REQUEST_TIMEOUT": "60"}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([str(exe), "--no-color", *args], capture_output=True, text=True, env=env, timeout=180)
        if ok:
            assert r.returncode == 0, f"osb {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r

    def run_json(*args: str):
        cut = args.index("--") if "--" in args else len(args)  # options go before the payload
        r = run(*args[:cut], "-o", "json", *args[cut:])
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            pytest.fail(f"osb {' '.join(args)} -o json printed no JSON ({e}):\n{r.stdout}\n{r.stderr}")

    run.json = run_json
    return run


@pytest.fixture(scope="module")
def created(osb, api):
    """A sandbox created by `osb sandbox create`; killed at the end if a test did not."""
    out = osb.json("sandbox", "create", "-i", BUSYBOX, "-t", "5m", "-m", "via=osb", "-e", "OSB_ENV=from-osb",
                   "--resource", "cpu=1", "--resource", "memory=256Mi", "--ready-timeout", "60s")
    sid = out["id"]
    yield sid
    api.delete(f"/v1/sandboxes/{sid}")


def test_sandbox_create(created, api, osb):
    info = api.get(f"/v1/sandboxes/{created}").json()
    assert info["status"]["state"] == "Running"
    assert info["metadata"] == {"via": "osb"}
    assert info["image"]["uri"] == BUSYBOX


def test_sandbox_get_and_list(created, osb):
    got = osb.json("sandbox", "get", created)
    assert got["id"] == created
    assert got["status"]["state"] == "Running"
    assert got["metadata"] == {"via": "osb"}
    listed = osb.json("sandbox", "list", "-m", "via=osb")
    rows = listed if isinstance(listed, list) else listed.get("items", listed.get("sandbox_infos"))
    assert [r["id"] for r in rows] == [created], listed
    running = osb.json("sandbox", "list", "-s", "Running")
    rows = running if isinstance(running, list) else running.get("items", running.get("sandbox_infos"))
    assert created in [r["id"] for r in rows]


def test_command_run(created, osb):
    # osb quotes each payload word into one shell command line: shell syntax goes via sh -c.
    r = osb("command", "run", created, "-o", "raw", "--", "sh", "-c", "echo $OSB_ENV; echo to-err >&2")
    assert r.stdout.split() == ["from-osb"], r
    assert "to-err" in r.stderr, r
    # Foreground output is raw only; a background run reports its execution as JSON.
    bg = osb.json("command", "run", created, "-d", "--", "sh", "-c", "echo bg-out > /tmp/bg.txt")
    assert bg["sandbox_id"] == created and bg["mode"] == "background" and bg["execution_id"], bg
    for _ in range(100):
        cat = osb("command", "run", created, "-o", "raw", "--", "cat", "/tmp/bg.txt", ok=False)
        if cat.returncode == 0:
            break
        time.sleep(0.1)
    assert cat.stdout.strip() == "bg-out", cat
    argv = osb("command", "run", created, "-o", "raw", "--argv", "--", "printf", "[%s]", "$HOME", "", "a b")
    assert argv.stdout.strip() == "[$HOME][][a b]", argv
    failed = osb("command", "run", created, "-o", "raw", "--", "sh", "-c", "exit 5", ok=False)
    assert failed.returncode != 0, "a failing command must fail osb"


def test_file_upload_cat_rm(created, osb, tmp_path):
    local = tmp_path / "up.txt"
    local.write_text("uploaded by osb\n")
    osb.json("file", "upload", created, str(local), "/tmp/up.txt")
    assert osb("file", "cat", created, "/tmp/up.txt").stdout == "uploaded by osb\n"
    osb.json("file", "rm", created, "/tmp/up.txt")
    gone = osb("file", "cat", created, "/tmp/up.txt", ok=False)
    assert gone.returncode == 1
    assert "FILE_NOT_FOUND" in gone.stdout + gone.stderr, gone


def test_egress_get(created, osb):
    policy = osb.json("egress", "get", created)
    assert policy["defaultAction" if "defaultAction" in policy else "default_action"] == "allow", policy


def test_snapshot_create_list(created, osb, api):
    snap = osb.json("snapshot", "create", created, "--name", "osb-snap")
    sid = snap.get("id") or snap.get("snapshot_id")
    assert sid, snap
    try:
        listed = osb.json("snapshot", "list", "--sandbox-id", created)
        rows = listed if isinstance(listed, list) else listed.get("items", listed.get("snapshots"))
        assert [r["id"] for r in rows] == [sid], listed
        assert rows[0]["name"] == "osb-snap"
    finally:
        api.delete(f"/v1/snapshots/{sid}")


def test_sandbox_kill_then_not_found(created, osb):
    killed = osb.json("sandbox", "kill", created)
    assert "killed" in json.dumps(killed).lower() or created in json.dumps(killed), killed
    gone = osb("sandbox", "get", created, "-o", "json", ok=False)
    assert gone.returncode == 1
    assert "SANDBOX_NOT_FOUND" in gone.stdout + gone.stderr, gone


def test_bad_image_shows_pvisor_code(osb):
    r = osb("sandbox", "create", "-i", "no-such-image/osb:missing", "-o", "json", ok=False)
    assert r.returncode == 1
    assert "IMAGE_NOT_FOUND" in r.stdout + r.stderr, r
