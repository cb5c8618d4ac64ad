//! Extended attributes as an erofs inline xattr body: name prefixes mapped
//! to the standard name indexes, entries packed after the body header.

use super::format::{
    self, XATTR_IBODY_HEADER_SIZE, XATTR_INDEX_NONE, XATTR_INDEX_POSIX_ACL_ACCESS, XATTR_INDEX_POSIX_ACL_DEFAULT,
    XATTR_INDEX_SECURITY, XATTR_INDEX_TRUSTED, XATTR_INDEX_USER,
};
use crate::pool::index::{Ino, Xattr};

/// Prefix → name index. Names matching none are stored whole under index 0,
/// which the format allows but the kernel does not show (its VFS knows no
/// handler for such names anyway).
const PREFIXES: &[(&[u8], u8)] =
    &[(b"user.", XATTR_INDEX_USER), (b"trusted.", XATTR_INDEX_TRUSTED), (b"security.", XATTR_INDEX_SECURITY)];

/// The name index and the stored rest of the name.
pub(crate) fn split_name(name: &[u8]) -> (u8, &[u8]) {
    match name {
        b"system.posix_acl_access" => return (XATTR_INDEX_POSIX_ACL_ACCESS, b""),
        b"system.posix_acl_default" => return (XATTR_INDEX_POSIX_ACL_DEFAULT, b""),
        _ => {}
    }
    PREFIXES
        .iter()
        .find_map(|(prefix, index)| name.strip_prefix(*prefix).map(|rest| (*index, rest)))
        .unwrap_or((XATTR_INDEX_NONE, name))
}

/// The full name an index and stored suffix stand for (None: unknown index).
#[cfg(test)]
pub(crate) fn full_name(index: u8, suffix: &[u8]) -> Option<Vec<u8>> {
    let prefix: &[u8] = match index {
        XATTR_INDEX_NONE => b"",
        XATTR_INDEX_USER => b"user.",
        XATTR_INDEX_POSIX_ACL_ACCESS => b"system.posix_acl_access",
        XATTR_INDEX_POSIX_ACL_DEFAULT => b"system.posix_acl_default",
        XATTR_INDEX_TRUSTED => b"trusted.",
        XATTR_INDEX_SECURITY => b"security.",
        _ => return None,
    };
    Some([prefix, suffix].concat())
}

/// The inline xattr body of inode `ino` (empty without xattrs). Attributes
/// erofs cannot hold (stored name over 255 bytes, value over 65535 bytes,
/// or past the 256 KiB an inode's body can describe) are skipped with a
/// warning; the second value counts them.
pub(crate) fn encode_ibody(ino: Ino, xattrs: &[Xattr]) -> (Vec<u8>, usize) {
    let mut body = Vec::new();
    let mut skipped = 0;
    for x in xattrs {
        let (index, suffix) = split_name(&x.name);
        let shown = String::from_utf8_lossy(&x.name);
        if suffix.len() > usize::from(u8::MAX) || x.value.len() > usize::from(u16::MAX) {
            tracing::warn!(ino, name = %shown, value_len = x.value.len(), "erofs: xattr too large, skipped");
            skipped += 1;
            continue;
        }
        let size = format::xattr_entry_size(suffix.len(), x.value.len());
        let start = body.len().max(XATTR_IBODY_HEADER_SIZE);
        if format::xattr_icount(start + size).is_none() {
            tracing::warn!(ino, name = %shown, "erofs: inode's xattrs exceed the inline body limit, skipped");
            skipped += 1;
            continue;
        }
        if body.is_empty() {
            body.resize(XATTR_IBODY_HEADER_SIZE, 0);
            format::encode_xattr_ibody_header(&mut body);
        }
        body.resize(start + size, 0);
        format::encode_xattr_entry(&mut body[start..], index, suffix, &x.value);
    }
    (body, skipped)
}

/// Parses an inline xattr body back into (full name, value) pairs, in
/// stored order. For tests and checks; None if malformed.
#[cfg(test)]
pub(crate) fn decode_ibody(body: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if body.is_empty() {
        return Some(Vec::new());
    }
    let shared = usize::from(*body.get(4)?);
    let mut at = XATTR_IBODY_HEADER_SIZE + 4 * shared;
    let mut out = Vec::new();
    while at < body.len() {
        let header = body.get(at..at + 4)?;
        let (name_len, index) = (usize::from(header[0]), header[1]);
        let value_len = usize::from(u16::from_le_bytes([header[2], header[3]]));
        let name = body.get(at + 4..at + 4 + name_len)?;
        let value = body.get(at + 4 + name_len..at + 4 + name_len + value_len)?;
        out.push((full_name(index, name)?, value.to_vec()));
        at += format::xattr_entry_size(name_len, value_len);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(name: &str, value: &[u8]) -> Xattr {
        Xattr { name: name.as_bytes().to_vec(), value: value.to_vec() }
    }

    #[test]
    fn prefixes() {
        assert_eq!(split_name(b"user.mime"), (1, &b"mime"[..]));
        assert_eq!(split_name(b"system.posix_acl_access"), (2, &b""[..]));
        assert_eq!(split_name(b"system.posix_acl_default"), (3, &b""[..]));
        assert_eq!(split_name(b"trusted.overlay.opaque"), (4, &b"overlay.opaque"[..]));
        assert_eq!(split_name(b"security.capability"), (6, &b"capability"[..]));
        assert_eq!(split_name(b"system.nfs4_acl"), (0, &b"system.nfs4_acl"[..]));
        assert_eq!(split_name(b"userx"), (0, &b"userx"[..]));
        for name in ["user.a", "system.posix_acl_access", "trusted.b", "security.c", "other.d"] {
            let (i, s) = split_name(name.as_bytes());
            assert_eq!(full_name(i, s).unwrap(), name.as_bytes());
        }
    }

    #[test]
    fn ibody_round_trip() {
        assert_eq!(encode_ibody(0, &[]), (Vec::new(), 0));
        let attrs = vec![
            x("security.capability", &[1, 0, 0, 2, 0x20, 0, 0, 0]),
            x("system.posix_acl_access", &[2, 0, 0, 0]),
            x("user.a", b"b"),
            x("weird.name", b""),
        ];
        let (body, skipped) = encode_ibody(0, &attrs);
        assert_eq!(skipped, 0);
        assert_eq!(body.len() % 4, 0);
        assert_eq!(body.len(), 12 + 24 + 8 + 8 + 16);
        let decoded = decode_ibody(&body).unwrap();
        let want: Vec<_> = attrs.iter().map(|a| (a.name.clone(), a.value.clone())).collect();
        assert_eq!(decoded, want);
    }

    #[test]
    fn oversized_are_skipped() {
        let long_name = format!("user.{}", "n".repeat(256));
        let attrs = vec![x(&long_name, b"v"), x("user.big", &vec![0; 70_000]), x("user.ok", b"v")];
        let (body, skipped) = encode_ibody(3, &attrs);
        assert_eq!(skipped, 2);
        assert_eq!(decode_ibody(&body).unwrap(), vec![(b"user.ok".to_vec(), b"v".to_vec())]);
        // Many maximal values: the body stops below the icount limit.
        let many: Vec<Xattr> = (0..6).map(|i| x(&format!("user.{i}"), &vec![1; 65_535])).collect();
        let (body, skipped) = encode_ibody(4, &many);
        assert_eq!(skipped, 3);
        assert!(format::xattr_icount(body.len()).is_some());
    }
}
