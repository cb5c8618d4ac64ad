# Shared steps of scripts/up.sh, scripts/test.sh and scripts/guest-kernel.sh. Source it; do not run it.
# Everything slow is cached outside the repository, under $PVISOR_CACHE.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PVISOR_CACHE=${PVISOR_CACHE:-/var/cache/pvisor}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PVISOR_CACHE/target}
# Whether every directory from / down to $1 lets other users through (o+x).
reachable_by_others() {
    local d=$1
    while [ "$d" != / ] && [ -n "$d" ]; do
        [ -e "$d" ] && (($(stat -c %a "$d") % 2 == 0)) && return 1
        d=$(dirname "$d")
    done
    return 0
}
# The release binaries. Unprivileged workers, agents and image servers (the tests run some as
# other users) open them, so where the checkout is not reachable by others (a clone in root's
# 0700 home) they live under the cache instead, one directory per checkout.
if reachable_by_others "$REPO"; then
    DIST=$REPO/target/dist
else
    DIST=$PVISOR_CACHE/dist/$(printf '%s' "$REPO" | sha256sum | cut -c1-16)
fi
VENV=$PVISOR_CACHE/venv
TEST_IMAGES=$PVISOR_CACHE/test-images

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# Installs those of the Debian packages named that are missing (one apt run).
install_missing() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        [ "$(id -u)" = 0 ] || { echo "need root to apt-get install ${missing[*]}" >&2; exit 1; }
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Debian packages the build, the images and the tests need.
ensure_packages() {
    # docker-registry, skopeo, apache2-utils: images/tests/registry.rs (a local registry to pull from).
    # fuse3: fusermount3, with which an unprivileged broker's image servers mount.
    # erofs-utils: fsck.erofs checks the vm backend's erofs image views.
    # qemu-system-x86, e2fsprogs, cpio: vmm's tests (a Linux guest under QEMU TCG, ext4 scratch
    # disks, the initramfs writer checked against GNU cpio). The kernel's build tools are
    # installed by scripts/guest-kernel.sh itself.
    install_missing protobuf-compiler mmdebstrap busybox-static ca-certificates debian-archive-keyring python3 python3-venv python3-pip gcc libc6-dev docker-registry skopeo apache2-utils fuse3 erofs-utils qemu-system-x86 e2fsprogs cpio
    command -v cargo >/dev/null || { echo "cargo not found: install a Rust toolchain (rustup, stable)" >&2; exit 1; }
}

# A QEMU whose vhost-user-vsock device migrates, for snapshots of vm sandboxes under the QEMU
# TCG test engine. Upstream QEMU (Debian 12's 7.2, and 10.0) marks that device unmigratable, so
# QEMU 10.0.2 (Debian's source, the one trixie ships) is built once with scripts/qemu/'s patch
# (it migrates as the kernel vhost-vsock device does) and only the test engine's devices
# (scripts/qemu/pvisor.mak), into $PVISOR_CACHE/qemu/<version>-<key>; the system's QEMU stays as
# it is and provides the firmware (bios-microvm.bin). About 10 minutes on 2 cores, once.
# Exports its path as PVISOR_QEMU (read by the broker and the worker).
QEMU_VERSION=10.0.2
QEMU_SHA256=0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1
qemu_snapshots() {
    local key dir work tarball=qemu_${QEMU_VERSION}+ds.orig.tar.xz
    key=$( (cat "$REPO"/scripts/qemu/*; declare -f qemu_snapshots) | sha256sum | cut -c1-16)
    dir=$PVISOR_CACHE/qemu/$QEMU_VERSION-$key
    export PVISOR_QEMU=$dir/bin/qemu-system-x86_64
    [ -x "$PVISOR_QEMU" ] && return
    install_missing curl xz-utils patch ninja-build pkgconf libglib2.0-dev zlib1g-dev libpixman-1-dev \
        libseccomp-dev libfdt-dev flex bison python3-venv
    log "building QEMU $QEMU_VERSION with scripts/qemu/ into $dir (vm snapshots under the test engine; once)"
    mkdir -p "$PVISOR_CACHE/qemu"
    if [ ! -f "$PVISOR_CACHE/qemu/$tarball" ]; then
        curl -fsSL --retry 3 -o "$PVISOR_CACHE/qemu/$tarball.tmp" "http://deb.debian.org/debian/pool/main/q/qemu/$tarball"
        mv "$PVISOR_CACHE/qemu/$tarball.tmp" "$PVISOR_CACHE/qemu/$tarball"
    fi
    echo "$QEMU_SHA256  $PVISOR_CACHE/qemu/$tarball" | sha256sum -c --quiet
    work=$PVISOR_CACHE/qemu/build-$key
    rm -rf "$work" && mkdir -p "$work"
    tar -C "$work" -xf "$PVISOR_CACHE/qemu/$tarball"
    # configure wants meson >= 1.5 (Debian 12 has 1.0) and finds it in the Python it is given.
    python3 -m venv "$work/venv" && "$work/venv/bin/pip" install -q meson==1.5.0 pycotap==1.3.1
    (
        cd "$work/qemu-$QEMU_VERSION"
        patch -p1 -s <"$REPO/scripts/qemu/vhost-user-vsock-migration.patch"
        cp "$REPO/scripts/qemu/pvisor.mak" configs/devices/x86_64-softmmu/pvisor.mak
        # Debian's source has no firmware blobs (the system's are used): skip unpacking them.
        sed -i 's/^if unpack_edk2_blobs$/if false/' pc-bios/meson.build
        mkdir build && cd build
        ../configure --python="$work/venv/bin/python3" --prefix="$dir" --target-list=x86_64-softmmu \
            --without-default-features --without-default-devices --with-devices-x86_64=pvisor \
            --enable-tcg --enable-seccomp --enable-vhost-user --enable-vhost-net --enable-fdt=system --enable-pixman \
            --disable-docs --disable-werror --disable-install-blobs >"$work/configure.log"
        ninja -j"$(nproc)" qemu-system-x86_64 >"$work/build.log"
        install -D -m 0755 qemu-system-x86_64 "$dir/bin/qemu-system-x86_64.tmp"
    )
    # Its data directory (relative to the binary) is the system's: firmware and option ROMs.
    mkdir -p "$dir/share" && ln -sfn /usr/share/qemu "$dir/share/qemu"
    "$dir/bin/qemu-system-x86_64.tmp" --version >/dev/null
    mv "$dir/bin/qemu-system-x86_64.tmp" "$PVISOR_QEMU"
    rm -rf "$work"
}

# Host settings the sandboxes need.
host_setup() {
    # An ns sandbox's network is a tap its init creates with the worker's own identity, so an
    # unprivileged broker's workers must be able to open /dev/net/tun. Debian's udev default is
    # 0666 (opening it grants nothing by itself: creating a tap needs CAP_NET_ADMIN over the
    # network namespace, so a user gets taps only in namespaces of its own); these hosts ship 0600.
    if [ -c /dev/net/tun ] && [ "$(stat -c %a /dev/net/tun)" != 666 ]; then
        if [ "$(id -u)" = 0 ]; then
            log "chmod 0666 /dev/net/tun (Debian's default; unprivileged workers open it)"
            chmod 0666 /dev/net/tun
        else
            echo "warning: /dev/net/tun is not 0666: unprivileged sandboxes get no network" >&2
        fi
    fi
}

# Release binaries into target/dist. The agent is static so it runs in any image; pvisor-netd
# is static too, so an idle one maps no shared libc and loader (1.5 MiB RSS instead of 2.3 MiB;
# its private memory is ~0.2 MiB either way). netd sits next to pvisor-worker: the worker
# starts it from its own directory.
build() {
    log "building (cargo target dir: $CARGO_TARGET_DIR)"
    mkdir -p "$CARGO_TARGET_DIR" "$DIST"
    (cd "$REPO" && cargo build --release --locked -p pvisor -p pvisor-worker -p pvisor-images --bin pvisor --bin pvisor-worker --bin pvisor-imaged)
    local triple
    triple=$(rustc -vV | sed -n 's/^host: //p')
    (cd "$REPO" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p pvisor-agent -p pvisor-netd --bin pvisor-agent --bin pvisor-netd --target "$triple")
    install -m 0755 "$CARGO_TARGET_DIR/release/pvisor" "$CARGO_TARGET_DIR/release/pvisor-worker" \
        "$CARGO_TARGET_DIR/release/pvisor-imaged" "$DIST/"
    install -m 0755 "$CARGO_TARGET_DIR/$triple/release/pvisor-agent" "$CARGO_TARGET_DIR/$triple/release/pvisor-netd" "$DIST/"
}

# The vm backend's guest kernel, built once from Debian's linux-source-6.1 (about 5 minutes of
# make -j2) and cached under $PVISOR_CACHE/guest; exports its path as PVISOR_GUEST_KERNEL.
guest_kernel() {
    log "guest kernel"
    PVISOR_GUEST_KERNEL=$("$REPO/scripts/guest-kernel.sh" | tail -n 1)
    [ -f "$PVISOR_GUEST_KERNEL" ] || { echo "guest-kernel.sh gave no kernel" >&2; exit 1; }
    export PVISOR_GUEST_KERNEL
}

# The test hosts' kernel (the guest kernel's options plus guest/kvm-host.options: KVM, 9p, KSM,
# veth), built once beside it (another ~5 minutes of make -j2 on a cold cache) for
# scripts/kvm-host.sh and tests/cgroupv2; exports its path as PVISOR_HOST_KERNEL.
host_kernel() {
    log "test host kernel"
    PVISOR_HOST_KERNEL=$("$REPO/scripts/guest-kernel.sh" --kvm-host | tail -n 1)
    [ -f "$PVISOR_HOST_KERNEL" ] || { echo "guest-kernel.sh --kvm-host gave no kernel" >&2; exit 1; }
    export PVISOR_HOST_KERNEL
}

# The four test images (+ an OCI-layout variant), built from Debian packages.
test_images() {
    log "test images ($TEST_IMAGES)"
    "$REPO/images/testdata/build-test-images.sh" "$TEST_IMAGES" >/dev/null
}

# A virtualenv made from requirements file $1 at $2, remade only when the file changes (its
# hash is the key). Every Python environment of the suite is one; each keeps its own pins.
keyed_venv() {
    local req=$1 venv=$2 what=$3 key
    key=$(sha256sum "$req" | cut -c1-16)
    if [ ! -f "$venv/.key-$key" ]; then
        log "$what ($venv)"
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
        touch "$venv/.key-$key"
    fi
}

# A virtualenv with the official OpenSandbox SDK, keyed by the requirements.
python_env() {
    keyed_venv "$REPO/tests/e2e/requirements.txt" "$VENV" "python environment"
}

# The API fuzzer's venv (schemathesis, tests/e2e/test_api_fuzz.py), apart from the SDK's so
# neither's pins move the other's; keyed by its requirements. Exports PVISOR_SCHEMATHESIS.
api_fuzz_env() {
    keyed_venv "$REPO/tests/apifuzz/requirements.txt" "$PVISOR_CACHE/venv-fuzz" "API fuzzer environment"
    export PVISOR_SCHEMATHESIS=$PVISOR_CACHE/venv-fuzz/bin/schemathesis
}

# The TypeScript SDK suite's packages (tests/ts: the pinned official SDK), installed by `npm ci`
# outside the repository and keyed by its package-lock.json. Exports PVISOR_TS_MODULES (its
# node_modules; tests/ts/run.sh links it). The SDK needs Node.js 20 or later.
ts_env() {
    local lock=$REPO/tests/ts/package-lock.json
    local key dir major
    command -v node >/dev/null && command -v npm >/dev/null || install_missing nodejs npm
    major=$(node -p 'process.versions.node.split(".")[0]')
    ((major >= 20)) || { echo "node $(node --version) is too old for the TypeScript SDK (needs 20+)" >&2; exit 1; }
    key=$(sha256sum "$lock" | cut -c1-16)
    dir=$PVISOR_CACHE/npm-ts/$key
    if [ ! -f "$dir/.done" ]; then
        log "TypeScript SDK environment ($dir)"
        rm -rf "$dir"
        mkdir -p "$dir"
        cp "$REPO/tests/ts/package.json" "$lock" "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
        touch "$dir/.done"
    fi
    export PVISOR_TS_MODULES=$dir/node_modules
}

# The real-client suite's venv (tests/clients: the official CLI `osb`, the OpenSandbox MCP
# server and the `mcp` client, grpcio-reflection), apart from the SDK's; keyed by its
# requirements. Exports PVISOR_CLIENTS_VENV.
clients_env() {
    keyed_venv "$REPO/tests/clients/requirements.txt" "$PVISOR_CACHE/venv-clients" "client environment"
    export PVISOR_CLIENTS_VENV=$PVISOR_CACHE/venv-clients
}

# A virtualenv with the Prometheus text parsers of tests/e2e/test_ops.py, keyed by its
# requirements; exports its interpreter as PVISOR_OPS_PYTHON.
ops_env() {
    keyed_venv "$REPO/tests/ops/requirements.txt" "$PVISOR_CACHE/venv-ops" "ops test environment"
    export PVISOR_OPS_PYTHON=$PVISOR_CACHE/venv-ops/bin/python
}
