#!/bin/bash
# PID 1 of the cgroup v2 test host (tests/cgroupv2/README.md).
#
# The guest's root is the build host's / over 9p, read-only; the scratch disk (/dev/vda,
# ext4, made by the launcher with the job in /job) is mounted at /mnt and gives the writable
# places: /tmp, /etc (a copy), /var/tmp, HOME. The unified hierarchy is mounted as systemd
# mounts it (nsdelegate) and is the only one (cgroup_no_v1=all on the command line); the root
# group hands memory, cpu and pids to its children, as systemd's does.
#
# The job (/mnt/job/env, sourced) names the checkout (REPO), the Python to run (PYTHON) and
# the tests (/mnt/job/tests, one pytest node id per line). Results: /mnt/results/junit.xml and
# /mnt/results/rc; the console gets pytest's output. The guest then reboots, which ends QEMU
# (-no-reboot, reboot=t).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "cgv2-guest: $*"; }
end() {
    sync
    say "end"
    reboot -f
    sleep 10
}
trap end EXIT

mount -t proc proc /proc || say "mount /proc failed"
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null || true
mkdir -p /dev/pts /dev/shm
mount -t devpts -o ptmxmode=0666,mode=0620 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
mount -t ext4 /dev/vda /mnt || { say "no scratch disk"; exit 1; }
mkdir -p /mnt/results

# shellcheck source=/dev/null
. /mnt/job/env

# Writable places. The checkout may live under /tmp on the host: keep it visible through the
# new /tmp (bound aside first, then back at its own path on the scratch disk's /tmp).
mkdir -p /run/repo /mnt/tmp /mnt/vartmp /mnt/home
mount --bind "$REPO" /run/repo
chmod 1777 /mnt/tmp /mnt/vartmp
mount --bind /mnt/tmp /tmp
mount --bind /mnt/vartmp /var/tmp
mkdir -p "$REPO"
mount --bind /run/repo "$REPO"
cp -a /etc /mnt/etc && mount --bind /mnt/etc /etc
# As Debian's udev sets them (these hosts' tests rely on the same; see scripts/common.sh).
chmod 0666 /dev/fuse /dev/net/tun 2>/dev/null || true
export HOME=/mnt/home PYTHONDONTWRITEBYTECODE=1 TMPDIR=/tmp
hostname cgv2-guest
ip link set lo up

# The root group hands the controllers pvisor uses down, as systemd's does, and the tests run
# in a group they share with other processes, like a root shell's session scope
# (user.slice/.../session-N.scope): a root broker started there must find a group of its own.
echo "+memory +cpu +pids" >/sys/fs/cgroup/cgroup.subtree_control
mkdir -p /sys/fs/cgroup/tests.slice/runner.scope
echo "+memory +cpu +pids" >/sys/fs/cgroup/tests.slice/cgroup.subtree_control
echo $$ >/sys/fs/cgroup/tests.slice/runner.scope/cgroup.procs
say "kernel $(uname -r); cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers);" \
    "v1 hierarchies: $(grep -c ' - cgroup ' /proc/self/mountinfo)"

cd "$REPO"
mapfile -t TESTS </mnt/job/tests
say "running ${#TESTS[@]} test ids"
"$PYTHON" -m pytest -v -p no:cacheprovider -o junit_family=xunit2 \
    --junitxml=/mnt/results/junit.xml "${TESTS[@]}" 2>&1
rc=$?
echo "$rc" >/mnt/results/rc
say "pytest exited $rc"
