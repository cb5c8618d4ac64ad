//! The tree being built: an arena of nodes. A node is an inode; directory
//! children are names pointing at nodes, so a hardlink is two names for one
//! node. Removed nodes stay in the arena, unreachable, and are dropped when
//! the tree is flattened.

use std::collections::BTreeMap;

use crate::pool::index::{Xattr, S_IFDIR};
use crate::pool::FileContent;

pub(crate) type NodeId = usize;
pub(crate) const ROOT: NodeId = 0;

#[derive(Clone, Debug)]
pub(crate) struct Meta {
    /// Permission bits (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub xattrs: Vec<Xattr>,
}

impl Meta {
    /// Directories created implicitly (a parent no entry named): root-owned
    /// 0755, as container runtimes do.
    pub(crate) fn implicit_dir() -> Meta {
        Meta { mode: 0o755, uid: 0, gid: 0, mtime: 0, xattrs: Vec::new() }
    }
}

#[derive(Debug)]
pub(crate) enum Kind {
    Dir(BTreeMap<Vec<u8>, NodeId>),
    File(FileContent),
    Symlink(Vec<u8>),
    /// Type bits (`S_IFCHR`/`S_IFBLK`) and device number.
    Device(u32, u64),
    Fifo,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub meta: Meta,
    pub kind: Kind,
}

impl Node {
    pub(crate) fn dir(meta: Meta) -> Node {
        Node { meta, kind: Kind::Dir(BTreeMap::new()) }
    }
    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir(_))
    }
    pub(crate) fn type_bits(&self) -> u32 {
        use crate::pool::index::{S_IFIFO, S_IFLNK, S_IFREG};
        match &self.kind {
            Kind::Dir(_) => S_IFDIR,
            Kind::File(_) => S_IFREG,
            Kind::Symlink(_) => S_IFLNK,
            Kind::Device(t, _) => *t,
            Kind::Fifo => S_IFIFO,
        }
    }
}

/// The arena.
pub(crate) struct Nodes {
    pub nodes: Vec<Node>,
}

impl Nodes {
    pub(crate) fn new() -> Nodes {
        Nodes { nodes: vec![Node::dir(Meta::implicit_dir())] }
    }
    pub(crate) fn add(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
    pub(crate) fn get(&self, id: NodeId) -> &Node {
        &self.nodes[id]
    }
    pub(crate) fn get_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id]
    }
    pub(crate) fn children(&self, dir: NodeId) -> Option<&BTreeMap<Vec<u8>, NodeId>> {
        match &self.nodes[dir].kind {
            Kind::Dir(c) => Some(c),
            _ => None,
        }
    }
    pub(crate) fn children_mut(&mut self, dir: NodeId) -> Option<&mut BTreeMap<Vec<u8>, NodeId>> {
        match &mut self.nodes[dir].kind {
            Kind::Dir(c) => Some(c),
            _ => None,
        }
    }
    pub(crate) fn child(&self, dir: NodeId, name: &[u8]) -> Option<NodeId> {
        self.children(dir).and_then(|c| c.get(name).copied())
    }
}
