//! Path resolution inside the tree being built, with the semantics of
//! `openat2(RESOLVE_IN_ROOT)`: the image root is `/` for the lookup, so
//! absolute symlinks and `..` stay inside the image whatever earlier layers
//! put there. Nothing here touches the host file system.

use std::collections::VecDeque;

use super::node::{Kind, Meta, Node, NodeId, Nodes, ROOT};

/// Most symlinks followed in one resolution (as Linux's MAXSYMLINKS).
const MAX_SYMLINKS: u32 = 40;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ResolveError {
    /// A component is missing (only when not creating).
    NotFound,
    /// A component is neither a directory nor a symlink to one.
    NotDir,
    /// Too many symlinks.
    Loop,
}

impl ResolveError {
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            ResolveError::NotFound => "a parent directory does not exist",
            ResolveError::NotDir => "a parent path component is not a directory",
            ResolveError::Loop => "too many levels of symbolic links",
        }
    }
}

/// Splits an archive path into clean components: leading `/` and `.`/empty
/// components are dropped; `..` anywhere or a NUL byte is refused with the
/// reason as the error.
pub(crate) fn clean(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".to_owned());
    }
    let mut out = Vec::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("path contains a '..' component".to_owned()),
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

/// Resolves the directory `comps`, following symlinks inside the tree. With
/// `create`, missing directories (including the dangling end of a symlink
/// chain) are created as implicit directories.
pub(crate) fn resolve_dir(nodes: &mut Nodes, comps: &[Vec<u8>], create: bool) -> Result<NodeId, ResolveError> {
    let mut todo: VecDeque<Vec<u8>> = comps.iter().cloned().collect();
    // The directories walked so far, so that `..` from a symlink target works.
    let mut stack: Vec<NodeId> = vec![ROOT];
    let mut followed = 0u32;
    while let Some(comp) = todo.pop_front() {
        let here = *stack.last().unwrap_or(&ROOT);
        match comp.as_slice() {
            b"" | b"." => continue,
            b".." => {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            _ => {}
        }
        let next = match nodes.child(here, &comp) {
            Some(id) => id,
            None if create => {
                let id = nodes.add(Node::dir(Meta::implicit_dir()));
                nodes.children_mut(here).ok_or(ResolveError::NotDir)?.insert(comp, id);
                id
            }
            None => return Err(ResolveError::NotFound),
        };
        match &nodes.get(next).kind {
            Kind::Dir(_) => stack.push(next),
            Kind::Symlink(target) => {
                followed += 1;
                if followed > MAX_SYMLINKS {
                    return Err(ResolveError::Loop);
                }
                if target.starts_with(b"/") {
                    stack.truncate(1);
                }
                for c in target.split(|&b| b == b'/').rev() {
                    todo.push_front(c.to_vec());
                }
            }
            _ => return Err(ResolveError::NotDir),
        }
    }
    Ok(*stack.last().unwrap_or(&ROOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symlink(nodes: &mut Nodes, dir: NodeId, name: &str, target: &str) {
        let id = nodes.add(Node { meta: Meta::implicit_dir(), kind: Kind::Symlink(target.as_bytes().to_vec()) });
        nodes.children_mut(dir).unwrap().insert(name.as_bytes().to_vec(), id);
    }

    fn comps(p: &str) -> Vec<Vec<u8>> {
        clean(p.as_bytes()).unwrap()
    }

    #[test]
    fn clean_refuses_dotdot_and_nul() {
        assert_eq!(comps("/a/./b//c/"), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert!(clean(b"a/../b").is_err());
        assert!(clean(b"a\0b").is_err());
    }

    #[test]
    fn symlinks_resolve_inside_the_tree() {
        let mut n = Nodes::new();
        let etc = resolve_dir(&mut n, &comps("etc"), true).unwrap();
        symlink(&mut n, ROOT, "abs", "/etc");
        symlink(&mut n, ROOT, "up", "../../../../etc");
        assert_eq!(resolve_dir(&mut n, &comps("abs"), false), Ok(etc));
        assert_eq!(resolve_dir(&mut n, &comps("up"), false), Ok(etc));
        symlink(&mut n, ROOT, "loop", "loop");
        assert_eq!(resolve_dir(&mut n, &comps("loop/x"), true), Err(ResolveError::Loop));
        // A dangling chain is created inside.
        symlink(&mut n, ROOT, "dang", "/new/deep");
        let deep = resolve_dir(&mut n, &comps("dang"), true).unwrap();
        assert_eq!(resolve_dir(&mut n, &comps("new/deep"), false), Ok(deep));
        assert_eq!(resolve_dir(&mut n, &comps("missing"), false), Err(ResolveError::NotFound));
    }
}
