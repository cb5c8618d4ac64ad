//! Errors of the KVM boundary.

use std::io;

/// A KVM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` could not be opened.
    #[error("opening /dev/kvm: {0}")]
    Open(#[source] io::Error),
    /// The KVM API version is not the stable one (12).
    #[error("KVM API version {0}, expected 12")]
    ApiVersion(i32),
    /// An ioctl failed; the first field names it.
    #[error("{0}: {1}")]
    Ioctl(&'static str, #[source] io::Error),
    /// KVM accepted fewer MSRs than were given.
    #[error("KVM_SET_MSRS set {set} of {wanted} MSRs")]
    PartialMsrs {
        /// How many were set.
        set: usize,
        /// How many were given.
        wanted: usize,
    },
    /// A CPUID or MSR table did not fit its KVM container.
    #[error("building the {0} table for KVM")]
    Table(&'static str),
}
