#!/usr/bin/env bash
# Runs the whole test suite: formatting and lints, Rust unit and integration
# tests, the end-to-end suite with the official OpenSandbox SDK, and the
# benchmark harness's smoke mode.
source "$(dirname "$0")/common.sh"
ensure_packages
qemu_snapshots
host_setup
build
guest_kernel
host_kernel
test_images
python_env
api_fuzz_env
clients_env
ts_env
ops_env
cd "$REPO"
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
log "cargo test"
# Every prerequisite is provided here, so a test missing one fails instead of
# printing SKIP (pvisor-testkit); tests that cannot run on these hosts are #[ignore]d.
PVISOR_TEST_STRICT=1 PVISOR_TEST_IMAGES=$TEST_IMAGES PVISOR_DIST=$DIST cargo test --locked --workspace -- --test-threads=2
log "Python interpreter driver (tests/driver)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/driver
log "fuzzing, bounded (scripts/fuzz.sh: every target of fuzz/ for 15 s)"
"$REPO/scripts/fuzz.sh" --seconds 15
log "end-to-end suite (official SDK)"
PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e \
    --ignore=tests/e2e/test_network.py
log "TypeScript SDK suite (tests/ts, node --test)"
PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES tests/ts/run.sh
log "Debian package (scripts/package.sh)"
install_missing systemd # systemd-analyze verify, offline
deb=$(scripts/package.sh --no-build | tail -n 1)
log "official clients: osb, MCP, gRPC reflection, API reference page, the package (tests/clients)"
PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PVISOR_DEB=$deb "$PVISOR_CLIENTS_VENV/bin/python" -m pytest -q \
    -p no:cacheprovider tests/clients
log "private test internet (tests/networld): unit tests, set-up, every server from the host"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/networld
"$VENV/bin/python" tests/networld up
"$VENV/bin/python" tests/networld check
log "cgroup v2 host: the e2e subset in the KVM test host, a pure cgroup v2 host (tests/cgroupv2)"
PVISOR_TEST_STRICT=1 PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider tests/cgroupv2
log "vm backend for real: the project's own VMM boots Linux guests in the KVM test host (tests/kvmhost)"
PVISOR_TEST_STRICT=1 PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider tests/kvmhost
log "network suite (official SDK, private internet; root and unprivileged broker)"
PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PVISOR_NETWORLD_KEEP=1 "$VENV/bin/python" -m pytest -q \
    -p no:cacheprovider tests/e2e/test_network.py
if [ -x bench/run ]; then
    log "benchmark smoke"
    PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PYTHON=$VENV/bin/python bench/run startup --pairs 2 --pvisor-only --out "$(mktemp -d)"
    # Ten SDK creates released at once, default admission: every one must succeed.
    PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PYTHON=$VENV/bin/python bench/run burst --pvisor-only \
        --bursts 2 --burst-warmup 1 --burst-size 10 --out "$(mktemp -d)"
    PVISOR_BIN=$DIST/pvisor PYTHON=$VENV/bin/python bench/run vm --runs 10 --rss-rounds 1 --out "$(mktemp -d)"
    PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PYTHON=$VENV/bin/python bench/run code --code-rounds 1 --code-warm 3 --out "$(mktemp -d)"
    PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PYTHON=$VENV/bin/python bench/run network --pvisor-only \
        --downloads 1 --connects 50 --creates 2 --idle 1 --out "$(mktemp -d)"
fi
log "private test internet: tear-down leaves nothing behind"
"$VENV/bin/python" tests/networld down
log "all tests passed"
