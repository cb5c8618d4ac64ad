//! The rules of the three filters, as data.
//!
//! Every entry names one syscall, what the filter does with it, under which argument condition,
//! and a one-line justification. The sandbox and worker filters default to *allow*: a syscall
//! with no deny rule runs, and their `Action::Allow` entries emit no BPF at all; they record a
//! deliberate decision to leave a security-relevant syscall open, so that the decision is
//! reviewed with the rest. The image server filter is an *allow list*: a syscall that no
//! `Action::Allow` rule lets through (under its condition) kills the process.
//!
//! Argument conditions compare the low 32 bits of the argument only. That matches the kernel:
//! every argument filtered here is an `int`/`unsigned int` in the kernel, or (clone's and
//! unshare's flags) has all the bits we look at in its low half.
//!
//! The sandbox list follows Docker's default seccomp profile for a container without
//! `CAP_SYS_ADMIN`: everything that profile refuses is refused here, with a few documented
//! differences (stricter: io_uring, `name_to_handle_at`, `clock_adjtime`/`adjtimex`,
//! `ioctl(TIOCSTI)`; Docker's profile also predates some new syscalls such as `fchmodat2` and
//! `mseal`, which stay allowed here).

use std::fmt;
use std::sync::OnceLock;

/// Which of the three filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterKind {
    /// Installed by the sandbox's init just before it execs the in-sandbox agent.
    Sandbox,
    /// Installed by the per-sandbox worker on all its threads once the sandbox runs.
    Worker,
    /// Installed by `pvisor-imaged`, the FUSE server of one image, once its mount is live.
    ImageServer,
    /// Installed by each vCPU thread of a vm-backend worker before its first `KVM_RUN`.
    Vcpu,
    /// Installed by the VMM's device event loop thread(s) before they touch guest memory.
    VmmDevice,
    /// Installed by `pvisor-netd`, a sandbox's network process, once it has jailed itself.
    Netd,
    /// Installed by the agent's isolator, the in-sandbox helper that builds isolated
    /// sessions' namespaces and mounts; the sessions' processes add the sandbox filter.
    Isolator,
}

impl FilterKind {
    /// Every kind, sandbox first.
    pub const ALL: [FilterKind; 7] = [
        FilterKind::Sandbox,
        FilterKind::Worker,
        FilterKind::ImageServer,
        FilterKind::Vcpu,
        FilterKind::VmmDevice,
        FilterKind::Netd,
        FilterKind::Isolator,
    ];

    /// What the filter does with a syscall that no rule (or no rule's condition) matches.
    pub fn default_action(self) -> DefaultAction {
        match self {
            FilterKind::Sandbox | FilterKind::Worker | FilterKind::Isolator => DefaultAction::Allow,
            FilterKind::ImageServer | FilterKind::Vcpu | FilterKind::VmmDevice | FilterKind::Netd => {
                DefaultAction::KillProcess
            }
        }
    }
}

impl fmt::Display for FilterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FilterKind::Sandbox => "sandbox",
            FilterKind::Worker => "worker",
            FilterKind::ImageServer => "image server",
            FilterKind::Vcpu => "vcpu",
            FilterKind::VmmDevice => "vmm device",
            FilterKind::Netd => "netd",
            FilterKind::Isolator => "isolator",
        })
    }
}

/// What a filter does with a syscall no rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultAction {
    /// A deny list: everything not refused runs.
    Allow,
    /// An allow list: everything not allowed kills the whole process (`SECCOMP_RET_KILL_PROCESS`),
    /// which the kernel logs, so a missing rule shows up at once instead of as an odd errno.
    KillProcess,
}

/// What a filter does with a matching syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let the syscall through. In a default-allow filter this is a documented decision that
    /// emits no BPF; in an allow list (the image server filter) it is what lets the syscall run.
    Allow,
    /// Fail the syscall with this errno without running it.
    Errno(i32),
}

/// `Action::Errno(EPERM)`, the deny action of both filters (as in Docker's default profile).
pub(crate) const EPERM: Action = Action::Errno(libc::EPERM);
/// `Action::Errno(ENOSYS)`: "not implemented", so that libc falls back to an older syscall.
pub(crate) const ENOSYS: Action = Action::Errno(libc::ENOSYS);
/// `Action::Errno(EAFNOSUPPORT)`: "address family not supported".
pub(crate) const EAFNOSUPPORT: Action = Action::Errno(libc::EAFNOSUPPORT);

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Allow => f.write_str("allow"),
            Action::Errno(e) => match errno_name(e) {
                Some(name) => f.write_str(name),
                None => write!(f, "errno {e}"),
            },
        }
    }
}

fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOSYS => "ENOSYS",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EINVAL => "EINVAL",
        libc::EACCES => "EACCES",
        _ => return None,
    })
}

/// When a rule applies. Arguments are numbered from 0; only their low 32 bits are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Whatever the arguments.
    Always,
    /// Argument `arg` has at least one of the bits of `mask` set.
    ArgAnyBit {
        /// Argument index (0..=5).
        arg: u8,
        /// Bits to test; must fit in 32 bits.
        mask: u64,
    },
    /// Argument `arg` equals one of `values`.
    ArgIn {
        /// Argument index (0..=5).
        arg: u8,
        /// Values that trigger the rule; each must fit in 32 bits.
        values: &'static [u64],
    },
    /// Argument `arg` equals none of `values`.
    ArgNotIn {
        /// Argument index (0..=5).
        arg: u8,
        /// The only values that do not trigger the rule; each must fit in 32 bits.
        values: &'static [u64],
    },
    /// Argument `arg`, masked with `mask`, equals `value` (e.g. `prot & PROT_EXEC == 0`).
    ArgMaskedEq {
        /// Argument index (0..=5).
        arg: u8,
        /// Bits to look at; must be non-zero and fit in 32 bits.
        mask: u64,
        /// What those bits must be; must lie within `mask`.
        value: u64,
    },
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list(f: &mut fmt::Formatter<'_>, values: &[u64]) -> fmt::Result {
            f.write_str("{")?;
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                if *v < 256 {
                    write!(f, "{v}")?;
                } else {
                    write!(f, "{v:#x}")?;
                }
            }
            f.write_str("}")
        }
        match *self {
            When::Always => f.write_str("always"),
            When::ArgAnyBit { arg, mask } => write!(f, "arg{arg} & {mask:#x} != 0"),
            When::ArgIn { arg, values } => {
                write!(f, "arg{arg} in ")?;
                list(f, values)
            }
            When::ArgNotIn { arg, values } => {
                write!(f, "arg{arg} not in ")?;
                list(f, values)
            }
            When::ArgMaskedEq { arg, mask, value } => write!(f, "arg{arg} & {mask:#x} == {value:#x}"),
        }
    }
}

/// One entry of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Syscall name, as in `man 2` (and libc's `SYS_` constant without the prefix).
    pub name: &'static str,
    /// Syscall number on the architecture this crate was compiled for.
    pub sysno: i64,
    /// What happens when the rule applies.
    pub action: Action,
    /// Argument condition under which the rule applies.
    pub when: When,
    /// Why: one line.
    pub justification: &'static str,
}

/// The rules of one filter, in table order. The worker's table is the sandbox's with the
/// worker's own rules replacing sandbox rules for the same syscall, and the rest appended.
pub fn rules(kind: FilterKind) -> &'static [Rule] {
    match kind {
        FilterKind::Sandbox => SANDBOX,
        FilterKind::ImageServer => IMAGE_SERVER,
        FilterKind::Netd => netd_rules::NETD,
        FilterKind::Vcpu => {
            static VCPU_TABLE: OnceLock<Vec<Rule>> = OnceLock::new();
            VCPU_TABLE.get_or_init(|| [vmm_rules::VCPU, vmm_rules::VCPU_VIRTIO].concat())
        }
        FilterKind::VmmDevice => {
            static VMM_DEVICE_TABLE: OnceLock<Vec<Rule>> = OnceLock::new();
            VMM_DEVICE_TABLE.get_or_init(|| [vmm_rules::VMM_DEVICE, vmm_rules::VMM_DEVICE_VIRTIO].concat())
        }
        FilterKind::Worker => {
            static WORKER_TABLE: OnceLock<Vec<Rule>> = OnceLock::new();
            WORKER_TABLE.get_or_init(|| compose(WORKER))
        }
        FilterKind::Isolator => {
            static ISOLATOR_TABLE: OnceLock<Vec<Rule>> = OnceLock::new();
            ISOLATOR_TABLE.get_or_init(|| compose(ISOLATOR))
        }
    }
}

/// Sandbox rules, then `own` rules replacing sandbox ones with the same syscall number.
fn compose(own: &[Rule]) -> Vec<Rule> {
    let mut out = Vec::with_capacity(SANDBOX.len() + own.len());
    for s in SANDBOX {
        if own.iter().any(|w| w.sysno == s.sysno) {
            // Put the own rules where the sandbox rule was, once.
            if !out.iter().any(|r: &Rule| r.sysno == s.sysno) {
                out.extend(own.iter().filter(|w| w.sysno == s.sysno).copied());
            }
        } else {
            out.push(*s);
        }
    }
    for w in own {
        if !SANDBOX.iter().any(|s| s.sysno == w.sysno) {
            out.push(*w);
        }
    }
    out
}

/// Whether a worker rule comes from the worker's own list (as opposed to the sandbox's).
pub(crate) fn is_worker_specific(rule: &Rule) -> bool {
    WORKER.contains(rule)
}

/// Whether an isolator rule comes from the isolator's own list (as opposed to the sandbox's).
pub(crate) fn is_isolator_specific(rule: &Rule) -> bool {
    ISOLATOR.contains(rule)
}

/// Namespaces the isolator never makes: a user namespace (sessions run in the sandbox's),
/// a cgroup namespace, a time namespace.
const ISOLATOR_REFUSED_NAMESPACES: u64 = (libc::CLONE_NEWUSER | libc::CLONE_NEWCGROUP) as u64;

const fn strip_sys_prefix(s: &'static str) -> &'static str {
    let bytes = s.as_bytes();
    assert!(bytes.len() > 4 && bytes[0] == b'S' && bytes[1] == b'Y' && bytes[2] == b'S' && bytes[3] == b'_');
    let (_, rest) = bytes.split_at(4);
    match std::str::from_utf8(rest) {
        Ok(name) => name,
        Err(_) => panic!("syscall constant is not UTF-8"),
    }
}

/// Syscall numbers: libc's, plus a few that libc no longer (or does not yet) define.
#[allow(non_upper_case_globals)]
mod nr {
    pub use libc::*;

    // Removed from the kernel in 2.6; libc dropped the constants. x86_64 numbers.
    #[cfg(target_arch = "x86_64")]
    pub const SYS_create_module: c_long = 174;
    #[cfg(target_arch = "x86_64")]
    pub const SYS_get_kernel_syms: c_long = 177;
    #[cfg(target_arch = "x86_64")]
    pub const SYS_query_module: c_long = 178;
    // Linux 6.15, the same number on every architecture (common syscall table).
    pub const SYS_open_tree_attr: c_long = 467;
}

/// `rule!(SYS_name, action, when, "justification")`.
macro_rules! rule {
    ($sys:ident, $action:expr, $when:expr, $why:literal $(,)?) => {
        Rule {
            name: strip_sys_prefix(stringify!($sys)),
            sysno: nr::$sys as i64,
            action: $action,
            when: $when,
            justification: $why,
        }
    };
}

#[path = "vmm_rules.rs"]
pub(crate) mod vmm_rules;

#[path = "netd_rules.rs"]
pub(crate) mod netd_rules;

/// The namespace flags of clone(2): `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS |
/// CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET` (Docker's mask, 0x7e020000).
/// `CLONE_NEWTIME` (0x80) is not among them: clone(2) cannot request it, its bit lies in the
/// `CSIGNAL` byte that carries the exit signal.
pub const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The namespace flags of unshare(2): the clone ones plus `CLONE_NEWTIME`.
pub const UNSHARE_NAMESPACE_FLAGS: u64 = CLONE_NAMESPACE_FLAGS | libc::CLONE_NEWTIME as u64;

/// The personas Docker's default profile lets through: `PER_LINUX` (0), `PER_LINUX32` (0x8),
/// `UNAME26` (0x20000), `PER_LINUX32 | UNAME26` (0x20008) and the query value 0xffffffff.
pub const ALLOWED_PERSONAS: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// `TIOCSTI` and `TIOCLINUX` (libc types them `c_ulong` on glibc, `c_int` on musl).
#[allow(clippy::unnecessary_cast)]
const TTY_INJECTION_IOCTLS: &[u64] = &[libc::TIOCSTI as u64, libc::TIOCLINUX as u64];

use When::Always;

/// The sandbox filter: default allow, these rules deny (see the module docs).
pub static SANDBOX: &[Rule] = &[
    // --- Namespaces -----------------------------------------------------------------------
    rule!(SYS_unshare, EPERM, When::ArgAnyBit { arg: 0, mask: UNSHARE_NAMESPACE_FLAGS },
        "New namespaces (above all CLONE_NEWUSER) hand out fresh capabilities that unlock kernel surface (netfilter, mounts, ...); unshare without namespace flags stays allowed."),
    rule!(SYS_clone, EPERM, When::ArgAnyBit { arg: 0, mask: CLONE_NAMESPACE_FLAGS },
        "Same as unshare, through clone (flags are arg0 on x86_64 and aarch64); fork, vfork and thread creation carry no namespace flag and stay allowed."),
    rule!(SYS_clone3, ENOSYS, Always,
        "Its flags sit in a struct that BPF cannot read, so namespace flags could not be filtered; ENOSYS (not EPERM) makes glibc fall back to the filtered clone(2)."),
    rule!(SYS_setns, EPERM, Always,
        "Joining another namespace (through a leaked /proc/PID/ns fd or a pidfd) is never needed inside the sandbox and is the classic way back into the host's."),
    // --- Mounts (init has finished the sandbox's mount layout before the filter) ----------
    rule!(SYS_mount, EPERM, Always,
        "Mounting could reshape the sandbox's filesystem view (e.g. over the masked /proc paths) and reaches filesystem-driver parsers."),
    rule!(SYS_umount2, EPERM, Always,
        "Unmounting could uncover what init's mounts hide (masked /proc entries, read-only binds)."),
    rule!(SYS_pivot_root, EPERM, Always,
        "init has already switched root; a second pivot only serves to rearrange or escape the mount layout."),
    rule!(SYS_mount_setattr, EPERM, Always,
        "New mount API: changes flags of existing mounts (e.g. clears read-only, nosuid or idmapping)."),
    rule!(SYS_move_mount, EPERM, Always,
        "New mount API: attaches or moves mount trees, the same power as mount(2)."),
    rule!(SYS_open_tree, EPERM, Always,
        "New mount API: clones mount trees (OPEN_TREE_CLONE) for move_mount, the same power as mount(2)."),
    rule!(SYS_open_tree_attr, EPERM, Always,
        "New mount API (Linux 6.15): open_tree that also sets mount attributes."),
    rule!(SYS_fsopen, EPERM, Always,
        "New mount API: creates a filesystem context, reaching the same driver code as mount(2)."),
    rule!(SYS_fsconfig, EPERM, Always,
        "New mount API: feeds options to a filesystem context (driver option parsers)."),
    rule!(SYS_fsmount, EPERM, Always,
        "New mount API: turns a filesystem context into a mount."),
    rule!(SYS_fspick, EPERM, Always,
        "New mount API: reopens an existing superblock for reconfiguration (a remount)."),
    // --- Kernel code, boot and host-wide administration -----------------------------------
    rule!(SYS_init_module, EPERM, Always,
        "Loads kernel code; never legitimate from a sandbox (CAP_SYS_MODULE in Docker)."),
    rule!(SYS_finit_module, EPERM, Always,
        "Loads kernel code from a file descriptor; same as init_module."),
    rule!(SYS_delete_module, EPERM, Always,
        "Unloads kernel modules from the host kernel."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_create_module, EPERM, Always,
        "Pre-2.6 module syscall, gone from the kernel; denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_get_kernel_syms, EPERM, Always,
        "Pre-2.6 module syscall, gone from the kernel; denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_query_module, EPERM, Always,
        "Pre-2.6 module syscall, gone from the kernel; denied like Docker so the number stays closed."),
    rule!(SYS_kexec_load, EPERM, Always,
        "Loads a new kernel to boot into."),
    rule!(SYS_kexec_file_load, EPERM, Always,
        "Loads a new kernel to boot into, from a file."),
    rule!(SYS_reboot, EPERM, Always,
        "Reboot/halt/Ctrl-Alt-Del control; no sandbox workload needs it (CAP_SYS_BOOT in Docker)."),
    rule!(SYS_swapon, EPERM, Always,
        "Host-wide swap configuration."),
    rule!(SYS_swapoff, EPERM, Always,
        "Host-wide swap configuration."),
    rule!(SYS_acct, EPERM, Always,
        "Process accounting is host-wide, not namespaced (CAP_SYS_PACCT in Docker)."),
    rule!(SYS_quotactl, EPERM, Always,
        "Disk quota administration is not namespaced."),
    rule!(SYS_quotactl_fd, EPERM, Always,
        "Disk quota administration through a file descriptor; same as quotactl."),
    rule!(SYS_syslog, EPERM, Always,
        "Reads or clears the host kernel log, which leaks kernel addresses and host activity."),
    rule!(SYS_vhangup, EPERM, Always,
        "Hangs up the current terminal (CAP_SYS_TTY_CONFIG in Docker)."),
    rule!(SYS_sethostname, EPERM, Always,
        "init sets the sandbox's hostname before the filter; Docker denies it without CAP_SYS_ADMIN."),
    rule!(SYS_setdomainname, EPERM, Always,
        "init sets the sandbox's UTS names before the filter; Docker denies it without CAP_SYS_ADMIN."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_ioperm, EPERM, Always,
        "Raw access to hardware I/O ports (CAP_SYS_RAWIO in Docker)."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_iopl, EPERM, Always,
        "Raw access to all hardware I/O ports and interrupt disabling (CAP_SYS_RAWIO in Docker)."),
    // --- Obsolete or unimplemented syscalls Docker denies ----------------------------------
    rule!(SYS_nfsservctl, EPERM, Always,
        "Removed NFS server control interface (Linux 3.1); denied like Docker."),
    rule!(SYS_lookup_dcookie, EPERM, Always,
        "Old profiling interface resolving kernel dcookies (removed in 6.9); CAP_SYS_ADMIN in Docker."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS__sysctl, EPERM, Always,
        "Obsolete binary sysctl interface (removed in 5.5); /proc/sys covers the legitimate use."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_sysfs, EPERM, Always,
        "Obsolete filesystem-type query; /proc/filesystems covers the legitimate use."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_ustat, EPERM, Always,
        "Obsolete filesystem statistics by device number; statfs covers the legitimate use."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_uselib, EPERM, Always,
        "Obsolete a.out shared-library loader."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_afs_syscall, EPERM, Always,
        "Never implemented in Linux; denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_getpmsg, EPERM, Always,
        "Never implemented in Linux (STREAMS); denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_putpmsg, EPERM, Always,
        "Never implemented in Linux (STREAMS); denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_security, EPERM, Always,
        "Never implemented in Linux; denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_tuxcall, EPERM, Always,
        "Never implemented in Linux; denied like Docker so the number stays closed."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_vserver, EPERM, Always,
        "Never implemented in Linux; denied like Docker so the number stays closed."),
    // --- Time (the clocks are not namespaced) ---------------------------------------------
    rule!(SYS_settimeofday, EPERM, Always,
        "Sets the host's wall clock; time namespaces only offset CLOCK_MONOTONIC/BOOTTIME."),
    rule!(SYS_clock_settime, EPERM, Always,
        "Sets a host clock; time namespaces only offset CLOCK_MONOTONIC/BOOTTIME."),
    rule!(SYS_clock_adjtime, EPERM, Always,
        "Tunes the host clock (NTP discipline); denied whole, read-only queries included, stricter than current Docker."),
    rule!(SYS_adjtimex, EPERM, Always,
        "The same interface as clock_adjtime on CLOCK_REALTIME; denied so the clock_adjtime rule cannot be sidestepped."),
    // --- Keyrings --------------------------------------------------------------------------
    rule!(SYS_add_key, EPERM, Always,
        "Kernel keyrings are not (fully) namespaced and have a long CVE history; Docker denies them."),
    rule!(SYS_keyctl, EPERM, Always,
        "Kernel keyrings are not (fully) namespaced and have a long CVE history; Docker denies them."),
    rule!(SYS_request_key, EPERM, Always,
        "Kernel keyrings are not (fully) namespaced; request_key can also upcall into host user space."),
    // --- Large kernel attack surface -------------------------------------------------------
    rule!(SYS_bpf, EPERM, Always,
        "eBPF programs and maps: a large kernel attack surface (verifier bugs) with no use in the sandbox."),
    rule!(SYS_perf_event_open, EPERM, Always,
        "Perf events leak kernel and host information and have a history of exploitable bugs."),
    rule!(SYS_userfaultfd, EPERM, Always,
        "Lets user space stall kernel page faults at will, a staple of kernel race exploits."),
    rule!(SYS_io_uring_setup, EPERM, Always,
        "io_uring runs I/O in kernel workers that seccomp never sees (a filter bypass) and is a leading source of kernel CVEs."),
    rule!(SYS_io_uring_enter, EPERM, Always,
        "See io_uring_setup; denied too in case a ring fd is ever inherited."),
    rule!(SYS_io_uring_register, EPERM, Always,
        "See io_uring_setup; denied too in case a ring fd is ever inherited."),
    rule!(SYS_open_by_handle_at, EPERM, Always,
        "Opens any file of a filesystem by handle, bypassing the mount layout (the 'shocker' container escape)."),
    rule!(SYS_name_to_handle_at, EPERM, Always,
        "Only produces handles for open_by_handle_at (denied); stricter than Docker, which allows it."),
    rule!(SYS_fanotify_init, EPERM, Always,
        "Filesystem-wide event monitoring across mounts (CAP_SYS_ADMIN in Docker)."),
    // --- Reaching into other processes beyond ptrace ---------------------------------------
    rule!(SYS_kcmp, EPERM, Always,
        "Compares kernel objects of two processes, leaking kernel pointer ordering (CAP_SYS_PTRACE in Docker)."),
    rule!(SYS_pidfd_getfd, EPERM, Always,
        "Takes a copy of another process's file descriptor (CAP_SYS_PTRACE in Docker)."),
    rule!(SYS_process_madvise, EPERM, Always,
        "Applies madvise to another process's memory (CAP_SYS_PTRACE in Docker)."),
    // --- NUMA memory policy (CAP_SYS_NICE in Docker; libnuma copes with EPERM) -------------
    rule!(SYS_get_mempolicy, EPERM, Always,
        "NUMA policy family, denied whole like Docker without CAP_SYS_NICE; libnuma treats EPERM as no NUMA."),
    rule!(SYS_set_mempolicy, EPERM, Always,
        "Binds memory to host NUMA nodes, which can starve other tenants of a node."),
    rule!(SYS_set_mempolicy_home_node, EPERM, Always,
        "Sets the home NUMA node of a memory range; same family as set_mempolicy."),
    rule!(SYS_mbind, EPERM, Always,
        "Binds memory ranges to host NUMA nodes; same family as set_mempolicy."),
    rule!(SYS_migrate_pages, EPERM, Always,
        "Moves all pages of a process between host NUMA nodes."),
    rule!(SYS_move_pages, EPERM, Always,
        "Moves pages of a process between host NUMA nodes."),
    // --- Argument-filtered ------------------------------------------------------------------
    rule!(SYS_personality, EPERM, When::ArgNotIn { arg: 0, values: ALLOWED_PERSONAS },
        "Only Docker's personas (PER_LINUX, PER_LINUX32, UNAME26, the query); others such as ADDR_NO_RANDOMIZE or READ_IMPLIES_EXEC weaken exploit mitigations."),
    rule!(SYS_socket, EPERM, When::ArgIn { arg: 0, values: &[libc::AF_VSOCK as u64] },
        "vsock is not network-namespaced and reaches the host or hypervisor (Docker denies it); every other family, AF_NETLINK included, sees only the sandbox's own netns."),
    rule!(SYS_ioctl, EPERM, When::ArgIn { arg: 1, values: TTY_INJECTION_IOCTLS },
        "TIOCSTI types input into a terminal and TIOCLINUX drives VT consoles, both ways to inject commands into a more privileged reader's tty (bubblewrap denies them too)."),
    // --- Deliberately allowed ----------------------------------------------------------------
    rule!(SYS_ptrace, Action::Allow, Always,
        "Debuggers and strace need it; the pid namespace hides every process outside the sandbox, and since Linux 4.8 tracers cannot bypass seccomp."),
    rule!(SYS_process_vm_readv, Action::Allow, Always,
        "Same ptrace-attach permission check as ptrace (allowed) and limited to sandbox processes by the pid namespace; used by profilers such as py-spy."),
    rule!(SYS_process_vm_writev, Action::Allow, Always,
        "Same ptrace-attach permission check as ptrace (allowed) and limited to sandbox processes by the pid namespace."),
];

/// The worker's own rules. The worker filter is the sandbox filter with these replacing the
/// sandbox rules for the same syscalls, and the rest appended.
pub static WORKER: &[Rule] = &[
    rule!(
        SYS_unshare,
        EPERM,
        Always,
        "The worker has made its sandbox and never unshares anything again, with or without namespace flags."
    ),
    rule!(
        SYS_execve,
        EPERM,
        Always,
        "The worker has spawned its sandbox and never execs; a hijacked worker cannot turn into another program."
    ),
    rule!(SYS_execveat, EPERM, Always, "Same as execve, through a directory fd."),
    rule!(
        SYS_ptrace,
        EPERM,
        Always,
        "The worker never traces; a hijacked worker must not take over its sandbox's processes."
    ),
    rule!(SYS_process_vm_readv, EPERM, Always, "The worker never reads other processes' memory."),
    rule!(SYS_process_vm_writev, EPERM, Always, "The worker never writes other processes' memory."),
    rule!(
        SYS_socket,
        EAFNOSUPPORT,
        When::ArgNotIn { arg: 0, values: &[libc::AF_UNIX as u64] },
        "The worker serves gRPC on a Unix socket only: no IP, netlink, packet or vsock sockets."
    ),
    rule!(
        SYS_chroot,
        EPERM,
        Always,
        "The worker's root is fixed; changing it only helps an attacker confuse path checks."
    ),
];

/// The isolator's own rules (the agent's helper that builds isolated sessions, and each
/// session's init until it has built the session's mounts). The isolator filter is the sandbox
/// filter with these replacing the sandbox rules for the same syscalls: what building pid,
/// mount, ipc, uts and network namespaces and a session's mount layout needs, nothing more.
/// A session's init adds the sandbox filter before any session process runs.
pub static ISOLATOR: &[Rule] = &[
    rule!(SYS_unshare, EPERM, When::ArgAnyBit { arg: 0, mask: ISOLATOR_REFUSED_NAMESPACES | libc::CLONE_NEWTIME as u64 },
        "The isolator clones sessions into new pid, mount, ipc, uts (and network) namespaces; never a user, cgroup or time namespace."),
    rule!(SYS_clone, EPERM, When::ArgAnyBit { arg: 0, mask: ISOLATOR_REFUSED_NAMESPACES },
        "Same as unshare: a session's namespaces come from clone(2), never a user or cgroup namespace."),
    rule!(SYS_mount, Action::Allow, Always,
        "A session's init builds its root: its own mount propagation, tmpfs, proc, devpts, overlay and (recursive) bind mounts of the sandbox's."),
    rule!(SYS_umount2, Action::Allow, Always,
        "A session's init detaches the sandbox's old root after pivot_root."),
    rule!(SYS_pivot_root, Action::Allow, Always,
        "A session's init switches to the root it built."),
    rule!(SYS_mount_setattr, Action::Allow, Always,
        "A session's init makes its root and read-only mounts read-only, recursively."),
];

/// `clone` flags the image server may pass: a thread (`CLONE_THREAD`), never a namespace.
const CLONE_THREAD_CHECK: u64 = libc::CLONE_THREAD as u64 | CLONE_NAMESPACE_FLAGS;

/// The image server filter (`pvisor-imaged`): an allow list, everything else kills the process.
///
/// What runs under it: fuser's session loop on the `/dev/fuse` fd that the server mounted
/// before jailing (a few threads that `read` requests and `writev` replies), the image view
/// (`pread64` of pack files opened before jailing, zstd decompression in memory), a thread
/// waiting for EOF on the lifeline pipe, and `write` to stderr. It cannot open, create or
/// receive a file descriptor, so reads and writes are not filtered by fd: every fd it has was
/// there before the filter (the fuse fd, read-only pack files, the ready and lifeline pipes
/// and stdio).
pub static IMAGE_SERVER: &[Rule] = &[
    // --- The FUSE loop and the image ----------------------------------------------------------
    rule!(SYS_read, Action::Allow, Always,
        "Requests from the /dev/fuse fd, and EOF from the lifeline pipe."),
    rule!(SYS_write, Action::Allow, Always,
        "Error messages to stderr and ready to the ready pipe; no fd can be opened, so none other is reachable."),
    rule!(SYS_writev, Action::Allow, Always,
        "Replies to the kernel on the /dev/fuse fd (fuser writes header and payload in one writev)."),
    rule!(SYS_pread64, Action::Allow, Always,
        "Compressed chunks from the pack files, opened read-only before the filter."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_fadvise64, Action::Allow, When::ArgIn { arg: 3, values: &[libc::POSIX_FADV_DONTNEED as u64] },
        "DONTNEED only: drops a pack range just read from the page cache (its content is cached decompressed)."),
    rule!(SYS_close, Action::Allow, Always,
        "Closing the ready pipe after writing ready, and fds dropped on exit."),
    rule!(SYS_fcntl, Action::Allow, When::ArgIn { arg: 1, values: &[libc::F_GETFD as u64] },
        "Rust's std checks that an fd is open before closing it (debug builds); F_GETFD only reads the close-on-exec flag."),
    #[cfg(target_arch = "x86_64")]
    rule!(SYS_poll, Action::Allow, Always,
        "fuser polls the /dev/fuse fd (zero timeout) to learn whether the mount is still there before unmounting."),
    rule!(SYS_ppoll, Action::Allow, Always,
        "Same as poll, where libc implements poll with ppoll (aarch64)."),
    rule!(SYS_umount2, EPERM, Always,
        "fuser tries to unmount when its session ends; the server has no capability left to do it, the broker detaches the mount."),
    rule!(SYS_openat, EPERM, Always,
        "No file is opened after the filter; refused (not killed) because fuser's end-of-session unmount falls back to spawning fusermount3, which first opens /dev/null."),
    // --- Memory ---------------------------------------------------------------------------------
    rule!(SYS_mmap, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "Allocations, thread stacks and decompression buffers; never executable memory."),
    rule!(SYS_mprotect, Action::Allow, When::ArgMaskedEq { arg: 2, mask: libc::PROT_EXEC as u64, value: 0 },
        "malloc arenas and stack guard pages change protection; never to executable."),
    rule!(SYS_munmap, Action::Allow, Always,
        "Freeing large allocations and thread stacks."),
    rule!(SYS_mremap, Action::Allow, Always,
        "Growing large allocations (realloc of mmap'ed blocks)."),
    rule!(SYS_madvise, Action::Allow, Always,
        "malloc returns freed memory (MADV_DONTNEED) and exiting threads release their stacks."),
    rule!(SYS_brk, Action::Allow, Always,
        "The main malloc arena grows and shrinks with brk."),
    // --- Threads and synchronisation ----------------------------------------------------------
    rule!(SYS_futex, Action::Allow, Always,
        "Mutexes (the view's chunk cache, fuser's state), thread joins."),
    rule!(SYS_clone, Action::Allow, When::ArgMaskedEq { arg: 0, mask: CLONE_THREAD_CHECK, value: libc::CLONE_THREAD as u64 },
        "fuser starts its worker threads after the filter is in place: threads only (CLONE_THREAD), no fork, no namespace."),
    rule!(SYS_clone3, ENOSYS, Always,
        "Its flags sit in a struct that BPF cannot read; ENOSYS makes glibc fall back to the filtered clone(2)."),
    rule!(SYS_set_robust_list, Action::Allow, Always,
        "glibc registers each new thread's robust futex list."),
    rule!(SYS_rseq, Action::Allow, Always,
        "glibc registers restartable sequences for each new thread."),
    rule!(SYS_prctl, Action::Allow, When::ArgIn { arg: 0, values: &[libc::PR_SET_NAME as u64] },
        "Naming the worker threads (fuser-N); no other prctl (no_new_privs and dumpable are set before the filter)."),
    rule!(SYS_sched_getaffinity, Action::Allow, Always,
        "glibc's pthread_getattr_np, which Rust's runtime calls in each new thread to locate its stack guard, reads the thread's CPU mask."),
    rule!(SYS_gettid, Action::Allow, Always,
        "Rust's runtime and glibc read the calling thread's id when a thread starts."),
    rule!(SYS_sched_yield, Action::Allow, Always,
        "Spin-then-yield in lock implementations."),
    // --- Signals and exit ----------------------------------------------------------------------
    rule!(SYS_sigaltstack, Action::Allow, Always,
        "Rust's runtime gives each thread an alternate signal stack for stack-overflow reports."),
    rule!(SYS_rt_sigaction, Action::Allow, Always,
        "glibc installs its internal thread signal handlers at the first pthread_create, which comes after the filter."),
    rule!(SYS_rt_sigprocmask, Action::Allow, Always,
        "glibc blocks signals around thread creation and exit."),
    rule!(SYS_rt_sigreturn, Action::Allow, Always,
        "Returning from a signal handler."),
    rule!(SYS_exit, Action::Allow, Always,
        "A thread ends."),
    rule!(SYS_exit_group, Action::Allow, Always,
        "The server ends (lifeline EOF, unmount, or an error)."),
    // --- Time ------------------------------------------------------------------------------------
    rule!(SYS_clock_gettime, Action::Allow, Always,
        "Timestamps when the vDSO cannot answer."),
];

/// The rule tables of all filters as Markdown: the content of `seccomp/RULES.md`.
pub fn rules_markdown() -> String {
    use std::fmt::Write as _;

    fn cell(text: &str) -> String {
        text.replace('|', "\\|")
    }
    /// A filter's table: one row per rule.
    fn plain_table(md: &mut String, rules: &[Rule]) {
        md.push_str("| Syscall | Nr | Action | When | Why |\n|---|---:|---|---|---|\n");
        for r in rules {
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {} | {} |",
                r.name,
                r.sysno,
                r.action,
                cell(&r.when.to_string()),
                cell(r.justification)
            );
        }
    }
    /// A filter layered on the sandbox's: one row per rule, `From` naming
    /// `own` for the rules `is_own` picks and `sandbox` for the rest.
    fn layered_table(md: &mut String, kind: FilterKind, is_own: fn(&Rule) -> bool, own: &str) {
        md.push_str("| Syscall | Nr | Action | When | From | Why |\n|---|---:|---|---|---|---|\n");
        for r in rules(kind) {
            let from = if is_own(r) { own } else { "sandbox" };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {} | {} | {} |",
                r.name,
                r.sysno,
                r.action,
                cell(&r.when.to_string()),
                from,
                cell(r.justification)
            );
        }
    }
    fn summary(rules: &[Rule]) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for rule in rules {
            let action = rule.action.to_string();
            match counts.iter_mut().find(|(a, _)| *a == action) {
                Some((_, n)) => *n += 1,
                None => counts.push((action, 1)),
            }
        }
        let parts: Vec<String> = counts.iter().map(|(a, n)| format!("{n} {a}")).collect();
        format!("{} rules: {}.", rules.len(), parts.join(", "))
    }

    let mut md = String::new();
    let arch = std::env::consts::ARCH;
    md.push_str("# pvisor seccomp rules\n\n");
    md.push_str(
        "<!-- Generated from seccomp/src/rules.rs by rules_markdown(); do not edit by hand. \
         `cargo test -p pvisor-seccomp` checks it; `PVISOR_SECCOMP_BLESS=1 cargo test -p \
         pvisor-seccomp` rewrites it. -->\n\n",
    );
    let _ = writeln!(
        md,
        "The sandbox and worker filters allow by default and act on the syscalls below; the \
         image server, vCPU and VMM device filters are allow lists. Numbers are {arch}'s. Conditions compare the low \
         32 bits of an argument. Before any rule, every program kills the process on a syscall \
         from a foreign architecture and (x86_64) refuses every x32 syscall with EPERM. In the \
         sandbox and worker filters `allow` rows emit no BPF: they record a decision to leave a \
         syscall open.\n"
    );

    let _ = writeln!(md, "## Sandbox filter\n");
    let _ = writeln!(
        md,
        "Installed by the sandbox's init before it execs the agent; covers every process of the \
         sandbox. {}\n",
        summary(rules(FilterKind::Sandbox))
    );
    plain_table(&mut md, rules(FilterKind::Sandbox));

    let _ = writeln!(md, "\n## Worker filter\n");
    let _ = writeln!(
        md,
        "Installed by the worker on all its threads (TSYNC) once its sandbox runs: the sandbox \
         rules, with the worker's own rules (From = worker) replacing or adding to them. {}\n",
        summary(rules(FilterKind::Worker))
    );
    layered_table(&mut md, FilterKind::Worker, is_worker_specific, "worker");

    let _ = writeln!(md, "\n## Isolator filter\n");
    let _ = writeln!(
        md,
        "Installed by the agent's isolator (the in-sandbox helper that builds isolated \
         sessions, `agent/src/isolated/`) on itself, before it serves; each session's init \
         inherits it and adds the sandbox filter once the session's mounts are built. The \
         sandbox rules, with the isolator's own rules (From = isolator) replacing them. {}\n",
        summary(rules(FilterKind::Isolator))
    );
    layered_table(&mut md, FilterKind::Isolator, is_isolator_specific, "isolator");

    let _ = writeln!(md, "\n## Image server filter\n");
    let _ = writeln!(
        md,
        "Installed by `pvisor-imaged` (the FUSE server of one image) on itself once its mount is \
         live and its capabilities are dropped. An allow list: a syscall no row lets through \
         (under its condition) kills the process. {}\n",
        summary(rules(FilterKind::ImageServer))
    );
    plain_table(&mut md, rules(FilterKind::ImageServer));

    let _ = writeln!(md, "\n## vCPU filter\n");
    let _ = writeln!(
        md,
        "Installed by each vCPU thread of the VMM (vm backend) on itself before its first \
         `KVM_RUN`; device emulation on exits runs under it. An allow list: a syscall no row \
         lets through kills the process. `ioctl` is pinned to the vCPU requests it needs; \
         rows after the base list come from `VCPU_VIRTIO` in `src/vmm_rules.rs` (the \
         virtio-mmio transport, emulated on the vCPU thread). {}\n",
        summary(rules(FilterKind::Vcpu))
    );
    plain_table(&mut md, rules(FilterKind::Vcpu));

    let _ = writeln!(md, "\n## VMM device filter\n");
    let _ = writeln!(
        md,
        "Installed by the VMM's device event loop thread(s) (virtio queues, block images, the \
         vsock muxer's Unix sockets) before they touch guest memory. An allow list: a syscall \
         no row lets through kills the process. The last rows come from the list the virtio \
         device models extend (`VMM_DEVICE_VIRTIO` in `src/vmm_rules.rs`). {}\n",
        summary(rules(FilterKind::VmmDevice))
    );
    plain_table(&mut md, rules(FilterKind::VmmDevice));

    let _ = writeln!(md, "\n## netd filter\n");
    let _ = writeln!(
        md,
        "Installed by `pvisor-netd` (a sandbox's network process, `src/netd_rules.rs`) on itself \
         once it has pivoted into an empty root and dropped every capability, before it reads \
         a frame from the sandbox. An allow list: a syscall no row lets through kills the \
         process. {}\n",
        summary(rules(FilterKind::Netd))
    );
    plain_table(&mut md, rules(FilterKind::Netd));
    md
}
