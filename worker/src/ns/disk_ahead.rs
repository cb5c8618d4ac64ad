//! The sandbox's disk made ahead: a warm worker, before it has a sandbox,
//! copies the default bound's template into a directory beside the state
//! dirs (`<data>/sandboxes/.ahead-<slot>`),
//! attaches a loop device and mounts the ext4 *nowhere* — a detached mount
//! made by the new mount API (`fsopen`/`fsconfig`/`fsmount`) that lives as
//! long as its fd — then marks the directory [`READY`](super::disk::READY).
//!
//! A create with that template moves the directory to its state dir
//! (broker) and the worker attaches the mount there (`move_mount`) in the
//! mount namespace it makes at that moment ([`super::disk::own`]), so the
//! namespace still sees every image the broker mounted since. No create
//! waits for the copy, the loop device or the mount. A create with another
//! bound, or a worker retired unused, just closes the fd: the kernel drops
//! the file system, the loop device clears itself, the directory goes.
use super::disk::{attach_loop, copy_sparse, sys, IMAGE, READY};
use crate::error::Result;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

// linux/mount.h
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOATIME: libc::c_uint = 0x10;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// A disk mounted ahead: the template it is a copy of, where it was made,
/// and its detached mount.
#[derive(Clone, Debug)]
pub struct Mounted {
    pub template: PathBuf,
    dir: PathBuf,
    /// Taken by [`Mounted::attach`] or dropped by [`Mounted::discard`]: the
    /// file system and its loop device go as soon as it is clear no sandbox has them.
    fs: Arc<Mutex<Option<OwnedFd>>>,
}

impl Mounted {
    /// Whether the broker moved this disk to `state_dir` for a create with
    /// `template` (it moves the directory only when the templates match).
    pub fn taken(&self, state_dir: &Path, template: &Path) -> bool {
        self.template == template && state_dir.join(READY).exists() && state_dir.join(IMAGE).exists()
    }

    /// Attaches the file system at `target`, in the caller's mount namespace
    /// (once: the fd is closed after, the mount stays).
    pub fn attach(&self, target: &Path) -> Result<()> {
        let fs = self.fs.lock().unwrap_or_else(PoisonError::into_inner).take();
        let fs = fs.ok_or_else(|| sys("attach the disk made ahead", std::io::Error::other("already used")))?;
        let to = cstr(target)?;
        // SAFETY: move_mount reads two NUL-terminated strings that live across
        // the call; `fs` is a detached mount fd we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                fs.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        if r < 0 {
            return Err(sys(format!("attach the disk at {}", target.display()), std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Not taken: the file system is dropped (the kernel clears the loop
    /// device) and the directory goes if the broker left it.
    pub fn discard(&self) {
        drop(self.fs.lock().unwrap_or_else(PoisonError::into_inner).take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Makes the disk `ahead` asks for. None (logged) if nothing was asked or
/// anything failed, and then nothing is left: a create mounts its own.
pub fn ahead(ahead: &crate::config::Ahead) -> Option<Mounted> {
    if ahead.disk_template.is_empty() || ahead.disk_dir.is_empty() {
        return None;
    }
    let (template, dir) = (PathBuf::from(&ahead.disk_template), PathBuf::from(&ahead.disk_dir));
    let t = std::time::Instant::now();
    let made = std::fs::create_dir(&dir).map_err(|e| sys(format!("mkdir {}", dir.display()), e)).and_then(|()| {
        let fs = mount_detached(&dir.join(IMAGE), &template)?;
        File::create(dir.join(READY)).map_err(|e| sys("mark the disk ready", e))?;
        Ok(fs)
    });
    match made {
        Ok(fs) => {
            tracing::debug!(took = ?t.elapsed(), dir = %dir.display(), "sandbox disk made ahead");
            Some(Mounted { template, dir, fs: Arc::new(Mutex::new(Some(fs))) })
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "the sandbox disk ahead: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            None
        }
    }
}

/// Copies `template` to `image`, attaches it to a loop device and makes an
/// ext4 of it, mounted nowhere; returns the mount's fd.
fn mount_detached(image: &Path, template: &Path) -> Result<OwnedFd> {
    copy_sparse(template, image)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| sys(format!("open {}", image.display()), e))?;
    let (dev, held) = attach_loop(&file)?;
    // SAFETY: fsopen reads one NUL-terminated string; it returns a new fd or -1.
    let ctx = fd(unsafe { libc::syscall(libc::SYS_fsopen, c"ext4".as_ptr(), FSOPEN_CLOEXEC) }, "fsopen ext4")?;
    let source = cstr(&dev)?;
    // noinit_itable: no background zeroing of the inode tables the template
    // left uninitialised (as `mount_own`).
    fsconfig(&ctx, FSCONFIG_SET_STRING, c"source", Some(&source))?;
    fsconfig(&ctx, FSCONFIG_SET_STRING, c"errors", Some(c"remount-ro"))?;
    fsconfig(&ctx, FSCONFIG_SET_FLAG, c"noinit_itable", None)?;
    fsconfig(&ctx, FSCONFIG_CMD_CREATE, c"", None)?;
    // SAFETY: fsmount takes a file system context fd we own and two flags.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), FSMOUNT_CLOEXEC, MOUNT_ATTR_NOATIME) };
    let mnt = fd(mnt, "fsmount")?;
    // The file system holds the device now; closing ours leaves auto-clear to it.
    drop(held);
    Ok(mnt)
}

fn fsconfig(ctx: &OwnedFd, cmd: libc::c_uint, key: &std::ffi::CStr, value: Option<&std::ffi::CStr>) -> Result<()> {
    let key_ptr = if cmd == FSCONFIG_CMD_CREATE { std::ptr::null() } else { key.as_ptr() };
    let value_ptr = value.map_or(std::ptr::null(), |v| v.as_ptr());
    // SAFETY: fsconfig reads the key and value strings (or none), which live
    // across the call; `ctx` is an fsopen fd we own.
    let r = unsafe { libc::syscall(libc::SYS_fsconfig, ctx.as_raw_fd(), cmd, key_ptr, value_ptr, 0) };
    if r < 0 {
        return Err(sys(format!("fsconfig {}", key.to_string_lossy()), std::io::Error::last_os_error()));
    }
    Ok(())
}

fn fd(r: libc::c_long, what: &str) -> Result<OwnedFd> {
    if r < 0 {
        return Err(sys(what, std::io::Error::last_os_error()));
    }
    // SAFETY: the syscall returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

fn cstr(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|e| sys(format!("path {}", p.display()), std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::super::disk::{own, tests::template, MOUNT};
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn size_of(dir: &Path) -> u64 {
        let st = nix::sys::statvfs::statvfs(dir).unwrap();
        st.blocks() as u64 * st.fragment_size() as u64
    }

    fn asked(template: &Path, dir: &Path) -> crate::config::Ahead {
        crate::config::Ahead {
            disk_template: template.to_string_lossy().into(),
            disk_dir: dir.to_string_lossy().into(),
        }
    }

    /// Needs root and loop devices. A disk made ahead and moved to the state
    /// dir is attached there; another template gets a fresh disk; failures and
    /// discards leave nothing.
    #[test]
    fn a_disk_made_ahead_is_attached_where_the_broker_moved_it() {
        let d = tempfile::tempdir().unwrap();
        let small = template(d.path(), "small.img", 32 << 20);
        let big = template(d.path(), "big.img", 48 << 20);
        let root = d.path().to_path_buf();
        // A thread of its own: the mount namespace `own` makes is the calling thread's.
        std::thread::spawn(move || {
            let warm = root.join("slot.disk");
            let m = ahead(&asked(&small, &warm)).expect("made ahead");
            assert_eq!(m.template, small);
            assert!(warm.join(READY).exists() && warm.join(IMAGE).exists(), "marked ready");
            // Mounted nowhere yet: the directory holds only the image and the mark.
            assert!(!warm.join(MOUNT).exists());
            // The broker's part: the create's state dir is the moved directory.
            let state = root.join("sandbox");
            std::fs::rename(&warm, &state).unwrap();
            assert!(m.taken(&state, &small) && !m.taken(&state, &big));
            let dir = own(&state, &small, Some(&m)).unwrap();
            assert_ne!(std::fs::metadata(&dir).unwrap().dev(), std::fs::metadata(&state).unwrap().dev());
            let total = size_of(&dir);
            assert!(total > 28 << 20 && total <= 32 << 20, "{total}");
            std::fs::write(dir.join("probe"), b"x").unwrap();
            assert!(!state.join(READY).exists(), "the mark goes once taken");

            // A create with another bound: a fresh disk of its own; the one
            // made ahead (not moved) is removed.
            let warm2 = root.join("slot2.disk");
            let m2 = ahead(&asked(&small, &warm2)).expect("made ahead");
            let other = root.join("other");
            std::fs::create_dir(&other).unwrap();
            let dir = own(&other, &big, Some(&m2)).unwrap();
            assert!(size_of(&dir) > 32 << 20, "{}", size_of(&dir));
            assert!(!warm2.exists(), "the unused disk's directory is gone");

            // Nothing asked, or a template that is not there: nothing made, nothing left.
            assert!(ahead(&crate::config::Ahead::default()).is_none());
            let slot3 = root.join("slot3.disk");
            assert!(ahead(&asked(&root.join("missing.img"), &slot3)).is_none());
            assert!(!slot3.exists());
            // A worker retired unused leaves nothing either.
            let slot4 = root.join("slot4.disk");
            ahead(&asked(&small, &slot4)).expect("made ahead").discard();
            assert!(!slot4.exists(), "discarded");
        })
        .join()
        .unwrap();
    }
}
