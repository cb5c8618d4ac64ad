// pvisor driven by the official OpenSandbox TypeScript SDK (npm @alibaba-group/opensandbox),
// unmodified and with no pvisor-specific option: lifecycle, commands, files, pause/resume,
// metrics, endpoints, kill and the errors a client sees.
//
// Run by tests/ts/run.sh, which starts `pvisor serve` (with an API key) and hands the SDK its
// address and key the way the SDK's users do: OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY.
// Without them every test skips, visibly.

import assert from "node:assert/strict";
import { after, describe, test } from "node:test";

import {
  ConnectionConfig,
  Sandbox,
  SandboxApiException,
  SandboxManager,
} from "@alibaba-group/opensandbox";

const SERVER = process.env.OPEN_SANDBOX_DOMAIN ?? "";
const SKIP = SERVER ? false : "OPEN_SANDBOX_DOMAIN is not set: run tests/ts/run.sh, which starts a server";
const BUSYBOX = "busybox:latest";
const SMALL = { cpu: "1", memory: "512Mi" };
const EXECD_PORT = 44772;

// Domain and API key come from the environment (the SDK's own defaults).
const config = () => new ConnectionConfig({ protocol: "http", requestTimeoutSeconds: 60 });

// Sandboxes this file created; whatever a failing test left is killed at the end.
const created = [];

async function createBusybox(extra = {}) {
  const sb = await Sandbox.create({
    connectionConfig: config(),
    image: BUSYBOX,
    resource: SMALL,
    timeoutSeconds: 300,
    readyTimeoutSeconds: 60,
    ...extra,
  });
  created.push(sb);
  return sb;
}

// Polls `probe` until it returns a truthy value (bounded by tries, not by a timed assertion).
async function eventually(what, probe, tries = 100, pauseMs = 100) {
  let last;
  for (let i = 0; i < tries; i++) {
    last = await probe();
    if (last) return last;
    await new Promise((r) => setTimeout(r, pauseMs));
  }
  assert.fail(`${what}: not seen after ${tries} tries (last: ${JSON.stringify(last)})`);
}

// Runs `fn`, which must throw the SDK's API error; returns it.
async function apiError(fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof SandboxApiException, `expected SandboxApiException, got ${e?.name}: ${e}`);
    return e;
  }
  assert.fail("the call succeeded where an API error was expected");
}

// Output messages are lines (their text without the newline).
const lines = (msgs) => msgs.map((m) => m.text.replace(/\n$/, ""));

after(async () => {
  for (const sb of created) {
    await sb.kill().catch(() => {});
    await sb.close().catch(() => {});
  }
});

describe("pvisor through the TypeScript SDK", { skip: SKIP }, () => {
  let sb;

  test("create: Running, with the image asked for", async () => {
    sb = await createBusybox({ metadata: { suite: "ts" }, env: { TS_ENV: "from-create" } });
    const info = await sb.getInfo();
    assert.equal(info.id, sb.id);
    assert.equal(info.status.state, "Running");
    assert.equal(info.image?.uri, BUSYBOX);
    assert.equal(info.metadata?.suite, "ts");
    assert.ok(info.createdAt instanceof Date && !Number.isNaN(info.createdAt.getTime()));
    assert.ok(info.expiresAt instanceof Date && info.expiresAt > info.createdAt);
    const manager = SandboxManager.create({ connectionConfig: config() });
    try {
      const list = await manager.listSandboxInfos({ metadata: { suite: "ts" } });
      assert.deepEqual(list.items.map((s) => s.id), [sb.id]);
    } finally {
      await manager.close();
    }
  });

  test("commands: stdout, stderr, exit code, env", async () => {
    const ok = await sb.commands.run("echo out-1; echo err-1 >&2; echo $TS_ENV");
    assert.deepEqual(lines(ok.logs.stdout), ["out-1", "from-create"]);
    assert.deepEqual(lines(ok.logs.stderr), ["err-1"]);
    assert.equal(ok.error, undefined);
    const bad = await sb.commands.run("echo before; exit 7");
    assert.deepEqual(lines(bad.logs.stdout), ["before"]);
    assert.equal(bad.exitCode, 7);
    const cwd = await sb.commands.run("pwd", { workingDirectory: "/tmp", envs: { X: "1" } });
    assert.deepEqual(lines(cwd.logs.stdout), ["/tmp"]);
  });

  test("commands: streamed to handlers", async () => {
    const seen = [];
    await sb.commands.run("for i in 1 2 3; do echo line-$i; done", undefined, {
      onStdout: (m) => seen.push(m.text.replace(/\n$/, "")),
    });
    assert.deepEqual(seen, ["line-1", "line-2", "line-3"]);
  });

  test("commands: background, status, logs, interrupt", async () => {
    const ex = await sb.commands.run("echo bg-start; sleep 60; echo bg-end", { background: true });
    assert.ok(ex.id, "a background run returns its command id");
    const logs = await eventually("background output", async () => {
      const l = await sb.commands.getBackgroundCommandLogs(ex.id);
      return l.content.includes("bg-start") && l;
    });
    assert.ok(!logs.content.includes("bg-end"));
    const running = await sb.commands.getCommandStatus(ex.id);
    assert.equal(running.running, true);
    await sb.commands.interrupt(ex.id);
    const stopped = await eventually("interrupted command to stop", async () => {
      const s = await sb.commands.getCommandStatus(ex.id);
      return s.running === false && s;
    });
    assert.notEqual(stopped.exitCode, 0);
    const done = await sb.commands.run("echo fin; exit 3", { background: true });
    const fin = await eventually("background command to finish", async () => {
      const s = await sb.commands.getCommandStatus(done.id);
      return s.running === false && s;
    });
    assert.equal(fin.exitCode, 3);
    assert.equal((await sb.commands.getBackgroundCommandLogs(done.id)).content.trim(), "fin");
  });

  test("files: write, read, info, search, move, delete", async () => {
    await sb.files.createDirectories([{ path: "/tmp/ts-files/sub", mode: 755 }]);
    await sb.files.writeFiles([
      { path: "/tmp/ts-files/a.txt", data: "hello from node\n", mode: 644 },
      { path: "/tmp/ts-files/sub/b.bin", data: new Uint8Array([0, 1, 2, 255]) },
    ]);
    assert.equal(await sb.files.readFile("/tmp/ts-files/a.txt"), "hello from node\n");
    assert.deepEqual([...(await sb.files.readBytes("/tmp/ts-files/sub/b.bin"))], [0, 1, 2, 255]);
    const info = await sb.files.getFileInfo(["/tmp/ts-files/a.txt"]);
    assert.equal(info["/tmp/ts-files/a.txt"].size, 16);
    const found = await sb.files.search({ path: "/tmp/ts-files", pattern: "*.txt" });
    assert.deepEqual(found.map((f) => f.path), ["/tmp/ts-files/a.txt"]);
    await sb.files.moveFiles([{ src: "/tmp/ts-files/a.txt", dest: "/tmp/ts-files/c.txt" }]);
    const cat = await sb.commands.run("cat /tmp/ts-files/c.txt; ls /tmp/ts-files");
    assert.deepEqual(lines(cat.logs.stdout), ["hello from node", "c.txt", "sub"]);
    await sb.files.deleteFiles(["/tmp/ts-files/c.txt"]);
    // The SDK's download does not parse error bodies (its code is UNEXPECTED_RESPONSE
    // whatever the server says); pvisor's {code, message} is in the raw body.
    const gone = await apiError(() => sb.files.readFile("/tmp/ts-files/c.txt"));
    assert.equal(gone.statusCode, 404);
    assert.equal(JSON.parse(gone.rawBody).code, "FILE_NOT_FOUND", gone.rawBody);
    const noInfo = await apiError(() => sb.files.getFileInfo(["/tmp/ts-files/c.txt"]));
    assert.equal(noInfo.statusCode, 404);
    assert.equal(noInfo.error.code, "FILE_NOT_FOUND");
    await sb.files.deleteDirectories(["/tmp/ts-files"]);
    const ls = await sb.commands.run("test -e /tmp/ts-files; echo $?");
    assert.deepEqual(lines(ls.logs.stdout), ["1"]);
  });

  test("metrics", async () => {
    const m = await sb.getMetrics();
    assert.ok(m.cpuCount >= 1, `cpuCount ${m.cpuCount}`);
    assert.ok(m.memoryTotalMiB > 0 && m.memoryTotalMiB <= 512, `memoryTotalMiB ${m.memoryTotalMiB}`);
    assert.ok(m.memoryUsedMiB >= 0 && m.memoryUsedMiB <= m.memoryTotalMiB, `memoryUsedMiB ${m.memoryUsedMiB}`);
    assert.ok(m.cpuUsedPercentage >= 0, `cpuUsedPercentage ${m.cpuUsedPercentage}`);
    assert.ok(m.timestamp > 0);
  });

  test("endpoints: no scheme, URL form, any port", async () => {
    for (const port of [EXECD_PORT, 8080, 65535]) {
      const ep = await sb.getEndpoint(port);
      assert.ok(ep.endpoint && !ep.endpoint.includes("://"), `port ${port}: ${ep.endpoint}`);
    }
    const url = await sb.getEndpointUrl(EXECD_PORT);
    assert.match(url, /^http:\/\//);
    const ping = await sb.isHealthy();
    assert.equal(ping, true);
  });

  test("pause and resume", async () => {
    await sb.commands.run("echo kept > /tmp/state");
    await sb.pause();
    await eventually("Paused state", async () => (await sb.getInfo()).status.state === "Paused");
    const resumed = await sb.resume({ readyTimeoutSeconds: 60 });
    created.push(resumed);
    assert.equal(resumed.id, sb.id);
    assert.equal((await resumed.getInfo()).status.state, "Running");
    const r = await resumed.commands.run("cat /tmp/state");
    assert.deepEqual(lines(r.logs.stdout), ["kept"]);
    sb = resumed;
  });

  test("kill, then the SDK sees 404 SANDBOX_NOT_FOUND", async () => {
    const id = sb.id;
    await sb.kill();
    const manager = SandboxManager.create({ connectionConfig: config() });
    try {
      const e = await apiError(() => manager.getSandboxInfo(id));
      assert.equal(e.statusCode, 404);
      assert.equal(e.error.code, "SANDBOX_NOT_FOUND");
      assert.ok(e.error.message?.includes(id), e.error.message);
      const again = await apiError(() => manager.killSandbox(id));
      assert.equal(again.statusCode, 404);
      assert.equal(again.error.code, "SANDBOX_NOT_FOUND");
    } finally {
      await manager.close();
    }
  });

  test("errors: an unknown image is the SDK's error with pvisor's code", async () => {
    const e = await apiError(() =>
      Sandbox.create({ connectionConfig: config(), image: "no-such-image/ts:missing", resource: SMALL }),
    );
    assert.equal(e.statusCode, 404);
    assert.equal(e.error.code, "IMAGE_NOT_FOUND");
    assert.ok(e.error.message, "the error carries pvisor's message");
  });

  test("errors: a bad resource request is a 400 with a code", async () => {
    const e = await apiError(() =>
      Sandbox.create({ connectionConfig: config(), image: BUSYBOX, resource: { cpu: "1", memory: "lots" } }),
    );
    assert.equal(e.statusCode, 400);
    assert.ok(e.error.code && e.error.code !== "INTERNAL_UNKNOWN_ERROR", e.error.code);
  });
});
