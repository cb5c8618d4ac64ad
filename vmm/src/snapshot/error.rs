//! Errors of taking and restoring snapshots.

use std::io;
use std::path::PathBuf;

/// A snapshot could not be taken, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM has a device whose state the VMM cannot save.
    #[error("this VM cannot be snapshotted: it has {0}")]
    Unsupported(&'static str),
    /// The VM could not be paused for the snapshot.
    #[error("pausing the VM for the snapshot: {0}")]
    Pause(#[from] crate::pause::Error),
    /// KVM refused to give or take state.
    #[error(transparent)]
    Kvm(#[from] crate::kvm::Error),
    /// Building the restored VM failed.
    #[error(transparent)]
    Vm(#[from] crate::vm::Error),
    /// Mapping the memory file failed.
    #[error(transparent)]
    Memory(#[from] crate::memory::Error),
    /// A snapshot file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// What the caller ran while the devices were held failed.
    #[error("while the VM was held for the snapshot: {0}")]
    WhileHeld(#[source] io::Error),
    /// The state file does not start with the snapshot magic.
    #[error("{0} is not a pvisor snapshot state file")]
    BadMagic(PathBuf),
    /// The state file was written in a format version this VMM does not read.
    #[error("snapshot format version {found}, this VMM reads version {supported}")]
    Version {
        /// The file's version.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The state file is shorter than its header says.
    #[error("the state file is truncated: {have} of {want} bytes")]
    Truncated {
        /// Bytes present after the header.
        have: u64,
        /// Bytes the header announces.
        want: u64,
    },
    /// The state's checksum does not match: the file was corrupted or altered.
    #[error("the state file's checksum does not match its content")]
    Checksum,
    /// The state did not decode (or encode).
    #[error("decoding the snapshot state: {0}")]
    Decode(#[source] serde_json::Error),
    /// A virtio transport could not be saved or restored.
    #[error("virtio-mmio transport: {0}")]
    Virtio(#[from] crate::devices::virtio::mmio::Error),
    /// The devices handed to a restore do not match the snapshot's.
    #[error("the snapshot has {snapshot} virtio devices, the restore was given {given}")]
    VirtioCount {
        /// In the snapshot.
        snapshot: usize,
        /// Handed to the restore.
        given: usize,
    },
    /// A restored virtio transport did not land where the snapshot had it.
    #[error("virtio device {index} was at {saved:#x} (GSI {saved_gsi}), the restore placed it at {placed:#x}")]
    VirtioSlot {
        /// Its index.
        index: usize,
        /// Where it was.
        saved: u64,
        /// Its GSI then.
        saved_gsi: u32,
        /// Where the restore put it.
        placed: u64,
    },
    /// The state and the memory file do not belong together.
    #[error("the memory file holds {file:#x} bytes, the state describes {state:#x}")]
    MemorySize {
        /// The memory file's size.
        file: u64,
        /// The state's RAM size.
        state: u64,
    },
}

impl Error {
    pub(super) fn io(what: &'static str, path: &std::path::Path) -> impl FnOnce(io::Error) -> Error {
        let path = path.to_owned();
        move |source| Error::Io { what, path, source }
    }
}
