//! Errors of walks and removals. Paths in messages are abbreviated (a path
//! in a deep tree can be megabytes long).
use nix::errno::Errno;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed on `path`.
    #[error("{op} {path}: {errno}")]
    Sys { op: &'static str, path: String, errno: Errno },
    /// A directory was moved or replaced while the walk was in it.
    #[error("{path}: replaced or moved during the walk")]
    Changed { path: String },
    /// A directory of the tree is on another file system (a mount point).
    #[error("{path}: a mount point inside the tree (another file system), not descended into")]
    MountPoint { path: String },
    /// A directory kept getting new entries while being emptied.
    #[error("{path}: still not empty after {passes} passes (entries keep appearing)")]
    NotEmpty { path: String, passes: u32 },
    /// A visitor's own error.
    #[error("{0}")]
    Visitor(String),
}

impl Error {
    /// The errno of a failed system call, if that is what this is.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Error::Sys { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// Whether the tree (or a part of the path to it) did not exist.
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(Errno::ENOENT)
    }
}
