//! The rule tables of the VMM's per-thread filters: `vcpu` and `vmm_device`.
//!
//! Both are allow lists (anything else kills the process), in the style of Firecracker's
//! per-thread filters: a vm-backend worker is a VMM with a small, known syscall set per
//! thread. A child module of `rules` so it shares its `rule!` macro and syscall numbers.

use super::*;

/// `KVM_RUN` (`_IO(0xAE, 0x80)`).
pub const KVM_RUN: u64 = 0xae80;
/// `KVM_GET_REGS` (`_IOR(0xAE, 0x81, struct kvm_regs)`, 144 bytes).
pub const KVM_GET_REGS: u64 = 0x8090_ae81;
/// `KVM_GET_SREGS` (`_IOR(0xAE, 0x83, struct kvm_sregs)`, 312 bytes).
pub const KVM_GET_SREGS: u64 = 0x8138_ae83;
/// The ioctls a vCPU thread makes, by request number.
pub const VCPU_IOCTLS: &[u64] = &[KVM_RUN, KVM_GET_REGS, KVM_GET_SREGS];

/// The only `fallocate` mode of the device thread: punch a hole, keep the size.
const FALLOC_PUNCH_HOLE_KEEP_SIZE: u64 = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64;

/// `clone` flags that must be exactly `CLONE_THREAD` (no fork, no namespace).
const CLONE_THREAD_ONLY: u64 = libc::CLONE_THREAD as u64 | CLONE_NAMESPACE_FLAGS;

/// The vCPU thread filter. What runs under it: `KVM_RUN` and the device emulation of each
/// exit (the serial port writing the console log and raising its irqfd, test devices, the
/// virtio-mmio transport's register accesses), waking the thread that waits for the VM's end,
/// the kick signal's handler, and the thread's exit.
#[rustfmt::skip]
pub static VCPU: &[Rule] = &[
    // --- KVM --------------------------------------------------------------------------------
    rule!(SYS_ioctl, Action::Allow, When::ArgIn { arg: 1, values: VCPU_IOCTLS },
        "KVM_RUN, and KVM_GET_REGS/KVM_GET_SREGS to put the registers into a failure report; no VM, system or other ioctl."),
    // --- Devices emulated on exits ----------------------------------------------------------
    rule!(SYS_write, Action::Allow, Always,
        "Eventfd writes (the serial port's irqfd, virtio interrupts and queue kicks) and panic messages to stderr."),
    rule!(SYS_pwrite64, Action::Allow, Always,
        "The console log file, written at the offset it keeps (no seek)."),
    rule!(SYS_ftruncate, Action::Allow, Always,
        "The console log file is truncated when it reaches its cap, so a flooding guest cannot grow it."),
    // --- Memory (never executable) ----------------------------------------------------------
    rule!(SYS_mmap, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "malloc's per-thread arena and large allocations; never executable memory."),
    rule!(SYS_mprotect, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "malloc arenas grow by changing protection; never to executable."),
    rule!(SYS_munmap, Action::Allow, Always,
        "Freeing large allocations, and the alternate signal stack when the thread ends."),
    rule!(SYS_mremap, Action::Allow, Always,
        "Growing large allocations (the console ring, report strings)."),
    rule!(SYS_madvise, Action::Allow, Always,
        "malloc returns freed memory and glibc releases the stack of an exiting thread."),
    rule!(SYS_brk, Action::Allow, Always,
        "The main malloc arena, should this thread's allocations land in it."),
    // --- Synchronisation, signals, exit -----------------------------------------------------
    rule!(SYS_futex, Action::Allow, Always,
        "Device locks shared with other vCPUs and the event loop, and waking the thread waiting for the VM's end."),
    rule!(SYS_sched_yield, Action::Allow, Always,
        "Spin-then-yield in lock implementations."),
    rule!(SYS_rt_sigreturn, Action::Allow, Always,
        "Returning from the kick handler, which sets immediate_exit to stop KVM_RUN."),
    rule!(SYS_rt_sigprocmask, Action::Allow, Always,
        "glibc blocks signals while a thread exits."),
    rule!(SYS_sigaltstack, Action::Allow, Always,
        "Rust's runtime removes the thread's alternate signal stack when it exits."),
    rule!(SYS_exit, Action::Allow, Always,
        "The vCPU thread ends once the VM has."),
    rule!(SYS_clock_gettime, Action::Allow, Always,
        "Timestamps when the vDSO cannot answer."),
];

/// **Extension point for the virtio-mmio transport** (helper "virtio"): its register
/// accesses are emulated on the vCPU thread that exited, so what they need beyond [`VCPU`]
/// (e.g. at device activation) goes here with its reason; the filter is `VCPU` followed by
/// these, and a syscall may appear in only one of them. Keep it short: anything slow or
/// fd-creating belongs on the device thread, woken through an eventfd.
///
/// A `QueueNotify` write that misses its ioeventfd signals the queue's eventfd (`write`) and
/// the device state is behind a mutex shared with the device thread (`futex`), both in
/// [`VCPU`]. A driver's device reset (Linux resets every virtio device as it registers it)
/// runs the device's reset on the vCPU thread; for virtio-vsock that drops every host
/// connection, pending host connects included: each leaves the muxer's epoll set and is
/// closed. Found by a review (a reset during the worker's first agent connect killed the
/// worker).
#[rustfmt::skip]
pub static VCPU_VIRTIO: &[Rule] = &[
    rule!(SYS_epoll_ctl, Action::Allow, Always,
        "A vsock device reset takes its host connections out of the muxer's epoll set."),
    rule!(SYS_close, Action::Allow, Always,
        "A vsock device reset closes its host connections (and pending host connects)."),
    rule!(SYS_shutdown, Action::Allow, Always,
        "A vsock device reset may shut a host connection down before closing it."),
];

/// The device event loop filter: the thread(s) that serve virtio queues, block images and
/// vsock connections, woken by eventfds through epoll.
///
/// `EventLoop::spawn` (pvisor-vmm) installs it as the first thing the new thread does, so the
/// thread's start (`set_robust_list`, `rseq`, `sigaltstack`, `prctl(PR_SET_NAME)`,
/// `sched_getaffinity`) is not in the list; its end (`madvise`, `munmap`, `sigaltstack`,
/// `rt_sigprocmask`, `exit`) is. The list was checked against `strace -f` of the virtio test
/// guests (`vmm/tests/virtio_guests.rs`).
#[rustfmt::skip]
pub static VMM_DEVICE: &[Rule] = &[
    // --- The event loop ---------------------------------------------------------------------
    rule!(SYS_epoll_wait, Action::Allow, Always,
        "The event loop waits on its eventfds and sockets."),
    rule!(SYS_epoll_pwait, Action::Allow, Always,
        "Same as epoll_wait, where libc implements it with epoll_pwait."),
    rule!(SYS_epoll_ctl, Action::Allow, Always,
        "Adding and removing fds (new vsock connections) from the epoll set."),
    rule!(SYS_read, Action::Allow, Always,
        "Eventfds (queue notifications from ioeventfds, stop requests) and stream sockets."),
    rule!(SYS_write, Action::Allow, Always,
        "Interrupt eventfds (irqfds), stream sockets, and error messages to stderr."),
    // --- Block devices ----------------------------------------------------------------------
    rule!(SYS_pread64, Action::Allow, Always,
        "virtio-blk reads of disk images opened before the filter."),
    rule!(SYS_pwrite64, Action::Allow, Always,
        "virtio-blk writes to the scratch disk."),
    rule!(SYS_preadv, Action::Allow, Always,
        "virtio-blk reads into several guest buffers at once."),
    rule!(SYS_pwritev, Action::Allow, Always,
        "virtio-blk writes from several guest buffers at once."),
    rule!(SYS_fdatasync, Action::Allow, Always,
        "virtio-blk flush requests on the scratch disk."),
    rule!(SYS_fsync, Action::Allow, Always,
        "virtio-blk flush, where the file needs its metadata synced too."),
    rule!(SYS_fallocate, Action::Allow, When::ArgIn { arg: 1, values: &[FALLOC_PUNCH_HOLE_KEEP_SIZE] },
        "virtio-blk DISCARD and WRITE_ZEROES on the scratch disk punch holes (the space goes back to the host); that mode only, so the disk cannot grow."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_fadvise64, Action::Allow, When::ArgIn { arg: 3, values: &[libc::POSIX_FADV_DONTNEED as u64] },
        "The image disk (an erofs view of the pool) drops the compressed pack range it just read from the page cache; POSIX_FADV_DONTNEED only."),
    // --- vsock muxer: host-side Unix sockets -------------------------------------------------
    rule!(SYS_socket, Action::Allow, When::ArgIn { arg: 0, values: &[libc::AF_UNIX as u64] },
        "A guest connection to a host port becomes a Unix socket connection; AF_UNIX only."),
    rule!(SYS_connect, Action::Allow, Always,
        "Connecting a guest-initiated vsock stream to its host Unix socket."),
    rule!(SYS_accept4, Action::Allow, Always,
        "Accepting host connections to a guest vsock port on the listening Unix socket."),
    rule!(SYS_sendmsg, Action::Allow, Always,
        "Forwarding vsock payload to the host socket."),
    rule!(SYS_recvmsg, Action::Allow, Always,
        "Reading host socket data to forward to the guest."),
    rule!(SYS_sendto, Action::Allow, Always,
        "send(2) on a connected socket is sendto with no address."),
    rule!(SYS_recvfrom, Action::Allow, Always,
        "recv(2) on a connected socket is recvfrom with no address."),
    rule!(SYS_shutdown, Action::Allow, Always,
        "Half-closing a host socket when the guest shuts down one direction of a vsock stream."),
    rule!(SYS_close, Action::Allow, Always,
        "Closing host sockets of finished vsock connections."),
    rule!(SYS_fcntl, Action::Allow, When::ArgIn { arg: 1, values: &[libc::F_GETFD as u64] },
        "Rust's std checks that an fd is open before closing it (debug builds); F_GETFD only reads the close-on-exec flag."),
    // --- Memory (never executable) ----------------------------------------------------------
    rule!(SYS_mmap, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "Allocations and buffers; never executable memory."),
    rule!(SYS_mprotect, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "malloc arenas grow by changing protection; never to executable."),
    rule!(SYS_munmap, Action::Allow, Always,
        "Freeing large allocations."),
    rule!(SYS_mremap, Action::Allow, Always,
        "Growing large allocations."),
    rule!(SYS_madvise, Action::Allow, Always,
        "malloc returns freed memory; exiting threads release their stacks; virtio-balloon gives the guest pages it reports free back to the host (MADV_REMOVE on the RAM memfd, MADV_DONTNEED on private RAM)."),
    rule!(SYS_brk, Action::Allow, Always,
        "The main malloc arena grows and shrinks with brk."),
    // --- Threads, signals, exit -------------------------------------------------------------
    rule!(SYS_futex, Action::Allow, Always,
        "Locks shared with the vCPU threads (device state, queues)."),
    rule!(SYS_sched_yield, Action::Allow, Always,
        "Spin-then-yield in lock implementations."),
    rule!(SYS_clone, Action::Allow, When::ArgMaskedEq { arg: 0, mask: CLONE_THREAD_ONLY, value: libc::CLONE_THREAD as u64 },
        "A device may start a helper thread: threads only (CLONE_THREAD), no fork, no namespace."),
    rule!(SYS_clone3, ENOSYS, Always,
        "Its flags sit in a struct that BPF cannot read; ENOSYS makes glibc fall back to the filtered clone(2)."),
    rule!(SYS_rt_sigreturn, Action::Allow, Always,
        "Returning from a signal handler."),
    rule!(SYS_rt_sigprocmask, Action::Allow, Always,
        "glibc blocks signals around thread creation and exit."),
    rule!(SYS_sigaltstack, Action::Allow, Always,
        "Rust's runtime sets up and removes a thread's alternate signal stack."),
    rule!(SYS_exit, Action::Allow, Always,
        "An event loop thread ends."),
    rule!(SYS_clock_gettime, Action::Allow, Always,
        "Timestamps and timeouts when the vDSO cannot answer."),
];

/// **Extension point for the virtio device models** (helper "virtio"): syscalls the
/// virtio-blk / virtio-vsock / vhost-user code needs on the device thread beyond
/// [`VMM_DEVICE`]. Add a rule here (with its reason) rather than editing the list above; the
/// filter is `VMM_DEVICE` followed by these, and a syscall may appear in only one of them.
#[rustfmt::skip]
pub static VMM_DEVICE_VIRTIO: &[Rule] = &[
    rule!(SYS_eventfd2, Action::Allow, Always,
        "New eventfds for queues set up when the guest activates a device."),
];
