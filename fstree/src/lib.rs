//! Walking and removing directory trees that an untrusted party controls.
//!
//! A sandbox can build a tree of any depth (a loop of `mkdir d; cd d` makes
//! 25,000 levels in about a second) and rename or swap entries while we look.
//! A recursive walk (`std::fs::remove_dir_all`, a hand-written recursion)
//! overflows the stack of the process doing it, and a path-based one fails
//! past `PATH_MAX` or follows a symlink swapped in for a directory. Every walk
//! here is therefore:
//!
//! * **iterative**: an explicit stack on the heap, so depth costs memory (a
//!   name per level), never stack;
//! * **fd-relative**: each name is opened relative to its already-open parent
//!   (`openat`, `unlinkat`, `fstatat`) with `O_NOFOLLOW`, so no path is ever
//!   longer than one name and no symlink is followed;
//! * **bounded in fds**: only the deepest [`MAX_OPEN_DIRS`] levels keep their
//!   directory open; a shallower one is reopened through `..` of its child
//!   when the walk climbs back, and checked to be the same inode (a directory
//!   moved meanwhile fails the walk instead of leading it elsewhere);
//! * **on one file system**: [`remove`] never descends into another file
//!   system (a mount point inside the tree is an error, not an emptied mount).
//!
//! [`remove::remove_tree`] deletes a tree; [`walk::walk`] visits one in
//! pre-order with a visitor that decides what to descend into.
//! [`replace::replace_file`] replaces one (trusted) file whole: temp, rename.
pub mod error;
mod path;
pub mod remove;
pub mod replace;
mod stack;
pub mod walk;

pub use error::Error;
pub use remove::{remove_tree, remove_tree_at, Removed};
pub use walk::{walk, Control, Visit, WalkOptions};

/// How many directory levels keep an open fd at once (the deepest ones).
pub const MAX_OPEN_DIRS: usize = 64;
