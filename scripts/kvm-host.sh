#!/usr/bin/env bash
# The KVM test host: a QEMU TCG guest whose `-cpu max` emulates AMD SVM with nested paging, so
# the /dev/kvm inside is hardware-style KVM and the project's own VMM boots Linux guests there.
# It runs COMMAND in that host as root and passes its output and exit status back; without a
# COMMAND it opens an interactive root shell on the terminal.
#
# Usage: scripts/kvm-host.sh [COMMAND [ARG...]]      (as root on the build host)
#
# Inside the host:
#   - / is this machine's / (9p, read-only) under an overlay whose upper layer is a sparse ext4
#     scratch disk: everything is writable, and nothing written reaches this machine, except
#   - the checkout (this script's repository), at its own path and writable through a 9p
#     export of its own: what a command writes there (bench results) lands here;
#   - so are the directories KVM_HOST_SHARE names (colon-separated), each at its own path, and
#     PVISOR_CACHE, CARGO_HOME and RUSTUP_HOME when they lie below /tmp or /var/tmp (fresh here);
#   - /var/cache/pvisor and every other directory of this machine are visible as they are;
#   - pure cgroup v2 (`cgroup_no_v1=all`), memory/cpu/pids handed down from the root group,
#     COMMAND in kvmhost.slice/command.scope, a group it shares (as a root shell's session
#     scope is shared);
#   - /dev/kvm (KVM_AMD), /dev/fuse and /dev/net/tun are 0666, as Debian's udev makes them;
#   - COMMAND runs in the caller's working directory (when it exists there) with the caller's
#     exported environment, less what describes this session (HOME, TERM, PWD, SHLVL, ...).
#
# Knobs (environment):
#   PVISOR_HOST_KERNEL   the test hosts' kernel (default: scripts/guest-kernel.sh --kvm-host)
#   KVM_HOST_MEMORY_MIB  the host's RAM (default 8192; allocated as it is touched)
#   KVM_HOST_CPUS        its vCPUs (default 2)
#   KVM_HOST_DISK_GIB    its scratch disk, sparse (default 64)
#   KVM_HOST_TIMEOUT     seconds until the host is killed (default 0: no limit)
#   KVM_HOST_CONSOLE     keep the kernel console in this file (default: shown when a run fails)
#   KVM_HOST_SHARE       more directories to share writable, colon-separated (e.g. for results)
#   KVM_HOST_QEMU        the QEMU that emulates the host (default: qemu-system-x86_64 on PATH)
#   KVM_HOST_APPEND      more words for the host kernel's command line
#
# Exit status: COMMAND's; 125 when the host did not run it to its end (the console's last
# lines go to stderr).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
INIT=$REPO/scripts/kvm-host.init
MEMORY=${KVM_HOST_MEMORY_MIB:-8192}
CPUS=${KVM_HOST_CPUS:-2}
DISK_GIB=${KVM_HOST_DISK_GIB:-64}
TIMEOUT=${KVM_HOST_TIMEOUT:-0}

die() { printf 'kvm-host: %s\n' "$*" >&2; exit 125; }
[ "$(id -u)" = 0 ] || die "needs root (the guest's root is this machine's / over 9p, passthrough)"
QEMU=${KVM_HOST_QEMU:-qemu-system-x86_64}
for tool in "$QEMU" mke2fs; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done
KERNEL=${PVISOR_HOST_KERNEL:-}
if [ -z "$KERNEL" ]; then
    KERNEL=$("$REPO/scripts/guest-kernel.sh" --kvm-host | tail -n 1) || die "no test host kernel"
fi
[ -f "$KERNEL" ] || die "kernel $KERNEL not found"

WORK=$(mktemp -d /tmp/pvisor-kvm-host.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
JOB=$WORK/disk/job
mkdir -p "$JOB"

# The job: argv and environment NUL-separated, the working directory, the terminal's size.
if (($#)); then
    printf '%s\0' "$@" >"$JOB/argv"
fi
pwd >"$JOB/cwd"
while IFS= read -r -d '' kv; do
    case ${kv%%=*} in
        HOME | PWD | OLDPWD | SHLVL | TERM | TERMCAP | COLUMNS | LINES | HOSTNAME | _ | SSH_* | DISPLAY | \
            XDG_* | DBUS_* | TMUX* | STY | WINDOW | MAIL | LS_COLORS | PS1 | PROMPT_COMMAND | BASH_FUNC_*) ;;
        *) printf '%s\0' "$kv" >>"$JOB/env" ;;
    esac
done < <(env -0)
: >>"$JOB/env"
# Writable shares: the checkout, then KVM_HOST_SHARE's directories (one 9p export each).
shares=("$REPO")
IFS=: read -r -a extra <<<"${KVM_HOST_SHARE:-}"
for d in "${extra[@]}"; do
    [ -n "$d" ] || continue
    [ -d "$d" ] || die "KVM_HOST_SHARE: $d is not a directory"
    shares+=("$(cd "$d" && pwd)")
done
# The host's /tmp and /var/tmp are fresh: caches the caller keeps below them would be hidden,
# so they are shared too (a cold run's PVISOR_CACHE=/var/tmp/..., say).
for var in PVISOR_CACHE CARGO_HOME RUSTUP_HOME; do
    d=${!var:-}
    case $d in
        /tmp/* | /var/tmp/*) [ -d "$d" ] && shares+=("$(cd "$d" && pwd)") ;;
    esac
done
printf '%s\n' "${shares[@]}" >"$JOB/shares"
if [ -t 0 ] && [ -t 1 ]; then stty size >"$JOB/tty-size" 2>/dev/null || true; fi

# The scratch disk: the overlay's upper layer and /run's disk, made with the job in it.
truncate -s "${DISK_GIB}G" "$WORK/scratch.img"
mke2fs -q -F -t ext4 -E root_owner=0:0 -d "$WORK/disk" "$WORK/scratch.img"

CONSOLE=${KVM_HOST_CONSOLE:-$WORK/console.log}
cmdline=(
    console=ttyS0 reboot=t panic=-1 quiet
    root=/dev/root rootfstype=9p "rootflags=trans=virtio,version=9p2000.L,msize=524288,cache=loose" ro
    "init=$INIT" cgroup_no_v1=all
    # TCG keeps one TSC for all vCPUs, but its boot-time sync check can fail and
    # leave the host on jiffies: no KVM_CLOCK_REALTIME, tick-grained timers.
    tsc=reliable
    # Shadow paging for the guests, not nested paging: under TCG's emulated NPT the guests'
    # kernels took page faults on mapped memory at random points of their boot (a triple
    # fault, a hang before the first console line, an oops; about half of the boots in a
    # create/delete loop), and one such fault was taken by this host's kernel instead
    # (a panic in svm_vcpu_run). With npt=0: 12 of 12 boots in that loop, and the vm lane
    # passed (tests/kvmhost/README.md).
    kvm_amd.npt=0
)
# shellcheck disable=SC2206 # words on purpose
cmdline+=(${KVM_HOST_APPEND:-})
qemu=(
    "$QEMU" -M microvm,acpi=off -accel tcg -cpu max -smp "$CPUS" -m "$MEMORY"
    -nodefaults -no-user-config -nographic -no-reboot
    -kernel "$KERNEL" -append "${cmdline[*]}"
    -fsdev local,id=root,path=/,security_model=passthrough,readonly=on,multidevs=remap
    -device virtio-9p-device,fsdev=root,mount_tag=/dev/root
    -drive "file=$WORK/scratch.img,format=raw,if=none,id=scratch,cache=unsafe"
    -device virtio-blk-device,drive=scratch
    -device virtio-serial-device,max_ports=4
)
for i in "${!shares[@]}"; do
    qemu+=(-fsdev "local,id=share$i,path=${shares[$i]},security_model=passthrough,multidevs=remap"
        -device "virtio-9p-device,fsdev=share$i,mount_tag=share$i")
done
if [ -f "$JOB/argv" ]; then
    # Output through FIFOs copied to this process's own stdout and stderr (cat writes to the
    # very file descriptions, so the output interleaves with the caller's as it would here);
    # the status to a file.
    mkfifo "$WORK/stdout" "$WORK/stderr"
    cat "$WORK/stdout" &
    cat "$WORK/stderr" >&2 &
    # Held open read-write here (never blocks) until QEMU is gone: the copies end only then.
    exec 3<>"$WORK/stdout" 4<>"$WORK/stderr"
    qemu+=(
        -serial "file:$CONSOLE"
        -chardev "file,id=out,path=$WORK/stdout" -device virtserialport,nr=1,chardev=out,name=stdout
        -chardev "file,id=err,path=$WORK/stderr" -device virtserialport,nr=2,chardev=err,name=stderr
        -chardev "file,id=rc,path=$WORK/rc" -device virtserialport,nr=3,chardev=rc,name=status
    )
    stdin=/dev/null
else
    qemu+=(-chardev stdio,id=con,signal=off -serial chardev:con
        -chardev "file,id=rc,path=$WORK/rc" -device virtserialport,nr=3,chardev=rc,name=status)
    stdin=/dev/stdin
fi

started=$(date +%s)
set +e
if [ "$TIMEOUT" -gt 0 ]; then
    timeout --kill-after=10 "$TIMEOUT" "${qemu[@]}" <"$stdin"
else
    "${qemu[@]}" <"$stdin"
fi
qemu_rc=$?
set -e
if [ -p "$WORK/stdout" ]; then
    exec 3>&- 4>&-
    wait
fi
rc=$(tr -dc 0-9 <"$WORK/rc" 2>/dev/null || true)
if [ -z "$rc" ]; then
    {
        echo "kvm-host: the host ended without COMMAND's status (qemu exit $qemu_rc after $(($(date +%s) - started)) s)"
        [ "$qemu_rc" = 124 ] && echo "kvm-host: killed after KVM_HOST_TIMEOUT=$TIMEOUT s"
        echo "kvm-host: console's last lines ($CONSOLE):"
        tail -n 40 "$CONSOLE" 2>/dev/null | sed 's/^/  | /'
    } >&2
    exit 125
fi
exit "$rc"
