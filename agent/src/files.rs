//! File and directory operations inside the sandbox.
//!
//! Every path must be absolute. A `..` that would climb above `/` is refused
//! (the sandbox root is the agent's `/`, so nothing can resolve outside it, but
//! such a path is a client bug worth reporting).
use crate::error::{AgentError, Result};
use crate::passwd;
use crate::tree_ops;
use pvisor_proto::agent::{FileInfo, PermissionEntry, ReplaceCount, ReplaceEntry};
use std::fs::{self, File, Metadata};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Checks and lexically normalizes a client path.
pub fn check_path(p: &str) -> Result<PathBuf> {
    if p.is_empty() {
        return Err(AgentError::InvalidArgument("path is empty".into()));
    }
    if p.contains('\0') {
        return Err(AgentError::InvalidArgument(format!("path {p:?} contains NUL")));
    }
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(AgentError::InvalidArgument(format!("path {p:?} is not absolute")));
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                // Popping "/" itself fails: that `..` would climb above the root.
                if !out.pop() {
                    return Err(AgentError::InvalidArgument(format!("path {p:?} escapes the sandbox root")));
                }
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => unreachable!("no prefixes on unix"),
        }
    }
    Ok(out)
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> AgentError + '_ {
    move |e| AgentError::io(path.display().to_string(), e)
}

fn ms(t: std::io::Result<std::time::SystemTime>) -> i64 {
    t.ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn file_type(md: &Metadata) -> &'static str {
    let t = md.file_type();
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "directory"
    } else if t.is_file() {
        "file"
    } else {
        "other"
    }
}

pub fn info_of(path: &Path, md: &Metadata) -> FileInfo {
    FileInfo {
        path: path.display().to_string(),
        size: md.len(),
        modified_at_ms: ms(md.modified()),
        created_at_ms: ms(md.created().or_else(|_| md.modified())),
        owner: passwd::user_by_uid(md.uid()).map(|u| u.name).unwrap_or_else(|| md.uid().to_string()),
        group: passwd::group_name(md.gid()).unwrap_or_else(|| md.gid().to_string()),
        mode: md.mode() & 0o7777,
        r#type: file_type(md).into(),
    }
}

/// Stats each path (following symlinks, like `stat`); any missing path fails.
pub fn stat(paths: &[String]) -> Result<Vec<FileInfo>> {
    paths
        .iter()
        .map(|p| {
            let path = check_path(p)?;
            let md = fs::metadata(&path).map_err(io_err(&path))?;
            Ok(info_of(&path, &md))
        })
        .collect()
}

fn resolve_owner(owner: Option<&str>, group: Option<&str>) -> Result<(Option<u32>, Option<u32>)> {
    let uid = match owner.filter(|s| !s.is_empty()) {
        Some(o) => {
            Some(passwd::resolve_uid(o).ok_or_else(|| AgentError::InvalidArgument(format!("unknown user {o:?}")))?)
        }
        None => None,
    };
    let gid = match group.filter(|s| !s.is_empty()) {
        Some(g) => {
            Some(passwd::resolve_gid(g).ok_or_else(|| AgentError::InvalidArgument(format!("unknown group {g:?}")))?)
        }
        None => None,
    };
    Ok((uid, gid))
}

/// Applies mode and ownership to one path.
pub fn apply_permissions(path: &Path, mode: Option<u32>, owner: Option<&str>, group: Option<&str>) -> Result<()> {
    if let Some(mode) = mode {
        if mode > 0o7777 {
            return Err(AgentError::InvalidArgument(format!("mode {mode:o} is out of range")));
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(path))?;
    }
    let (uid, gid) = resolve_owner(owner, group)?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(path, uid, gid).map_err(io_err(path))?;
    }
    Ok(())
}

pub fn set_permissions(entries: &[PermissionEntry]) -> Result<()> {
    for e in entries {
        let path = check_path(&e.path)?;
        if !path.exists() {
            return Err(AgentError::NotFound(e.path.clone()));
        }
        apply_permissions(&path, e.mode, e.owner.as_deref(), e.group.as_deref())?;
    }
    Ok(())
}

/// `mkdir -p` with mode and owner applied to the leaf.
pub fn make_dirs(entries: &[PermissionEntry]) -> Result<()> {
    for e in entries {
        let path = check_path(&e.path)?;
        fs::create_dir_all(&path).map_err(io_err(&path))?;
        apply_permissions(&path, e.mode, e.owner.as_deref(), e.group.as_deref())?;
    }
    Ok(())
}

/// A file being written by an upload: data goes to a temporary sibling that
/// replaces the target only when complete, so a broken upload loses nothing.
pub struct UploadFile {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    mode: u32,
    owner: Option<String>,
    group: Option<String>,
}

impl UploadFile {
    pub fn create(path: &str, mode: Option<u32>, owner: Option<String>, group: Option<String>) -> Result<Self> {
        let path = check_path(path)?;
        let parent = path.parent().ok_or_else(|| AgentError::InvalidArgument("cannot write to /".into()))?;
        fs::create_dir_all(parent).map_err(io_err(parent))?;
        if path.is_dir() {
            return Err(AgentError::InvalidArgument(format!("{} is a directory", path.display())));
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = parent.join(format!(".{name}.pvisor-upload-{:08x}", rand::random::<u32>()));
        let file = File::options().write(true).create_new(true).open(&tmp).map_err(io_err(&tmp))?;
        Ok(UploadFile { path, tmp, file, mode: mode.unwrap_or(0o644), owner, group })
    }

    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.file.write_all(data).map_err(io_err(&self.path))
    }

    pub fn finish(self) -> Result<()> {
        let r = (|| {
            apply_permissions(&self.tmp, Some(self.mode), self.owner.as_deref(), self.group.as_deref())?;
            fs::rename(&self.tmp, &self.path).map_err(io_err(&self.path))
        })();
        if r.is_err() {
            let _ = fs::remove_file(&self.tmp);
        }
        r
    }

    pub fn abort(self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Opens a file for download at `offset`; returns the file and bytes to send.
pub fn open_for_read(path: &str, offset: u64, limit: u64) -> Result<(File, u64)> {
    let path = check_path(path)?;
    let mut f = File::open(&path).map_err(io_err(&path))?;
    let md = f.metadata().map_err(io_err(&path))?;
    if md.is_dir() {
        return Err(AgentError::InvalidArgument(format!("{} is a directory", path.display())));
    }
    let len = md.len();
    if offset > len {
        return Err(AgentError::InvalidArgument(format!("offset {offset} is beyond the end ({len})")));
    }
    f.seek(SeekFrom::Start(offset)).map_err(io_err(&path))?;
    let rest = len - offset;
    Ok((f, if limit == 0 { rest } else { rest.min(limit) }))
}

/// Reads up to `max` bytes.
pub fn read_chunk(f: &mut File, max: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let n = f.read(&mut buf).map_err(|e| AgentError::io("read", e))?;
    buf.truncate(n);
    Ok(buf)
}

pub fn remove_files(paths: &[String]) -> Result<()> {
    for p in paths {
        let path = check_path(p)?;
        let md = fs::symlink_metadata(&path).map_err(io_err(&path))?;
        if md.is_dir() {
            return Err(AgentError::InvalidArgument(format!("{} is a directory", path.display())));
        }
        fs::remove_file(&path).map_err(io_err(&path))?;
    }
    Ok(())
}

pub fn remove_dirs(paths: &[String]) -> Result<()> {
    for p in paths {
        let path = check_path(p)?;
        if path == Path::new("/") {
            return Err(AgentError::InvalidArgument("refusing to remove /".into()));
        }
        tree_ops::remove_tree(&path)?;
    }
    Ok(())
}

fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    let md = fs::symlink_metadata(src).map_err(io_err(src))?;
    if md.is_dir() {
        tree_ops::copy_dir(src, dest)
    } else if md.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src).map_err(io_err(src))?, dest).map_err(io_err(dest))
    } else {
        fs::copy(src, dest).map(|_| ()).map_err(io_err(dest))
    }
}

/// Renames `src` to `dest`, creating `dest`'s parent, copying across filesystems.
pub fn rename(src: &str, dest: &str) -> Result<()> {
    let (src, dest) = (check_path(src)?, check_path(dest)?);
    fs::symlink_metadata(&src).map_err(io_err(&src))?;
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    match fs::rename(&src, &dest) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            copy_tree(&src, &dest)?;
            tree_ops::remove_tree(&src)
        }
        Err(e) => Err(AgentError::io(dest.display().to_string(), e)),
    }
}

/// Replaces every occurrence of `old` with `new` in each (UTF-8) file.
pub fn replace(entries: &[ReplaceEntry]) -> Result<Vec<ReplaceCount>> {
    let mut counts = Vec::new();
    for e in entries {
        let path = check_path(&e.path)?;
        if e.old.is_empty() {
            return Err(AgentError::InvalidArgument(format!("{}: nothing to replace", e.path)));
        }
        let text = fs::read(&path).map_err(io_err(&path))?;
        let text = String::from_utf8(text)
            .map_err(|_| AgentError::InvalidArgument(format!("{} is not UTF-8 text", e.path)))?;
        let n = text.matches(e.old.as_str()).count() as u64;
        if n > 0 {
            fs::write(&path, text.replace(e.old.as_str(), &e.new)).map_err(io_err(&path))?;
        }
        counts.push(ReplaceCount { path: e.path.clone(), replaced: n });
    }
    Ok(counts)
}

/// Entries under `root` down to `depth` levels (1 = direct children, 0 =
/// none). Listings never follow symlinks, so a `root` that is one is refused
/// (the spec's 400) rather than listed through.
pub fn list_dir(root: &str, depth: u32) -> Result<Vec<FileInfo>> {
    let root = check_path(root)?;
    let md = fs::symlink_metadata(&root).map_err(io_err(&root))?;
    if md.file_type().is_symlink() {
        return Err(AgentError::InvalidArgument(format!(
            "{} is a symbolic link: list the directory it points to",
            root.display()
        )));
    }
    if !md.is_dir() {
        return Err(AgentError::InvalidArgument(format!("{} is not a directory", root.display())));
    }
    if depth == 0 {
        return Ok(Vec::new());
    }
    tree_ops::list_dir(&root, depth)
}

/// Files under `root` whose name (or path relative to `root`, when the
/// pattern has a `/`) matches the glob `pattern` (default `**`).
pub fn search(root: &str, pattern: &str) -> Result<Vec<FileInfo>> {
    let root = check_path(root)?;
    let pattern = if pattern.is_empty() { "**" } else { pattern };
    let pat = glob::Pattern::new(pattern)
        .map_err(|e| AgentError::InvalidArgument(format!("bad pattern {pattern:?}: {e}")))?;
    let opts = glob::MatchOptions { require_literal_separator: false, ..Default::default() };
    let by_path = pattern.contains('/');
    tree_ops::search(&root, |name, rel| {
        pattern == "**" || pat.matches_path_with(if by_path { rel } else { name }, opts)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_path_normalizes_and_refuses_escapes() {
        assert_eq!(check_path("/a/./b/../c").unwrap(), PathBuf::from("/a/c"));
        assert_eq!(check_path("/a/..").unwrap(), PathBuf::from("/"));
        assert!(check_path("/../etc/passwd").is_err());
        assert!(check_path("/a/../../etc").is_err());
        assert!(check_path("relative/path").is_err());
        assert!(check_path("").is_err());
    }

    #[test]
    fn upload_replaces_atomically_and_abort_keeps_old() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("sub/f.txt");
        let t = target.to_str().unwrap();
        let mut u = UploadFile::create(t, Some(0o600), None, None).unwrap();
        u.write(b"hello").unwrap();
        u.finish().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"hello");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o777, 0o600);
        let mut u = UploadFile::create(t, None, None, None).unwrap();
        u.write(b"partial").unwrap();
        u.abort();
        assert_eq!(fs::read(&target).unwrap(), b"hello");
        assert_eq!(fs::read_dir(d.path().join("sub")).unwrap().count(), 1);
    }

    #[test]
    fn replace_search_list_rename() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_str().unwrap().to_string();
        fs::create_dir_all(d.path().join("x/y")).unwrap();
        fs::write(d.path().join("x/a.txt"), "one two one").unwrap();
        fs::write(d.path().join("x/y/b.py"), "print(1)").unwrap();
        let c =
            replace(&[ReplaceEntry { path: format!("{root}/x/a.txt"), old: "one".into(), new: "1".into() }]).unwrap();
        assert_eq!(c[0].replaced, 2);
        assert_eq!(fs::read_to_string(d.path().join("x/a.txt")).unwrap(), "1 two 1");
        let found = search(&root, "*.py").unwrap();
        assert_eq!(found.len(), 1);
        assert!(found[0].path.ends_with("x/y/b.py"));
        assert_eq!(search(&root, "").unwrap().len(), 2);
        assert_eq!(list_dir(&root, 1).unwrap().len(), 1);
        assert_eq!(list_dir(&root, 3).unwrap().len(), 4);
        assert_eq!(list_dir(&root, 0).unwrap().len(), 0);
        std::os::unix::fs::symlink(d.path().join("x"), d.path().join("link")).unwrap();
        assert!(matches!(list_dir(&format!("{root}/link"), 1), Err(AgentError::InvalidArgument(_))));
        assert!(matches!(list_dir(&format!("{root}/x/a.txt"), 1), Err(AgentError::InvalidArgument(_))));
        // A symlink inside a listing is an entry, not followed.
        assert_eq!(list_dir(&root, 3).unwrap().len(), 5);
        rename(&format!("{root}/x/a.txt"), &format!("{root}/z/moved.txt")).unwrap();
        assert!(d.path().join("z/moved.txt").exists());
        assert!(!d.path().join("x/a.txt").exists());
        assert!(remove_files(&[format!("{root}/x")]).is_err());
        remove_dirs(&[format!("{root}/x")]).unwrap();
        assert!(!d.path().join("x").exists());
    }
}
