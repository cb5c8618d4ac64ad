#!/usr/bin/env bash
# Builds everything, imports the default images and runs the service in the
# foreground on 127.0.0.1:8080 (override with PVISOR_LISTEN).
source "$(dirname "$0")/common.sh"
ensure_packages
host_setup
build
guest_kernel
test_images
# The official SDK's environment: bench/run and the examples use it.
python_env
# The data directory is pvisor's default (/var/lib/pvisor for root) unless
# PVISOR_DATA_DIR is set; both commands below read that variable.
log "importing images"
for f in busybox debian-bookworm-slim python-3.11-slim python-3.11-tools; do
    "$DIST/pvisor" image import "$TEST_IMAGES/$f.tar"
done
log "serving on ${PVISOR_LISTEN:-127.0.0.1:8080} (default image: python:3.11-slim; Ctrl-C stops)"
exec "$DIST/pvisor" serve --listen "${PVISOR_LISTEN:-127.0.0.1:8080}"
