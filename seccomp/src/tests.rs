//! Tests of the data and of the compiled programs, without installing anything: a small
//! classic-BPF interpreter runs the programs on synthetic `seccomp_data` and the result is
//! compared with what the rule table says.

use std::collections::BTreeSet;

use seccompiler::sock_filter;

use crate::compile::{compile, BPF_JMP_JA, BPF_JMP_JEQ_K, BPF_JMP_JGE_K, BPF_LD_W_ABS, BPF_MAX_LEN, BPF_RET_K};
use crate::rules::{rules, rules_markdown, Action, DefaultAction, FilterKind, Rule, When};
use crate::{filter, Error};

const BPF_JMP_JGT_K: u16 = 0x25;
const BPF_JMP_JSET_K: u16 = 0x45;
const BPF_ALU_AND_K: u16 = 0x54;

#[cfg(target_arch = "x86_64")]
const ARCH: u32 = crate::compile::AUDIT_ARCH_X86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

fn errno_ret(errno: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | errno as u32
}

/// Runs a seccomp BPF program the way the kernel does, on `struct seccomp_data`.
fn run(prog: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, arg) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    for _ in 0..=prog.len() {
        let insn = &prog[pc];
        pc += 1;
        let k = insn.k;
        let branch = |cond: bool| usize::from(if cond { insn.jt } else { insn.jf });
        match insn.code {
            BPF_LD_W_ABS => {
                let off = k as usize;
                assert!(off & 3 == 0 && off + 4 <= data.len(), "bad load offset {off}");
                acc = u32::from_ne_bytes(data[off..off + 4].try_into().unwrap());
            }
            BPF_JMP_JA => pc += k as usize,
            BPF_JMP_JEQ_K => pc += branch(acc == k),
            BPF_JMP_JGE_K => pc += branch(acc >= k),
            BPF_JMP_JGT_K => pc += branch(acc > k),
            BPF_JMP_JSET_K => pc += branch(acc & k != 0),
            BPF_ALU_AND_K => acc &= k,
            BPF_RET_K => return k,
            code => panic!("unexpected BPF opcode {code:#x} at {}", pc - 1),
        }
    }
    panic!("program did not return (backward jump?)");
}

/// What the table says the filter of `kind` returns.
fn expected(kind: FilterKind, rules: &[Rule], nr: u32, args: [u64; 6]) -> u32 {
    for rule in rules.iter().filter(|r| r.sysno == i64::from(nr)) {
        let low = |arg: u8| u64::from(args[usize::from(arg)] as u32);
        let hit = match rule.when {
            When::Always => true,
            When::ArgAnyBit { arg, mask } => low(arg) & mask != 0,
            When::ArgIn { arg, values } => values.contains(&low(arg)),
            When::ArgNotIn { arg, values } => !values.contains(&low(arg)),
            When::ArgMaskedEq { arg, mask, value } => low(arg) & mask == value,
        };
        if hit {
            return match rule.action {
                Action::Allow => ALLOW,
                Action::Errno(errno) => errno_ret(errno),
            };
        }
    }
    match kind.default_action() {
        DefaultAction::Allow => ALLOW,
        DefaultAction::KillProcess => libc::SECCOMP_RET_KILL_PROCESS,
    }
}

/// Argument vectors worth trying for a syscall: around every value its rules mention, with
/// high bits set to check that only the low 32 bits count, and with the other arguments at
/// 0 or all ones.
fn sample_args(rules: &[Rule], nr: u32) -> Vec<[u64; 6]> {
    let mut samples = vec![[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]];
    for rule in rules.iter().filter(|r| r.sysno == i64::from(nr)) {
        let (arg, interesting): (u8, Vec<u64>) = match rule.when {
            When::Always => continue,
            When::ArgAnyBit { arg, mask } => {
                let mut v: Vec<u64> = (0..32).map(|b| 1u64 << b).collect();
                v.extend([0, mask, !mask & 0xffff_ffff, 0x11, 0x80]);
                (arg, v)
            }
            When::ArgMaskedEq { arg, mask, value } => {
                let mut v: Vec<u64> = (0..32).map(|b| 1u64 << b).collect();
                v.extend([0, mask, value, value | !mask & 0xffff_ffff, mask & !value, 0xffff_ffff]);
                (arg, v)
            }
            When::ArgIn { arg, values } | When::ArgNotIn { arg, values } => {
                let mut v = vec![0, 1, 0x7fff_ffff, 0xffff_ffff];
                for x in values {
                    v.extend([*x, x.wrapping_add(1), x.wrapping_sub(1)]);
                }
                (arg, v)
            }
        };
        for value in interesting {
            for high in [0u64, 1 << 32, 0xdead_beef << 32] {
                for others in [0u64, u64::MAX] {
                    let mut args = [others; 6];
                    args[usize::from(arg)] = value | high;
                    samples.push(args);
                }
            }
        }
    }
    samples
}

fn all_sysnos(rules: &[Rule]) -> BTreeSet<u32> {
    let mut set: BTreeSet<u32> = (0..1024).collect();
    set.extend(rules.iter().map(|r| r.sysno as u32));
    set
}

#[test]
fn every_rule_has_a_one_line_justification() {
    for kind in FilterKind::ALL {
        for rule in rules(kind) {
            let why = rule.justification.trim();
            assert!(!why.is_empty(), "{kind}: {} has no justification", rule.name);
            assert!(!why.contains('\n'), "{kind}: {} justification spans lines", rule.name);
            assert!(why.ends_with('.'), "{kind}: {} justification is not a sentence", rule.name);
            assert!(!rule.name.is_empty() && rule.sysno >= 0);
        }
    }
}

#[test]
fn each_syscall_appears_once_per_filter() {
    for kind in FilterKind::ALL {
        let mut seen = BTreeSet::new();
        for rule in rules(kind) {
            assert!(seen.insert(rule.sysno), "{kind}: {} listed twice", rule.name);
        }
    }
}

#[test]
fn every_filter_compiles_within_the_kernel_limit() {
    for kind in FilterKind::ALL {
        let prog = filter(kind).unwrap();
        assert!(prog.len() > 50 && prog.len() <= BPF_MAX_LEN, "{kind}: {}", prog.len());
    }
}

#[test]
fn compiled_programs_do_what_the_tables_say() {
    for kind in FilterKind::ALL {
        let table = rules(kind);
        let prog = filter(kind).unwrap();
        let mut checked = 0usize;
        for nr in all_sysnos(table) {
            for args in sample_args(table, nr) {
                assert_eq!(
                    run(&prog, nr, ARCH, args),
                    expected(kind, table, nr, args),
                    "{kind}: syscall {nr} with args {args:x?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 1024, "{kind}: only {checked} cases");
    }
}

#[test]
fn foreign_architectures_are_killed() {
    const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
    for kind in FilterKind::ALL {
        let prog = filter(kind).unwrap();
        for nr in [0, 39, 165, 435] {
            for arch in [AUDIT_ARCH_I386, 0, ARCH ^ 1] {
                assert_eq!(
                    run(&prog, nr, arch, [0; 6]),
                    libc::SECCOMP_RET_KILL_PROCESS,
                    "{kind}: arch {arch:#x} nr {nr}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_syscalls_are_refused() {
    for kind in FilterKind::ALL {
        let prog = filter(kind).unwrap();
        for nr in [0, libc::SYS_getpid as u32, libc::SYS_mount as u32, 512, 0x3fff_ffff] {
            let x32 = nr | crate::compile::X32_SYSCALL_BIT;
            assert_eq!(run(&prog, x32, ARCH, [0; 6]), errno_ret(libc::EPERM), "{kind}: {x32:#x}");
        }
        let getpid = run(&prog, libc::SYS_getpid as u32, ARCH, [0; 6]);
        // write: the one syscall every filter allows (the vCPU filter has no read).
        let write = run(&prog, libc::SYS_write as u32, ARCH, [0; 6]);
        assert_eq!(write, ALLOW, "{kind}");
        assert_eq!(getpid == ALLOW, kind.default_action() == DefaultAction::Allow, "{kind}");
    }
}

#[test]
fn worker_refuses_everything_the_sandbox_refuses() {
    let sandbox = filter(FilterKind::Sandbox).unwrap();
    let worker = filter(FilterKind::Worker).unwrap();
    let table = rules(FilterKind::Sandbox);
    for nr in all_sysnos(table) {
        for args in sample_args(table, nr) {
            let s = run(&sandbox, nr, ARCH, args);
            if s != ALLOW {
                let w = run(&worker, nr, ARCH, args);
                assert_ne!(w, ALLOW, "worker allows {nr} {args:x?} which the sandbox refuses");
            }
        }
    }
}

/// The isolator lets through exactly what building a session takes: pid, mount, ipc, uts and
/// network namespaces by clone, the mount syscalls; everything else the sandbox refuses stays
/// refused (user namespaces, setns, fspick, modules, ...).
#[test]
fn isolator_filter_opens_only_namespaces_and_mounts() {
    let sandbox = filter(FilterKind::Sandbox).unwrap();
    let isolator = filter(FilterKind::Isolator).unwrap();
    let ns = (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNET)
        as u64
        | libc::SIGCHLD as u64;
    assert_eq!(run(&isolator, libc::SYS_clone as u32, ARCH, [ns, 0, 0, 0, 0, 0]), ALLOW);
    assert_ne!(run(&sandbox, libc::SYS_clone as u32, ARCH, [ns, 0, 0, 0, 0, 0]), ALLOW);
    for refused in [libc::CLONE_NEWUSER, libc::CLONE_NEWCGROUP] {
        let flags = ns | refused as u64;
        assert_eq!(run(&isolator, libc::SYS_clone as u32, ARCH, [flags, 0, 0, 0, 0, 0]), errno_ret(libc::EPERM));
        assert_eq!(
            run(&isolator, libc::SYS_unshare as u32, ARCH, [refused as u64, 0, 0, 0, 0, 0]),
            errno_ret(libc::EPERM)
        );
    }
    assert_eq!(
        run(&isolator, libc::SYS_unshare as u32, ARCH, [libc::CLONE_NEWTIME as u64, 0, 0, 0, 0, 0]),
        errno_ret(libc::EPERM)
    );
    for opened in ["mount", "umount2", "pivot_root", "mount_setattr"] {
        let nr = rules(FilterKind::Sandbox).iter().find(|r| r.name == opened).unwrap().sysno as u32;
        assert_eq!(run(&isolator, nr, ARCH, [0; 6]), ALLOW, "{opened}");
        assert_ne!(run(&sandbox, nr, ARCH, [0; 6]), ALLOW, "{opened}");
    }
    // Everything else the sandbox refuses, the isolator refuses the same way.
    let table = rules(FilterKind::Sandbox);
    let own: Vec<u32> = rules(FilterKind::Isolator)
        .iter()
        .filter(|r| crate::rules::is_isolator_specific(r))
        .map(|r| r.sysno as u32)
        .collect();
    for nr in all_sysnos(table).into_iter().filter(|nr| !own.contains(nr)) {
        for args in sample_args(table, nr) {
            assert_eq!(run(&isolator, nr, ARCH, args), run(&sandbox, nr, ARCH, args), "{nr} {args:x?}");
        }
    }
}

fn action_of(kind: FilterKind, name: &str) -> Option<(Action, When)> {
    rules(kind).iter().find(|r| r.name == name).map(|r| (r.action, r.when))
}

#[test]
fn the_brief_is_covered() {
    let eperm = Action::Errno(libc::EPERM);
    #[rustfmt::skip]
    let always_denied = [
        "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "delete_module",
        "finit_module", "init_module", "kcmp", "kexec_file_load", "kexec_load", "keyctl",
        "lookup_dcookie", "mount", "mount_setattr", "move_mount", "open_tree", "fsopen",
        "fsconfig", "fsmount", "fspick", "umount2", "pivot_root", "name_to_handle_at",
        "open_by_handle_at", "nfsservctl", "perf_event_open", "quotactl", "quotactl_fd",
        "reboot", "request_key", "setns", "settimeofday", "swapon", "swapoff", "userfaultfd",
        "syslog", "io_uring_setup", "io_uring_enter", "io_uring_register",
        #[cfg(target_arch = "x86_64")] "create_module",
        #[cfg(target_arch = "x86_64")] "get_kernel_syms",
        #[cfg(target_arch = "x86_64")] "ioperm",
        #[cfg(target_arch = "x86_64")] "iopl",
        #[cfg(target_arch = "x86_64")] "sysfs",
        #[cfg(target_arch = "x86_64")] "_sysctl",
        #[cfg(target_arch = "x86_64")] "uselib",
        #[cfg(target_arch = "x86_64")] "ustat",
    ];
    for kind in [FilterKind::Sandbox, FilterKind::Worker] {
        for name in always_denied {
            assert_eq!(action_of(kind, name), Some((eperm, When::Always)), "{kind}: {name}");
        }
        assert_eq!(action_of(kind, "clone3"), Some((Action::Errno(libc::ENOSYS), When::Always)));
        assert_eq!(action_of(kind, "clone"), Some((eperm, When::ArgAnyBit { arg: 0, mask: 0x7e02_0000 })));
        assert_eq!(
            action_of(kind, "personality"),
            Some((eperm, When::ArgNotIn { arg: 0, values: &[0, 8, 0x20000, 0x20008, 0xffff_ffff] }))
        );
    }
    assert_eq!(action_of(FilterKind::Sandbox, "unshare"), Some((eperm, When::ArgAnyBit { arg: 0, mask: 0x7e02_0080 })));
    for name in ["ptrace", "process_vm_readv", "process_vm_writev"] {
        assert_eq!(action_of(FilterKind::Sandbox, name), Some((Action::Allow, When::Always)));
        assert_eq!(action_of(FilterKind::Worker, name), Some((eperm, When::Always)));
    }
    for name in ["execve", "execveat", "unshare", "chroot"] {
        assert_eq!(action_of(FilterKind::Worker, name), Some((eperm, When::Always)), "{name}");
        assert_ne!(action_of(FilterKind::Sandbox, name), Some((eperm, When::Always)), "{name}");
    }
    assert_eq!(
        action_of(FilterKind::Worker, "socket"),
        Some((Action::Errno(libc::EAFNOSUPPORT), When::ArgNotIn { arg: 0, values: &[libc::AF_UNIX as u64] }))
    );
}

#[test]
fn inconsistent_tables_are_rejected() {
    fn rule(sysno: i64, action: Action, when: When, justification: &'static str) -> Rule {
        Rule { name: "probe", sysno, action, when, justification }
    }
    let eperm = Action::Errno(libc::EPERM);
    let bad: Vec<Vec<Rule>> = vec![
        vec![rule(1, eperm, When::ArgMaskedEq { arg: 0, mask: 0, value: 0 }, "x.")],
        vec![rule(1, eperm, When::ArgMaskedEq { arg: 0, mask: 1, value: 2 }, "x.")],
        vec![rule(1, eperm, When::ArgMaskedEq { arg: 0, mask: 1 << 32, value: 0 }, "x.")],
        vec![rule(1, eperm, When::Always, " ")],
        vec![rule(1, eperm, When::Always, "x."), rule(1, Action::Errno(libc::ENOSYS), When::Always, "x.")],
        vec![rule(1, Action::Allow, When::ArgIn { arg: 0, values: &[1] }, "x.")],
        vec![rule(1, Action::Errno(0), When::Always, "x.")],
        vec![rule(1, eperm, When::ArgIn { arg: 0, values: &[] }, "x.")],
        vec![rule(1, eperm, When::ArgIn { arg: 0, values: &[1 << 32] }, "x.")],
        vec![rule(1, eperm, When::ArgAnyBit { arg: 0, mask: 0 }, "x.")],
        vec![rule(1, eperm, When::ArgIn { arg: 6, values: &[1] }, "x.")],
        vec![rule(1, eperm, When::Always, "x."), rule(1, eperm, When::ArgIn { arg: 0, values: &[1] }, "x.")],
    ];
    for table in bad {
        let err = compile(FilterKind::Sandbox, &table).unwrap_err();
        assert!(matches!(err, Error::InvalidRules { .. }), "{table:?}: {err}");
    }
    // The same shapes, made consistent, compile.
    let good = [
        rule(1, eperm, When::ArgIn { arg: 0, values: &[1] }, "x."),
        rule(1, eperm, When::ArgIn { arg: 1, values: &[2] }, "x."),
        rule(2, Action::Allow, When::Always, "x."),
    ];
    let prog = compile(FilterKind::Sandbox, &good).unwrap();
    assert_eq!(run(&prog, 1, ARCH, [1, 0, 0, 0, 0, 0]), errno_ret(libc::EPERM));
    assert_eq!(run(&prog, 1, ARCH, [0, 2, 0, 0, 0, 0]), errno_ret(libc::EPERM));
    assert_eq!(run(&prog, 1, ARCH, [0, 1, 0, 0, 0, 0]), ALLOW);
    assert_eq!(run(&prog, 2, ARCH, [0; 6]), ALLOW);
    // Nothing to deny: the program still checks the architecture and then allows.
    let empty = compile(FilterKind::Sandbox, &[]).unwrap();
    assert_eq!(run(&empty, 1, ARCH, [0; 6]), ALLOW);
    // An allow list: conditional allow rules are fine, errno rules chain into them, and with
    // nothing allowed everything is killed.
    let allow_list = [
        rule(1, Action::Allow, When::ArgMaskedEq { arg: 2, mask: 4, value: 0 }, "x."),
        rule(2, Action::Allow, When::Always, "x."),
        rule(3, eperm, When::ArgIn { arg: 0, values: &[7] }, "x."),
    ];
    let prog = compile(FilterKind::ImageServer, &allow_list).unwrap();
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    assert_eq!(run(&prog, 1, ARCH, [0, 0, 3, 0, 0, 0]), ALLOW);
    assert_eq!(run(&prog, 1, ARCH, [0, 0, 7, 0, 0, 0]), kill);
    assert_eq!(run(&prog, 2, ARCH, [u64::MAX; 6]), ALLOW);
    assert_eq!(run(&prog, 3, ARCH, [7, 0, 0, 0, 0, 0]), errno_ret(libc::EPERM));
    assert_eq!(run(&prog, 3, ARCH, [8, 0, 0, 0, 0, 0]), kill);
    assert_eq!(run(&prog, 4, ARCH, [0; 6]), kill);
    let nothing = compile(FilterKind::ImageServer, &[rule(3, eperm, When::Always, "x.")]).unwrap();
    assert_eq!(run(&nothing, 3, ARCH, [0; 6]), errno_ret(libc::EPERM));
    assert_eq!(run(&nothing, 1, ARCH, [0; 6]), kill);
    assert_eq!(run(&compile(FilterKind::ImageServer, &[]).unwrap(), 1, ARCH, [0; 6]), kill);
}

#[test]
fn empty_program_is_not_installed() {
    let err = std::thread::spawn(|| crate::apply_to_thread(&Vec::new())).join().unwrap().unwrap_err();
    assert!(matches!(err, Error::EmptyProgram), "{err}");
}

/// `seccomp/RULES.md` is generated from the tables; this keeps it in sync. Run with
/// `PVISOR_SECCOMP_BLESS=1` to rewrite it.
#[cfg(target_arch = "x86_64")]
#[test]
fn rules_md_matches_the_tables() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/RULES.md");
    let want = rules_markdown();
    if std::env::var_os("PVISOR_SECCOMP_BLESS").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    if have != want {
        println!("----- expected {path} -----\n{want}----- end -----");
        panic!(
            "{path} is out of date with src/rules.rs; the expected content is printed above \
             (or rerun with PVISOR_SECCOMP_BLESS=1 to rewrite it)"
        );
    }
}

#[test]
fn markdown_lists_every_rule_of_every_filter() {
    let md = rules_markdown();
    for kind in FilterKind::ALL {
        for rule in rules(kind) {
            assert!(md.contains(rule.justification), "{kind}: {}", rule.name);
        }
    }
    let rows = md.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(rows, FilterKind::ALL.iter().map(|k| rules(*k).len()).sum::<usize>());
}

#[test]
fn image_server_is_an_allow_list() {
    let kind = FilterKind::ImageServer;
    let prog = filter(kind).unwrap();
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let call = |nr: libc::c_long, args: [u64; 6]| run(&prog, nr as u32, ARCH, args);
    // Everything that opens, creates or receives an fd, execs, forks, mounts, or signals is killed.
    #[rustfmt::skip]
    let killed = [
        libc::SYS_open_by_handle_at, libc::SYS_socket, libc::SYS_recvmsg, libc::SYS_dup,
        libc::SYS_execve, libc::SYS_execveat, libc::SYS_mount, libc::SYS_setns,
        #[cfg(target_arch = "x86_64")] libc::SYS_fork,
        #[cfg(target_arch = "x86_64")] libc::SYS_vfork,
        libc::SYS_unshare, libc::SYS_ptrace, libc::SYS_kill, libc::SYS_ioctl, libc::SYS_fcntl, libc::SYS_pwrite64,
        libc::SYS_memfd_create, libc::SYS_io_uring_setup, libc::SYS_bpf, libc::SYS_getpid, libc::SYS_seccomp,
    ];
    for nr in killed {
        assert_eq!(call(nr, [0; 6]), kill, "syscall {nr}");
        assert_eq!(call(nr, [u64::MAX; 6]), kill, "syscall {nr}");
    }
    for nr in [libc::SYS_read, libc::SYS_writev, libc::SYS_pread64, libc::SYS_futex, libc::SYS_exit_group] {
        assert_eq!(call(nr, [0; 6]), ALLOW, "syscall {nr}");
    }
    // No executable memory.
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let rwx = rw | libc::PROT_EXEC as u64;
    for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
        assert_eq!(call(nr, [0, 4096, rw, 0, 0, 0]), ALLOW);
        assert_eq!(call(nr, [0, 4096, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call(nr, [0, 4096, rwx, 0, 0, 0]), kill);
        assert_eq!(call(nr, [0, 4096, libc::PROT_EXEC as u64, 0, 0, 0]), kill);
    }
    // Threads only: glibc's pthread_create flags pass, fork-like and namespace flags do not.
    let thread = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;
    assert_eq!(call(libc::SYS_clone, [thread, 0, 0, 0, 0, 0]), ALLOW);
    assert_eq!(call(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]), kill);
    assert_eq!(call(libc::SYS_clone, [thread | libc::CLONE_NEWNS as u64, 0, 0, 0, 0, 0]), kill);
    assert_eq!(call(libc::SYS_clone, [thread | libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]), kill);
    assert_eq!(call(libc::SYS_clone3, [0; 6]), errno_ret(libc::ENOSYS));
    // prctl: naming threads only.
    assert_eq!(call(libc::SYS_prctl, [libc::PR_SET_NAME as u64, 0, 0, 0, 0, 0]), ALLOW);
    for option in [libc::PR_SET_NO_NEW_PRIVS, libc::PR_SET_DUMPABLE, libc::PR_SET_SECCOMP, libc::PR_CAPBSET_DROP] {
        assert_eq!(call(libc::SYS_prctl, [option as u64, 0, 0, 0, 0, 0]), kill, "prctl {option}");
    }
    // fuser's unmount attempt at the end of a session (umount2, then spawning fusermount3,
    // which opens /dev/null first) fails quietly instead.
    assert_eq!(call(libc::SYS_umount2, [0; 6]), errno_ret(libc::EPERM));
    assert_eq!(call(libc::SYS_openat, [0; 6]), errno_ret(libc::EPERM));
    #[cfg(target_arch = "x86_64")]
    assert_eq!(call(libc::SYS_open, [0; 6]), kill);
    // fcntl: reading the fd flags only (Rust's debug-build check before close).
    assert_eq!(call(libc::SYS_fcntl, [3, libc::F_GETFD as u64, 0, 0, 0, 0]), ALLOW);
    for cmd in [libc::F_DUPFD, libc::F_DUPFD_CLOEXEC, libc::F_SETFD, libc::F_SETFL, libc::F_SETLK] {
        assert_eq!(call(libc::SYS_fcntl, [3, cmd as u64, 0, 0, 0, 0]), kill, "fcntl {cmd}");
    }
}

#[test]
fn vmm_filters_are_allow_lists_without_exec_memory() {
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let rwx = rw | libc::PROT_EXEC as u64;
    for kind in [FilterKind::Vcpu, FilterKind::VmmDevice] {
        assert_eq!(kind.default_action(), DefaultAction::KillProcess);
        let prog = filter(kind).unwrap();
        let call = |nr: libc::c_long, args: [u64; 6]| run(&prog, nr as u32, ARCH, args);
        #[rustfmt::skip]
        let killed = [
            libc::SYS_openat, libc::SYS_execve, libc::SYS_execveat, libc::SYS_ptrace, libc::SYS_mount,
            libc::SYS_unshare, libc::SYS_setns, libc::SYS_kill, libc::SYS_memfd_create, libc::SYS_bpf,
            libc::SYS_io_uring_setup, libc::SYS_seccomp, libc::SYS_prctl, libc::SYS_getpid,
            #[cfg(target_arch = "x86_64")] libc::SYS_fork,
            #[cfg(target_arch = "x86_64")] libc::SYS_open,
        ];
        for nr in killed {
            assert_eq!(call(nr, [0; 6]), kill, "{kind}: syscall {nr}");
        }
        for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
            assert_eq!(call(nr, [0, 4096, rw, 0, 0, 0]), ALLOW, "{kind}");
            assert_eq!(call(nr, [0, 4096, rwx, 0, 0, 0]), kill, "{kind}");
            assert_eq!(call(nr, [0, 4096, libc::PROT_EXEC as u64, 0, 0, 0]), kill, "{kind}");
        }
        for nr in [libc::SYS_futex, libc::SYS_write, libc::SYS_exit, libc::SYS_rt_sigreturn] {
            assert_eq!(call(nr, [0; 6]), ALLOW, "{kind}: syscall {nr}");
        }
    }
}

#[test]
fn vcpu_ioctls_are_pinned_to_the_vcpu_requests() {
    use crate::vmm::{KVM_GET_REGS, KVM_GET_SREGS, KVM_RUN};
    let prog = filter(FilterKind::Vcpu).unwrap();
    let ioctl = |request: u64| run(&prog, libc::SYS_ioctl as u32, ARCH, [9, request, 0, 0, 0, 0]);
    for request in [KVM_RUN, KVM_GET_REGS, KVM_GET_SREGS] {
        assert_eq!(ioctl(request), ALLOW, "{request:#x}");
    }
    // KVM_SET_REGS, KVM_SET_SREGS, KVM_CREATE_VCPU, KVM_SET_USER_MEMORY_REGION, KVM_CREATE_VM,
    // KVM_IRQFD, and a terminal ioctl: all kill.
    for request in [0x4090_ae82u64, 0x4138_ae84, 0xae41, 0x4020_ae46, 0xae01, 0x4020_ae76, libc::TIOCSTI] {
        assert_eq!(ioctl(request), libc::SECCOMP_RET_KILL_PROCESS, "{request:#x}");
    }
    let nr = |n: libc::c_long| run(&prog, n as u32, ARCH, [libc::AF_UNIX as u64, 0, 0, 0, 0, 0]);
    for n in [libc::SYS_socket, libc::SYS_connect, libc::SYS_epoll_wait, libc::SYS_clone] {
        assert_eq!(nr(n), libc::SECCOMP_RET_KILL_PROCESS, "vCPU threads never need syscall {n}");
    }
    // A virtio reset on a vCPU thread drops vsock host connections.
    for n in [libc::SYS_close, libc::SYS_epoll_ctl, libc::SYS_shutdown] {
        assert_eq!(nr(n), ALLOW, "virtio reset: syscall {n}");
    }
}

#[test]
fn the_device_loop_gets_unix_sockets_only() {
    let prog = filter(FilterKind::VmmDevice).unwrap();
    let socket = |domain: i32| run(&prog, libc::SYS_socket as u32, ARCH, [domain as u64, 1, 0, 0, 0, 0]);
    assert_eq!(socket(libc::AF_UNIX), ALLOW);
    for domain in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_VSOCK, libc::AF_PACKET] {
        assert_eq!(socket(domain), libc::SECCOMP_RET_KILL_PROCESS, "domain {domain}");
    }
    let call = |n: libc::c_long| run(&prog, n as u32, ARCH, [0; 6]);
    for n in [libc::SYS_accept4, libc::SYS_connect, libc::SYS_sendmsg, libc::SYS_recvmsg, libc::SYS_shutdown] {
        assert_eq!(call(n), ALLOW, "syscall {n}");
    }
    assert_eq!(call(libc::SYS_ioctl), libc::SECCOMP_RET_KILL_PROCESS, "no ioctl on the device thread");
    assert_eq!(call(libc::SYS_clone3), errno_ret(libc::ENOSYS));
}

#[test]
fn netd_reaches_only_inet_sockets_and_no_files() {
    let prog = filter(FilterKind::Netd).unwrap();
    let kill = libc::SECCOMP_RET_KILL_PROCESS;
    let call = |nr: libc::c_long, args: [u64; 6]| run(&prog, nr as u32, ARCH, args);
    // No file, no exec, no process, no namespace, no other socket family.
    #[rustfmt::skip]
    let killed = [
        libc::SYS_openat, libc::SYS_open_by_handle_at, libc::SYS_execve, libc::SYS_execveat, libc::SYS_clone,
        libc::SYS_clone3, libc::SYS_unshare, libc::SYS_setns, libc::SYS_mount, libc::SYS_ptrace, libc::SYS_kill,
        libc::SYS_ioctl, libc::SYS_accept4, libc::SYS_listen, libc::SYS_socketpair, libc::SYS_dup,
        libc::SYS_memfd_create, libc::SYS_io_uring_setup, libc::SYS_bpf, libc::SYS_seccomp, libc::SYS_prctl,
        #[cfg(target_arch = "x86_64")] libc::SYS_open,
        #[cfg(target_arch = "x86_64")] libc::SYS_fork,
    ];
    for nr in killed {
        assert_eq!(call(nr, [0; 6]), kill, "syscall {nr}");
    }
    for family in [libc::AF_UNIX, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET, libc::AF_VSOCK] {
        assert_eq!(call(libc::SYS_socket, [family as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0]), kill, "{family}");
    }
    let inet = libc::AF_INET as u64;
    for (ty, proto) in [(libc::SOCK_STREAM, 0), (libc::SOCK_DGRAM, 0), (libc::SOCK_DGRAM, libc::IPPROTO_ICMP)] {
        assert_eq!(call(libc::SYS_socket, [inet, ty as u64, proto as u64, 0, 0, 0]), ALLOW);
    }
    for nr in [libc::SYS_read, libc::SYS_write, libc::SYS_recvmsg, libc::SYS_sendmsg, libc::SYS_connect] {
        assert_eq!(call(nr, [0; 6]), ALLOW, "syscall {nr}");
    }
    // fcntl only reads and sets file status flags (non-blocking); no F_DUPFD.
    assert_eq!(call(libc::SYS_fcntl, [3, libc::F_SETFL as u64, 0, 0, 0, 0]), ALLOW);
    assert_eq!(call(libc::SYS_fcntl, [3, libc::F_DUPFD as u64, 0, 0, 0, 0]), kill);
    let rwx = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    assert_eq!(call(libc::SYS_mmap, [0, 4096, rwx, 0, 0, 0]), kill);
}
