//! The finished tree as index inodes: reachable nodes numbered breadth-first
//! from the root, link counts computed, unreachable nodes dropped, file
//! content placed in that order.

use std::collections::{HashMap, VecDeque};

use super::node::{Kind, NodeId, Nodes, ROOT};
use super::ContentSink;
use crate::pool::index::{Data, Dirent, Ino, Inode};

pub(super) fn flatten(nodes: &Nodes, sink: &mut dyn ContentSink) -> std::io::Result<Vec<Inode>> {
    // Number reachable nodes; a hardlinked node keeps its first number.
    let mut ino_of: HashMap<NodeId, Ino> = HashMap::new();
    let mut order: Vec<(NodeId, Ino)> = Vec::new(); // (node, parent ino)
    let mut links: Vec<u32> = Vec::new();
    let mut queue = VecDeque::from([(ROOT, 0 as Ino)]);
    ino_of.insert(ROOT, 0);
    order.push((ROOT, 0));
    links.push(2);
    while let Some((id, ino)) = queue.pop_front() {
        let Some(children) = nodes.children(id) else { continue };
        for &child in children.values() {
            if let Some(&existing) = ino_of.get(&child) {
                links[existing as usize] += 1;
                continue;
            }
            let child_ino = order.len() as Ino;
            ino_of.insert(child, child_ino);
            order.push((child, ino));
            let is_dir = nodes.get(child).is_dir();
            links.push(if is_dir { 2 } else { 1 });
            if is_dir {
                links[ino as usize] += 1;
                queue.push_back((child, child_ino));
            }
        }
    }
    order
        .iter()
        .zip(links)
        .map(|(&(id, parent), nlink)| {
            let node = nodes.get(id);
            let data = match &node.kind {
                Kind::Dir(children) => Data::Dir {
                    parent,
                    entries: children.iter().map(|(name, c)| Dirent { name: name.clone(), ino: ino_of[c] }).collect(),
                },
                Kind::File(c) => Data::File { size: c.size, digest: c.digest, extents: sink.place(c)? },
                Kind::Symlink(t) => Data::Symlink { target: t.clone() },
                Kind::Device(_, rdev) => Data::Device { rdev: *rdev },
                Kind::Fifo => Data::Fifo,
            };
            Ok(Inode {
                mode: node.type_bits() | node.meta.mode,
                uid: node.meta.uid,
                gid: node.meta.gid,
                mtime: node.meta.mtime,
                nlink,
                xattrs: node.meta.xattrs.clone(),
                data,
            })
        })
        .collect()
}
