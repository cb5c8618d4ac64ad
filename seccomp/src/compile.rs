//! Rule table -> BPF program.
//!
//! seccompiler's `SeccompFilter` has one match action and one mismatch action, but our filters
//! return different errnos for different syscalls (EPERM for most, ENOSYS for clone3,
//! EAFNOSUPPORT for the worker's sockets). So the rules are grouped by errno, each group is
//! compiled by seccompiler into its own program (match: that errno, mismatch: allow), and the
//! programs are chained: in every program but the last, each `RET ALLOW` becomes a jump to the
//! first instruction of the next program. Instructions are replaced one for one, so every
//! jump seccompiler computed stays valid. Each syscall number belongs to exactly one group,
//! so the order of the groups does not change what the filter returns.
//!
//! An allow list (the image server filter) adds one last program built from its `Allow` rules:
//! match: allow, mismatch: kill the process. The errno groups before it chain into it, so a
//! syscall that none of them refuses is allowed only if an allow rule says so.
//!
//! On x86_64 a hand-written prologue comes first: it kills the process on a foreign
//! architecture (as seccompiler's own check does) and refuses every x32 syscall (numbers with
//! bit 30 set), because those reach the same kernel code under different numbers and would
//! walk around a deny list.
//!
//! Every instruction is one the kernel's seccomp action cache understands (loads of `nr` and
//! `arch`, JEQ/JGE/JA, AND, RET), so syscalls the filter allows whatever their arguments are
//! cached as "always allow" per syscall number and never run the program again.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::rules::{Action, DefaultAction, FilterKind, Rule, When};
use crate::Error;

/// The kernel's limit on the length of a seccomp BPF program (`BPF_MAXINSNS`).
pub const BPF_MAX_LEN: usize = 4096;

#[cfg(target_arch = "x86_64")]
const TARGET_ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET_ARCH: TargetArch = TargetArch::aarch64;

// Classic BPF opcodes (linux/bpf_common.h).
/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `seccomp_data`.
pub(crate) const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`: jump forward by `k`.
pub(crate) const BPF_JMP_JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
pub(crate) const BPF_JMP_JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
pub(crate) const BPF_JMP_JGE_K: u16 = 0x35;
/// `BPF_RET | BPF_K`.
pub(crate) const BPF_RET_K: u16 = 0x06;

// Offsets in `struct seccomp_data`.
pub(crate) const SECCOMP_DATA_NR: u32 = 0;
pub(crate) const SECCOMP_DATA_ARCH: u32 = 4;

/// `AUDIT_ARCH_X86_64` (linux/audit.h): EM_X86_64 | 64-bit | little endian.
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `__X32_SYSCALL_BIT`: x32 syscalls arrive with arch x86_64 and this bit set in `nr`.
#[cfg(target_arch = "x86_64")]
pub(crate) const X32_SYSCALL_BIT: u32 = 0x4000_0000;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn errno_ret(errno: i32) -> u32 {
    // errno values are small positive numbers; SECCOMP_RET_DATA keeps the low 16 bits.
    libc::SECCOMP_RET_ERRNO | (errno as u32 & libc::SECCOMP_RET_DATA)
}

/// Instructions that run before the seccompiler-built programs.
fn prologue() -> BpfProgram {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
            jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
            stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
            stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
            jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            stmt(BPF_RET_K, errno_ret(libc::EPERM)),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Compiles one filter's rule table.
pub(crate) fn compile(kind: FilterKind, rules: &[Rule]) -> Result<BpfProgram, Error> {
    let Grouped { errnos, allowed } = group(kind, rules)?;
    let compile_err = |source| Error::Compile { filter: kind, source };

    let mut segments = Vec::with_capacity(errnos.len() + 1);
    for (errno, table) in errnos {
        let filter = SeccompFilter::new(table, SeccompAction::Allow, SeccompAction::Errno(errno as u32), TARGET_ARCH)
            .map_err(compile_err)?;
        let segment: BpfProgram = filter.try_into().map_err(compile_err)?;
        segments.push(segment);
    }
    // What follows the last program, if anything: every program before it chains to it.
    let tail = match kind.default_action() {
        DefaultAction::Allow if segments.is_empty() => Some(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW)),
        DefaultAction::Allow => None,
        DefaultAction::KillProcess if allowed.is_empty() => Some(stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS)),
        DefaultAction::KillProcess => {
            let filter = SeccompFilter::new(allowed, SeccompAction::KillProcess, SeccompAction::Allow, TARGET_ARCH)
                .map_err(compile_err)?;
            segments.push(filter.try_into().map_err(compile_err)?);
            None
        }
    };

    let mut program = prologue();
    let count = segments.len();
    for (i, mut segment) in segments.into_iter().enumerate() {
        if i + 1 < count || tail.is_some() {
            chain_to_next(&mut segment);
        }
        program.extend(segment);
    }
    program.extend(tail);

    if program.len() > BPF_MAX_LEN {
        return Err(Error::TooLarge { filter: kind, len: program.len(), max: BPF_MAX_LEN });
    }
    Ok(program)
}

/// Turns every `RET ALLOW` of `segment` into a jump to just past its end.
fn chain_to_next(segment: &mut [sock_filter]) {
    let allow = stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW);
    let len = segment.len();
    for (i, insn) in segment.iter_mut().enumerate() {
        if *insn == allow {
            // Lands on index `len`: JA jumps to pc + 1 + k.
            *insn = stmt(BPF_JMP_JA, (len - i - 1) as u32);
        }
    }
}

type Table = BTreeMap<i64, Vec<SeccompRule>>;

/// A rule table sorted for compilation.
struct Grouped {
    /// Deny rules, one seccompiler table per errno.
    errnos: BTreeMap<i32, Table>,
    /// Allow rules of an allow list (empty for a default-allow filter).
    allowed: Table,
}

/// Checks the table and sorts its deny rules into one seccompiler table per errno, and (for an
/// allow list) its allow rules into one more.
fn group(kind: FilterKind, rules: &[Rule]) -> Result<Grouped, Error> {
    let allow_list = kind.default_action() == DefaultAction::KillProcess;
    let invalid = |rule: &Rule, why: &str| Error::InvalidRules {
        filter: kind,
        reason: format!("{} ({}): {why}", rule.name, rule.sysno),
    };
    let compile_err = |source| Error::Compile { filter: kind, source };

    let mut action_of: BTreeMap<i64, Action> = BTreeMap::new();
    let mut groups: BTreeMap<i32, Table> = BTreeMap::new();
    let mut allowed = Table::new();
    for rule in rules {
        if rule.justification.trim().is_empty() {
            return Err(invalid(rule, "no justification"));
        }
        if let Some(previous) = action_of.insert(rule.sysno, rule.action) {
            if previous != rule.action {
                return Err(invalid(rule, "two rules with different actions"));
            }
        }
        let errno = match rule.action {
            Action::Allow if allow_list => None,
            Action::Allow if rule.when == When::Always => continue,
            Action::Allow => {
                return Err(invalid(rule, "an allow rule cannot have a condition in a default-allow filter"))
            }
            Action::Errno(errno) if errno > 0 && errno <= 4095 => Some(errno),
            Action::Errno(_) => return Err(invalid(rule, "errno out of range")),
        };
        let chain = seccomp_rules(&rule.when)
            .map_err(|why| invalid(rule, why))?
            .into_iter()
            .map(|conditions| SeccompRule::new(conditions).map_err(compile_err))
            .collect::<Result<Vec<_>, _>>()?;
        let table = match errno {
            Some(errno) => groups.entry(errno).or_default(),
            None => &mut allowed,
        };
        match table.get_mut(&rule.sysno) {
            None => {
                table.insert(rule.sysno, chain);
            }
            Some(existing) if existing.is_empty() || chain.is_empty() => {
                return Err(invalid(rule, "an unconditional rule next to another rule"));
            }
            Some(existing) => existing.extend(chain),
        }
    }
    Ok(Grouped { errnos: groups, allowed })
}

/// The seccompiler rules (an OR of ANDs of conditions) for a condition; empty for `Always`.
fn seccomp_rules(when: &When) -> Result<Vec<Vec<SeccompCondition>>, &'static str> {
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|_| "argument index out of range")
    };
    let check_values = |values: &[u64]| {
        if values.is_empty() {
            Err("empty value list")
        } else if values.iter().any(|v| *v > u64::from(u32::MAX)) {
            Err("value wider than 32 bits")
        } else {
            Ok(())
        }
    };
    match *when {
        When::Always => Ok(Vec::new()),
        When::ArgAnyBit { arg, mask } => {
            if mask == 0 || mask > u64::from(u32::MAX) {
                return Err("mask must be non-zero and fit in 32 bits");
            }
            // (arg & mask) != 0 is not expressible directly; OR one rule per bit.
            (0..32)
                .map(|bit| 1u64 << bit)
                .filter(|bit| mask & bit != 0)
                .map(|bit| Ok(vec![cond(arg, SeccompCmpOp::MaskedEq(bit), bit)?]))
                .collect()
        }
        When::ArgIn { arg, values } => {
            check_values(values)?;
            values.iter().map(|v| Ok(vec![cond(arg, SeccompCmpOp::Eq, *v)?])).collect()
        }
        When::ArgNotIn { arg, values } => {
            check_values(values)?;
            let all = values.iter().map(|v| cond(arg, SeccompCmpOp::Ne, *v)).collect::<Result<Vec<_>, _>>()?;
            Ok(vec![all])
        }
        When::ArgMaskedEq { arg, mask, value } => {
            if mask == 0 || mask > u64::from(u32::MAX) || value & !mask != 0 {
                return Err("mask must be non-zero and fit in 32 bits, value must lie within it");
            }
            Ok(vec![vec![cond(arg, SeccompCmpOp::MaskedEq(mask), value)?]])
        }
    }
}
