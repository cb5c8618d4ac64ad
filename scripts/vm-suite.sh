#!/usr/bin/env bash
# The whole end-to-end suite with vm sandboxes under the project's own VMM, in the KVM test host
# (scripts/kvm-host.sh). CI runs a named subset of it (tests/kvmhost/test_vm_lane.py); this runs
# every test (a few hours: everything in the host is emulated). Tests about the ns jail only skip
# with their reason. The junit XML, pytest's output and the servers' logs go to OUT.
#
# Usage: scripts/vm-suite.sh [OUT] [PYTEST_ARG...]     (as root; after scripts/test.sh's set-up)
source "$(dirname "$0")/common.sh"
OUT=$(mkdir -p "${1:-/var/tmp/pvisor-vm-suite}" && cd "${1:-/var/tmp/pvisor-vm-suite}" && pwd)
shift || true
guest_kernel
host_kernel
cd "$REPO"
export PVISOR_BIN=${PVISOR_BIN:-$DIST/pvisor} PVISOR_TEST_IMAGES=$TEST_IMAGES
# Its own copy of the binaries: a rebuild meanwhile cannot mix them.
rm -rf "$OUT/dist" && cp -a "$(dirname "$PVISOR_BIN")" "$OUT/dist"
export PVISOR_BIN=$OUT/dist/pvisor
log "the e2e suite with vm sandboxes in the KVM test host (results in $OUT)"
start=$(date +%s)
set +e
KVM_HOST_SHARE=$OUT KVM_HOST_CONSOLE=$OUT/console.log scripts/kvm-host.sh env \
    PYTHONDONTWRITEBYTECODE=1 PVISOR_E2E_BACKEND=vm PVISOR_E2E_DEADLINE_SCALE=4 PVISOR_E2E_HEALTH_TIMEOUT=240 \
    PVISOR_READY_TIMEOUT_SECS=60 \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs --tb=short -o junit_family=xunit2 \
    --junitxml="$OUT/junit.xml" --basetemp="$OUT/pytest" tests/e2e --ignore=tests/e2e/test_network.py "$@" \
    2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
log "the vm suite took $(($(date +%s) - start)) s (pytest exit $rc)"
exit "$rc"
