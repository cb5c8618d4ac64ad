//! The pool on disk: image indexes, chunk packs, the name table, locking.

mod chunker;
mod derive;
mod gc;
mod import;
pub mod index;
pub mod pack;
mod pull;
mod store;
pub mod view;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

pub use chunker::{ChunkStats, CHUNK_SIZE, SMALL};
pub use derive::DerivedImage;
pub use gc::{DuReport, GcReport, ImageUsage};
pub use import::{ImportEvent, ImportStats};
pub use pull::PullProgress;

use crate::error::{Error, Result};
use crate::reference::{self, Reference};
use crate::{ImageRecord, Options, ID_RANGE};
use index::{Extent, Index};
use pack::Catalog;
use store::{Store, INDEX_FILE};
use view::ImageView;

pub(crate) use store::write_atomic;

/// Where a file's content is in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileContent {
    pub size: u64,
    pub digest: [u8; 32],
    pub extents: Vec<Extent>,
    /// A small file waiting in the import's spool at this offset: it gets
    /// its extents when the final tree is known (see `chunker`).
    pub spooled: Option<u64>,
}

/// Readers hold every pack open: raise the soft open-file limit to the hard
/// one (best effort; gc also merges small packs to keep their number down).
fn raise_nofile_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

pub(crate) fn unique_name() -> String {
    store::unique_name("p")
}

/// The image pool rooted at one directory.
pub struct Pool {
    store: Store,
    options: Options,
    /// Serializes name-table changes within this process (the flock on
    /// `root/lock` does so across processes).
    mutex: Mutex<()>,
}

impl Pool {
    /// Opens (creating if needed) the pool at `root` with [`Options::detect`].
    pub fn open(root: &Path) -> Result<Self> {
        Self::open_with(root, Options::detect())
    }

    /// Opens (creating if needed) the pool at `root`. Leftovers of
    /// interrupted imports are removed.
    pub fn open_with(root: &Path, options: Options) -> Result<Self> {
        if let Some(s) = options.id_shift {
            if s.checked_add(ID_RANGE).is_none() {
                return Err(Error::Options(format!("id_shift {s} leaves no room for {ID_RANGE} ids")));
            }
        }
        if !(1..=22).contains(&options.level) {
            return Err(Error::Options(format!("zstd level {} is not in 1..=22", options.level)));
        }
        raise_nofile_limit();
        Ok(Pool { store: Store::open(root)?, options, mutex: Mutex::new(()) })
    }

    /// The uid/gid shift images are served with.
    pub fn id_shift(&self) -> Option<u32> {
        self.options.id_shift
    }

    /// The pool's directory.
    pub fn root(&self) -> &Path {
        &self.store.root
    }

    /// Finds an image by name, id, id prefix (≥ 12 hex digits) or digest reference.
    pub fn resolve(&self, reference: &str) -> Result<ImageRecord> {
        let names = self.store.names()?;
        let id = self.find_id(reference, &names)?;
        self.record(&id, &names)
    }

    /// All images, sorted by id.
    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        let names = self.store.names()?;
        let mut out = Vec::new();
        for id in self.store.ids()? {
            match self.record(&id, &names) {
                Ok(r) => out.push(r),
                Err(Error::NotFound(_)) => {} // removed meanwhile
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Removes a name; the image goes when no name is left. Given an id (or
    /// id prefix or digest reference), removes the image and all its names.
    /// Its chunks stay until [`Pool::gc`] (running sandboxes keep reading
    /// them either way).
    pub fn remove(&self, reference: &str) -> Result<()> {
        let _guard = self.mutex.lock().unwrap_or_else(PoisonError::into_inner);
        let lock = self.store.lock()?;
        let mut names = self.store.names()?;
        let by_name = match reference::parse(reference)? {
            Reference::Name(n) => Some(n),
            Reference::Prefix { name: Some(n), .. } if names.contains_key(&n) => Some(n),
            _ => None,
        };
        let id = match by_name {
            Some(name) => {
                let id = names.remove(&name).ok_or_else(|| Error::NotFound(reference.to_owned()))?;
                if names.values().any(|v| *v == id) {
                    self.store.save_names(&names)?;
                    return Ok(());
                }
                id
            }
            None => {
                let id = self.find_id(reference, &names)?;
                names.retain(|_, v| *v != id);
                id
            }
        };
        self.store.save_names(&names)?;
        let doomed = self.store.retire(&id)?;
        drop(lock);
        drop(doomed); // deleted outside the lock
        Ok(())
    }

    /// Opens an image for reading. The view holds its packs open and stays
    /// valid whatever gc or removal happens afterwards.
    pub fn view(&self, image: &ImageRecord) -> Result<ImageView> {
        let _gc = self.store.gc_lock(false)?;
        let index = self.index(&image.id)?;
        let catalog = Catalog::load(&self.store.packs)?;
        ImageView::new(index, Arc::new(catalog), &image.id)
    }

    /// Reads an image's index.
    pub fn index(&self, id: &str) -> Result<Index> {
        let path = self.store.image_dir(id)?.join(INDEX_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::NotFound(id.to_owned())),
            Err(e) => return Err(Error::io(&path, e)),
        };
        Index::decode(&bytes, &path)
    }

    fn record(&self, id: &str, names: &BTreeMap<String, String>) -> Result<ImageRecord> {
        let meta = self.store.read_image(id)?.ok_or_else(|| Error::NotFound(id.to_owned()))?;
        Ok(ImageRecord {
            names: names.iter().filter(|(_, v)| **v == meta.id).map(|(k, _)| k.clone()).collect(),
            id: meta.id,
            config: meta.config,
            size_bytes: meta.size_bytes,
            imported_at: meta.imported_at,
        })
    }

    fn find_id(&self, reference: &str, names: &BTreeMap<String, String>) -> Result<String> {
        let not_found = || Error::NotFound(reference.to_owned());
        match reference::parse(reference)? {
            Reference::Name(n) => names.get(&n).cloned().ok_or_else(not_found),
            Reference::Id(id) => {
                if self.store.read_image(&id)?.is_some() {
                    return Ok(id);
                }
                // A manifest digest (`name@sha256:...` as pulled) also identifies an image.
                for candidate in self.store.ids()? {
                    if let Some(meta) = self.store.read_image(&candidate)? {
                        if meta.manifest_digests.contains(&id) {
                            return Ok(candidate);
                        }
                    }
                }
                Err(not_found())
            }
            Reference::Prefix { name, prefix } => {
                if let Some(id) = name.and_then(|n| names.get(&n).cloned()) {
                    return Ok(id);
                }
                let want = format!("sha256:{prefix}");
                let matches: Vec<String> = self.store.ids()?.into_iter().filter(|id| id.starts_with(&want)).collect();
                match matches.len() {
                    0 => Err(not_found()),
                    1 => Ok(matches.into_iter().next().unwrap_or_default()),
                    _ => Err(Error::Ambiguous { reference: reference.to_owned(), candidates: matches }),
                }
            }
        }
    }
}
