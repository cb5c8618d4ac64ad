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
# numpy, pandas and matplotlib with their dependencies for the tools image, as
# CPython 3.11 manylinux2014 x86_64 wheels (the python3 of bookworm), hash-pinned.
# Wheels rather than Debian's packages: Debian's python3-matplotlib pulls in
# python3-fonttools, which depends on scipy, sympy and a C++ toolchain (1 GB).
SCI_REQUIREMENTS='contourpy==1.3.0 --hash=sha256:637f674226be46f6ba372fd29d9523dd977a291f66ab2a74fbeb5530bb3f445d
cycler==0.12.1 --hash=sha256:85cef7cff222d8644161529808465972e51340599459b8ac3ccbac5a854e0d30
fonttools==4.54.1 --hash=sha256:82834962b3d7c5ca98cb56001c33cf20eb110ecf442725dc5fdf36d16ed1ab07
kiwisolver==1.4.7 --hash=sha256:18077b53dc3bb490e330669a99920c5e6a496889ae8c63b58fbc57c3d7f33a18
matplotlib==3.9.2 --hash=sha256:8912ef7c2362f7193b5819d17dae8629b34a95c58603d781329712ada83f9447
numpy==1.26.4 --hash=sha256:666dbfb6ec68962c033a450943ded891bed2d54e6755e35e5835d63f4f6931d5
packaging==24.1 --hash=sha256:5b8f2217dbdbd2f7f384c41c628544e6d52f2d0f53c6d0c3ea61aa5d1d7ff124
pandas==2.2.3 --hash=sha256:c124333816c3a9b03fbeef3a9f230ba9a737e9e5bb4060aa2107a86cc0a497fc
pillow==10.4.0 --hash=sha256:5e84b6cc6a4a3d76c153a6b19270b3526a5a8ed6b09501d3af891daa2a9de7d6
pyparsing==3.1.4 --hash=sha256:a6a7ee4235a3f944aa1fa2249307708f893fe5717dc603503c6c7969c070fb7c
python-dateutil==2.9.0.post0 --hash=sha256:a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427
pytz==2024.2 --hash=sha256:31c7c1817eb7fae7ca4b8c7ee50c72f93aa2dd863de768e1ef4245d426aa0725
six==1.16.0 --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
tzdata==2024.2 --hash=sha256:a48093786cdcde33cad18c2555e8532f34422074448fbc874186f0abd79565cd'
SCI_PLATFORM=(--platform manylinux2014_x86_64 --python-version 3.11 --implementation cp --abi cp311)

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
EXTRAS_TMP=
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK" "$STAGE" ${ROOTFS_TMP:+"$ROOTFS_TMP"} ${EXTRAS_TMP:+"$EXTRAS_TMP"} ${WHEELS_TMP:+"$WHEELS_TMP"}
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- inputs (cached in $SRC_CACHE, each moved into place only when complete) ----
MMDEB_VERSION=$(dpkg-query -W -f='${Version}' mmdebstrap)
ROOTFS_KEY=$(printf '%s\n' "$SUITE" "$MIRROR" "$SOURCE_DATE_EPOCH" "$MMDEB_VERSION" \
             "${MMDEBSTRAP_ARGS[@]}" "python3" | sha256sum | cut -c1-16)
ROOTFS=$SRC_CACHE/rootfs-$SUITE-$ROOTFS_KEY
# One more rootfs tarball (minbase + nodejs), keyed apart so adding it left the
# first two cached.
EXTRAS_KEY=$(printf '%s\n' "$SUITE" "$MIRROR" "$SOURCE_DATE_EPOCH" "$MMDEB_VERSION" \
             "${MMDEBSTRAP_ARGS[@]}" "node=nodejs" | sha256sum | cut -c1-16)
EXTRAS=$SRC_CACHE/extras-$SUITE-$EXTRAS_KEY
WHEELS_KEY=$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -c1-16)
WHEELS=$SRC_CACHE/wheels-$WHEELS_KEY
SCI_WHEELS_KEY=$(printf '%s\n' "$SCI_REQUIREMENTS" "${SCI_PLATFORM[@]}" | sha256sum | cut -c1-16)
SCI_WHEELS=$SRC_CACHE/sciwheels-$SCI_WHEELS_KEY

mmdeb() { # name, extra mmdebstrap args...
    local name=$1
    shift
    # exec: the background job's pid is mmdebstrap's own, so cleanup() can
    # signal it directly (mmdebstrap then unmounts and removes its tempdir)
    local dir=${MMDEB_DIR:-$ROOTFS_TMP}
    exec mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$@" "$SUITE" "$dir/$name.tar" "$MIRROR" \
        >"$dir/$name.log" 2>&1
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

if [[ -f $EXTRAS/node.tar ]]; then
    log "using cached rootfs tarball $EXTRAS"
else
    log "mmdebstrap $SUITE: minbase + nodejs"
    EXTRAS_TMP=$(mktemp -d "$EXTRAS.tmp.XXXXXX")
    MMDEB_DIR=$EXTRAS_TMP mmdeb node --include=nodejs &
    pids+=($!)
    names+=(node)
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

if [[ -d $SCI_WHEELS ]]; then
    log "using cached wheels $SCI_WHEELS"
else
    log "downloading numpy/pandas/matplotlib wheels"
    WHEELS_TMP=$(mktemp -d "$SCI_WHEELS.tmp.XXXXXX")
    printf '%s\n' "$SCI_REQUIREMENTS" >"$WHEELS_TMP/requirements.txt"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-deps \
        --only-binary=:all: "${SCI_PLATFORM[@]}" --require-hashes -r "$WHEELS_TMP/requirements.txt" \
        -d "$WHEELS_TMP" >&2
    chmod 755 "$WHEELS_TMP"
    mv "$WHEELS_TMP" "$SCI_WHEELS"
    WHEELS_TMP=
    find "$SRC_CACHE" -mindepth 1 -maxdepth 1 -name 'sciwheels-*' ! -path "$SCI_WHEELS" -exec rm -rf {} +
fi

for i in "${!pids[@]}"; do
    name=${names[$i]}
    if ! wait "${pids[$i]}"; then
        case $name in node) dir=$EXTRAS_TMP ;; *) dir=$ROOTFS_TMP ;; esac
        tail -n 30 "$dir/$name.log" >&2 || true
        die "mmdebstrap ($name) failed; log above"
    fi
done
pids=()
if [[ -n $ROOTFS_TMP ]]; then
    rm -rf "$ROOTFS"
    chmod 755 "$ROOTFS_TMP"
    mv "$ROOTFS_TMP" "$ROOTFS"
    ROOTFS_TMP=
    find "$SRC_CACHE" -mindepth 1 -maxdepth 1 -name "rootfs-$SUITE-*" ! -path "$ROOTFS" -exec rm -rf {} +
    log "rootfs tarballs ready after $((SECONDS - START))s"
fi
if [[ -n $EXTRAS_TMP ]]; then
    rm -rf "$EXTRAS"
    chmod 755 "$EXTRAS_TMP"
    mv "$EXTRAS_TMP" "$EXTRAS"
    EXTRAS_TMP=
    find "$SRC_CACHE" -mindepth 1 -maxdepth 1 -name "extras-$SUITE-*" ! -path "$EXTRAS" -exec rm -rf {} +
    log "extra rootfs tarballs ready after $((SECONDS - START))s"
fi

# ---- layers + archives ----------------------------------------------------------------
"$PYTHON" "$HERE/mkarchive.py" build --busybox "$BUSYBOX" \
    --minbase "$ROOTFS/minbase.tar" --python "$ROOTFS/python.tar" --wheels "$WHEELS" \
    --sci-wheels "$SCI_WHEELS" --node "$EXTRAS/node.tar" \
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
