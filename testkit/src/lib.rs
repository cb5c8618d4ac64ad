//! Test-only helpers shared by the workspace's integration tests.
//!
//! A test whose prerequisite is missing (no root, no guest kernel, no test
//! image, …) cannot make libtest report it as skipped at run time. So the
//! rule is: where the suite's runner provides every prerequisite
//! (`scripts/test.sh` sets `PVISOR_TEST_STRICT=1`; `CI=true` counts too) a
//! missing one **fails** the test, and only elsewhere (a developer's
//! `cargo test` without root, say) does the test print a `SKIP:` line and
//! return. Tests that cannot run on these hosts at all are `#[ignore = "…"]`
//! instead, so the runner reports them as ignored.

use std::fmt::Display;
use std::path::PathBuf;

/// Whether missing prerequisites fail tests (see the module docs).
pub fn strict() -> bool {
    std::env::var("PVISOR_TEST_STRICT").is_ok_and(|v| v == "1") || std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Reports a missing prerequisite: panics under [`strict`], otherwise prints
/// `SKIP: why` to stderr (the caller then returns).
#[track_caller]
pub fn skip(why: impl Display) {
    assert!(!strict(), "prerequisite missing (PVISOR_TEST_STRICT=1 requires it): {why}");
    eprintln!("SKIP: {why}");
}

/// `Some(value)` when the test may go on, `None` after [`skip`]ing with
/// `why` (for `let Some(x) = require(...) else { return };`).
#[track_caller]
pub fn require<T>(found: Option<T>, why: impl Display) -> Option<T> {
    if found.is_none() {
        skip(why);
    }
    found
}

/// A path from the environment variable `var`, or `None` after [`skip`].
#[track_caller]
pub fn require_env(var: &str, hint: &str) -> Option<PathBuf> {
    require(std::env::var_os(var).map(PathBuf::from), format!("{var} is unset ({hint})"))
}

/// `true` when running as root; otherwise [`skip`]s with `why` and returns false.
#[track_caller]
pub fn require_root(why: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        skip(format!("needs root: {why}"));
    }
    root
}

/// The crate's source directory: `CARGO_MANIFEST_DIR` at run time (cargo sets it for the test
/// binaries it runs; a runner that starts a binary itself sets it too), else `compiled`, the
/// value baked in at build time. A shared target directory can hand one checkout's test binary
/// to another, so the build-time path may name a checkout that is gone.
pub fn manifest_dir(compiled: &str) -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| PathBuf::from(compiled), PathBuf::from)
}
