#!/usr/bin/env bash
# Builds the Debian package of the workspace (cargo-deb over the release binaries of
# scripts/common.sh `build`) and prints its path on the last line: the five binaries in
# /usr/lib/pvisor (pvisor also as /usr/bin/pvisor), pvisor.service (unprivileged, Delegate=yes),
# /etc/pvisor/pvisor.env and a postinst making the `pvisor` user and /var/lib/pvisor.
# packaging/ holds the unit, the environment file and the maintainer scripts;
# broker/Cargo.toml [package.metadata.deb] lists the assets. cargo-deb is installed once from
# crates.io into $PVISOR_CACHE/cargo-bin, keyed by version. tests/clients/test_package.py
# inspects the result (dpkg-deb -c/-I, systemd-analyze verify). cargo-deb warns that the
# target/dist paths are not its target dir (intended) and finds no $auto deps for the two
# static binaries (they have none).
#
#   scripts/package.sh [--no-build]   (--no-build: package target/dist as it is)
source "$(dirname "$0")/common.sh"

CARGO_DEB_VERSION=3.8.0
DEB_BIN=$PVISOR_CACHE/cargo-bin/cargo-deb-$CARGO_DEB_VERSION/bin
OUT=$REPO/target/debian

# dpkg-shlibdeps resolves the dynamic binaries' library dependencies ($auto).
install_missing dpkg-dev
if [ ! -x "$DEB_BIN/cargo-deb" ]; then
    log "installing cargo-deb $CARGO_DEB_VERSION into $DEB_BIN"
    CARGO_TARGET_DIR=$PVISOR_CACHE/cargo-bin/build cargo install --locked --quiet cargo-deb \
        --version "$CARGO_DEB_VERSION" --root "${DEB_BIN%/bin}"
fi
[ "${1:-}" = --no-build ] || build
BINARIES=(pvisor pvisor-worker pvisor-imaged pvisor-agent pvisor-netd)
for b in "${BINARIES[@]}"; do
    [ -x "$DIST/$b" ] || { echo "$DIST/$b is missing: run scripts/common.sh build first" >&2; exit 1; }
done
# broker/Cargo.toml names target/dist; where the checkout keeps its binaries under the cache
# (a checkout other users cannot reach, scripts/common.sh), they are copied there for cargo-deb.
if [ "$DIST" != "$REPO/target/dist" ]; then
    mkdir -p "$REPO/target/dist"
    for b in "${BINARIES[@]}"; do
        cp -f "$DIST/$b" "$REPO/target/dist/$b"
    done
fi
log "Debian package (cargo deb, into $OUT)"
mkdir -p "$OUT"
deb=$(cd "$REPO" && "$DEB_BIN/cargo-deb" --no-build --locked -p pvisor --output "$OUT" | tail -n 1)
[ -f "$deb" ] || { echo "cargo deb made no package (it said: $deb)" >&2; exit 1; }
echo "$deb"
