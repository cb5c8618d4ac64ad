#!/usr/bin/env bash
# Builds the vm backend's guest kernel from Debian's linux-source-6.1 with the
# options in guest/kernel.options (applied on top of `make tinyconfig`), checks
# that every option took and that vmlinux has a PVH entry note, and caches it
# at OUTDIR/<key>/vmlinux (OUTDIR defaults to $PVISOR_CACHE/guest), where key
# hashes the source package version and the options files. A cached rerun is
# instant. Progress goes to stderr; the last line on stdout is the path.
#
# --kvm-host builds the test hosts' kernel instead: the same options plus
# guest/kvm-host.options (KVM, 9p, KSM, veth), for scripts/kvm-host.sh and
# tests/cgroupv2. Sandboxes never boot it.
#
# The untarred source tree is kept under OUTDIR/build (about 1.6 GB), one per
# source version, with one object tree per flavour beside it (O=), so a change
# to the options recompiles only the files that depend on the options changed
# (for a widely used option, most of them). Delete that directory to reclaim
# the space; the cached kernels stay valid.
#
# Usage: scripts/guest-kernel.sh [--kvm-host] [OUTDIR]
set -euo pipefail

# REPO, PVISOR_CACHE, log and install_missing.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
FLAVOUR=guest
OPTION_FILES=("$REPO/guest/kernel.options")
if [ "${1:-}" = --kvm-host ]; then
    FLAVOUR=kvm-host
    OPTION_FILES+=("$REPO/guest/kvm-host.options")
    shift
fi
OUTDIR=${1:-$PVISOR_CACHE/guest}
SRC_PKG=linux-source-6.1
SRC_TAR=/usr/src/$SRC_PKG.tar.xz

die() { printf 'guest-kernel: %s\n' "$*" >&2; exit 1; }

# What the build needs: the source package, the kernel's build tools, readelf (binutils).
ensure_build_packages() {
    install_missing "$SRC_PKG" bc bison flex libelf-dev make gcc libc6-dev binutils xz-utils
    [ -f "$SRC_TAR" ] || die "$SRC_TAR missing although $SRC_PKG is installed"
}

# Every option line of the options file must appear in .config as written; an
# option asked to be off must not be set (absent counts as off). Prints the misses.
check_options() {
    local config=$1 bad=() line name
    while IFS= read -r line; do
        if [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
            grep -qxF -- "$line" "$config" || bad+=("$line (got: $(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" "$config" || echo absent))")
        elif [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            name=${BASH_REMATCH[1]}
            if grep -qE "^$name=" "$config"; then bad+=("$line (got: $(grep -E "^$name=" "$config"))"); fi
        fi
    done < <(cat "${OPTION_FILES[@]}")
    if ((${#bad[@]})); then
        printf 'guest-kernel: these options did not take:\n' >&2
        printf '  %s\n' "${bad[@]}" >&2
        return 1
    fi
}

# PVH direct boot needs the XEN_ELFNOTE_PHYS32_ENTRY note (owner "Xen", type 18).
check_pvh_note() {
    readelf -n "$1" | grep -E '^\s*Xen\s' | grep -qE '\(0x0*12\)|\b18\b' \
        || die "$1 has no PVH entry note (Xen note type 18): is CONFIG_PVH on?"
}

ensure_build_packages
for f in "${OPTION_FILES[@]}"; do [ -f "$f" ] || die "$f missing"; done
VERSION=$(dpkg-query -W -f='${Version}' "$SRC_PKG")
KEY=$( { printf '%s %s\n' "$SRC_PKG" "$VERSION"; cat "${OPTION_FILES[@]}"; } | sha256sum | cut -c1-16)
OUT=$OUTDIR/$KEY
if [ -f "$OUT/vmlinux" ]; then
    log "$FLAVOUR kernel cached ($SRC_PKG $VERSION, key $KEY)"
    echo "$OUT/vmlinux"
    exit 0
fi

mkdir -p "$OUTDIR/build"
# One build at a time per cache (two set-ups may run side by side).
exec 9>"$OUTDIR/build/.lock"
flock 9
if [ -f "$OUT/vmlinux" ]; then
    echo "$OUT/vmlinux"
    exit 0
fi

start=$(date +%s)
TREE=$OUTDIR/build/$SRC_PKG-$VERSION
if [ ! -f "$TREE/.pvisor-untarred" ]; then
    log "unpacking $SRC_TAR"
    rm -rf "$TREE" "$TREE.tmp"
    mkdir -p "$TREE.tmp"
    tar -xf "$SRC_TAR" -C "$TREE.tmp" --strip-components=1
    touch "$TREE.tmp/.pvisor-untarred"
    mv "$TREE.tmp" "$TREE"
fi

cd "$TREE"
# Objects live in one tree per flavour (O=): the source tree must stay clean. Trees built in
# place by an earlier version of this script are cleaned once.
[ -f .config ] && { log "cleaning the in-tree build of an earlier layout"; make -s mrproper; }
OBJ=$OUTDIR/build/obj-$VERSION-$FLAVOUR
mkdir -p "$OBJ"
log "configuring $FLAVOUR (tinyconfig + $(cat "${OPTION_FILES[@]}" | grep -c '^CONFIG_\|^# CONFIG_') options)"
make -s O="$OBJ" tinyconfig >/dev/null
scripts/kconfig/merge_config.sh -m -O "$OBJ" "$OBJ/.config" "${OPTION_FILES[@]}" >/dev/null
make -s O="$OBJ" olddefconfig >&2
check_options "$OBJ/.config" || die "fix ${OPTION_FILES[*]} (an option may need another one it depends on)"

log "building the $FLAVOUR vmlinux (make -j$(nproc); log in $OBJ/build.log)"
if ! make -j"$(nproc)" O="$OBJ" vmlinux >"$OBJ/build.log" 2>&1; then
    tail -n 40 "$OBJ/build.log" >&2
    die "kernel build failed (full log: $OBJ/build.log)"
fi
check_pvh_note "$OBJ/vmlinux"

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
cp "$OBJ/vmlinux" "$OUT.tmp/vmlinux"
cp "$OBJ/.config" "$OUT.tmp/config"
printf '%s %s\n' "$SRC_PKG" "$VERSION" >"$OUT.tmp/source"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
log "$FLAVOUR kernel built in $(($(date +%s) - start)) s: $(stat -c %s "$OUT/vmlinux") bytes"
echo "$OUT/vmlinux"
