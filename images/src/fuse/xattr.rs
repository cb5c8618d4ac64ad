//! Extended attributes from the index, with the size-probing protocol of getxattr(2) and
//! listxattr(2): a request with size 0 asks for the length, a buffer too small is `ERANGE`.

use fuser::Errno;

use crate::pool::index::Inode;

/// Prefixes of attributes that overlayfs interprets on its layers (redirects, metacopy,
/// whiteouts, opacity). This mount is an overlay's lower layer, and an image must not steer the
/// overlay of its sandbox, so they are never shown.
const HIDDEN: [&[u8]; 2] = [b"trusted.overlay.", b"user.overlay."];

/// Whether an attribute of the image is shown.
pub(crate) fn visible(name: &[u8]) -> bool {
    !HIDDEN.iter().any(|p| name.starts_with(p))
}

/// The value of attribute `name`, if the inode has it (and it is shown).
pub(crate) fn get<'a>(inode: &'a Inode, name: &[u8]) -> Option<&'a [u8]> {
    if !visible(name) {
        return None;
    }
    let i = inode.xattrs.binary_search_by(|x| x.name.as_slice().cmp(name)).ok()?;
    Some(&inode.xattrs[i].value)
}

/// The names of the inode's shown attributes, each NUL-terminated, as listxattr returns them.
pub(crate) fn list(inode: &Inode) -> Vec<u8> {
    let mut out = Vec::new();
    for x in inode.xattrs.iter().filter(|x| visible(&x.name)) {
        out.extend_from_slice(&x.name);
        out.push(0);
    }
    out
}

/// What to answer for a value of this length to a request with buffer `size`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The caller probes for the length.
    Size(u32),
    /// The value fits.
    Data,
}

pub(crate) fn answer(len: usize, size: u32) -> Result<Answer, Errno> {
    let len32 = u32::try_from(len).map_err(|_| Errno::E2BIG)?;
    if size == 0 {
        Ok(Answer::Size(len32))
    } else if len32 > size {
        Err(Errno::ERANGE)
    } else {
        Ok(Answer::Data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::index::{Data, Xattr};

    fn inode(names: &[&str]) -> Inode {
        let mut xattrs: Vec<Xattr> =
            names.iter().map(|n| Xattr { name: n.as_bytes().to_vec(), value: format!("v:{n}").into_bytes() }).collect();
        xattrs.sort_by(|a, b| a.name.cmp(&b.name));
        Inode { mode: 0o100644, uid: 0, gid: 0, mtime: 0, nlink: 1, xattrs, data: Data::Fifo }
    }

    #[test]
    fn lists_and_gets_what_is_visible() {
        let i = inode(&["user.a", "trusted.overlay.opaque", "security.capability", "user.overlay.redirect"]);
        assert_eq!(list(&i), b"security.capability\0user.a\0");
        assert_eq!(get(&i, b"user.a"), Some(b"v:user.a".as_slice()));
        assert_eq!(get(&i, b"user.b"), None);
        assert_eq!(get(&i, b"trusted.overlay.opaque"), None);
        assert_eq!(get(&i, b"user.overlay.redirect"), None);
    }

    #[test]
    fn size_probing() {
        assert_eq!(answer(5, 0), Ok(Answer::Size(5)));
        assert_eq!(answer(5, 4), Err(Errno::ERANGE));
        assert_eq!(answer(5, 5), Ok(Answer::Data));
        assert_eq!(answer(0, 0), Ok(Answer::Size(0)));
        assert_eq!(answer(0, 8), Ok(Answer::Data));
    }
}
