#!/usr/bin/env bash
# Build pvisor's local test container images as docker-archive tarballs (the
# `docker save` layout) plus one OCI image-layout tarball, from Debian packages
# and pinned PyPI wheels. No registry or Docker engine needed. See README.md.
#
#   images/testdata/build-test-images.sh [OUT_DIR]
#
# OUT_DIR defaults to ${PVISOR_CACHE:-/var/cache/pvisor}/test-images. Prints the
# archive paths on stdout, one per line; logs go to stderr. Needs root
# (mmdebstrap --mode=root) and network access to deb.debian.org and PyPI on a
# cold build. Env: PVISOR_TEST_IMAGES_SUITE (default bookworm),
# PVISOR_TEST_IMAGES_FORCE=1 (rebuild even if the cache stamp matches).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${PVISOR_CACHE:-/var/cache/pvisor}
OUT_DIR=${1:-$CACHE_ROOT/test-images}
OUT_DIR=${OUT_DIR%/}
SUITE=${PVISOR_TEST_IMAGES_SUITE:-bookworm}

log() { printf '[build-test-images] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---- fast path: cache stamp -------------------------------------------------
# The key covers both build scripts and the suite; the archives are fully
# determined by them plus the cached inputs below.
KEY=$( { cat "$HERE/build-test-images.sh" "$HERE/mkarchive.py"; printf 'suite=%s\n' "$SUITE"; } \
       | sha256sum | cut -d' ' -f1)

cache_hit() {
    [[ -f $OUT_DIR/.stamp && -f $OUT_DIR/.archives ]] || return 1
    [[ $(<"$OUT_DIR/.stamp") == "$KEY" ]] || return 1
    local n
    while read -r n; do [[ -f $OUT_DIR/$n ]] || return 1; done <"$OUT_DIR/.archives"
}
print_paths() {
    local n
    while read -r n; do printf '%s/%s\n' "$OUT_DIR" "$n"; done <"$OUT_DIR/.archives"
}

if [[ -z ${PVISOR_TEST_IMAGES_FORCE:-} ]] && cache_hit; then
    print_paths
    exit 0
fi

# ---- settings -----------------------------------------------------------------
MIRROR=http://deb.debian.org/debian
export SOURCE_DATE_EPOCH=1704067200 # 2024-01-01T00:00:00Z: mtime of generated files
PYTHON=/usr/bin/python3
SRC_CACHE=$CACHE_ROOT/test-images-src # mmdebstrap tarballs + wheels, keyed separately
# every host package used below (installed if missing; flock/sha256sum/mktemp are essential)
APT_PACKAGES=(mmdebstrap busybox-static python3 python3-pip ca-certificates debian-archive-keyring)
MMDEBSTRAP_ARGS=(--mode=root --variant=minbase --format=tar
                 --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
# Pure-Python wheels for the python-tools image (exact versions, hash-pinned;
# the hashes also make pip pick the py3-none-any wheel of charset-normalizer).
REQUIREMENTS='attrs==24.2.0 --hash=sha256:81921eb96de3191c8258c199618104dd27ac608d9366f5e35d011eae1867ede2
certifi==2024.8.30 --hash=sha256:922820b53db7a7257ffbda3f597266d435245903d80737e34f8a45ff3e3230d8
charset-normalizer==3.4.0 --hash=sha256:fe9f97feb71aa9896b81973a7bbada8c49501dc73e58a10fcef6663af95e5079
idna==3.10 --hash=sha256:946d195a0d259cbba61165e88e65941f16e9b36ea6ddb97f00452bae8b1287d3
requests==2.32.3 --hash=sha256:70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6
urllib3==2.2.3 --hash=sha256:ca899ca043dcb1bafa3e262d73aa25c465bfb49e0bd9dd5d59f1d0acba2f8fac'

[[ $EUID -eq 0 ]] || die "must run as root (mmdebstrap --mode=root)"

mkdir -p "$CACHE_ROOT" "$SRC_CACHE" "$(dirname "$OUT_DIR")"
exec 9>"$CACHE_ROOT/.test-images.lock"
if ! flock -n 9; then
    log "waiting for another build (lock $CACHE_ROOT/.test-images.lock)"
    flock 9
fi
if [[ -z ${PVISOR_TEST_IMAGES_FORCE:-} ]] && cache_hit; then
    print_paths
    exit 0
fi
START=$SECONDS
log "building test images into $OUT_DIR (key ${KEY:0:16}, suite $SUITE)"

# leftovers of interrupted builds (we hold the lock, so nobody else owns them)
rm -rf "$OUT_DIR".tmp.* "$OUT_DIR".old.* "$SRC_CACHE"/*.tmp.* "$SRC_CACHE"/.work.*

# ---- host packages --------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing host packages: ${missing[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >&2
fi
BUSYBOX=$(dpkg -L busybox-static | grep -m1 -E '^(/usr)?/bin/busybox$') ||
    die "busybox-static does not ship /bin/busybox"

WORK=$(mktemp -d "$SRC_CACHE/.work.XXXXXX")
STAGE=$(mktemp -d "$OUT_DIR.tmp.XXXXXX")
ROOTFS_TMP=
WHEELS_TMP=
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK" "$STAGE" ${ROOTFS_TMP:+"$ROOTFS_TMP"} ${WHEELS_TMP:+"$WHEELS_TMP"}
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- inputs (cached in $SRC_CACHE, each moved into place only when complete) ----
MMDEB_VERSION=$(dpkg-query -W -f='${Version}' mmdebstrap)
ROOTFS_KEY=$(printf '%s\n' "$SUITE" "$MIRROR" "$SOURCE_DATE_EPOCH" "$MMDEB_VERSION" \
             "${MMDEBSTRAP_ARGS[@]}" "python3" | sha256sum | cut -c1-16)
ROOTFS=$SRC_CACHE/rootfs-$SUITE-$ROOTFS_KEY
WHEELS_KEY=$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -c1-16)
WHEELS=$SRC_CACHE/wheels-$WHEELS_KEY

mmdeb() { # name, extra mmdebstrap args...
    local name=$1
    shift
    # exec: the background job's pid is mmdebstrap's own, so cleanup() can
    # signal it directly (mmdebstrap then unmounts and removes its tempdir)
    exec mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$@" "$SUITE" "$ROOTFS_TMP/$name.tar" "$MIRROR" \
        >"$ROOTFS_TMP/$name.log" 2>&1
}

if [[ -f $ROOTFS/minbase.tar && -f $ROOTFS/python.tar ]]; then
    log "using cached rootfs tarballs $ROOTFS"
else
    log "mmdebstrap $SUITE: minbase and minbase+python3 (in parallel)"
    ROOTFS_TMP=$(mktemp -d "$ROOTFS.tmp.XXXXXX")
    mmdeb minbase &
    pids+=($!)
    mmdeb python --include=python3 &
    pids+=($!)
    names=(minbase python)
fi

if [[ -d $WHEELS ]]; then
    log "using cached wheels $WHEELS"
else
    log "downloading wheels"
    WHEELS_TMP=$(mktemp -d "$WHEELS.tmp.XXXXXX")
    printf '%s\n' "$REQUIREMENTS" >"$WHEELS_TMP/requirements.txt"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
        --only-binary=:all: --require-hashes -r "$WHEELS_TMP/requirements.txt" -d "$WHEELS_TMP" >&2
    chmod 755 "$WHEELS_TMP"
    mv "$WHEELS_TMP" "$WHEELS"
    WHEELS_TMP=
    find "$SRC_CACHE" -mindepth 1 -maxdepth 1 -name 'wheels-*' ! -path "$WHEELS" -exec rm -rf {} +
fi

if [[ -n $ROOTFS_TMP ]]; then
    for i in "${!pids[@]}"; do
        name=${names[$i]}
        if ! wait "${pids[$i]}"; then
            tail -n 30 "$ROOTFS_TMP/$name.log" >&2 || true
            die "mmdebstrap ($name) failed; log above"
        fi
    done
    pids=()
    rm -rf "$ROOTFS"
    chmod 755 "$ROOTFS_TMP"
    mv "$ROOTFS_TMP" "$ROOTFS"
    ROOTFS_TMP=
    find "$SRC_CACHE" -mindepth 1 -maxdepth 1 -name "rootfs-$SUITE-*" ! -path "$ROOTFS" -exec rm -rf {} +
    log "rootfs tarballs ready after $((SECONDS - START))s"
fi

# ---- layers + archives ----------------------------------------------------------------
"$PYTHON" "$HERE/mkarchive.py" build --busybox "$BUSYBOX" \
    --minbase "$ROOTFS/minbase.tar" --python "$ROOTFS/python.tar" --wheels "$WHEELS" \
    --suite "$SUITE" --epoch "$SOURCE_DATE_EPOCH" --work "$WORK" --out "$STAGE" >"$STAGE/.archives"
"$PYTHON" "$HERE/mkarchive.py" verify "$STAGE" >&2
(cd "$STAGE" && xargs sha256sum <.archives >SHA256SUMS)
printf '%s\n' "$KEY" >"$STAGE/.stamp"
chmod 755 "$STAGE"

# swap into place: OUT_DIR is either the old complete result or the new one
old=
if [[ -e $OUT_DIR ]]; then
    old=$OUT_DIR.old.$$
    mv "$OUT_DIR" "$old"
fi
mv "$STAGE" "$OUT_DIR"
[[ -z $old ]] || rm -rf "$old"
log "done in $((SECONDS - START))s"
print_paths
