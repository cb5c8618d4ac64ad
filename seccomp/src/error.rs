//! Errors of this crate.

use std::io;

use crate::rules::FilterKind;

/// What can go wrong building or installing a filter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The rule table is inconsistent (a bug in `rules.rs`, caught by the tests).
    #[error("invalid rule in the {filter} seccomp filter: {reason}")]
    InvalidRules {
        /// Which filter.
        filter: FilterKind,
        /// What is wrong, naming the rule.
        reason: String,
    },
    /// seccompiler refused the rules.
    #[error("compiling the {filter} seccomp filter: {source}")]
    Compile {
        /// Which filter.
        filter: FilterKind,
        /// seccompiler's error.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The program is longer than the kernel accepts.
    #[error("the {filter} seccomp filter has {len} BPF instructions; the kernel accepts {max}")]
    TooLarge {
        /// Which filter.
        filter: FilterKind,
        /// Its length in instructions.
        len: usize,
        /// The kernel's limit.
        max: usize,
    },
    /// An empty program was passed to `apply_*`.
    #[error("refusing to install an empty seccomp BPF program")]
    EmptyProgram,
    /// `prctl(PR_SET_NO_NEW_PRIVS, 1)` failed; nothing was installed.
    #[error("prctl(PR_SET_NO_NEW_PRIVS) failed: {0}")]
    NoNewPrivs(#[source] io::Error),
    /// `seccomp(SECCOMP_SET_MODE_FILTER)` failed; nothing was installed.
    #[error("seccomp(SECCOMP_SET_MODE_FILTER) failed: {0}")]
    Install(#[source] io::Error),
    /// With TSYNC, a thread could not be synchronised (it has a filter the caller lacks);
    /// nothing was installed on any thread.
    #[error("seccomp TSYNC failed: thread {tid} has diverging filters; nothing was installed")]
    ThreadSync {
        /// The thread that could not be synchronised.
        tid: i64,
    },
}

impl From<seccompiler::Error> for Error {
    fn from(error: seccompiler::Error) -> Self {
        #[allow(unreachable_patterns)] // seccompiler's "json" feature adds a variant.
        match error {
            seccompiler::Error::EmptyFilter => Error::EmptyProgram,
            seccompiler::Error::Prctl(e) => Error::NoNewPrivs(e),
            seccompiler::Error::Seccomp(e) => Error::Install(e),
            seccompiler::Error::ThreadSync(tid) => Error::ThreadSync { tid },
            other => Error::Install(io::Error::other(other.to_string())),
        }
    }
}
