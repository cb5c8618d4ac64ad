//! The rule table of the netd filter (`pvisor-netd`, one per sandbox): an allow list.
//!
//! A child module of `rules` so it shares its `rule!` macro and syscall numbers. What runs
//! under it: one thread's mio event loop (epoll) over the sandbox's link (a tap or a
//! SOCK_SEQPACKET socket, read/write one frame each), the control socket (recvmsg with
//! SCM_RIGHTS, sendmsg), and host sockets it creates itself: TCP and UDP over AF_INET only,
//! a UDP bind probing whether an address is the host's own. It has no file to open (its root
//! is an empty tmpfs) and may not open one, exec, fork or make namespaces.

use super::*;

/// `fcntl` commands: mark the link non-blocking (the link arrives after the filter), and
/// std's debug-build fd check.
const FCNTL_CMDS: &[u64] = &[libc::F_GETFL as u64, libc::F_SETFL as u64, libc::F_GETFD as u64];

/// The netd filter (`pvisor-netd`): an allow list, everything else kills the process.
#[rustfmt::skip]
pub static NETD: &[Rule] = &[
    // --- The event loop --------------------------------------------------------------------
    rule!(SYS_epoll_wait, Action::Allow, Always,
        "mio waits on the link, the control socket and the host sockets."),
    rule!(SYS_epoll_pwait, Action::Allow, Always,
        "Same as epoll_wait, where libc implements it with epoll_pwait."),
    rule!(SYS_epoll_create1, Action::Allow, Always,
        "The event loop's epoll instance is made at start, when the link arrives (after the filter)."),
    rule!(SYS_epoll_ctl, Action::Allow, Always,
        "Host sockets of new flows join the epoll set and leave it when the flow ends; the link and control socket join once."),
    // --- The link, the control socket, host sockets -----------------------------------------
    rule!(SYS_read, Action::Allow, Always,
        "One Ethernet frame per read from the link; data from host TCP streams."),
    rule!(SYS_write, Action::Allow, Always,
        "One frame per write to the link; data to host TCP streams; error messages to stderr."),
    rule!(SYS_recvmsg, Action::Allow, Always,
        "Control messages from the worker, the first carrying the link's fd (SCM_RIGHTS)."),
    rule!(SYS_sendmsg, Action::Allow, Always,
        "One NetdReply per control message."),
    rule!(SYS_recvfrom, Action::Allow, Always,
        "Datagrams of UDP flows and upstream DNS answers."),
    rule!(SYS_sendto, Action::Allow, Always,
        "Datagrams of UDP flows and DNS questions forwarded upstream."),
    rule!(SYS_socket, Action::Allow, When::ArgIn { arg: 0, values: &[libc::AF_INET as u64] },
        "A host socket per flow (TCP, UDP) and for the host-address probe: AF_INET only, no Unix, netlink, packet or IPv6 sockets."),
    rule!(SYS_connect, Action::Allow, Always,
        "Non-blocking host connects of allowed TCP flows; connected UDP flow sockets."),
    rule!(SYS_bind, Action::Allow, Always,
        "UDP sockets bind an ephemeral port; binding a probe socket to an address tells whether it is the host's own (EADDRNOTAVAIL: not)."),
    rule!(SYS_getsockopt, Action::Allow, Always,
        "SO_ERROR: the outcome of a non-blocking connect."),
    rule!(SYS_setsockopt, Action::Allow, Always,
        "TCP_NODELAY and socket buffer sizes of host sockets; SO_LINGER 0 to pass a sandbox's reset on."),
    rule!(SYS_getpeername, Action::Allow, Always,
        "Whether a non-blocking connect has completed."),
    rule!(SYS_getsockname, Action::Allow, Always,
        "std and mio read a socket's local address after bind."),
    rule!(SYS_shutdown, Action::Allow, Always,
        "Passing the sandbox's FIN on to the host stream (SHUT_WR)."),
    rule!(SYS_close, Action::Allow, Always,
        "Host sockets of ended flows and probe sockets are closed."),
    rule!(SYS_fcntl, Action::Allow, When::ArgIn { arg: 1, values: FCNTL_CMDS },
        "The link, received after the filter, is made non-blocking (F_GETFL/F_SETFL); F_GETFD is std's check that an fd is open."),
    // --- Memory (never executable) ------------------------------------------------------------
    rule!(SYS_mmap, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "Frame buffers and per-flow socket buffers; never executable memory."),
    rule!(SYS_mprotect, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "malloc arenas change protection; never to executable."),
    rule!(SYS_munmap, Action::Allow, Always,
        "Freeing large allocations (a flow's buffers)."),
    rule!(SYS_mremap, Action::Allow, Always,
        "Growing large allocations (flow tables)."),
    rule!(SYS_madvise, Action::Allow, Always,
        "malloc returns freed memory, keeping an idle netd small."),
    rule!(SYS_brk, Action::Allow, Always,
        "The main malloc arena grows and shrinks with brk."),
    // --- Misc -----------------------------------------------------------------------------------
    rule!(SYS_getrandom, Action::Allow, Always,
        "Seeds for smoltcp's initial sequence numbers, DNS ids and std's hash maps."),
    rule!(SYS_futex, Action::Allow, Always,
        "std's locks (stderr, once-initialised statics); netd has one thread."),
    rule!(SYS_clock_gettime, Action::Allow, Always,
        "Timestamps when the vDSO cannot answer (smoltcp timers, flow expiry)."),
    rule!(SYS_rt_sigreturn, Action::Allow, Always,
        "Returning from a signal handler."),
    rule!(SYS_rt_sigprocmask, Action::Allow, Always,
        "glibc blocks signals around abort on a panic."),
    rule!(SYS_sigaltstack, Action::Allow, Always,
        "Rust's runtime removes the main thread's alternate signal stack at exit."),
    rule!(SYS_exit_group, Action::Allow, Always,
        "netd ends (control socket closed, link gone, or an error)."),
    rule!(SYS_exit, Action::Allow, Always,
        "The thread ends."),
];
