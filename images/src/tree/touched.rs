//! The paths one layer created or kept (and their parents), which an opaque
//! marker in that layer spares. Stored as a trie of names — each prefix once
//! — so an entry of depth d costs O(d), not O(d²).

use std::collections::HashMap;

/// A path prefix: 0 is the image root.
pub(crate) type PathId = u32;
pub(crate) const ROOT: PathId = 0;

#[derive(Default)]
pub(crate) struct Touched {
    ids: HashMap<(PathId, Vec<u8>), PathId>,
}

impl Touched {
    /// Marks `comps` and all its ancestors.
    pub(crate) fn mark(&mut self, comps: &[Vec<u8>]) {
        let mut at = ROOT;
        for c in comps {
            let next = self.ids.len() as PathId + 1;
            at = *self.ids.entry((at, c.clone())).or_insert(next);
        }
    }

    /// The id of `comps` if it was marked.
    pub(crate) fn find(&self, comps: &[Vec<u8>]) -> Option<PathId> {
        comps.iter().try_fold(ROOT, |at, c| self.child(at, c))
    }

    /// The id of `name` under `parent` if it was marked.
    pub(crate) fn child(&self, parent: PathId, name: &[u8]) -> Option<PathId> {
        self.ids.get(&(parent, name.to_vec())).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_marked_once() {
        let mut t = Touched::default();
        let p = |s: &str| s.split('/').map(|c| c.as_bytes().to_vec()).collect::<Vec<_>>();
        t.mark(&p("a/b/c"));
        t.mark(&p("a/b/d"));
        assert_eq!(t.ids.len(), 4);
        let ab = t.find(&p("a/b")).unwrap();
        assert!(t.child(ab, b"c").is_some() && t.child(ab, b"x").is_none());
        assert!(t.find(&p("a/x")).is_none());
        // Depth 10,000 costs 10,000 entries.
        let deep: Vec<Vec<u8>> = (0..10_000).map(|_| b"a".to_vec()).collect();
        let mut t = Touched::default();
        t.mark(&deep);
        assert_eq!(t.ids.len(), 10_000);
    }
}
