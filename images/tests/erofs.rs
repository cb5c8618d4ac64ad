//! The erofs view of an image against real readers: `fsck.erofs` (check and
//! extraction) and, as root, the kernel (loop device + `mount -t erofs`).
//!
//! Every image is written out by streaming `ErofsView::read_at`, then what
//! the tools see is compared with the image's index and content.

mod common;

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use pvisor_images::erofs::{format, ErofsView};
use pvisor_images::pool::index::{
    Data, Dirent, Index, Ino, Xattr, ROOT, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT,
};
use pvisor_images::{ImageView, Options, Pool};
use sha2::{Digest, Sha256};

const DEFAULT_IMAGES: &str = "/var/cache/pvisor/test-images";
const PIECE: usize = 1 << 20;

fn test_image(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("PVISOR_TEST_IMAGES").map_or_else(|| PathBuf::from(DEFAULT_IMAGES), PathBuf::from);
    let path = dir.join(name);
    let why = format!("test image {} is missing", path.display());
    pvisor_testkit::require(Some(path).filter(|p| p.exists()), why)
}

/// An imported image and its erofs view written out to a file.
struct Fixture {
    dir: tempfile::TempDir,
    image: Arc<ImageView>,
    fs: ErofsView,
    file: PathBuf,
}

impl Fixture {
    fn index(&self) -> &Index {
        self.image.index()
    }
}

fn import(archive: &Path) -> (tempfile::TempDir, Arc<ImageView>) {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::open_with(&dir.path().join("pool"), Options::default()).unwrap();
    let records = pool.import(archive).unwrap();
    let view = pool.view(&records[0]).unwrap();
    (dir, Arc::new(view))
}

fn fixture(name: &str, archive: &Path) -> Fixture {
    let start = Instant::now();
    let (dir, image) = import(archive);
    eprintln!("{name}: imported in {:.2} s", start.elapsed().as_secs_f64());
    let start = Instant::now();
    let fs = ErofsView::new(image.clone()).unwrap();
    let built = start.elapsed();
    let s = fs.stats();
    let with_xattrs = image.index().inodes.iter().filter(|i| !i.xattrs.is_empty()).count();
    eprintln!(
        "{name}: view built in {:.1} ms: {} inodes ({} extended, {} inline, {} with xattrs), \
         metadata {} bytes ({:.2} MiB), {} files mapped ({:.1} MiB), image {:.1} MiB",
        built.as_secs_f64() * 1e3,
        s.inodes,
        s.extended_inodes,
        s.inline_inodes,
        with_xattrs,
        s.meta_bytes,
        s.meta_bytes as f64 / 1048576.0,
        s.mapped_files,
        s.data_bytes as f64 / 1048576.0,
        fs.len() as f64 / 1048576.0,
    );
    assert_eq!(s.skipped_xattrs, 0);
    let file = dir.path().join("image.erofs");
    let start = Instant::now();
    write_out(&fs, &file);
    eprintln!("{name}: written out in {:.2} s", start.elapsed().as_secs_f64());
    Fixture { dir, image, fs, file }
}

/// Streams the whole view into `path` in 1 MiB pieces.
fn write_out(fs: &ErofsView, path: &Path) {
    let mut out = io::BufWriter::new(fs::File::create(path).unwrap());
    let mut buf = vec![0u8; PIECE];
    let mut offset = 0u64;
    loop {
        let n = fs.read_at(offset, &mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(n == PIECE || offset + n as u64 == fs.len(), "short read inside the image");
        out.write_all(&buf[..n]).unwrap();
        offset += n as u64;
    }
    out.flush().unwrap();
    assert_eq!(offset, fs.len());
    assert_eq!(fs.len() % ErofsView::BLOCK_SIZE, 0);
}

/// The whole content of file `ino`, through the image view.
fn content(image: &ImageView, ino: Ino) -> Vec<u8> {
    let size = image.index().inodes[ino as usize].size() as usize;
    let mut out = vec![0u8; size];
    let mut done = 0;
    while done < size {
        let n = image.read(ino, done as u64, &mut out[done..]).unwrap();
        assert!(n > 0, "inode {ino}: content ends early");
        done += n;
    }
    out
}

fn tool_present(tool: &str) -> bool {
    match Command::new(tool).arg("--help").output() {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => panic!("running {tool}: {e}"),
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{text}", out.status);
    text
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// What to compare between the index and a tree on disk.
#[derive(Clone, Copy)]
struct Compare {
    /// Owners (extraction as root, or a mount).
    owners: bool,
    /// Mount-only properties: mtime, nlink, hardlink identity, xattrs.
    mounted: bool,
    /// Device nodes (an extraction without privileges cannot create them).
    devices: bool,
}

/// Walks the index from the root and checks every entry of `root` against it.
fn compare_tree(image: &ImageView, root: &Path, how: Compare) -> usize {
    let index = image.index();
    let mut st_inos: HashMap<u64, Ino> = HashMap::new();
    let mut by_ino: HashMap<Ino, u64> = HashMap::new();
    let mut stack = vec![(ROOT, root.to_path_buf())];
    let mut checked = 0;
    while let Some((ino, path)) = stack.pop() {
        let inode = &index.inodes[ino as usize];
        let md = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let what = path.display().to_string();
        checked += 1;
        let kind = inode.mode & S_IFMT;
        assert_eq!(md.mode() & S_IFMT, kind, "{what}: type");
        if kind != S_IFLNK {
            // fsck.erofs 1.5 extracts with chmod before chown, which clears
            // setuid/setgid (an image from mkfs.erofs loses them the same way).
            let bits = if how.mounted { 0o7777 } else { 0o1777 };
            assert_eq!(md.mode() & bits, inode.mode & bits, "{what}: mode");
        }
        if how.owners {
            assert_eq!((md.uid(), md.gid()), (inode.uid, inode.gid), "{what}: owner");
        }
        if how.mounted {
            assert_eq!(md.mtime(), inode.mtime, "{what}: mtime");
            assert_eq!(md.nlink(), u64::from(inode.nlink), "{what}: nlink");
            // Hardlinks: one inode number per index inode, and vice versa.
            let seen = *st_inos.entry(md.ino()).or_insert(ino);
            assert_eq!(seen, ino, "{what}: st_ino {} shared with index inode {seen}", md.ino());
            let seen = *by_ino.entry(ino).or_insert(md.ino());
            assert_eq!(seen, md.ino(), "{what}: hardlinks of index inode {ino} differ in st_ino");
            let mut want: Vec<(Vec<u8>, Vec<u8>)> =
                inode.xattrs.iter().filter(|x| visible(x)).map(|x| (x.name.clone(), x.value.clone())).collect();
            want.sort();
            assert_eq!(xattrs(&path), want, "{what}: xattrs");
        }
        match &inode.data {
            Data::Dir { entries, .. } => {
                let mut names: Vec<Vec<u8>> =
                    fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name().as_bytes().to_vec()).collect();
                names.sort();
                let expected =
                    |e: &&Dirent| how.devices || !matches!(index.inodes[e.ino as usize].data, Data::Device { .. });
                let want: Vec<Vec<u8>> = entries.iter().filter(expected).map(|e| e.name.clone()).collect();
                if names != want {
                    let shown = |v: &[Vec<u8>], not_in: &[Vec<u8>]| -> Vec<String> {
                        v.iter()
                            .filter(|n| !not_in.contains(n))
                            .map(|n| String::from_utf8_lossy(n).into_owned())
                            .collect()
                    };
                    panic!("{what}: entries missing {:?}, unexpected {:?}", shown(&want, &names), shown(&names, &want));
                }
                for e in entries.iter().filter(expected) {
                    stack.push((e.ino, path.join(OsStr::from_bytes(&e.name))));
                }
            }
            Data::File { size, digest, .. } => {
                assert_eq!(md.len(), *size, "{what}: size");
                let on_disk = fs::read(&path).unwrap();
                let through_view = content(image, ino);
                assert!(on_disk == through_view, "{what}: content differs from the image view");
                assert_eq!(Sha256::digest(&on_disk).as_slice(), digest, "{what}: digest");
            }
            Data::Symlink { target } => {
                assert_eq!(fs::read_link(&path).unwrap().as_os_str().as_bytes(), &target[..], "{what}: target");
                assert_eq!(md.len(), target.len() as u64, "{what}: symlink size");
            }
            Data::Device { rdev } => {
                assert!(md.file_type().is_char_device() || md.file_type().is_block_device());
                assert_eq!(md.rdev(), *rdev, "{what}: device number");
            }
            Data::Fifo => assert!(md.file_type().is_fifo(), "{what}: fifo"),
        }
    }
    assert_eq!(checked, reachable(index, how.devices), "every index entry checked");
    checked
}

/// Names reachable from the root (a hardlinked file once per name).
fn reachable(index: &Index, devices: bool) -> usize {
    let counted = |e: &&Dirent| devices || !matches!(index.inodes[e.ino as usize].data, Data::Device { .. });
    1 + index.inodes.iter().map(|i| i.entries().iter().filter(counted).count()).sum::<usize>()
}

/// Xattrs the kernel shows: the standard name prefixes (others are stored
/// under name index 0, which Linux hides).
fn visible(x: &Xattr) -> bool {
    ["user.", "trusted.", "security."].iter().any(|p| x.name.starts_with(p.as_bytes()))
        || x.name == b"system.posix_acl_access"
        || x.name == b"system.posix_acl_default"
}

/// All xattrs of `path` (not following symlinks), sorted by name.
fn xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 64 << 10];
    // SAFETY: `c` is a NUL-terminated path and `names` a writable buffer of
    // the length passed; the kernel writes at most that many bytes.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "llistxattr {}: {}", path.display(), io::Error::last_os_error());
    let mut out = Vec::new();
    for name in names[..n as usize].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        let mut value = vec![0u8; 64 << 10];
        // SAFETY: as above; `cname` is NUL-terminated, `value` writable for
        // its whole length.
        let len = unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        assert!(len >= 0, "lgetxattr {} {:?}: {}", path.display(), cname, io::Error::last_os_error());
        value.truncate(len as usize);
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

/// `fsck.erofs` on the image, then its extraction compared with the index.
fn check_fsck(fx: &Fixture, name: &str) {
    if !tool_present("fsck.erofs") {
        pvisor_testkit::skip("fsck.erofs is not installed (apt-get install erofs-utils)");
        return;
    }
    let start = Instant::now();
    let out = run(Command::new("fsck.erofs").arg(&fx.file));
    eprintln!("{name}: fsck.erofs ok in {:.2} s: {}", start.elapsed().as_secs_f64(), out.trim().replace('\n', "; "));
    let target = fx.dir.path().join("extract");
    let start = Instant::now();
    // Permissions as in the image also without root (umask otherwise).
    let mut fsck = Command::new("fsck.erofs");
    fsck.arg(format!("--extract={}", target.display())).arg("--preserve-perms").arg(&fx.file);
    run(&mut fsck);
    let root = is_root();
    let n = compare_tree(&fx.image, &target, Compare { owners: root, mounted: false, devices: root });
    eprintln!("{name}: fsck.erofs --extract ok, {n} paths compared in {:.2} s", start.elapsed().as_secs_f64());
    fs::remove_dir_all(&target).ok();
}

/// A read-only loop device with the image mounted; both undone on drop.
struct Mounted {
    dir: tempfile::TempDir,
    loopdev: Option<String>,
    mounted: bool,
}

impl Mounted {
    fn new(file: &Path) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let mut m = Mounted { dir, loopdev: None, mounted: false };
        let dev = run(Command::new("losetup").args(["-r", "-f", "--show"]).arg(file)).trim().to_owned();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        m.loopdev = Some(dev.clone());
        run(Command::new("mount").args(["-t", "erofs", "-o", "ro"]).arg(&dev).arg(m.dir.path()));
        m.mounted = true;
        m
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let ok = Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
            if !ok {
                // Lazily, so the loop device can still go away.
                let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
            }
        }
        if let Some(dev) = &self.loopdev {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

fn can_mount() -> bool {
    if !pvisor_testkit::require_root("the erofs mount check") {
        return false;
    }
    let erofs =
        fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.lines().any(|l| l.trim_end().ends_with("erofs")));
    if !erofs || !Path::new("/dev/loop-control").exists() || !tool_present("losetup") {
        pvisor_testkit::skip("the mount check needs erofs in the kernel, /dev/loop-control and losetup");
        return false;
    }
    true
}

/// The image mounted by the kernel, compared with the index.
fn check_mount(fx: &Fixture, name: &str) {
    if !can_mount() {
        return;
    }
    let start = Instant::now();
    let m = Mounted::new(&fx.file);
    let n = compare_tree(&fx.image, m.dir.path(), Compare { owners: true, mounted: true, devices: true });
    let st = nix::sys::statfs::statfs(m.dir.path()).unwrap();
    assert_eq!(st.blocks() * st.block_size() as u64, fx.fs.len(), "statfs size");
    drop(m);
    eprintln!("{name}: mounted, {n} paths compared in {:.2} s", start.elapsed().as_secs_f64());
}

/// Superblock sanity of the written image.
fn check_superblock(fx: &Fixture) {
    let mut head = vec![0u8; 4096];
    fx.fs.read_at(0, &mut head).unwrap();
    let sb = format::SuperBlock::decode(&head[format::SUPER_OFFSET..]).expect("superblock");
    assert_eq!(u64::from(sb.blocks) * 4096, fx.fs.len());
    assert_eq!(sb.inos, fx.index().inodes.len() as u64);
    assert_eq!(sb.feature_incompat, 0);
    assert_eq!(sb.feature_compat & format::FEATURE_COMPAT_SB_CHKSUM, 0);
    assert!(head[..1024].iter().all(|&b| b == 0));
}

/// Random reads (odd offsets and lengths, across metadata, data and
/// padding) return the same bytes as the sequential stream.
fn check_random_reads(fx: &Fixture) {
    let whole = fs::read(&fx.file).unwrap();
    let len = fx.fs.len();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let offset = x % len;
        let n = ((x >> 40) % 300_000) as usize;
        let mut buf = vec![0xAAu8; n];
        let got = fx.fs.read_at(offset, &mut buf).unwrap();
        let end = (offset as usize + n).min(whole.len());
        assert_eq!(got, end - offset as usize);
        assert!(buf[..got] == whole[offset as usize..end], "read_at({offset}, {n})");
    }
    let mut buf = [0u8; 16];
    assert_eq!(fx.fs.read_at(len, &mut buf).unwrap(), 0);
    assert_eq!(fx.fs.read_at(len + 5, &mut buf).unwrap(), 0);
    assert_eq!(fx.fs.read_at(len - 4, &mut buf).unwrap(), 4);
}

fn check_image(name: &str, archive: &Path) {
    let fx = fixture(name, archive);
    check_superblock(&fx);
    check_fsck(&fx, name);
    check_mount(&fx, name);
}

fn real_image(file: &str) {
    let Some(archive) = test_image(file) else { return };
    check_image(file.trim_end_matches(".tar"), &archive);
}

#[test]
fn erofs_busybox() {
    real_image("busybox.tar");
}

#[test]
fn erofs_debian_bookworm_slim() {
    real_image("debian-bookworm-slim.tar");
}

#[test]
fn erofs_python_slim() {
    real_image("python-3.11-slim.tar");
}

#[test]
fn erofs_python_tools() {
    real_image("python-3.11-tools.tar");
}

// ---------------------------------------------------------------------------
// A hand-made image with the edge cases.

const MTIME: u64 = 1_600_000_000;

/// Deterministic bytes that do not compress or deduplicate.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A layer tar written with the `tar` crate (GNU headers, long names and
/// link targets as GNU extensions, xattrs as PAX records).
struct Layer {
    b: tar::Builder<Vec<u8>>,
}

impl Layer {
    fn new() -> Layer {
        Layer { b: tar::Builder::new(Vec::new()) }
    }

    fn header(kind: tar::EntryType, mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h.set_size(0);
        h
    }

    fn pax(&mut self, path: &str, xattrs: &[(&str, &[u8])]) {
        let mut body = Vec::new();
        for (name, value) in xattrs {
            let key = format!("SCHILY.xattr.{name}");
            // "<len> <key>=<value>\n", where len counts itself.
            let rest = key.len() + value.len() + 3;
            let mut len = rest + 1;
            while len.to_string().len() + rest != len {
                len = len.to_string().len() + rest;
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        let mut h = Layer::header(tar::EntryType::XHeader, 0o644);
        h.set_size(body.len() as u64);
        let short: String = path.chars().take(80).collect();
        self.b.append_data(&mut h, format!("PaxHeaders/{short}"), &body[..]).unwrap();
    }

    fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        let mut h = Layer::header(tar::EntryType::Directory, mode);
        self.b.append_data(&mut h, path, io::empty()).unwrap();
        self
    }

    fn file_with(&mut self, path: &str, data: &[u8], mode: u32, edit: impl FnOnce(&mut tar::Header)) -> &mut Self {
        let mut h = Layer::header(tar::EntryType::Regular, mode);
        h.set_size(data.len() as u64);
        edit(&mut h);
        self.b.append_data(&mut h, path, data).unwrap();
        self
    }

    fn file(&mut self, path: &str, data: &[u8]) -> &mut Self {
        self.file_with(path, data, 0o644, |_| {})
    }

    fn link(&mut self, kind: tar::EntryType, path: &str, target: &str) -> &mut Self {
        let mut h = Layer::header(kind, 0o777);
        self.b.append_link(&mut h, path, target).unwrap();
        self
    }

    fn special(&mut self, kind: tar::EntryType, path: &str, mode: u32, dev: (u32, u32)) -> &mut Self {
        let mut h = Layer::header(kind, mode);
        h.set_device_major(dev.0).unwrap();
        h.set_device_minor(dev.1).unwrap();
        self.b.append_data(&mut h, path, io::empty()).unwrap();
        self
    }

    fn finish(self) -> Vec<u8> {
        self.b.into_inner().unwrap()
    }
}

/// A docker-archive with one image made of `layer`.
fn docker_archive(layer: &[u8], tag: &str) -> Vec<u8> {
    use common::{docker_members, run_config, tar_members, Comp, DockerImage, Layer};
    let image = DockerImage {
        tags: vec![tag.to_owned()],
        config: run_config(&[], &["/bin/sh"], &[], "", ""),
        layers: vec![Layer::new(layer.to_vec(), Comp::Plain)],
    };
    tar_members(&docker_members(&[image], false))
}

/// A POSIX ACL xattr value (version 2; entries of tag, perm, id).
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn edge_layer() -> Vec<u8> {
    const UNDEFINED: u32 = u32::MAX;
    let access =
        acl(&[(0x01, 6, UNDEFINED), (0x02, 4, 1000), (0x04, 4, UNDEFINED), (0x10, 4, UNDEFINED), (0x20, 0, UNDEFINED)]);
    let default =
        acl(&[(0x01, 7, UNDEFINED), (0x04, 5, UNDEFINED), (0x08, 5, 2000), (0x10, 5, UNDEFINED), (0x20, 5, UNDEFINED)]);
    let long_name = "n".repeat(255);
    let long_dir = format!("{}/", "d".repeat(255));
    let target_1000: String = (0..250).map(|_| "abc/").collect();
    let target_4095: String = format!("{}x", "t/".repeat(2047));
    let big = noise(3 * (128 << 10) + 5000, 7);
    // No '\n' in values: the tar crate's PAX parser splits records on it.
    let huge_value: Vec<u8> = noise(3000, 9).into_iter().map(|b| if b == b'\n' { b'.' } else { b }).collect();

    let mut l = Layer::new();
    l.dir("./", 0o755)
        .file("empty", b"")
        .file("exact4096", &noise(4096, 1))
        .file("f4097", &noise(4097, 2))
        .file("big", &big)
        .file(&long_name, b"a file with a 255-byte name\n")
        .dir(&long_dir, 0o750)
        .file(&format!("{long_dir}{long_name}"), b"both long\n")
        .link(tar::EntryType::Symlink, "link1000", &target_1000)
        .link(tar::EntryType::Symlink, "link4095", &target_4095)
        .link(tar::EntryType::Symlink, "short", "exact4096")
        .special(tar::EntryType::Fifo, "fifo", 0o640, (0, 0))
        .special(tar::EntryType::Char, "null", 0o666, (1, 3))
        .special(tar::EntryType::Char, "bigminor", 0o600, (4, 300))
        .special(tar::EntryType::Block, "sda1", 0o660, (8, 1))
        .file("hl-a", b"linked\n")
        .link(tar::EntryType::Link, "hl-b", "hl-a")
        .file_with("owned", b"setuid, other owner\n", 0o4750, |h| {
            h.set_uid(1000);
            h.set_gid(2000);
        })
        .file_with("old", b"another mtime\n", 0o444, |h| h.set_mtime(12345))
        .dir("private/", 0o700)
        .file("private/secret", b"s\n");
    l.pax(
        "xattrs",
        &[
            ("user.comment", b"hello"),
            ("user.big", &huge_value),
            ("trusted.overlay.opaque", b"y"),
            ("security.capability", &[0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            ("system.posix_acl_access", &access),
            ("weird.namespace", b"hidden by the kernel"),
        ],
    );
    l.file("xattrs", b"has xattrs\n");
    // An xattr body larger than a block.
    let (v1, v2, v3) = (vec![b'1'; 3000], vec![b'2'; 3000], vec![b'3'; 2500]);
    l.pax("bigxattrs", &[("user.x1", &v1), ("user.x2", &v2), ("security.x3", &v3)]);
    l.file("bigxattrs", b"xattrs over 8 KiB\n");
    l.pax("acldir", &[("system.posix_acl_default", &default), ("user.dir", b"d")]);
    l.dir("acldir/", 0o775);
    l.pax("link-x", &[("trusted.sym", b"1")]);
    l.link(tar::EntryType::Symlink, "link-x", "short");
    l.dir("many/", 0o755);
    for i in 0..500 {
        let name = format!("many/entry-{i:03}-{}", "x".repeat(i % 40));
        if i % 10 == 0 {
            l.dir(&format!("{name}/"), 0o755);
        } else {
            l.file(&name, &noise(i, i as u64 + 100));
        }
    }
    l.link(tar::EntryType::Link, "many/hl-c", "hl-a");
    l.finish()
}

#[test]
fn erofs_edge_cases() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("edge.tar");
    fs::write(&archive, docker_archive(&edge_layer(), "edge:latest")).unwrap();
    let fx = fixture("edge", &archive);

    // The importer kept what the test is about.
    let index = fx.index();
    let get = |p: &str| &index.inodes[index.lookup_path(p).unwrap_or_else(|| panic!("{p} missing")) as usize];
    assert_eq!(get("hl-a").nlink, 3);
    assert_eq!(index.lookup_path("hl-b"), index.lookup_path("many/hl-c"));
    assert_eq!(get("many").entries().len(), 501);
    assert_eq!(get("big").size(), 3 * (128 << 10) + 5000);
    assert_eq!(get("link1000").size(), 1000);
    assert_eq!(get("link4095").size(), 4095);
    assert_eq!(get("xattrs").xattrs.len(), 6);
    assert_eq!(get("acldir").xattrs.len(), 2);
    assert_eq!(get("bigxattrs").xattrs.len(), 3);
    assert_eq!(get("null").kind(), S_IFCHR);
    assert_eq!(get("sda1").kind(), S_IFBLK);
    assert_eq!(get("fifo").kind(), S_IFIFO);
    assert_eq!(get("old").mtime, 12345);
    assert_eq!(get("owned").mode & 0o7777, 0o4750);
    assert!(get(&"d".repeat(255)).kind() == S_IFDIR);
    if let Data::File { extents, .. } = &get("big").data {
        let chunks: std::collections::HashSet<u32> = extents.iter().map(|x| x.chunk).collect();
        assert!(chunks.len() >= 3, "big spans several pool chunks: {extents:?}");
    }
    let s = fx.fs.stats();
    assert!(s.extended_inodes >= 1 && s.extended_inodes < s.inodes, "both inode forms: {s:?}");

    check_superblock(&fx);
    check_random_reads(&fx);
    check_fsck(&fx, "edge");
    check_mount(&fx, "edge");
}

fn small_archive(dir: &Path) -> PathBuf {
    let archive = dir.join("small.tar");
    let mut l = Layer::new();
    l.dir("./", 0o755).file("a", &noise(10_000, 3)).file("b", &noise(70_000, 4)).file("c", b"");
    fs::write(&archive, docker_archive(&l.finish(), "small:latest")).unwrap();
    archive
}

/// The data area maps file content: block reads return the files' bytes in
/// index order, each file zero-padded to a block.
#[test]
fn erofs_maps_file_data() {
    let dir = tempfile::tempdir().unwrap();
    let (_pool, image) = import(&small_archive(dir.path()));
    let fs = ErofsView::new(image.clone()).unwrap();
    let s = fs.stats();
    assert_eq!(s.mapped_files, 2);
    assert_eq!(s.data_bytes, (3 + 18) * 4096);
    assert_eq!(s.meta_bytes + s.data_bytes, fs.len());
    let meta = s.meta_bytes;
    // File data in index order: "a" then "b"; the tail of "a" pads with zeros.
    let a = content(&image, image.index().lookup_path("a").unwrap());
    let b = content(&image, image.index().lookup_path("b").unwrap());
    let mut buf = vec![0xFFu8; 3 * 4096 + 100];
    assert_eq!(fs.read_at(meta, &mut buf).unwrap(), buf.len());
    assert_eq!(&buf[..10_000], &a[..]);
    assert!(buf[10_000..3 * 4096].iter().all(|&x| x == 0));
    assert_eq!(&buf[3 * 4096..], &b[..100]);
    let mut tail = vec![0xFFu8; 8192];
    assert_eq!(fs.read_at(fs.len() - 8192, &mut tail).unwrap(), 8192);
    let b_end = 70_000 - 17 * 4096;
    assert_eq!(&tail[4096..4096 + b_end], &b[17 * 4096..]);
    assert!(tail[4096 + b_end..].iter().all(|&x| x == 0));
}

/// Building the view reads no file content: with the pool's packs emptied
/// under an open image, the view still builds and serves its metadata, and
/// only reads of file data fail.
#[test]
fn erofs_builds_without_reading_content() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, image) = import(&small_archive(dir.path()));
    for pack in fs::read_dir(pool.path().join("pool/packs")).unwrap() {
        let path = pack.unwrap().path();
        if path.extension() == Some(OsStr::new("pack")) {
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        }
    }
    let fs = ErofsView::new(image).unwrap();
    let meta = fs.stats().meta_bytes;
    let mut buf = vec![0u8; meta as usize];
    assert_eq!(fs.read_at(0, &mut buf).unwrap(), buf.len());
    assert!(format::SuperBlock::decode(&buf[format::SUPER_OFFSET..]).is_some());
    let mut block = [0u8; 4096];
    assert!(fs.read_at(meta, &mut block).is_err(), "file data comes from the (emptied) pool");
}
