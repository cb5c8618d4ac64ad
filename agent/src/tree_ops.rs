//! The file API's walks of the sandbox's trees: listing with a depth,
//! search, recursive delete and the copy of a cross-file-system move.
//!
//! The tenant shapes these trees (any depth, symlinks anywhere, entries
//! swapped while we look), so every walk is `pvisor_fstree`'s: iterative
//! (a 100,000-level tree costs heap, not the agent's stack: the agent is PID 1
//! and its death ends the sandbox), fd-relative (no path-length limit) and
//! never follows a symlink. What a listing or search returns is bounded
//! ([`MAX_RESULTS`], [`MAX_RESULT_BYTES`]): past it the call fails instead of
//! building an answer the agent's memory or the gRPC message cannot hold.
use crate::error::{AgentError, Result};
use crate::passwd;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::{fchmod, mkdirat, FileStat, Mode, SFlag};
use pvisor_fstree::{walk, Control, Visit, WalkOptions};
use pvisor_proto::agent::FileInfo;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Most entries one listing or search returns.
pub const MAX_RESULTS: usize = 100_000;
/// Most bytes of paths one listing or search returns.
pub const MAX_RESULT_BYTES: usize = 32 << 20;
/// Deepest tree a cross-file-system move copies (it holds an fd per level
/// of the destination).
pub const MAX_COPY_DEPTH: u32 = 512;

fn open_dir(path: &Path) -> Result<OwnedFd> {
    let fd = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| AgentError::io(path.display().to_string(), e.into()))?;
    // SAFETY: open just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn info_of_stat(path: String, st: &FileStat) -> FileInfo {
    let ms = st.st_mtime.max(0) * 1000 + st.st_mtime_nsec / 1_000_000;
    let kind = match kind(st) {
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFREG => "file",
        _ => "other",
    };
    FileInfo {
        path,
        size: st.st_size.max(0) as u64,
        modified_at_ms: ms,
        // stat has no birth time; the modification time stands in for it.
        created_at_ms: ms,
        owner: passwd::user_by_uid(st.st_uid).map(|u| u.name).unwrap_or_else(|| st.st_uid.to_string()),
        group: passwd::group_name(st.st_gid).unwrap_or_else(|| st.st_gid.to_string()),
        mode: st.st_mode & 0o7777,
        r#type: kind.into(),
    }
}

/// Collects results within the bounds.
struct Results {
    root: String,
    out: Vec<FileInfo>,
    bytes: usize,
}

impl Results {
    fn new(root: &Path) -> Self {
        let mut root = root.display().to_string();
        if !root.ends_with('/') {
            root.push('/');
        }
        Results { root, out: Vec::new(), bytes: 0 }
    }

    fn push(&mut self, v: &Visit<'_>) -> Result<()> {
        let path = format!("{}{}", self.root, String::from_utf8_lossy(v.path));
        self.bytes += path.len();
        if self.out.len() >= MAX_RESULTS || self.bytes > MAX_RESULT_BYTES {
            return Err(AgentError::InvalidArgument(format!(
                "more than {MAX_RESULTS} entries or {} MiB of paths under {}: narrow the depth or pattern",
                MAX_RESULT_BYTES >> 20,
                self.root
            )));
        }
        self.out.push(info_of_stat(path, v.stat));
        Ok(())
    }
}

/// Entries under `root` (a directory, symlinks to it followed) down to
/// `depth` levels (1 = direct children).
pub fn list_dir(root: &Path, depth: u32) -> Result<Vec<FileInfo>> {
    let fd = open_dir(root)?;
    let mut res = Results::new(root);
    walk::<AgentError, _>(fd.as_fd(), &root.display().to_string(), WalkOptions { max_depth: depth.max(1) }, |v| {
        res.push(v)?;
        Ok(Control::Descend)
    })?;
    Ok(res.out)
}

/// Non-directories under `root` for which `matches(name, relative path)` holds.
pub fn search(root: &Path, matches: impl Fn(&Path, &Path) -> bool) -> Result<Vec<FileInfo>> {
    let fd = open_dir(root)?;
    let mut res = Results::new(root);
    walk::<AgentError, _>(fd.as_fd(), &root.display().to_string(), WalkOptions::default(), |v| {
        if !v.is_dir() && matches(Path::new(OsStr::from_bytes(v.name.to_bytes())), Path::new(OsStr::from_bytes(v.path)))
        {
            res.push(v)?;
        }
        Ok(Control::Descend)
    })?;
    Ok(res.out)
}

/// Removes `path` and everything under it; a missing path is fine.
pub fn remove_tree(path: &Path) -> Result<()> {
    match pvisor_fstree::remove_tree(path) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn sys_err<'a>(path: &'a Path, what: &str) -> impl Fn(nix::Error) -> AgentError + 'a {
    let what = what.to_owned();
    move |e| AgentError::io(format!("{} ({what})", path.display()), e.into())
}

/// Copies the directory `src` to the new directory `dest` (not following
/// symlinks: they are copied as symlinks), keeping modes. Fifos, sockets
/// and devices are refused.
pub fn copy_dir(src: &Path, dest: &Path) -> Result<()> {
    let src_fd = nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(sys_err(src, "open"))?;
    // SAFETY: open just returned this fd and nothing else owns it.
    let src_fd = unsafe { OwnedFd::from_raw_fd(src_fd) };
    let src_mode = nix::sys::stat::fstat(src_fd.as_raw_fd()).map_err(sys_err(src, "stat"))?.st_mode & 0o7777;
    std::fs::create_dir(dest).map_err(|e| AgentError::io(dest.display().to_string(), e))?;
    // Destination directories on the way down, with the mode each gets
    // once its content is in (it may not allow writing into it).
    let mut dests: Vec<(OwnedFd, u32)> = vec![(open_dir(dest)?, src_mode)];
    let finish =
        |d: (OwnedFd, u32)| fchmod(d.0.as_raw_fd(), Mode::from_bits_truncate(d.1)).map_err(sys_err(dest, "chmod"));
    walk::<AgentError, _>(src_fd.as_fd(), &src.display().to_string(), WalkOptions::default(), |v| {
        while dests.len() > v.depth as usize {
            if let Some(d) = dests.pop() {
                finish(d)?;
            }
        }
        let parent = dests.last().map(|d| d.0.as_raw_fd()).ok_or_else(|| AgentError::InvalidArgument("copy".into()))?;
        let mode = v.stat.st_mode & 0o7777;
        match kind(v.stat) {
            SFlag::S_IFDIR => {
                if v.depth >= MAX_COPY_DEPTH {
                    return Err(AgentError::InvalidArgument(format!(
                        "{} is more than {MAX_COPY_DEPTH} levels deep: too deep to move across file systems",
                        src.display()
                    )));
                }
                mkdirat(Some(parent), v.name, Mode::from_bits_truncate(0o700)).map_err(sys_err(dest, "mkdir"))?;
                let fd = openat(
                    Some(parent),
                    v.name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(sys_err(dest, "open"))?;
                // SAFETY: openat just returned this fd and nothing else owns it.
                dests.push((unsafe { OwnedFd::from_raw_fd(fd) }, mode));
                Ok(Control::Descend)
            }
            SFlag::S_IFLNK => {
                let target = readlinkat(Some(v.parent.as_raw_fd()), v.name).map_err(sys_err(src, "readlink"))?;
                nix::unistd::symlinkat(target.as_os_str(), Some(parent), v.name).map_err(sys_err(dest, "symlink"))?;
                Ok(Control::Skip)
            }
            SFlag::S_IFREG => {
                let open = |dir, flags, m| {
                    openat(Some(dir), v.name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::from_bits_truncate(m))
                        // SAFETY: openat just returned this fd and nothing else owns it.
                        .map(|fd| unsafe { File::from_raw_fd(fd) })
                };
                let mut from = open(v.parent.as_raw_fd(), OFlag::O_RDONLY, 0).map_err(sys_err(src, "open"))?;
                let mut to = open(parent, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL, 0o600)
                    .map_err(sys_err(dest, "create"))?;
                std::io::copy(&mut from, &mut to).map_err(|e| AgentError::io(dest.display().to_string(), e))?;
                fchmod(to.as_raw_fd(), Mode::from_bits_truncate(mode)).map_err(sys_err(dest, "chmod"))?;
                Ok(Control::Skip)
            }
            _ => Err(AgentError::InvalidArgument(format!(
                "{}: cannot move a fifo, socket or device across file systems",
                String::from_utf8_lossy(v.path)
            ))),
        }
    })?;
    while let Some(d) = dests.pop() {
        finish(d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `levels` nested `d` directories under `top` and a file `leaf` at the
    /// bottom, made fd-relative (the path is past PATH_MAX).
    fn chain(top: &Path, levels: usize) {
        let mut fd = open_dir(top).expect("open");
        for _ in 0..levels {
            mkdirat(Some(fd.as_raw_fd()), c"d", Mode::from_bits_truncate(0o755)).expect("mkdirat");
            let raw = openat(Some(fd.as_raw_fd()), c"d", OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
                .expect("openat");
            // SAFETY: openat just returned this fd and nothing else owns it.
            fd = unsafe { OwnedFd::from_raw_fd(raw) };
        }
        let raw = openat(
            Some(fd.as_raw_fd()),
            c"leaf.txt",
            OFlag::O_CREAT | OFlag::O_WRONLY,
            Mode::from_bits_truncate(0o644),
        )
        .expect("leaf");
        // SAFETY: openat just returned this fd and nothing else owns it.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
    }

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()).expect("tempdir")
    }

    #[test]
    fn search_list_and_delete_a_tree_100000_levels_deep() {
        let d = scratch();
        let root = d.path().join("deep");
        std::fs::create_dir(&root).expect("mkdir");
        chain(&root, 100_000);
        let found = search(&root, |name, _| name == Path::new("leaf.txt")).expect("search");
        assert_eq!(found.len(), 1);
        assert!(found[0].path.ends_with("/d/d/leaf.txt"));
        assert_eq!(found[0].path.len(), root.display().to_string().len() + 1 + 100_000 * 2 + "leaf.txt".len());
        assert_eq!(list_dir(&root, 3).expect("list").len(), 3);
        let all = list_dir(&root, u32::MAX);
        assert!(all.is_err_and(|e| e.to_string().contains("narrow")), "bounded, not 10 GB of paths");
        remove_tree(&root).expect("rm");
        assert!(!root.exists());
    }

    #[test]
    fn copy_keeps_modes_and_symlinks_and_refuses_deep_trees() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch();
        let src = d.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).expect("mkdir");
        std::fs::write(src.join("a/b/f"), "data").expect("write");
        std::fs::set_permissions(src.join("a/b/f"), std::fs::Permissions::from_mode(0o751)).expect("chmod");
        std::fs::set_permissions(src.join("a"), std::fs::Permissions::from_mode(0o555)).expect("chmod");
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).expect("symlink");
        let dest = d.path().join("dest");
        copy_dir(&src, &dest).expect("copy");
        assert_eq!(std::fs::read_to_string(dest.join("a/b/f")).expect("read"), "data");
        let mode = |p: &Path| std::fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode(&dest.join("a/b/f")), 0o751);
        assert_eq!(mode(&dest.join("a")), 0o555);
        assert_eq!(std::fs::read_link(dest.join("link")).expect("link"), Path::new("/etc/passwd"));
        let deep = d.path().join("deep");
        std::fs::create_dir(&deep).expect("mkdir");
        chain(&deep, MAX_COPY_DEPTH as usize + 10);
        let r = copy_dir(&deep, &d.path().join("deep2"));
        assert!(r.is_err_and(|e| e.to_string().contains("too deep")));
        std::fs::set_permissions(dest.join("a"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(src.join("a"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}
