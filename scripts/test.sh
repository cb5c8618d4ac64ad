#!/usr/bin/env bash
# Runs the whole test suite: formatting and lints, Rust unit and integration
# tests, the end-to-end suite with the official OpenSandbox SDK, and the
# benchmark harness's smoke mode.
source "$(dirname "$0")/common.sh"
ensure_packages
host_setup
build
guest_kernel
test_images
python_env
cd "$REPO"
log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
log "cargo test"
PVISOR_TEST_IMAGES=$TEST_IMAGES PVISOR_DIST=$DIST cargo test --locked --workspace -- --test-threads=2
log "end-to-end suite (official SDK)"
PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/e2e
if [ -x bench/run ]; then
    log "benchmark smoke"
    PVISOR_BIN=$DIST/pvisor PVISOR_TEST_IMAGES=$TEST_IMAGES PYTHON=$VENV/bin/python bench/run startup --pairs 2 --pvisor-only --out "$(mktemp -d)"
    PVISOR_BIN=$DIST/pvisor PYTHON=$VENV/bin/python bench/run vm --runs 10 --rss-rounds 1 --out "$(mktemp -d)"
fi
log "all tests passed"
