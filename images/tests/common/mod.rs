//! Builders for small docker-archive and OCI-layout tarballs, helpers to
//! look at an imported image through its index and view, and checks that
//! nothing escaped the pool.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use pvisor_images::pool::index::{Data, Ino, Inode, S_IFMT};
use pvisor_images::{ImageRecord, ImageView, Options, Pool};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const MTIME: u64 = 1_600_000_000;

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A raw tar stream built entry by entry (GNU headers, names written verbatim
/// so tests can produce hostile archives).
#[derive(Default, Clone)]
pub struct LayerBuilder {
    out: Vec<u8>,
}

fn header(name: &[u8], kind: tar::EntryType, size: u64, mode: u32, uid: u64, gid: u64, link: &[u8]) -> tar::Header {
    assert!(name.len() <= 100 && link.len() <= 100, "keep test names short");
    let mut h = tar::Header::new_gnu();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(gid);
    h.set_mtime(MTIME);
    h.set_cksum();
    h
}

impl LayerBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a header with `size` and then exactly `data` (which may be shorter).
    pub fn raw(mut self, h: &tar::Header, data: &[u8]) -> Self {
        self.out.extend_from_slice(h.as_bytes());
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.resize(self.out.len() + pad, 0);
        self
    }

    pub fn entry(
        self,
        name: &str,
        kind: tar::EntryType,
        mode: u32,
        (uid, gid): (u64, u64),
        link: &str,
        data: &[u8],
    ) -> Self {
        let h = header(name.as_bytes(), kind, data.len() as u64, mode, uid, gid, link.as_bytes());
        self.raw(&h, data)
    }

    pub fn dir(self, path: &str, mode: u32) -> Self {
        self.entry(path, tar::EntryType::Directory, mode, (0, 0), "", b"")
    }
    pub fn file(self, path: &str, data: &[u8], mode: u32) -> Self {
        self.entry(path, tar::EntryType::Regular, mode, (0, 0), "", data)
    }
    pub fn file_owned(self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> Self {
        self.entry(path, tar::EntryType::Regular, mode, (uid, gid), "", data)
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(path, tar::EntryType::Symlink, 0o777, (0, 0), target, b"")
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.entry(path, tar::EntryType::Link, 0o644, (0, 0), target, b"")
    }
    pub fn fifo(self, path: &str) -> Self {
        self.entry(path, tar::EntryType::Fifo, 0o640, (0, 0), "", b"")
    }
    pub fn chardev(self, path: &str, major: u32, minor: u32) -> Self {
        self.device(path, tar::EntryType::Char, major, minor)
    }
    pub fn blockdev(self, path: &str, major: u32, minor: u32) -> Self {
        self.device(path, tar::EntryType::Block, major, minor)
    }
    fn device(self, path: &str, kind: tar::EntryType, major: u32, minor: u32) -> Self {
        let mut h = header(path.as_bytes(), kind, 0, 0o666, 0, 0, b"");
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        h.set_cksum();
        self.raw(&h, b"")
    }
    /// A file with its own mtime.
    pub fn file_at(self, path: &str, data: &[u8], mode: u32, mtime: u64) -> Self {
        let mut h = header(path.as_bytes(), tar::EntryType::Regular, data.len() as u64, mode, 0, 0, b"");
        h.set_mtime(mtime);
        h.set_cksum();
        self.raw(&h, data)
    }
    /// A PAX extended header (`key=value` records) for the next entry.
    pub fn pax(self, records: &[(&str, &[u8])]) -> Self {
        let mut body = Vec::new();
        for (key, value) in records {
            // "<len> <key>=<value>\n", where <len> counts itself.
            let rest = key.len() + value.len() + 3; // ' ', '=', '\n'
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        let h = header(b"PaxHeaders/x", tar::EntryType::XHeader, body.len() as u64, 0o644, 0, 0, b"");
        self.raw(&h, &body)
    }
    /// `dir/.wh.name` for `dir/name`.
    pub fn whiteout(self, path: &str) -> Self {
        let (dir, name) = path.rsplit_once('/').map(|(d, n)| (format!("{d}/"), n)).unwrap_or((String::new(), path));
        self.file(&format!("{dir}.wh.{name}"), b"", 0o600)
    }
    pub fn opaque(self, dir: &str) -> Self {
        self.file(&format!("{dir}/.wh..wh..opq"), b"", 0o600)
    }
    /// A header claiming `size` bytes followed by only `data`.
    pub fn lying_size(self, path: &str, size: u64, data: &[u8]) -> Self {
        let h = header(path.as_bytes(), tar::EntryType::Regular, size, 0o644, 0, 0, b"");
        self.raw(&h, data)
    }

    pub fn build(mut self) -> Vec<u8> {
        self.out.resize(self.out.len() + 1024, 0);
        self.out
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Comp {
    Plain,
    Gzip,
    Zstd,
}

/// A layer: its uncompressed tar and how it is stored.
#[derive(Clone)]
pub struct Layer {
    pub plain: Vec<u8>,
    pub comp: Comp,
}

impl Layer {
    pub fn new(plain: Vec<u8>, comp: Comp) -> Self {
        Layer { plain, comp }
    }
    pub fn blob(&self) -> Vec<u8> {
        match self.comp {
            Comp::Plain => self.plain.clone(),
            Comp::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(&self.plain).unwrap();
                e.finish().unwrap()
            }
            Comp::Zstd => zstd::encode_all(&self.plain[..], 3).unwrap(),
        }
    }
    pub fn diff_id(&self) -> String {
        sha256(&self.plain)
    }
    pub fn media_type(&self) -> &'static str {
        match self.comp {
            Comp::Plain => "application/vnd.oci.image.layer.v1.tar",
            Comp::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
            Comp::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
        }
    }
}

pub fn run_config(entrypoint: &[&str], cmd: &[&str], env: &[&str], workdir: &str, user: &str) -> Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": env, "WorkingDir": workdir, "User": user},
    })
}

fn config_with_rootfs(config: &Value, layers: &[Layer]) -> Vec<u8> {
    let mut c = config.clone();
    c["rootfs"] = json!({"type": "layers", "diff_ids": layers.iter().map(Layer::diff_id).collect::<Vec<_>>()});
    serde_json::to_vec(&c).unwrap()
}

/// Archive members, in order.
pub type Members = Vec<(String, Vec<u8>)>;

pub struct DockerImage {
    pub tags: Vec<String>,
    pub config: Value,
    pub layers: Vec<Layer>,
}

/// Members of a docker-archive. `blobs_style`: newer docker layout
/// (`blobs/sha256/...` plus `oci-layout`/`index.json` next to `manifest.json`).
pub fn docker_members(images: &[DockerImage], blobs_style: bool) -> Members {
    let mut members: Members = Vec::new();
    let mut manifest = Vec::new();
    for img in images {
        let config = config_with_rootfs(&img.config, &img.layers);
        let config_hex = hex::encode(Sha256::digest(&config));
        let config_name = if blobs_style { format!("blobs/sha256/{config_hex}") } else { format!("{config_hex}.json") };
        let mut layer_names = Vec::new();
        for layer in &img.layers {
            let blob = layer.blob();
            let name = if blobs_style {
                format!("blobs/sha256/{}", hex::encode(Sha256::digest(&blob)))
            } else {
                format!("{}/layer.tar", hex::encode(Sha256::digest(&layer.plain)))
            };
            if !members.iter().any(|(n, _)| *n == name) {
                members.push((name.clone(), blob));
            }
            layer_names.push(name);
        }
        members.push((config_name.clone(), config));
        manifest.push(json!({"Config": config_name, "RepoTags": img.tags, "Layers": layer_names}));
    }
    members.push(("manifest.json".into(), serde_json::to_vec(&manifest).unwrap()));
    if blobs_style {
        // What newer docker writes alongside; the importer must prefer manifest.json.
        members.push(("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()));
        members.push(("index.json".into(), br#"{"schemaVersion":2,"manifests":[]}"#.to_vec()));
    }
    members
}

pub struct OciImage {
    pub ref_name: Option<String>,
    pub containerd_name: Option<String>,
    pub config: Value,
    pub layers: Vec<Layer>,
    /// Reference the manifest through a nested image index that also lists
    /// an arm64 variant (which must be ignored).
    pub via_index: bool,
}

fn put_blob(members: &mut Members, bytes: Vec<u8>) -> (String, usize) {
    let digest = sha256(&bytes);
    let len = bytes.len();
    let name = format!("blobs/sha256/{}", &digest[7..]);
    if !members.iter().any(|(n, _)| *n == name) {
        members.push((name, bytes));
    }
    (digest, len)
}

/// Members of an OCI image layout.
pub fn oci_members(images: &[OciImage]) -> Members {
    let mut members: Members = vec![("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec())];
    let mut index = Vec::new();
    for img in images {
        let config = config_with_rootfs(&img.config, &img.layers);
        let (config_digest, config_len) = put_blob(&mut members, config);
        let layers: Vec<Value> = img
            .layers
            .iter()
            .map(|l| {
                let (d, n) = put_blob(&mut members, l.blob());
                json!({"mediaType": l.media_type(), "digest": d, "size": n})
            })
            .collect();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_len},
            "layers": layers,
        });
        let (mdigest, mlen) = put_blob(&mut members, serde_json::to_vec(&manifest).unwrap());
        let mut annotations = serde_json::Map::new();
        if let Some(r) = &img.ref_name {
            annotations.insert("org.opencontainers.image.ref.name".into(), json!(r));
        }
        if let Some(r) = &img.containerd_name {
            annotations.insert("io.containerd.image.name".into(), json!(r));
        }
        let desc = if img.via_index {
            // An arm64 sibling that points at a blob that is not even there.
            let nested = json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "e".repeat(64)), "size": 10,
                     "platform": {"os": "linux", "architecture": "arm64"}},
                    {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": mlen,
                     "platform": {"os": "linux", "architecture": "amd64"}},
                ],
            });
            let (idigest, ilen) = put_blob(&mut members, serde_json::to_vec(&nested).unwrap());
            json!({"mediaType": "application/vnd.oci.image.index.v1+json", "digest": idigest, "size": ilen, "annotations": annotations})
        } else {
            json!({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdigest, "size": mlen, "annotations": annotations})
        };
        index.push(desc);
    }
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": index});
    members.push(("index.json".into(), serde_json::to_vec(&index).unwrap()));
    members
}

/// A plain tar of the members.
pub fn tar_members(members: &Members) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(MTIME);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    b.into_inner().unwrap()
}

/// A temporary directory with a pool root and an "outside" sentinel.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
}

/// Pool options of the tests: no id shift, the default zstd level.
pub fn options() -> Options {
    Options { id_shift: None, level: 3 }
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("secret"), b"host secret").unwrap();
        Env { dir, root, outside }
    }

    pub fn pool(&self) -> Pool {
        Pool::open_with(&self.root, options()).unwrap()
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    pub fn archive(&self, name: &str, members: &Members) -> PathBuf {
        self.write(name, &tar_members(members))
    }

    /// Everything in the temp dir outside the pool (path → content/target).
    pub fn outside_snapshot(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        snapshot(self.dir.path(), self.dir.path(), &self.root, &mut out);
        out
    }

    /// The pool holds nothing but its own files: complete images (metadata
    /// and index only), packs each with its catalog, nothing left in tmp/.
    pub fn assert_store_clean(&self) {
        assert_pool_clean(&self.root, false);
    }
}

/// See [`Env::assert_store_clean`]. `after_crash`: also accept what an
/// interrupted pack publication leaves in `packs/` (a pack whose catalog
/// was never written, a catalog temp file), which only gc removes.
pub fn assert_pool_clean(root: &Path, after_crash: bool) {
    for e in fs::read_dir(root).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            ["images", "packs", "tmp", "lock", "gc.lock", "names.json"].contains(&name.as_str()),
            "stray {name} in pool root"
        );
    }
    let tmp: Vec<_> = fs::read_dir(root.join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "tmp/ not empty: {tmp:?}");
    for e in fs::read_dir(root.join("images")).unwrap() {
        let e = e.unwrap();
        assert_eq!(e.file_name().len(), 64, "stray {:?} in images/", e.file_name());
        let mut inner: Vec<String> =
            fs::read_dir(e.path()).unwrap().map(|x| x.unwrap().file_name().into_string().unwrap()).collect();
        inner.sort();
        assert_eq!(inner, ["image.json", "index"]);
    }
    let packs: Vec<String> =
        fs::read_dir(root.join("packs")).unwrap().map(|x| x.unwrap().file_name().into_string().unwrap()).collect();
    for name in &packs {
        if let Some(stem) = name.strip_suffix(".cat") {
            assert!(packs.contains(&format!("{stem}.pack")), "catalog {name} without its pack");
        } else if let Some(stem) = name.strip_suffix(".pack") {
            assert!(after_crash || packs.contains(&format!("{stem}.cat")), "pack {name} without its catalog");
        } else {
            assert!(after_crash && name.ends_with(".cat.tmp"), "stray {name} in packs/");
        }
    }
}

/// Names and sizes of the files in `packs/` (to check a refused import
/// added nothing).
pub fn packs_snapshot(root: &Path) -> BTreeMap<String, u64> {
    fs::read_dir(root.join("packs"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), e.metadata().unwrap().len())
        })
        .collect()
}

fn snapshot(base: &Path, dir: &Path, skip: &Path, out: &mut BTreeMap<PathBuf, String>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p == skip {
            continue;
        }
        let rel = p.strip_prefix(base).unwrap().to_path_buf();
        let md = fs::symlink_metadata(&p).unwrap();
        if md.file_type().is_symlink() {
            out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
        } else if md.is_dir() {
            out.insert(rel, "dir".into());
            snapshot(base, &p, skip, out);
        } else {
            out.insert(rel, sha256(&fs::read(&p).unwrap()));
        }
    }
}

/// Ids and names of the pool's images, for before/after comparisons.
pub fn listing(pool: &Pool) -> Vec<(String, Vec<String>)> {
    pool.list().unwrap().into_iter().map(|r| (r.id, r.names)).collect()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

// ---- looking at an imported image --------------------------------------------

pub fn view(pool: &Pool, rec: &ImageRecord) -> ImageView {
    pool.view(rec).unwrap_or_else(|e| panic!("view of {}: {e}", rec.id))
}

/// The inode number at `path` (symlinks not followed), if any.
pub fn lookup(pool: &Pool, rec: &ImageRecord, path: &str) -> Option<Ino> {
    pool.index(&rec.id).unwrap().lookup_path(path)
}

pub fn exists(pool: &Pool, rec: &ImageRecord, path: &str) -> bool {
    lookup(pool, rec, path).is_some()
}

/// The inode at `path` (symlinks not followed).
pub fn stat(pool: &Pool, rec: &ImageRecord, path: &str) -> Inode {
    let index = pool.index(&rec.id).unwrap();
    let ino = index.lookup_path(path).unwrap_or_else(|| panic!("{path}: not in the image"));
    index.inodes[ino as usize].clone()
}

/// Permission bits (`0o7777`) of an inode.
pub fn perm(inode: &Inode) -> u32 {
    inode.mode & 0o7777
}

/// The content of the regular file at `path`.
pub fn read(pool: &Pool, rec: &ImageRecord, path: &str) -> Vec<u8> {
    view(pool, rec).read_path(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The target of the symlink at `path`.
pub fn readlink(pool: &Pool, rec: &ImageRecord, path: &str) -> String {
    match stat(pool, rec, path).data {
        Data::Symlink { target } => String::from_utf8(target).unwrap(),
        other => panic!("{path} is not a symlink: {other:?}"),
    }
}

/// Entry names of the directory at `path`, in index (sorted) order.
pub fn ls(pool: &Pool, rec: &ImageRecord, path: &str) -> Vec<String> {
    let inode = stat(pool, rec, path);
    assert!(inode.is_dir(), "{path} is not a directory");
    inode.entries().iter().map(|e| String::from_utf8(e.name.clone()).unwrap()).collect()
}

/// What a path of an image is, for whole-tree comparisons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    Other(u32),
}

/// Every path of the image (`""` is the root) with its content, regular
/// files read through the view in odd-sized pieces (so reads cross chunk
/// and extent boundaries).
pub fn tree(view: &ImageView) -> BTreeMap<String, Node> {
    let index = view.index();
    let mut out = BTreeMap::new();
    let mut stack = vec![(String::new(), 0 as Ino)];
    while let Some((path, ino)) = stack.pop() {
        let inode = &index.inodes[ino as usize];
        let node = match &inode.data {
            Data::Dir { entries, .. } => {
                for e in entries {
                    let name = String::from_utf8(e.name.clone()).unwrap();
                    let child = if path.is_empty() { name } else { format!("{path}/{name}") };
                    stack.push((child, e.ino));
                }
                Node::Dir
            }
            Data::File { .. } => Node::File(read_ino(view, ino)),
            Data::Symlink { target } => Node::Symlink(String::from_utf8(target.clone()).unwrap()),
            _ => Node::Other(inode.mode & S_IFMT),
        };
        out.insert(path, node);
    }
    out
}

/// A file's content through [`ImageView::read`], 100 003 bytes at a time.
pub fn read_ino(view: &ImageView, ino: Ino) -> Vec<u8> {
    let size = view.index().inodes[ino as usize].size() as usize;
    let mut out = vec![0u8; size];
    let mut off = 0;
    while off < size {
        let end = (off + 100_003).min(size);
        let n = view.read(ino, off as u64, &mut out[off..end]).unwrap();
        assert!(n > 0, "short read at {off} of {size}");
        off += n;
    }
    let mut past = [0u8; 8];
    assert_eq!(view.read(ino, size as u64, &mut past).unwrap(), 0, "read past the end");
    out
}

/// The regular files of an image and their content.
pub fn files(view: &ImageView) -> BTreeMap<String, Vec<u8>> {
    tree(view)
        .into_iter()
        .filter_map(|(p, n)| match n {
            Node::File(data) => Some((p, data)),
            _ => None,
        })
        .collect()
}

// ---- generated data -----------------------------------------------------------

/// A small deterministic PRNG (splitmix64), so tests need no extra crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Incompressible bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n.div_ceil(8) * 8];
        for c in out.chunks_exact_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
    /// Compressible text-like bytes (words from a small vocabulary).
    pub fn text(&mut self, n: usize) -> Vec<u8> {
        const WORDS: [&str; 16] = [
            "alpha", "beta", "gamma", "delta", "sandbox", "pool", "chunk", "layer", "index", "image", "zstd", "the",
            "of", "and", "\n", "= 42;",
        ];
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(WORDS[self.below(16) as usize].as_bytes());
            out.push(b' ');
        }
        out.truncate(n);
        out
    }
}
