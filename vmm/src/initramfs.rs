//! The guest's initramfs: a small newc ("070701") cpio writer and the standard
//! archive that carries the static agent as `/init`.
//!
//! The kernel unpacks the initramfs into its rootfs before it runs `/init`,
//! and opens `/dev/console` from it to give `/init` its stdin/stdout/stderr,
//! so the archive must hold that device node; it is built here rather than
//! with `cpio(1)` because creating device nodes on the host needs root, and
//! because the archive is a few entries written in memory at create time.
//!
//! Format (as the kernel's `init/initramfs.c` reads it): each entry is a
//! 110-byte ASCII header (the magic `070701` and 13 fields of 8 hex digits),
//! the NUL-terminated name, NUL padding to a multiple of 4 bytes, the data
//! (file content or symlink target), NUL padding to a multiple of 4 bytes.
//! The archive ends with an entry named `TRAILER!!!`. Names are relative
//! (`dev/console`), as `find . | cpio -o -H newc` writes them; every entry is
//! owned by root, has mtime 0 (archives are reproducible) and its own inode
//! number (no hard links).

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Errors of building or writing an initramfs.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    /// A path that is empty, has an empty, `.` or `..` component, or a NUL byte.
    #[error("invalid initramfs path {0:?}")]
    InvalidPath(String),
    /// A permission mode with bits outside `0o7777`.
    #[error("invalid mode {mode:#o} for {path} (only permission bits, at most 0o7777)")]
    InvalidMode { path: String, mode: u32 },
    /// An entry whose parent directory was not added before it.
    #[error("{path}: parent directory {parent} is not in the archive (add it first with dir())")]
    MissingParent { path: String, parent: String },
    /// Two entries with the same path.
    #[error("{0} is already in the archive")]
    Duplicate(String),
    /// A file or symlink target too large for a newc header (4 GiB - 1).
    #[error("{path} is {len} bytes, more than a newc entry can hold")]
    TooLarge { path: String, len: usize },
    /// More entries than newc inode numbers (32 bits) can tell apart.
    #[error("too many entries for one newc archive ({0})")]
    TooManyEntries(usize),
    /// Reading a file that goes into the archive.
    #[error("reading {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    /// Writing the archive out.
    #[error("writing the initramfs: {0}")]
    Write(#[from] io::Error),
}

/// File type bits of `st_mode`.
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// The magic of the newc format (no checksum).
const MAGIC: &[u8; 6] = b"070701";
/// The header: magic plus 13 fields of 8 hex digits.
const HEADER_LEN: usize = 6 + 13 * 8;
/// The name of the entry that ends an archive.
const TRAILER: &str = "TRAILER!!!";

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    CharDev { major: u32, minor: u32 },
}

#[derive(Debug, Clone)]
struct Entry {
    path: String,
    perm: u32,
    kind: Kind,
}

impl Entry {
    fn mode(&self) -> u32 {
        let ty = match self.kind {
            Kind::Dir => S_IFDIR,
            Kind::File(_) => S_IFREG,
            Kind::Symlink(_) => S_IFLNK,
            Kind::CharDev { .. } => S_IFCHR,
        };
        ty | self.perm
    }

    fn data(&self) -> &[u8] {
        match &self.kind {
            Kind::File(bytes) => bytes,
            Kind::Symlink(target) => target.as_bytes(),
            Kind::Dir | Kind::CharDev { .. } => &[],
        }
    }

    fn rdev(&self) -> (u32, u32) {
        match self.kind {
            Kind::CharDev { major, minor } => (major, minor),
            _ => (0, 0),
        }
    }
}

/// An initramfs being assembled in memory, written out in the order entries
/// were added (so a directory always precedes what it holds).
#[derive(Debug, Default, Clone)]
pub struct Initramfs {
    entries: Vec<Entry>,
    paths: HashSet<String>,
    dirs: HashSet<String>,
}

impl Initramfs {
    /// An empty archive (its root, `.`, is the kernel's rootfs and needs no entry).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a directory with permission bits `mode` (e.g. `0o755`).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, InitramfsError> {
        let path = self.push(path, mode, Kind::Dir)?;
        self.dirs.insert(path);
        Ok(self)
    }

    /// Adds a regular file holding `bytes`.
    pub fn file(&mut self, path: &str, mode: u32, bytes: impl Into<Vec<u8>>) -> Result<&mut Self, InitramfsError> {
        self.push(path, mode, Kind::File(bytes.into()))?;
        Ok(self)
    }

    /// Adds a regular file with the content of `source` on the host.
    pub fn file_from(&mut self, path: &str, mode: u32, source: &Path) -> Result<&mut Self, InitramfsError> {
        let bytes = std::fs::read(source).map_err(|e| InitramfsError::Read { path: source.to_owned(), source: e })?;
        self.file(path, mode, bytes)
    }

    /// Adds a symbolic link at `path` pointing to `target` (stored as given).
    pub fn symlink(&mut self, path: &str, target: &str) -> Result<&mut Self, InitramfsError> {
        if target.is_empty() || target.contains('\0') {
            return Err(InitramfsError::InvalidPath(target.to_owned()));
        }
        self.push(path, 0o777, Kind::Symlink(target.to_owned()))?;
        Ok(self)
    }

    /// Adds a character device node, e.g. `/dev/console` (5, 1) or `/dev/null` (1, 3).
    pub fn char_dev(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> Result<&mut Self, InitramfsError> {
        self.push(path, mode, Kind::CharDev { major, minor })?;
        Ok(self)
    }

    /// Writes the archive, trailer included.
    pub fn write_to<W: Write>(&self, mut out: W) -> Result<(), InitramfsError> {
        for (i, entry) in self.entries.iter().enumerate() {
            let nlink = if matches!(entry.kind, Kind::Dir) { 2 } else { 1 };
            // Inode numbers only need to be distinct; 0 is left to the trailer.
            let ino = u32::try_from(i + 1).map_err(|_| InitramfsError::TooManyEntries(self.entries.len()))?;
            write_entry(&mut out, ino, entry.mode(), nlink, entry.rdev(), &entry.path, entry.data())?;
        }
        write_entry(&mut out, 0, 0, 1, (0, 0), TRAILER, &[])?;
        out.flush()?;
        Ok(())
    }

    /// The archive as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, InitramfsError> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }

    fn push(&mut self, path: &str, perm: u32, kind: Kind) -> Result<String, InitramfsError> {
        let path = normalize(path)?;
        if perm & !0o7777 != 0 {
            return Err(InitramfsError::InvalidMode { path, mode: perm });
        }
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !self.dirs.contains(parent) {
                return Err(InitramfsError::MissingParent { parent: parent.to_owned(), path });
            }
        }
        if self.paths.contains(&path) {
            return Err(InitramfsError::Duplicate(path));
        }
        let entry = Entry { path: path.clone(), perm, kind };
        if u32::try_from(entry.data().len()).is_err() {
            return Err(InitramfsError::TooLarge { path, len: entry.data().len() });
        }
        self.paths.insert(path.clone());
        self.entries.push(entry);
        Ok(path)
    }
}

/// `/a/b`, `a/b` and `a/b/` all name the archive entry `a/b`.
fn normalize(path: &str) -> Result<String, InitramfsError> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    let valid = !trimmed.is_empty()
        && !trimmed.contains('\0')
        && trimmed.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if valid {
        Ok(trimmed.to_owned())
    } else {
        Err(InitramfsError::InvalidPath(path.to_owned()))
    }
}

/// Number of NUL bytes that bring `len` to a multiple of 4.
fn pad4(len: usize) -> usize {
    (4 - len % 4) % 4
}

fn write_entry<W: Write>(
    out: &mut W,
    ino: u32,
    mode: u32,
    nlink: u32,
    (rdev_major, rdev_minor): (u32, u32),
    name: &str,
    data: &[u8],
) -> io::Result<()> {
    let name_size = name.len() + 1;
    let fields: [usize; 13] = [
        ino as usize,
        mode as usize,
        0, // uid
        0, // gid
        nlink as usize,
        0, // mtime
        data.len(),
        0, // devmajor (of the filesystem the entry came from)
        0, // devminor
        rdev_major as usize,
        rdev_minor as usize,
        name_size,
        0, // check (only used by the "070702" crc format)
    ];
    let mut header = Vec::with_capacity(HEADER_LEN + name_size + 3);
    header.extend_from_slice(MAGIC);
    for field in fields {
        // Sizes were checked to fit 32 bits when the entry was added.
        write!(header, "{field:08x}")?;
    }
    header.extend_from_slice(name.as_bytes());
    header.push(0);
    header.resize(header.len() + pad4(HEADER_LEN + name_size), 0);
    out.write_all(&header)?;
    out.write_all(data)?;
    out.write_all(&[0u8; 3][..pad4(data.len())])
}

/// Directories the guest agent mounts on before it pivots into the sandbox
/// root: the pseudo filesystems, the image's erofs view (`/mnt/lower`), the
/// scratch disk that holds the overlay's upper and work dirs (`/mnt/scratch`),
/// and the overlay itself (`/newroot`).
pub const AGENT_DIRS: &[&str] = &["dev", "proc", "sys", "tmp", "mnt", "mnt/lower", "mnt/scratch", "newroot"];

/// The standard initramfs of a vm sandbox: the static agent at `agent` as
/// `/init` (0755), `/dev/console` and `/dev/null`, and [`AGENT_DIRS`].
pub fn agent_initramfs(agent: &Path) -> Result<Vec<u8>, InitramfsError> {
    let mut archive = Initramfs::new();
    for dir in AGENT_DIRS {
        archive.dir(dir, 0o755)?;
    }
    archive.char_dev("dev/console", 0o600, 5, 1)?.char_dev("dev/null", 0o666, 1, 3)?.file_from("init", 0o755, agent)?;
    archive.to_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::process::{Command, Stdio};

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// Unpacks `archive` with GNU cpio (`cpio -idmv`) into a fresh directory.
    fn unpack(archive: &[u8]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new("cpio")
            .args(["-idmv", "--no-absolute-filenames"])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cpio(1) is needed for this test (apt-get install cpio; scripts/common.sh installs it)");
        child.stdin.take().expect("stdin").write_all(archive).expect("feeding cpio");
        let out = child.wait_with_output().expect("cpio");
        assert!(out.status.success(), "cpio -idmv failed: {}", String::from_utf8_lossy(&out.stderr));
        dir
    }

    /// `cpio -itv` listing of `archive`.
    fn list(archive: &[u8]) -> String {
        let mut child = Command::new("cpio")
            .args(["-itv"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("cpio(1) is needed for this test (apt-get install cpio; scripts/common.sh installs it)");
        child.stdin.take().expect("stdin").write_all(archive).expect("feeding cpio");
        let out = child.wait_with_output().expect("cpio");
        assert!(out.status.success(), "cpio -itv failed");
        String::from_utf8(out.stdout).expect("utf-8 listing")
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn header_layout_is_byte_exact() {
        let mut archive = Initramfs::new();
        archive.file("/init", 0o755, b"hi".to_vec()).expect("add");
        let bytes = archive.to_bytes().expect("write");

        let mut want = Vec::new();
        want.extend_from_slice(b"070701");
        // ino, mode (S_IFREG|0755), uid, gid, nlink, mtime, filesize,
        // devmajor, devminor, rdevmajor, rdevminor, namesize ("init\0"), check
        for field in ["00000001", "000081ed", "00000000", "00000000", "00000001", "00000000", "00000002"] {
            want.extend_from_slice(field.as_bytes());
        }
        for field in ["00000000", "00000000", "00000000", "00000000", "00000005", "00000000"] {
            want.extend_from_slice(field.as_bytes());
        }
        want.extend_from_slice(b"init\0"); // 110 + 5 = 115 bytes ...
        want.push(0); // ... padded to 116
        want.extend_from_slice(b"hi\0\0"); // data padded to 4
        assert_eq!(want.len(), 120);
        assert_eq!(&bytes[..120], &want[..], "first entry:\n{:?}", String::from_utf8_lossy(&bytes[..120]));

        let trailer = &bytes[120..];
        let mut want = Vec::new();
        want.extend_from_slice(b"070701");
        want.extend_from_slice(b"00000000000000000000000000000000");
        want.extend_from_slice(b"00000001"); // nlink
        want.extend_from_slice("00000000".repeat(6).as_bytes()); // mtime, filesize, dev, rdev
        want.extend_from_slice(b"0000000b00000000"); // namesize 11, check
        want.extend_from_slice(b"TRAILER!!!\0");
        want.push(0); // 110 + 11 = 121, padded to 124
        want.push(0);
        want.push(0);
        assert_eq!(trailer, &want[..]);
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn name_and_data_padding_for_every_remainder() {
        // Names of 1..=4 bytes and data of 0..=4 bytes cover every padding case.
        let mut archive = Initramfs::new();
        for (i, name) in ["a", "bb", "ccc", "dddd"].iter().enumerate() {
            archive.file(name, 0o644, vec![b'x'; i]).expect("add");
        }
        archive.file("eeeee", 0o644, vec![b'y'; 4]).expect("add");
        let bytes = archive.to_bytes().expect("write");
        // Walk the archive as the kernel does: every header starts 4-aligned.
        let mut off = 0;
        let mut names = Vec::new();
        loop {
            assert_eq!(off % 4, 0);
            assert_eq!(&bytes[off..off + 6], MAGIC);
            let field = |n: usize| {
                let s = std::str::from_utf8(&bytes[off + 6 + n * 8..off + 14 + n * 8]).expect("ascii");
                usize::from_str_radix(s, 16).expect("hex")
            };
            let (size, name_size) = (field(6), field(11));
            let name = &bytes[off + HEADER_LEN..off + HEADER_LEN + name_size - 1];
            names.push(String::from_utf8(name.to_vec()).expect("name"));
            assert_eq!(bytes[off + HEADER_LEN + name_size - 1], 0, "name is NUL-terminated");
            let data_off = off + HEADER_LEN + name_size + pad4(HEADER_LEN + name_size);
            off = data_off + size + pad4(size);
            if names.last().map(String::as_str) == Some(TRAILER) {
                break;
            }
        }
        assert_eq!(off, bytes.len());
        assert_eq!(names, ["a", "bb", "ccc", "dddd", "eeeee", TRAILER]);
    }

    #[test]
    fn gnu_cpio_unpacks_modes_contents_and_symlinks() {
        let mut archive = Initramfs::new();
        archive
            .dir("bin", 0o755)
            .and_then(|a| a.dir("etc", 0o750))
            .and_then(|a| a.dir("etc/deep", 0o700))
            .and_then(|a| a.file("bin/tool", 0o755, b"#!/bin/sh\necho tool\n".to_vec()))
            .and_then(|a| a.file("etc/deep/secret", 0o600, b"s3cret".to_vec()))
            .and_then(|a| a.file("etc/empty", 0o644, Vec::new()))
            .and_then(|a| a.file("etc/setuid", 0o4755, b"x".to_vec()))
            .and_then(|a| a.symlink("bin/sh", "tool"))
            .and_then(|a| a.symlink("etc/abs", "/bin/tool"))
            .expect("build");
        if is_root() {
            archive.dir("dev", 0o755).and_then(|a| a.char_dev("dev/null", 0o666, 1, 3)).expect("build");
        } else {
            println!("NOTE: not root, so the device node is checked in the listing only");
        }
        let dir = unpack(&archive.to_bytes().expect("write"));
        let root = dir.path();

        assert_eq!(mode_of(&root.join("bin")), 0o755);
        assert_eq!(mode_of(&root.join("etc")), 0o750);
        assert_eq!(mode_of(&root.join("etc/deep")), 0o700);
        assert_eq!(mode_of(&root.join("bin/tool")), 0o755);
        assert_eq!(mode_of(&root.join("etc/deep/secret")), 0o600);
        assert_eq!(mode_of(&root.join("etc/setuid")), 0o4755);
        assert_eq!(std::fs::read(root.join("bin/tool")).expect("read"), b"#!/bin/sh\necho tool\n");
        assert_eq!(std::fs::read(root.join("etc/deep/secret")).expect("read"), b"s3cret");
        assert_eq!(std::fs::read(root.join("etc/empty")).expect("read"), b"");
        assert_eq!(std::fs::read_link(root.join("bin/sh")).expect("readlink"), Path::new("tool"));
        assert_eq!(std::fs::read_link(root.join("etc/abs")).expect("readlink"), Path::new("/bin/tool"));
        assert_eq!(std::fs::read(root.join("bin/sh")).expect("read through link"), b"#!/bin/sh\necho tool\n");
        if is_root() {
            let meta = std::fs::symlink_metadata(root.join("dev/null")).expect("stat");
            assert!(meta.file_type().is_char_device());
            assert_eq!(meta.rdev(), libc::makedev(1, 3));
            assert_eq!(mode_of(&root.join("dev/null")), 0o666);
        }
    }

    #[test]
    fn agent_initramfs_has_init_console_and_mount_points() {
        let src = tempfile::tempdir().expect("tempdir");
        let agent = src.path().join("pvisor-agent");
        std::fs::write(&agent, b"\x7fELF not really an agent").expect("write");
        let bytes = agent_initramfs(&agent).expect("build");

        let listing = list(&bytes);
        let line = |name: &str| {
            listing
                .lines()
                .find(|l| l.split_whitespace().last() == Some(name))
                .unwrap_or_else(|| panic!("{name} not in the archive:\n{listing}"))
        };
        assert!(line("init").starts_with("-rwxr-xr-x"), "{}", line("init"));
        let console: Vec<&str> = line("dev/console").split_whitespace().collect();
        assert_eq!(console[0], "crw-------", "{listing}");
        assert_eq!(&console[4..6], ["5,", "1"], "{listing}");
        let null: Vec<&str> = line("dev/null").split_whitespace().collect();
        assert_eq!(null[0], "crw-rw-rw-", "{listing}");
        assert_eq!(&null[4..6], ["1,", "3"], "{listing}");
        for dir in AGENT_DIRS {
            assert!(line(dir).starts_with("drwxr-xr-x"), "{}", line(dir));
        }

        let dir = unpack(&bytes);
        assert_eq!(std::fs::read(dir.path().join("init")).expect("read"), b"\x7fELF not really an agent");
        assert_eq!(mode_of(&dir.path().join("init")), 0o755);
    }

    #[test]
    fn agent_initramfs_reports_a_missing_agent() {
        let err = agent_initramfs(Path::new("/nonexistent/pvisor-agent")).expect_err("no agent");
        assert!(matches!(err, InitramfsError::Read { ref path, .. } if path == Path::new("/nonexistent/pvisor-agent")));
    }

    #[test]
    fn bad_entries_are_refused() {
        let mut archive = Initramfs::new();
        for bad in ["", "/", "a//b", "./a", "a/../b", "..", "a\0b"] {
            assert!(matches!(archive.dir(bad, 0o755), Err(InitramfsError::InvalidPath(_))), "{bad:?}");
        }
        assert!(matches!(
            archive.file("x/y", 0o644, Vec::new()),
            Err(InitramfsError::MissingParent { ref parent, .. }) if parent == "x"
        ));
        archive.dir("x", 0o755).expect("dir");
        assert!(matches!(archive.dir("/x/", 0o755), Err(InitramfsError::Duplicate(ref p)) if p == "x"));
        assert!(matches!(archive.file("x/f", 0o10644, Vec::new()), Err(InitramfsError::InvalidMode { .. })));
        assert!(matches!(archive.symlink("x/l", ""), Err(InitramfsError::InvalidPath(_))));
        // A file is not a directory: nothing can be added beneath it.
        archive.file("x/f", 0o644, Vec::new()).expect("file");
        assert!(matches!(archive.file("x/f/g", 0o644, Vec::new()), Err(InitramfsError::MissingParent { .. })));
        // Refused entries left nothing behind: the archive holds x and x/f only.
        let listing = list(&archive.to_bytes().expect("write"));
        let names: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().last()).collect();
        assert_eq!(names, ["x", "x/f"]);
    }
}
