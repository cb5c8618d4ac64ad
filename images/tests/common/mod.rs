//! Builders for small docker-archive and OCI-layout tarballs, and helpers to
//! check that nothing escaped the store.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use pvisor_images::{ImageStore, Options};
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
        let mut h = header(path.as_bytes(), tar::EntryType::Char, 0, 0o666, 0, 0, b"");
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        h.set_cksum();
        self.raw(&h, b"")
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

/// A temporary directory with a store root and an "outside" sentinel.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub outside: PathBuf,
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

    pub fn store(&self) -> ImageStore {
        ImageStore::open_with(&self.root, Options { id_shift: None }).unwrap()
    }

    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    pub fn archive(&self, name: &str, members: &Members) -> PathBuf {
        self.write(name, &tar_members(members))
    }

    /// Everything in the temp dir outside the store (path → content/target).
    pub fn outside_snapshot(&self) -> BTreeMap<PathBuf, String> {
        let mut out = BTreeMap::new();
        snapshot(self.dir.path(), self.dir.path(), &self.root, &mut out);
        out
    }

    /// The store holds nothing but its own files: no strays next to image
    /// trees, nothing left in tmp/.
    pub fn assert_store_clean(&self) {
        for e in fs::read_dir(&self.root).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            assert!(["images", "tmp", "lock", "names.json"].contains(&name.as_str()), "stray {name} in store root");
        }
        let tmp: Vec<_> = fs::read_dir(self.root.join("tmp")).unwrap().collect();
        assert!(tmp.is_empty(), "tmp/ not empty: {tmp:?}");
        for e in fs::read_dir(self.root.join("images")).unwrap() {
            let e = e.unwrap();
            assert_eq!(e.file_name().len(), 64, "stray {:?} in images/", e.file_name());
            let mut inner: Vec<String> =
                fs::read_dir(e.path()).unwrap().map(|x| x.unwrap().file_name().into_string().unwrap()).collect();
            inner.sort();
            assert_eq!(inner, ["image.json", "rootfs"]);
        }
    }
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

/// Ids and names of the store's images, for before/after comparisons.
pub fn listing(store: &ImageStore) -> Vec<(String, Vec<String>)> {
    store.list().unwrap().into_iter().map(|r| (r.id, r.names)).collect()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
