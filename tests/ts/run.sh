#!/usr/bin/env bash
# Runs tests/ts (the official OpenSandbox TypeScript SDK against pvisor) with node's built-in
# test runner: installs the pinned SDK (scripts/common.sh ts_env, cached by package-lock.json),
# starts `pvisor serve` on a free loopback port with a fresh data dir, busybox imported, an API
# key and --stop-sandboxes-on-exit, points the SDK at it through its own environment variables
# (OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY), runs `node --test`, stops the server, and says
# how many tests were skipped.
#
# Environment: PVISOR_BIN (default target/dist/pvisor), PVISOR_TEST_IMAGES.
source "$(dirname "$0")/../../scripts/common.sh"
BIN=${PVISOR_BIN:-$DIST/pvisor}
IMAGES=${PVISOR_TEST_IMAGES:-$TEST_IMAGES}
[ -x "$BIN" ] || { echo "pvisor binary $BIN not found: build it first (or set PVISOR_BIN)" >&2; exit 1; }
[ -f "$IMAGES/busybox.tar" ] || { echo "$IMAGES/busybox.tar is missing: run images/testdata/build-test-images.sh" >&2; exit 1; }
[ -n "${PVISOR_TS_MODULES:-}" ] || ts_env

# node resolves packages next to the importing file: the cached node_modules, by a link.
ln -sfn "$PVISOR_TS_MODULES" "$REPO/tests/ts/node_modules"

work=$(mktemp -d /tmp/pvisor-ts-XXXXXX)
chmod 0755 "$work" # the sandboxes' mapped uids traverse the data dir's ancestors
server_pid=
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid"
        for _ in $(seq 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$BIN" image import "$IMAGES/busybox.tar" --data-dir "$work/data" >"$work/import.log" 2>&1 \
    || { cat "$work/import.log" >&2; exit 1; }
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export PVISOR_API_KEY="ts-secret-$RANDOM"
"$BIN" serve --listen "127.0.0.1:$port" --data-dir "$work/data" --backend ns --stop-sandboxes-on-exit \
    </dev/null >"$work/server.log" 2>&1 &
server_pid=$!
for i in $(seq 300); do
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$port/health" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { echo "pvisor serve exited:" >&2; tail -40 "$work/server.log" >&2; exit 1; }
    [ "$i" = 300 ] && { echo "pvisor serve not healthy after 30 s:" >&2; tail -40 "$work/server.log" >&2; exit 1; }
    sleep 0.1
done

log "TypeScript SDK suite (node $(node --version), pvisor on 127.0.0.1:$port)"
rc=0
(cd "$REPO/tests/ts" && OPEN_SANDBOX_DOMAIN="127.0.0.1:$port" OPEN_SANDBOX_API_KEY=$PVISOR_API_KEY \
    node --test --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$work/tap" ./*.test.mjs) || rc=$?
skipped=$(sed -n 's/^# skipped //p' "$work/tap" | tail -n 1)
if [ "${skipped:-0}" != 0 ]; then
    echo "WARNING: $skipped TypeScript SDK test(s) skipped:" >&2
    grep -E '# SKIP' "$work/tap" >&2 || true
fi
if [ "$rc" != 0 ]; then
    echo "--- server log tail ($work/server.log) ---" >&2
    tail -60 "$work/server.log" >&2
fi
exit "$rc"
