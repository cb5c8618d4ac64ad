//! `pvisor-imaged` for real: images imported into a temporary pool, served by the real binary
//! on a real FUSE mount, and compared, inode by inode and byte by byte, with the image's index
//! and `ImageView::read`. Then the mount is used as the lower layer of an overlay and programs
//! of the image run from it (chroot), and the server's two ways out (lifeline EOF, unmount) are
//! exercised together with the broker-side `umount2(MNT_DETACH)`.
//!
//! Skipped (with a SKIP line on stderr; a failure under `PVISOR_TEST_STRICT=1`) when `/dev/fuse` is missing, when the test images are
//! missing, or when not running as root (mount(2) needs it; fusermount3 is not assumed).

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pvisor_images::fuse::IdMap;
use pvisor_images::pool::index::{Data, Ino, S_IFMT};
use pvisor_images::{ImageRecord, ImageView, Options, Pool};
use sha2::{Digest, Sha256};

const SERVER: &str = env!("CARGO_BIN_EXE_pvisor-imaged");
const TIMEOUT: Duration = Duration::from_secs(60);

// ---- Environment ---------------------------------------------------------------------------

fn images_dir() -> PathBuf {
    std::env::var_os("PVISOR_TEST_IMAGES").map_or_else(|| PathBuf::from("/var/cache/pvisor/test-images"), PathBuf::from)
}

/// The test image archives, or None (after printing why) if the test must be skipped.
fn prerequisites(test: &str, archives: &[&str]) -> Option<Vec<PathBuf>> {
    let skip = |why: String| {
        pvisor_testkit::skip(format!("{test}: {why}"));
        None
    };
    if !Path::new("/dev/fuse").exists() {
        return skip("/dev/fuse is missing".into());
    }
    if !nix::unistd::geteuid().is_root() {
        return skip("needs root to mount(2) a FUSE file system and an overlay".into());
    }
    let paths: Vec<PathBuf> = archives.iter().map(|a| images_dir().join(a)).collect();
    if let Some(missing) = paths.iter().find(|p| !p.exists()) {
        return skip(format!("test image {} is missing (set PVISOR_TEST_IMAGES)", missing.display()));
    }
    Some(paths)
}

/// A temporary pool with the given archives imported.
struct Fixture {
    tmp: tempfile::TempDir,
    pool: Pool,
}

impl Fixture {
    fn new(archives: &[PathBuf]) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let pool = Pool::open_with(&tmp.path().join("pool"), Options::default()).unwrap();
        for a in archives {
            pool.import(a).unwrap_or_else(|e| panic!("importing {}: {e}", a.display()));
        }
        Fixture { tmp, pool }
    }

    fn pool_dir(&self) -> PathBuf {
        self.tmp.path().join("pool")
    }

    fn view(&self, reference: &str) -> (ImageRecord, ImageView) {
        let record = self.pool.resolve(reference).unwrap();
        let view = self.pool.view(&record).unwrap();
        (record, view)
    }

    /// A fresh empty directory under the fixture.
    fn dir(&self, name: &str) -> PathBuf {
        let d = self.tmp.path().join(name);
        fs::create_dir_all(&d).unwrap();
        d
    }
}

// ---- The server ------------------------------------------------------------------------------

/// A running `pvisor-imaged`, with the broker's ends of its ready and lifeline pipes.
struct Server {
    child: Child,
    lifeline: Option<OwnedFd>,
    mountpoint: PathBuf,
    stderr: PathBuf,
}

/// Duplicates `fd` to a number ≥ 100, close-on-exec (clear of the 3 and 4 the child wants).
fn high_dup(fd: &OwnedFd) -> OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: F_DUPFD_CLOEXEC on an open fd returns a new fd that nothing else owns.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
    assert!(n >= 100, "F_DUPFD_CLOEXEC: {}", io::Error::last_os_error());
    // SAFETY: `n` was just returned by the kernel and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(n) }
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

impl Server {
    /// Starts the server with the ready pipe as fd 3 and the lifeline as fd 4, and waits for
    /// `ready`.
    fn start(pool: &Path, image: &str, mountpoint: &Path, ids: &[&str]) -> Server {
        let stderr = mountpoint.with_extension("stderr");
        let (ready_r, ready_w) = pipe();
        let (life_r, life_w) = pipe();
        let (ready_hi, life_hi) = (high_dup(&ready_w), high_dup(&life_r));
        let (rw, lr) = (ready_hi.as_raw_fd(), life_hi.as_raw_fd());
        let mut cmd = Command::new(SERVER);
        cmd.args(["--pool".as_ref(), pool.as_os_str()])
            .args(["--image", image])
            .args(["--mountpoint".as_ref(), mountpoint.as_os_str()])
            .args(ids)
            .args(["--ready-fd", "3", "--lifeline-fd", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap());
        // SAFETY: dup2 is async-signal-safe; both sources are ≥ 100, so neither is clobbered.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(rw, 3) < 0 || libc::dup2(lr, 4) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop((ready_w, life_r, ready_hi, life_hi));
        let mut server = Server { child, lifeline: Some(life_w), mountpoint: mountpoint.to_path_buf(), stderr };
        server.wait_ready(ready_r);
        server
    }

    fn wait_ready(&mut self, ready: OwnedFd) {
        let mut fds = [nix::poll::PollFd::new(ready.as_fd(), nix::poll::PollFlags::POLLIN)];
        let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::try_from(TIMEOUT).unwrap()).unwrap();
        assert_eq!(n, 1, "no ready within {TIMEOUT:?}; stderr: {}", self.stderr_text());
        let mut got = String::new();
        File::from(ready).read_to_string(&mut got).unwrap();
        if got != "ready\n" {
            let status = self.wait_exit();
            panic!("server said {got:?} and exited with {status}; stderr: {}", self.stderr_text());
        }
        assert!(is_mount_point(&self.mountpoint), "ready, but nothing is mounted");
    }

    fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit within {TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Closes the lifeline and expects a clean exit.
    fn close_lifeline(&mut self) {
        drop(self.lifeline.take());
        let status = self.wait_exit();
        assert!(
            status.success(),
            "exit after lifeline EOF: {status:?} (signal {:?}); stderr: {}",
            status.signal(),
            self.stderr_text()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = detach(&self.mountpoint);
    }
}

/// The broker's side of unmounting: `umount2(MNT_DETACH)`.
fn detach(path: &Path) -> nix::Result<()> {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH)
}

fn is_mount_point(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.as_os_str().as_bytes();
    info.lines().any(|l| l.split(' ').nth(4).map(str::as_bytes) == Some(want))
}

/// An overlay with `lower` as its only lower layer; unmounted on drop.
struct Overlay {
    merged: PathBuf,
}

impl Overlay {
    fn mount(lower: &Path, scratch: &Path) -> Overlay {
        let (upper, work, merged) = (scratch.join("upper"), scratch.join("work"), scratch.join("merged"));
        for d in [&upper, &work, &merged] {
            fs::create_dir_all(d).unwrap();
        }
        let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), work.display());
        nix::mount::mount(Some("overlay"), &merged, Some("overlay"), nix::mount::MsFlags::empty(), Some(opts.as_str()))
            .unwrap_or_else(|e| panic!("overlay over the FUSE mount: {e}"));
        Overlay { merged }
    }

    /// Runs `argv` chrooted into the overlay; returns stdout.
    fn run(&self, argv: &[&str]) -> String {
        let out = Command::new("chroot")
            .arg(&self.merged)
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .unwrap();
        assert!(out.status.success(), "{argv:?}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.merged, nix::mount::MntFlags::MNT_DETACH);
    }
}

// ---- Comparing a mount with the index -----------------------------------------------------------

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The attribute names of `path` (not following symlinks), by the size-probing protocol.
fn list_xattrs(path: &Path) -> Vec<Vec<u8>> {
    let c = cpath(path);
    // SAFETY: a NUL-terminated path and a null buffer of size 0 (asks for the size).
    let size = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if size < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
        // The server turns xattr support off for images without any xattr;
        // the caller compares with the index, which must then have none.
        return Vec::new();
    }
    assert!(size >= 0, "{}: llistxattr: {}", path.display(), io::Error::last_os_error());
    let mut buf = vec![0u8; size as usize];
    if size > 0 {
        // SAFETY: `buf` has `size` writable bytes.
        let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert_eq!(n, size, "{}", path.display());
    }
    buf.split(|b| *b == 0).filter(|n| !n.is_empty()).map(<[u8]>::to_vec).collect()
}

/// `lgetxattr` with a buffer of `size` bytes: the value (or, with size 0, the length as a
/// vector of that many zeros), or the errno.
fn get_xattr(path: &Path, name: &[u8], size: usize) -> Result<Vec<u8>, i32> {
    let (c, n) = (cpath(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; size];
    // SAFETY: NUL-terminated strings; `buf` has `size` writable bytes (null when 0).
    let got = unsafe {
        let ptr = if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
        libc::lgetxattr(c.as_ptr(), n.as_ptr(), ptr, size)
    };
    if got < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.resize(got as usize, 0);
    Ok(buf)
}

/// Visible (not overlay-reserved) attributes of an inode, as the server should show them.
fn visible_xattrs(view: &ImageView, ino: Ino) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let hidden = |n: &[u8]| n.starts_with(b"trusted.overlay.") || n.starts_with(b"user.overlay.");
    view.index().inodes[ino as usize]
        .xattrs
        .iter()
        .filter(|x| !hidden(&x.name))
        .map(|x| (x.name.clone(), x.value.clone()))
        .collect()
}

/// What a full comparison covered.
#[derive(Debug, Default)]
struct Counts {
    paths: usize,
    files: usize,
    bytes: u64,
    dirs: usize,
    symlinks: usize,
    xattrs: usize,
}

/// Compares everything under `mount` with the index and content of `view`.
fn check_tree(mount: &Path, view: &ImageView, ids: IdMap) -> Counts {
    let index = view.index();
    let mut counts = Counts::default();
    let mut stack: Vec<(PathBuf, Ino)> = vec![(mount.to_path_buf(), 0)];
    while let Some((path, ino)) = stack.pop() {
        let inode = &index.inodes[ino as usize];
        let md = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let at = path.display();
        counts.paths += 1;
        assert_eq!(md.mode() & S_IFMT, inode.mode & S_IFMT, "{at}: type");
        assert_eq!(md.mode() & 0o7777, inode.mode & 0o7777, "{at}: mode");
        assert_eq!(md.uid(), ids.uid(inode.uid), "{at}: uid");
        assert_eq!(md.gid(), ids.gid(inode.gid), "{at}: gid");
        assert_eq!((md.mtime(), md.mtime_nsec()), (inode.mtime, 0), "{at}: mtime");
        assert_eq!(md.nlink(), u64::from(inode.nlink), "{at}: nlink");
        // One inode number per index inode: hardlinked names share it.
        assert_eq!(md.ino(), u64::from(ino) + 1, "{at}: st_ino");
        let xattrs = visible_xattrs(view, ino);
        let listed: Vec<Vec<u8>> = list_xattrs(&path);
        assert_eq!(listed, xattrs.keys().cloned().collect::<Vec<_>>(), "{at}: xattr names");
        for (name, value) in &xattrs {
            assert_eq!(get_xattr(&path, name, value.len()).as_ref(), Ok(value), "{at}: xattr {name:?}");
            counts.xattrs += 1;
        }
        match &inode.data {
            Data::Dir { entries, .. } => {
                counts.dirs += 1;
                let mut dir =
                    nix::dir::Dir::open(&path, nix::fcntl::OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
                let mut seen: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
                for e in dir.iter() {
                    let e = e.unwrap();
                    assert!(seen.insert(e.file_name().to_bytes().to_vec(), e.ino()).is_none(), "{at}: duplicate entry");
                }
                assert!(
                    seen.remove(b".".as_slice()).is_some() && seen.remove(b"..".as_slice()).is_some(),
                    "{at}: . and .."
                );
                let want: BTreeMap<Vec<u8>, u64> =
                    entries.iter().map(|e| (e.name.clone(), u64::from(e.ino) + 1)).collect();
                assert_eq!(seen, want, "{at}: readdir");
                for e in entries {
                    stack.push((path.join(OsStr::from_bytes(&e.name)), e.ino));
                }
            }
            Data::File { size, .. } => {
                counts.files += 1;
                assert_eq!(md.len(), *size, "{at}: size");
                let got = fs::read(&path).unwrap_or_else(|e| panic!("{at}: {e}"));
                let mut want = vec![0u8; *size as usize];
                assert_eq!(view.read(ino, 0, &mut want).unwrap(), want.len(), "{at}");
                assert!(got == want, "{at}: content differs ({} vs {} bytes)", got.len(), want.len());
                counts.bytes += size;
            }
            Data::Symlink { target } => {
                counts.symlinks += 1;
                assert_eq!(fs::read_link(&path).unwrap().as_os_str().as_bytes(), target.as_slice(), "{at}: target");
                assert_eq!(md.len(), target.len() as u64, "{at}: symlink size");
            }
            Data::Device { rdev } => {
                assert!(md.file_type().is_char_device() || md.file_type().is_block_device(), "{at}");
                assert_eq!(md.rdev(), *rdev, "{at}: rdev");
            }
            Data::Fifo => assert!(md.file_type().is_fifo(), "{at}"),
        }
    }
    // Every name was visited: the root plus every directory entry (hardlinks by each name).
    assert_eq!(counts.paths, index.inodes.iter().map(|i| i.entries().len()).sum::<usize>() + 1);
    counts
}

/// Every write path fails with EROFS.
fn check_read_only(mount: &Path, file: &Path, dir: &Path) {
    let erofs = |what: &str, r: io::Result<()>| {
        let e = r.err().unwrap_or_else(|| panic!("{what} succeeded on the read-only mount"));
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs("create", File::create(mount.join("new-file")).map(drop));
    erofs("mkdir", fs::create_dir(mount.join("new-dir")));
    erofs("open for writing", fs::OpenOptions::new().write(true).open(file).map(drop));
    erofs("open O_TRUNC", fs::OpenOptions::new().write(true).truncate(true).open(file).map(drop));
    erofs("append", fs::OpenOptions::new().append(true).open(file).map(drop));
    erofs("unlink", fs::remove_file(file));
    erofs("rmdir", fs::remove_dir(dir));
    erofs("rename", fs::rename(file, mount.join("renamed")));
    erofs("chmod", fs::set_permissions(file, fs::Permissions::from_mode(0o777)));
    erofs("symlink", std::os::unix::fs::symlink("x", mount.join("new-link")));
    erofs("link", fs::hard_link(file, mount.join("new-hardlink")));
    erofs("chown", std::os::unix::fs::lchown(file, Some(1), Some(1)));
    let c = cpath(file);
    // SAFETY: NUL-terminated strings and a 1-byte value that outlive the call.
    let rc = unsafe { libc::lsetxattr(c.as_ptr(), c"user.x".as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    erofs("setxattr", if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) });
}

// ---- A synthetic image: xattrs, devices, fifos, hardlinks, multi-chunk files -------------------

/// A tar entry with optional PAX records before it.
fn append(
    b: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &[u8],
    pax: &[(&str, &[u8])],
) {
    append_with(b, path, kind, mode, data, pax, |_| {});
}

fn append_with(
    b: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &[u8],
    pax: &[(&str, &[u8])],
    edit: impl FnOnce(&mut tar::Header),
) {
    if !pax.is_empty() {
        let mut records = Vec::new();
        for (key, value) in pax {
            let base = key.len() + value.len() + 3;
            let mut len = base + base.to_string().len();
            if len.to_string().len() != base.to_string().len() {
                len += 1;
            }
            records.extend_from_slice(format!("{len} {key}=").as_bytes());
            records.extend_from_slice(value);
            records.push(b'\n');
        }
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_path("PaxHeaders/entry").unwrap();
        h.set_size(records.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, records.as_slice()).unwrap();
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_path(path).unwrap();
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(2000);
    h.set_mtime(1_600_000_000);
    h.set_size(data.len() as u64);
    edit(&mut h);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// Deterministic, poorly compressible bytes.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes a docker-archive with one layer of everything the index can hold, tagged
/// `synthetic:latest`.
fn synthetic_archive(dir: &Path) -> PathBuf {
    use tar::EntryType as T;
    let mut l = tar::Builder::new(Vec::new());
    append(&mut l, "data/", T::Directory, 0o755, b"", &[]);
    let xattrs: &[(&str, &[u8])] = &[
        ("SCHILY.xattr.user.comment", b"hello xattr"),
        ("SCHILY.xattr.user.empty", b""),
        ("SCHILY.xattr.user.big", &[b'v'; 300]),
        ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
        ("SCHILY.xattr.user.overlay.redirect", b"/elsewhere"),
    ];
    append(&mut l, "data/plain", T::Regular, 0o644, b"hello\n", xattrs);
    append(&mut l, "data/big", T::Regular, 0o755, &noise(300 * 1024 + 17), &[]);
    append_with(&mut l, "data/big-link", T::Link, 0o755, b"", &[], |h| h.set_link_name("data/big").unwrap());
    append_with(&mut l, "data/link", T::Symlink, 0o777, b"", &[], |h| h.set_link_name("plain").unwrap());
    append_with(&mut l, "data/dangling", T::Symlink, 0o777, b"", &[], |h| h.set_link_name("/no/such/target").unwrap());
    append(&mut l, "data/setuid", T::Regular, 0o4755, b"#!/bin/sh\n", &[]);
    append(&mut l, "data/unreadable", T::Regular, 0o000, b"secret", &[]);
    append(&mut l, "data/empty", T::Regular, 0o644, b"", &[]);
    append(&mut l, "data/fifo", T::Fifo, 0o600, b"", &[]);
    append(&mut l, "dev/", T::Directory, 0o755, b"", &[]);
    append_with(&mut l, "dev/null2", T::Char, 0o666, b"", &[], |h| {
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
    });
    append_with(&mut l, "dev/blk", T::Block, 0o660, b"", &[], |h| {
        h.set_device_major(8).unwrap();
        h.set_device_minor(0x1234).unwrap();
    });
    append(&mut l, "many/", T::Directory, 0o700, b"", &[]);
    for i in 0..300 {
        append(
            &mut l,
            &format!("many/entry-with-a-longish-name-{i:03}"),
            T::Regular,
            0o644,
            format!("{i}").as_bytes(),
            &[],
        );
    }
    let layer = l.into_inner().unwrap();
    let diff_id = hex::encode(Sha256::digest(&layer));
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/bin/sh"]}},"rootfs":{{"type":"layers","diff_ids":["sha256:{diff_id}"]}}}}"#
    );
    let config_name = format!("{}.json", hex::encode(Sha256::digest(config.as_bytes())));
    let manifest = format!(r#"[{{"Config":"{config_name}","RepoTags":["synthetic:latest"],"Layers":["layer.tar"]}}]"#);
    let mut ar = tar::Builder::new(Vec::new());
    for (name, data) in
        [("manifest.json", manifest.as_bytes()), (config_name.as_str(), config.as_bytes()), ("layer.tar", &layer)]
    {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        ar.append(&h, data).unwrap();
    }
    let path = dir.join("synthetic.tar");
    File::create(&path).unwrap().write_all(&ar.into_inner().unwrap()).unwrap();
    path
}

// ---- Tests ---------------------------------------------------------------------------------------------

#[test]
fn busybox_matches_its_index_runs_from_an_overlay_and_exits_on_lifeline_eof() {
    let Some(archives) = prerequisites("busybox", &["busybox.tar"]) else { return };
    let fx = Fixture::new(&archives);
    let (_, view) = fx.view("busybox:latest");
    let mnt = fx.dir("mnt");
    let ids = IdMap::Shift(100_000);
    let mut server = Server::start(&fx.pool_dir(), "busybox:latest", &mnt, &["--id-shift", "100000"]);

    let counts = check_tree(&mnt, &view, ids);
    assert!(counts.files > 0 && counts.dirs > 1, "{counts:?}");
    let line = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let ours = line.lines().find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap())).unwrap();
    assert!(ours.contains(" ro,") && ours.contains("nosuid") && ours.contains("nodev"), "{ours}");
    assert!(
        ours.contains(" - fuse.pvisor pvisor:") && ours.contains("default_permissions") && ours.contains("allow_other"),
        "{ours}"
    );
    check_read_only(&mnt, &mnt.join("bin/busybox"), &mnt.join("bin"));
    assert_eq!(fs::symlink_metadata(mnt.join("no/such")).unwrap_err().kind(), io::ErrorKind::NotFound);
    assert_eq!(fs::symlink_metadata(mnt.join("nonexistent")).unwrap_err().kind(), io::ErrorKind::NotFound);

    {
        let overlay = Overlay::mount(&mnt, &fx.dir("overlay"));
        assert_eq!(overlay.run(&["/bin/busybox", "echo", "hi"]), "hi\n");
        // Writes go to the upper layer; the image does not change.
        overlay.run(&["/bin/busybox", "sh", "-c", "echo changed > /etc/motd-test"]);
        assert!(!mnt.join("etc/motd-test").exists());
    }

    server.close_lifeline();
    // The server is gone, the mount is left disconnected until the broker detaches it (what
    // the kernel has cached, e.g. attributes, stays readable; statfs always asks the server).
    assert!(is_mount_point(&mnt));
    assert_eq!(nix::sys::statvfs::statvfs(&mnt).unwrap_err(), nix::errno::Errno::ENOTCONN);
    detach(&mnt).unwrap();
    assert!(!is_mount_point(&mnt));
    eprintln!("busybox: {counts:?}");
}

#[test]
fn python_matches_its_index_imports_from_an_overlay_and_exits_when_unmounted() {
    let Some(archives) = prerequisites("python", &["python-3.11-slim.tar"]) else { return };
    let fx = Fixture::new(&archives);
    let (_, view) = fx.view("python:3.11-slim");
    let mnt = fx.dir("mnt");
    let mut server = Server::start(&fx.pool_dir(), "python:3.11-slim", &mnt, &["--id-shift", "200000"]);

    let counts = check_tree(&mnt, &view, IdMap::Shift(200_000));
    assert!(counts.files > 1000 && counts.bytes > 50 << 20, "{counts:?}");
    check_read_only(&mnt, &mnt.join("etc/passwd"), &mnt.join("etc"));

    let python = ["usr/local/bin/python3", "usr/bin/python3"]
        .into_iter()
        .find(|p| view.index().lookup_path(p).is_some())
        .expect("python3 in the image");
    {
        let overlay = Overlay::mount(&mnt, &fx.dir("overlay"));
        let out =
            overlay.run(&[&format!("/{python}"), "-c", "import json, email, http.client; print(json.dumps([1]))"]);
        assert_eq!(out, "[1]\n");
    }

    // The broker unmounts first: the server sees the file system go and exits 0.
    detach(&mnt).unwrap();
    let status = server.wait_exit();
    assert!(status.success(), "exit after unmount: {status:?}; stderr: {}", server.stderr_text());
    assert!(!is_mount_point(&mnt));
    eprintln!("python: {counts:?}");
}

#[test]
fn synthetic_image_xattrs_devices_hardlinks_and_id_mappings() {
    let Some(_) = prerequisites("synthetic", &[]) else { return };
    let scratch = tempfile::tempdir().unwrap();
    let archive = synthetic_archive(scratch.path());
    let fx = Fixture::new(&[archive]);
    let (_, view) = fx.view("synthetic:latest");

    for (ids, args) in [
        (IdMap::Shift(100_000), vec!["--id-shift", "100000"]),
        (IdMap::Owner(1234, 5678), vec!["--owner", "1234:5678"]),
    ] {
        let mnt = fx.dir(&format!("mnt-{}", args[0].trim_start_matches('-')));
        let mut server = Server::start(&fx.pool_dir(), "synthetic:latest", &mnt, &args);
        let counts = check_tree(&mnt, &view, ids);
        assert_eq!((counts.dirs, counts.symlinks), (4, 2), "{counts:?}");
        assert_eq!(counts.xattrs, 3, "{counts:?}");

        let plain = mnt.join("data/plain");
        let md = fs::metadata(&plain).unwrap();
        match ids {
            IdMap::Shift(_) => assert_eq!((md.uid(), md.gid()), (101_000, 102_000)),
            IdMap::Owner(..) => assert_eq!((md.uid(), md.gid()), (1234, 5678)),
        }
        // Hardlinks: one inode, two names.
        let (big, link) =
            (fs::metadata(mnt.join("data/big")).unwrap(), fs::metadata(mnt.join("data/big-link")).unwrap());
        assert_eq!((big.ino(), big.nlink()), (link.ino(), 2));
        // xattr size probing: size 0 gives the length, a short buffer ERANGE, absent ENODATA,
        // overlay's own names never show.
        assert_eq!(get_xattr(&plain, b"user.comment", 0).map(|v| v.len()), Ok(11));
        assert_eq!(get_xattr(&plain, b"user.comment", 3), Err(libc::ERANGE));
        assert_eq!(get_xattr(&plain, b"user.empty", 0), Ok(Vec::new()));
        assert_eq!(get_xattr(&plain, b"user.nope", 64), Err(libc::ENODATA));
        assert_eq!(get_xattr(&plain, b"trusted.overlay.opaque", 64), Err(libc::ENODATA));
        assert_eq!(get_xattr(&plain, b"user.overlay.redirect", 64), Err(libc::ENODATA));
        assert_eq!(list_xattrs(&plain), [b"user.big".to_vec(), b"user.comment".to_vec(), b"user.empty".to_vec()]);
        // Reads at every alignment across chunk boundaries.
        let want = view.read_path("data/big").unwrap();
        let mut f = File::open(mnt.join("data/big")).unwrap();
        for (offset, len) in [(0usize, 1usize), (131_071, 2), (131_072, 4096), (262_000, 50_000), (want.len() - 5, 100)]
        {
            let mut buf = vec![0u8; len];
            let n = std::os::unix::fs::FileExt::read_at(&f, &mut buf, offset as u64).unwrap();
            assert_eq!(&buf[..n], &want[offset..(offset + len).min(want.len())], "read at {offset}");
        }
        let mut all = Vec::new();
        f.read_to_end(&mut all).unwrap();
        assert!(all == want);
        check_read_only(&mnt, &plain, &mnt.join("many"));
        let st = nix::sys::statvfs::statvfs(&mnt).unwrap();
        assert_eq!(st.files(), view.index().inodes.len() as u64);
        assert!(st.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));

        server.close_lifeline();
        detach(&mnt).unwrap();
    }
}

#[test]
fn bad_invocations_exit_2_with_a_message() {
    let Some(_) = prerequisites("bad invocations", &[]) else { return };
    let run = |args: &[&str]| {
        let out = Command::new(SERVER).args(args).stdin(Stdio::null()).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--pool", "/nonexistent"]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("pvisor-imaged: ") && err.contains("--image is required") && err.contains("usage:"),
        "{err}"
    );
    let (code, err) = run(&["--pool", "/nonexistent/pool", "--image", "x", "--mountpoint", "/tmp"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no image pool at /nonexistent/pool"), "{err}");
    assert!(!Path::new("/nonexistent").exists(), "a pool was created");

    let fx = Fixture::new(&[]);
    let mnt = fx.dir("mnt");
    let pool = fx.pool_dir();
    let (code, err) =
        run(&["--pool", pool.to_str().unwrap(), "--image", "nothing:here", "--mountpoint", mnt.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("image not found") && err.contains("nothing:here"), "{err}");
    let (code, err) = run(&["--pool", "/p", "--image", "x", "--mountpoint", "/m", "--lifeline-fd", "77"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--lifeline-fd 77"), "{err}");
    assert!(!is_mount_point(&mnt));
}
