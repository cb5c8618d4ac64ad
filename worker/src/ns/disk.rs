//! The sandbox's own disk: a file system of exactly its disk bound for the
//! overlay's upper and work directories.
//!
//! The broker makes one empty ext4 image per bound size (once, then cached:
//! `NsConfig.disk_template`); the worker copies it sparsely into the state
//! dir (a few hundred KiB of metadata), attaches a loop device to the copy
//! (`LOOP_CONFIGURE`, auto-clear, direct I/O) and mounts it at
//! `<state>/disk` — in a mount namespace of the worker's own (a slave of the
//! host's, so the host sees nothing and nothing needs unmounting). The
//! sandbox's mount namespace is cloned from it. When the worker and the
//! sandbox are gone the kernel drops the mount and the loop device clears
//! itself; the broker's teardown removes the image file with the state dir.
//!
//! A warm worker does most of this before it has a sandbox when the broker
//! asks it to ([`super::disk_ahead`]); [`own`] then only attaches the mount.
//!
//! What that gives: a write past the bound fails with ENOSPC inside, `df /`
//! shows the sandbox's own size (overlay reports its upper's file system),
//! the host's file system holds at most the image's size for the sandbox,
//! and neither the pool nor another sandbox shares the space. Needs root
//! (loop devices, mounting ext4); an unprivileged worker never gets a template.
use crate::error::{Result, WorkerError};
use nix::mount::{mount, MsFlags};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// `<state>/disk.ext4`: the sandbox's copy of the template.
pub const IMAGE: &str = "disk.ext4";
/// `<state>/disk`: where it is mounted (in the worker's namespace only).
pub const MOUNT: &str = "disk";
/// `<dir>/ready`: made once a disk mounted ahead is ready to be taken.
pub const READY: &str = "ready";

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

pub(super) fn sys(what: impl Into<String>, e: impl Into<std::io::Error>) -> WorkerError {
    WorkerError::sys(what, e.into())
}

/// Copies `src` to a new file `dst`, data ranges only (holes stay holes).
pub fn copy_sparse(src: &Path, dst: &Path) -> Result<()> {
    let from = File::open(src).map_err(|e| sys(format!("open {}", src.display()), e))?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| sys(format!("create {}", dst.display()), e))?;
    let len = from.metadata().map_err(|e| sys("stat the disk template", e))?.len();
    to.set_len(len).map_err(|e| sys("size the sandbox disk", e))?;
    let fd = from.as_raw_fd();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos: i64 = 0;
    while (pos as u64) < len {
        // SAFETY: lseek on an fd we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data past `pos`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let end = if hole < 0 { len as i64 } else { hole };
        let mut off = data;
        while off < end {
            let n = ((end - off) as usize).min(buf.len());
            from.read_exact_at(&mut buf[..n], off as u64).map_err(|e| sys("read the disk template", e))?;
            to.write_all_at(&buf[..n], off as u64).map_err(|e| sys("write the sandbox disk", e))?;
            off += n as i64;
        }
        pos = end;
    }
    Ok(())
}

/// Attaches a free loop device to `image`; the device clears itself once
/// its last user is gone, so the returned open device must be held until
/// the mount holds it too.
pub(super) fn attach_loop(image: &File) -> Result<(PathBuf, File)> {
    let ctl = File::open("/dev/loop-control").map_err(|e| sys("open /dev/loop-control", e))?;
    // Another worker may take the same free device first: try again.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(sys("LOOP_CTL_GET_FREE", std::io::Error::last_os_error()));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| sys(format!("open {}", path.display()), e))?;
        for flags in [LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO, LO_FLAGS_AUTOCLEAR] {
            // SAFETY: all-zero is a valid loop_info64 (plain integers and arrays).
            let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
            info.lo_flags = flags;
            let cfg = LoopConfig { fd: image.as_raw_fd() as u32, block_size: 4096, info, reserved: [0; 8] };
            // SAFETY: LOOP_CONFIGURE reads one loop_config, which lives across the call.
            if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) } == 0 {
                return Ok((path, dev));
            }
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EBUSY) => break,     // taken meanwhile: next device
                Some(libc::EINVAL) => continue, // no direct I/O here: plain
                _ => return Err(sys(format!("LOOP_CONFIGURE {}", path.display()), err)),
            }
        }
    }
    Err(WorkerError::Start("no free loop device after 16 tries".into()))
}

/// Gives the worker a mount namespace of its own, a slave of the host's (it
/// sees the image mounts the broker makes later; the host sees none of its).
fn own_namespace() -> Result<()> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|e| sys("worker mount namespace", e))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
        .map_err(|e| sys("make the worker's mounts slaves", e))
}

/// Gives the worker a mount namespace of its own (a slave of the host's)
/// and mounts the sandbox's disk at `<state>/disk`; returns that directory.
pub fn mount_own(state_dir: &Path, template: &Path) -> Result<PathBuf> {
    let image_path = state_dir.join(IMAGE);
    let t = std::time::Instant::now();
    copy_sparse(template, &image_path)?;
    let copied = t.elapsed();
    let image = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&image_path)
        .map_err(|e| sys(format!("open {}", image_path.display()), e))?;
    own_namespace()?;
    let (dev, held) = attach_loop(&image)?;
    let target = state_dir.join(MOUNT);
    std::fs::create_dir_all(&target).map_err(|e| sys(format!("mkdir {}", target.display()), e))?;
    // noinit_itable: no background zeroing of the inode tables the template
    // left uninitialised (it would write most of them into the sparse file).
    mount(Some(&dev), &target, Some("ext4"), MsFlags::MS_NOATIME, Some("errors=remount-ro,noinit_itable"))
        .map_err(|e| sys(format!("mount the sandbox disk {}", dev.display()), e))?;
    // The mount holds the device now; closing ours leaves auto-clear to it.
    drop(held);
    tracing::debug!(copy = ?copied, total = ?t.elapsed(), dev = %dev.display(), "sandbox disk mounted");
    Ok(target)
}

/// The sandbox's disk: the one a warm worker mounted ahead (`ahead`) when
/// the broker moved it to `state_dir` for a create with its template, else a
/// fresh copy of `template` mounted now. Returns the mount's directory.
pub fn own(state_dir: &Path, template: &Path, ahead: Option<&super::disk_ahead::Mounted>) -> Result<PathBuf> {
    match ahead {
        Some(m) if m.taken(state_dir, template) => {
            own_namespace()?;
            let target = state_dir.join(MOUNT);
            std::fs::create_dir_all(&target).map_err(|e| sys(format!("mkdir {}", target.display()), e))?;
            m.attach(&target)?;
            let _ = std::fs::remove_file(state_dir.join(READY));
            tracing::debug!("sandbox disk mounted ahead");
            Ok(target)
        }
        other => {
            if let Some(m) = other {
                m.discard();
            }
            mount_own(state_dir, template)
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        let dst = d.path().join("dst");
        copy_sparse(&src, &dst).unwrap();
        let out = File::open(&dst).unwrap();
        let mut b = [0u8; 4];
        out.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"head");
        out.read_exact_at(&mut b, (64 << 20) - 4).unwrap();
        assert_eq!(&b, b"tail");
        use std::os::unix::fs::MetadataExt;
        assert!(out.metadata().unwrap().blocks() * 512 < 8 << 20, "holes were written");
        assert!(copy_sparse(&src, &dst).is_err(), "never overwrites");
    }

    /// An empty ext4 image of `bytes` at `<dir>/<name>`, made as the broker makes templates.
    pub(in crate::ns) fn template(dir: &Path, name: &str, bytes: u64) -> PathBuf {
        let t = dir.join(name);
        File::create(&t).unwrap().set_len(bytes).unwrap();
        let ok = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096", "-m", "0", "-O", "^has_journal"])
            .arg(&t)
            .status()
            .unwrap();
        assert!(ok.success());
        t
    }

    /// Needs root and loop devices, as every host of this project has.
    #[test]
    fn mounts_a_copy_of_the_template_in_a_namespace_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        let template = template(d.path(), "t.img", 32 << 20);
        let state = d.path().join("state");
        std::fs::create_dir(&state).unwrap();
        // A thread of its own: the mount namespace is the calling thread's.
        let s = state.clone();
        let total = std::thread::spawn(move || {
            let dir = mount_own(&s, &template).unwrap();
            let st = nix::sys::statvfs::statvfs(&dir).unwrap();
            st.blocks() as u64 * st.fragment_size() as u64
        })
        .join()
        .unwrap();
        assert!(total > 28 << 20 && total <= 32 << 20, "{total}");
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
        assert_eq!(dev(&state.join(MOUNT)), dev(&state), "the test's own namespace has no mount");
    }
}
