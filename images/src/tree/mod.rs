//! Flattening layers into one tree, in memory: files, directories, links,
//! device nodes, modes, owners, mtimes, xattrs and overlay-style whiteouts,
//! applied in layer order. File content goes straight to a [`ContentSink`]
//! (the pool's chunker) as it streams by; the tree keeps only where it went.
//! Nothing is written to the host file system, so no entry, symlink or
//! hardlink can reach outside the image.

mod flatten;
mod node;
mod resolve;
mod seed;
mod touched;

use std::io::{self, Read};

use tar::EntryType;

use crate::archive::{Budget, BudgetReader, EXTENSION_BUDGET, MAX_ENTRY_SIZE};
use crate::error::{Error, Result};
use crate::pool::index::{Inode, Xattr, S_IFBLK, S_IFCHR};
use crate::pool::FileContent;
use node::{Kind, Meta, Node, NodeId, Nodes, ROOT};
use resolve::{clean, resolve_dir, ResolveError};
use touched::Touched;

/// Ids inside the image must be below this (one user namespace range).
pub(crate) const ID_RANGE: u64 = 65536;
/// Non-file entries may carry a little data (ignored); more is refused.
const MAX_SPECIAL_DATA: u64 = 1 << 20;
/// Most inodes an image may have.
const MAX_NODES: usize = 8 << 20;
/// Longest file name (as Linux's NAME_MAX).
const MAX_NAME: usize = 255;
/// Longest path (as Linux's PATH_MAX).
const MAX_PATH: usize = 4096;
/// Largest xattr value (as Linux's XATTR_SIZE_MAX) and most xattr bytes per entry.
const MAX_XATTR: usize = 64 << 10;
const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const XATTR_PAX_PREFIX: &str = "SCHILY.xattr.";

/// Where file content goes: returns how to find it again.
pub(crate) trait ContentSink {
    /// Takes a file's content as it streams by.
    fn add_file(&mut self, data: &mut dyn Read, size: u64) -> Result<FileContent, io::Error>;
    /// The final extents of a file of the finished tree (called once per
    /// file, in tree order, when no layer can change the tree any more).
    fn place(&mut self, content: &FileContent) -> Result<Vec<crate::pool::index::Extent>, io::Error>;
}

/// Builds one image tree from its layers.
pub(crate) struct TreeBuilder {
    nodes: Nodes,
}

/// Context of the entry being applied, for error messages.
struct Ctx<'a> {
    entry: &'a str,
    layer: &'a str,
}

impl Ctx<'_> {
    fn unsafe_(&self, reason: impl std::fmt::Display) -> Error {
        Error::unsafe_entry(self.entry, format!("{reason} (layer {})", self.layer))
    }
    fn bad(&self, reason: impl std::fmt::Display) -> Error {
        Error::bad(Some(self.entry), format!("{reason} (layer {})", self.layer))
    }
    fn resolve(&self, e: ResolveError) -> Error {
        self.bad(e.describe())
    }
}

impl TreeBuilder {
    pub(crate) fn new() -> Self {
        TreeBuilder { nodes: Nodes::new() }
    }

    /// Applies one uncompressed layer tar stream.
    ///
    /// `plain_size` is the stream's total size when known (uncompressed
    /// blobs), used to refuse entries claiming more data than there is.
    pub(crate) fn apply_layer<R: Read>(
        &mut self,
        reader: R,
        layer: &str,
        plain_size: Option<u64>,
        sink: &mut dyn ContentSink,
    ) -> Result<()> {
        let budget = Budget::new();
        let mut archive = tar::Archive::new(BudgetReader::new(reader, budget.clone()));
        let mut entries = archive.entries().map_err(|e| Error::bad(None, format!("layer {layer}: {e}")))?;
        // Paths (and their parents) created or kept by this layer: an opaque
        // marker removes everything else in its directory.
        let mut touched = Touched::default();
        loop {
            budget.limit(EXTENSION_BUDGET);
            let next = entries.next();
            budget.unlimited();
            let mut entry = match next {
                None => break,
                Some(Ok(e)) => e,
                Some(Err(e)) if budget.exceeded() => {
                    return Err(Error::unsafe_entry(
                        "<tar extension header>",
                        format!("long-name/PAX header data over {EXTENSION_BUDGET} bytes (layer {layer}): {e}"),
                    ))
                }
                Some(Err(e)) => return Err(Error::bad(None, format!("layer {layer}: {e}"))),
            };
            let raw_path = entry.path_bytes().into_owned();
            let name = String::from_utf8_lossy(&raw_path).into_owned();
            let ctx = Ctx { entry: &name, layer };
            self.apply_entry(&mut entry, &raw_path, &ctx, plain_size, &mut touched, sink)?;
            if self.nodes.nodes.len() > MAX_NODES {
                return Err(ctx.unsafe_(format!("the image has over {MAX_NODES} entries")));
            }
        }
        Ok(())
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw_path: &[u8],
        ctx: &Ctx<'_>,
        plain_size: Option<u64>,
        touched: &mut Touched,
        sink: &mut dyn ContentSink,
    ) -> Result<()> {
        let size = entry.size();
        if size > MAX_ENTRY_SIZE {
            return Err(ctx.unsafe_(format!("declared size {size} exceeds the {MAX_ENTRY_SIZE}-byte limit")));
        }
        if let Some(total) = plain_size {
            // Sparse entries store less than their size; check what is stored.
            let stored = if entry.header().entry_type().is_gnu_sparse() {
                entry.header().entry_size().unwrap_or(u64::MAX)
            } else {
                size
            };
            let end = entry.raw_file_position().checked_add(stored);
            if !matches!(end, Some(end) if end <= total) {
                return Err(ctx.unsafe_(format!("declared size {size} exceeds the remaining layer data")));
            }
        }
        let comps = clean(raw_path).map_err(|r| ctx.unsafe_(r))?;
        if comps.iter().any(|c| c.len() > MAX_NAME) {
            return Err(ctx.bad(format!("a path component is longer than {MAX_NAME} bytes")));
        }
        if raw_path.len() > MAX_PATH {
            return Err(ctx.unsafe_(format!("the path is longer than {MAX_PATH} bytes")));
        }
        let kind = entry.header().entry_type();

        if let Some(last) = comps.last() {
            if last.starts_with(WHITEOUT_PREFIX) {
                drain_special(entry, ctx)?;
                let parent = &comps[..comps.len() - 1];
                if last == OPAQUE_MARKER {
                    touched.mark(parent);
                    return self.opaque(parent, touched, ctx);
                }
                if last.starts_with(b".wh..wh.") {
                    tracing::debug!(entry = ctx.entry, "ignoring aufs metadata entry");
                    return Ok(());
                }
                let target = &last[WHITEOUT_PREFIX.len()..];
                if target.is_empty() || target == b"." || target == b".." {
                    return Err(ctx.unsafe_("whiteout names no valid entry"));
                }
                return self.whiteout(parent, target, ctx);
            }
        }

        let mut meta = || -> Result<Meta> {
            let m = entry_meta(entry).map_err(|e| ctx.bad(format!("bad header: {e}")))?;
            if u64::from(m.uid) >= ID_RANGE || u64::from(m.gid) >= ID_RANGE {
                return Err(
                    ctx.unsafe_(format!("owner {}:{} is outside the mappable id range 0..{ID_RANGE}", m.uid, m.gid))
                );
            }
            Ok(m)
        };
        match kind {
            EntryType::Directory => {
                let meta = meta()?;
                touched.mark(&comps);
                self.make_dir(&comps, meta, ctx)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let meta = meta()?;
                touched.mark(&comps);
                let Some(name) = comps.last() else {
                    return Err(ctx.bad("a file entry cannot replace the image root"));
                };
                let parent = self.parent(&comps, ctx)?;
                let mut counted = CountingReader { inner: &mut *entry, n: 0 };
                let content = sink.add_file(&mut counted, size).map_err(|e| ctx.bad(format!("file data: {e}")))?;
                if counted.n != size || content.size != size {
                    return Err(ctx.bad(format!("truncated: {} of {size} bytes", counted.n)));
                }
                self.put(parent, name, Node { meta, kind: Kind::File(content) });
                return Ok(());
            }
            EntryType::Symlink => {
                let meta = meta()?;
                touched.mark(&comps);
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| ctx.bad("symlink without a target"))?;
                if target.contains(&0) || target.len() > 4095 {
                    return Err(ctx.bad("symlink target contains a NUL byte or is too long"));
                }
                let Some(name) = comps.last() else {
                    return Err(ctx.bad("a symlink cannot replace the image root"));
                };
                let parent = self.parent(&comps, ctx)?;
                // Stored verbatim: only ever resolved inside the image.
                self.put(parent, name, Node { meta, kind: Kind::Symlink(target) });
            }
            EntryType::Link => {
                touched.mark(&comps);
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| ctx.bad("hardlink without a target"))?;
                self.make_hardlink(&comps, &target, ctx)?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let meta = meta()?;
                touched.mark(&comps);
                let Some(name) = comps.last() else {
                    return Err(ctx.bad("a device node cannot replace the image root"));
                };
                let header = entry.header();
                let major = u64::from(header.device_major().ok().flatten().unwrap_or(0));
                let minor = u64::from(header.device_minor().ok().flatten().unwrap_or(0));
                let rdev = nix::sys::stat::makedev(major, minor);
                let kind = match kind {
                    EntryType::Char => Kind::Device(S_IFCHR, rdev),
                    EntryType::Block => Kind::Device(S_IFBLK, rdev),
                    _ => Kind::Fifo,
                };
                let parent = self.parent(&comps, ctx)?;
                self.put(parent, name, Node { meta, kind });
            }
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {}
            other => tracing::warn!(entry = ctx.entry, "skipping unsupported tar entry type {other:?}"),
        }
        drain_special(entry, ctx)
    }

    /// Resolves (creating if needed) the parent directory of `comps`.
    fn parent(&mut self, comps: &[Vec<u8>], ctx: &Ctx<'_>) -> Result<NodeId> {
        resolve_dir(&mut self.nodes, &comps[..comps.len().saturating_sub(1)], true).map_err(|e| ctx.resolve(e))
    }

    /// Names `node` as `name` in `parent`, replacing whatever was there.
    fn put(&mut self, parent: NodeId, name: &[u8], node: Node) {
        let id = self.nodes.add(node);
        self.link(parent, name, id);
    }

    fn link(&mut self, parent: NodeId, name: &[u8], id: NodeId) {
        if let Some(children) = self.nodes.children_mut(parent) {
            children.insert(name.to_vec(), id);
        }
    }

    fn make_dir(&mut self, comps: &[Vec<u8>], meta: Meta, ctx: &Ctx<'_>) -> Result<()> {
        let Some(name) = comps.last() else {
            self.nodes.get_mut(ROOT).meta = meta;
            return Ok(());
        };
        let parent = self.parent(comps, ctx)?;
        match self.nodes.child(parent, name) {
            // An existing directory keeps its content and takes the new metadata.
            Some(id) if self.nodes.get(id).is_dir() => self.nodes.get_mut(id).meta = meta,
            _ => self.put(parent, name, Node::dir(meta)),
        }
        Ok(())
    }

    fn make_hardlink(&mut self, comps: &[Vec<u8>], target: &[u8], ctx: &Ctx<'_>) -> Result<()> {
        let Some(name) = comps.last() else {
            return Err(ctx.bad("a hardlink cannot replace the image root"));
        };
        let tcomps = clean(target).map_err(|r| ctx.unsafe_(format!("hardlink target: {r}")))?;
        let Some(tname) = tcomps.last() else {
            return Err(ctx.unsafe_("hardlink to the image root"));
        };
        let shown = String::from_utf8_lossy(target);
        let missing = || ctx.unsafe_(format!("hardlink target {shown:?} does not exist in the image"));
        let tparent = match resolve_dir(&mut self.nodes, &tcomps[..tcomps.len() - 1], false) {
            Ok(id) => id,
            Err(ResolveError::NotFound | ResolveError::NotDir) => return Err(missing()),
            Err(e) => return Err(ctx.resolve(e)),
        };
        let tid = self.nodes.child(tparent, tname).ok_or_else(missing)?;
        if self.nodes.get(tid).is_dir() {
            return Err(ctx.unsafe_(format!("hardlink target {shown:?} is a directory")));
        }
        let parent = self.parent(comps, ctx)?;
        self.link(parent, name, tid);
        Ok(())
    }

    /// `.wh.<name>`: delete `<name>` (recursively) in `parent`.
    fn whiteout(&mut self, parent: &[Vec<u8>], target: &[u8], ctx: &Ctx<'_>) -> Result<()> {
        let dir = match resolve_dir(&mut self.nodes, parent, false) {
            Ok(id) => id,
            Err(ResolveError::NotFound | ResolveError::NotDir) => return Ok(()), // nothing to hide
            Err(e) => return Err(ctx.resolve(e)),
        };
        if let Some(children) = self.nodes.children_mut(dir) {
            children.remove(target);
        }
        Ok(())
    }

    /// `.wh..wh..opq`: remove everything in `dir` that this layer did not create.
    fn opaque(&mut self, dir: &[Vec<u8>], touched: &Touched, ctx: &Ctx<'_>) -> Result<()> {
        // The directory exists in this layer, even if no entry said so.
        let id = resolve_dir(&mut self.nodes, dir, true).map_err(|e| ctx.resolve(e))?;
        // The marker marked `dir` itself, so it has an id.
        let Some(dir_id) = touched.find(dir) else { return Ok(()) };
        let mut stack = vec![(dir_id, id)];
        while let Some((path, id)) = stack.pop() {
            let Some(children) = self.nodes.children(id) else { continue };
            let mut doomed = Vec::new();
            for (name, &child) in children {
                match touched.child(path, name) {
                    Some(child_path) => {
                        if self.nodes.get(child).is_dir() {
                            stack.push((child_path, child));
                        }
                    }
                    None => doomed.push(name.clone()),
                }
            }
            if let Some(children) = self.nodes.children_mut(id) {
                for name in doomed {
                    children.remove(&name);
                }
            }
        }
        Ok(())
    }

    /// The finished tree's inodes, with file content placed by `sink`.
    pub(crate) fn finish(self, sink: &mut dyn ContentSink) -> io::Result<Vec<Inode>> {
        flatten::flatten(&self.nodes, sink)
    }
}

/// Counts the bytes a sink actually read (to detect truncated entries).
struct CountingReader<'a, R: Read> {
    inner: &'a mut R,
    n: u64,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// Reads (and discards) the data of a non-file entry, refusing large amounts.
fn drain_special<R: Read>(entry: &mut tar::Entry<'_, R>, ctx: &Ctx<'_>) -> Result<()> {
    let mut limited = entry.take(MAX_SPECIAL_DATA + 1);
    let n = io::copy(&mut limited, &mut io::sink()).map_err(|e| ctx.bad(format!("reading entry data: {e}")))?;
    if n > MAX_SPECIAL_DATA {
        return Err(ctx.unsafe_(format!("non-file entry carries over {MAX_SPECIAL_DATA} bytes of data")));
    }
    Ok(())
}

/// Owner, mode, mtime and xattrs from the header (PAX overrides included).
fn entry_meta<R: Read>(entry: &mut tar::Entry<'_, R>) -> io::Result<Meta> {
    let header = entry.header();
    let old = header.as_old();
    let clamp = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    let mut meta = Meta {
        uid: clamp(numeric(header.uid(), &old.uid)?),
        gid: clamp(numeric(header.gid(), &old.gid)?),
        mode: numeric(header.mode().map(u64::from), &old.mode)? as u32 & 0o7777,
        mtime: numeric(header.mtime(), &old.mtime)?.min(i64::MAX as u64) as i64,
        xattrs: Vec::new(),
    };
    if let Some(exts) = entry.pax_extensions()? {
        for ext in exts.flatten() {
            let Ok(key) = ext.key() else { continue };
            let parse = |v: Option<&str>| v.and_then(|s| s.split('.').next()).and_then(|s| s.parse::<u64>().ok());
            match key {
                "mtime" => {
                    if let Some(secs) = ext.value().ok().and_then(|v| v.split('.').next()?.parse::<i64>().ok()) {
                        meta.mtime = secs;
                    }
                }
                "uid" => meta.uid = parse(ext.value().ok()).map(clamp).unwrap_or(meta.uid),
                "gid" => meta.gid = parse(ext.value().ok()).map(clamp).unwrap_or(meta.gid),
                _ => {
                    if let Some(name) = key.strip_prefix(XATTR_PAX_PREFIX) {
                        meta.xattrs.push(Xattr { name: name.as_bytes().to_vec(), value: ext.value_bytes().to_vec() });
                    }
                }
            }
        }
    }
    meta.xattrs.sort_by(|a, b| a.name.cmp(&b.name));
    meta.xattrs.dedup_by(|a, b| a.name == b.name);
    let total: usize = meta.xattrs.iter().map(|x| x.name.len() + x.value.len()).sum();
    if total > MAX_XATTR {
        return Err(io::Error::other(format!("extended attributes of over {MAX_XATTR} bytes")));
    }
    Ok(meta)
}

/// A numeric header field; an empty one (all NUL/space, as some writers
/// leave it) reads as 0, like Go's archive/tar does.
fn numeric(parsed: io::Result<u64>, raw: &[u8]) -> io::Result<u64> {
    match parsed {
        Err(_) if raw.iter().all(|&b| b == 0 || b == b' ') => Ok(0),
        other => other,
    }
}
