//! Replacing one file whole: the contents go to `<name>.tmp` beside it, which
//! is renamed over the file, so a reader (or a process started after a crash)
//! sees the old contents or the new, never a part. A crash can leave the
//! `.tmp` behind; its owner removes such leftovers when it opens its directory.
//!
//! [`Durability::Synced`] also puts both the file and the rename on the disk
//! before returning (fsync of the file, then of the directory), for state that
//! must survive a host crash the moment it is acknowledged. [`Durability::Deferred`]
//! leaves that to the caller (the broker's records are fsynced off the request
//! path, in batches).
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// When the new contents must be on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// On the disk (file and directory entry) before [`replace_file`] returns.
    Synced,
    /// Visible to every reader at once; on the disk when the caller syncs.
    Deferred,
}

/// The temporary name [`replace_file`] writes `path`'s new contents to.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut tmp: OsString = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Replaces `path` with `bytes` atomically (see the module docs). On an
/// error the old file (if any) is untouched; the caller names `path`.
pub fn replace_file(path: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let tmp = temp_path(path);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    if durability == Durability::Synced {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, path)?;
    if durability == Durability::Synced {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temp() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("state.json");
        for (i, durability) in [Durability::Synced, Durability::Deferred].into_iter().enumerate() {
            let body = format!("{{\"v\":{i}}}");
            replace_file(&p, body.as_bytes(), durability).expect("replace");
            assert_eq!(fs::read_to_string(&p).expect("read"), body);
            assert!(!temp_path(&p).exists());
        }
    }

    #[test]
    fn a_failed_replace_keeps_the_old_file() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join("f");
        fs::write(&p, b"old").expect("write");
        fs::create_dir(temp_path(&p)).expect("a directory where the temp file goes");
        replace_file(&p, b"new", Durability::Synced).expect_err("cannot create the temp file");
        assert_eq!(fs::read(&p).expect("read"), b"old");
    }
}
