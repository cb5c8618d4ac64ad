//! Image reference parsing and normalization.
//!
//! Names are stored in their short, familiar form: `busybox:latest`,
//! `foo/bar:1.0`, `ghcr.io/org/img:v1`. Docker Hub spellings
//! (`docker.io/library/busybox`, `index.docker.io/foo/bar`, `registry-1.docker.io/x/y`, `library/busybox`)
//! collapse onto that form, and a missing tag means `latest`.

use crate::error::{Error, Result};

/// Longest accepted repository name (without tag), as in the distribution spec.
const MAX_NAME_LEN: usize = 255;
const DEFAULT_TAG: &str = "latest";

/// What a user-supplied reference points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reference {
    /// A normalized `repo:tag` name.
    Name(String),
    /// A full image id, `sha256:<64 hex>` (plain id or the digest of `name@sha256:...`).
    Id(String),
    /// 12..63 lowercase hex characters: a name if one exists with that spelling,
    /// otherwise an image id prefix.
    Prefix { name: Option<String>, prefix: String },
}

/// Normalizes an image name (`repo[:tag]`) to the form stored in the name table.
///
/// `busybox` → `busybox:latest`, `docker.io/library/busybox:1` → `busybox:1`,
/// `docker.io/foo/bar` → `foo/bar:latest`. Digest references are refused here
/// (they do not name anything; see [`crate::Pool::resolve`]).
pub fn normalize_name(reference: &str) -> Result<String> {
    let invalid = |reason: &str| Error::InvalidReference { reference: reference.to_owned(), reason: reason.to_owned() };
    if reference.is_empty() {
        return Err(invalid("empty reference"));
    }
    if reference.contains('@') {
        return Err(invalid("digest references cannot be used as names"));
    }
    // The tag follows the last ':' unless a '/' comes after it (then the ':' is a port).
    let (repo, tag) = match reference.rfind(':') {
        Some(i) if !reference[i + 1..].contains('/') => (&reference[..i], &reference[i + 1..]),
        _ => (reference, DEFAULT_TAG),
    };
    if !valid_tag(tag) {
        return Err(invalid("invalid tag"));
    }
    let (domain, path) = split_domain(repo);
    if let Some(d) = domain {
        if !valid_domain(d) {
            return Err(invalid("invalid registry host"));
        }
    }
    let components: Vec<&str> = path.split('/').collect();
    if components.iter().any(|c| !valid_path_component(c)) {
        return Err(invalid(
            "invalid repository name (lowercase letters, digits and separators '.', '_', '__', '-' only)",
        ));
    }
    let is_hub = domain.is_none_or(|d| HUB_ALIASES.contains(&d));
    let path = if is_hub && components.len() == 2 && components[0] == "library" { components[1] } else { path };
    let name = match domain {
        Some(d) if !is_hub => format!("{d}/{path}"),
        // A Hub repository whose first component reads as a host keeps the
        // Hub's name, or normalizing again would move it to that host (found
        // by the image_manifest fuzz target: `docker.io/docker.io/x`).
        _ if split_domain(path).0.is_some() => format!("docker.io/{path}"),
        _ => path.to_owned(),
    };
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("repository name too long"));
    }
    Ok(format!("{name}:{tag}"))
}

/// Parses any accepted reference form.
pub(crate) fn parse(reference: &str) -> Result<Reference> {
    if let Some(hex) = reference.strip_prefix("sha256:") {
        if is_hex(hex) && hex.len() == 64 {
            return Ok(Reference::Id(reference.to_owned()));
        }
        return Err(Error::InvalidReference {
            reference: reference.to_owned(),
            reason: "image id must be sha256:<64 lowercase hex characters>".to_owned(),
        });
    }
    if is_hex(reference) && reference.len() == 64 {
        return Ok(Reference::Id(format!("sha256:{reference}")));
    }
    if is_hex(reference) && (12..64).contains(&reference.len()) {
        return Ok(Reference::Prefix { name: normalize_name(reference).ok(), prefix: reference.to_owned() });
    }
    if let Some((name, digest)) = reference.split_once('@') {
        // The name part must be well formed, but the digest alone decides.
        normalize_name(name)?;
        if !is_sha256_digest(digest) {
            return Err(Error::InvalidReference {
                reference: reference.to_owned(),
                reason: "only sha256:<64 hex> digests are supported".to_owned(),
            });
        }
        return Ok(Reference::Id(digest.to_owned()));
    }
    Ok(Reference::Name(normalize_name(reference)?))
}

/// Splits a registry host off a repository path, following Docker's rule:
/// the first component is a host if it contains '.' or ':', is `localhost`,
/// or has uppercase letters.
fn split_domain(repo: &str) -> (Option<&str>, &str) {
    match repo.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (Some(first), rest)
        }
        _ => (None, repo),
    }
}

/// The names Docker Hub goes by in references.
pub(crate) const HUB_ALIASES: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// `sha256:` followed by 64 lowercase hex digits.
pub(crate) fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64 && is_hex(hex))
}

pub(crate) fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `[\w][\w.-]{0,127}`
pub(crate) fn valid_tag(tag: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && word(bytes[0])
        && bytes.iter().all(|&b| word(b) || b == b'.' || b == b'-')
}

/// `[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*`
pub(crate) fn valid_path_component(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or one or more '-'.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Host name components separated by '.', with an optional `:port`.
fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    // A port is 1..=65535, as the registry client requires (found by the
    // image_manifest fuzz target: `host:505000/x` was a valid name here but
    // no reference to pull).
    if let Some(p) = port {
        if !p.bytes().all(|b| b.is_ascii_digit()) || !p.parse::<u16>().is_ok_and(|n| n > 0) {
            return false;
        }
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn normalization_table() {
        let table = [
            ("busybox", "busybox:latest"),
            ("busybox:1.36", "busybox:1.36"),
            ("library/busybox", "busybox:latest"),
            ("docker.io/library/busybox:latest", "busybox:latest"),
            ("docker.io/busybox", "busybox:latest"),
            ("index.docker.io/library/busybox:musl", "busybox:musl"),
            ("registry-1.docker.io/library/alpine:3", "alpine:3"),
            ("docker.io/foo/bar", "foo/bar:latest"),
            ("foo/bar:v1", "foo/bar:v1"),
            ("library/foo/bar", "library/foo/bar:latest"),
            ("ghcr.io/org/img", "ghcr.io/org/img:latest"),
            ("ghcr.io/library/img:x", "ghcr.io/library/img:x"),
            ("localhost/img", "localhost/img:latest"),
            ("localhost:5000/img:dev", "localhost:5000/img:dev"),
            ("registry.example.com:443/a/b/c:1_2-3.4", "registry.example.com:443/a/b/c:1_2-3.4"),
            ("my-app__x.y:TAG", "my-app__x.y:TAG"),
        ];
        for (input, want) in table {
            assert_eq!(normalize_name(input).unwrap(), want, "input {input}");
            assert_eq!(parse(input).unwrap(), Reference::Name(want.to_owned()));
        }
    }

    #[test]
    fn invalid_names() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "a//b",
            "/busybox",
            "busybox/",
            "bad_-sep",
            "-lead",
            "a:b:c/d",
            "foo bar",
            "has..dots",
            "x@sha256:1234",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
        let long = "a".repeat(300);
        assert!(normalize_name(&long).is_err());
    }

    #[test]
    fn normalizing_is_idempotent_for_hub_repositories_named_like_hosts() {
        for name in ["docker.io/docker.io/8ro.36", "docker.io/localhost/x:1", "docker.io/a.b/c"] {
            let once = normalize_name(name).unwrap();
            assert!(once.starts_with("docker.io/"), "{name:?} gave {once:?}");
            assert_eq!(normalize_name(&once).unwrap(), once, "{name:?}");
        }
        assert_eq!(normalize_name("docker.io/library/busybox").unwrap(), "busybox:latest");
    }

    #[test]
    fn registry_ports_are_real_ports() {
        assert_eq!(normalize_name("host:5000/a").unwrap(), "host:5000/a:latest");
        assert_eq!(normalize_name("host:65535/a:v1").unwrap(), "host:65535/a:v1");
        for bad in ["host:505000/a", "loca:505000/oop00/oca:org", "host:0/a", "host:/a", "host:65536/a"] {
            assert!(normalize_name(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn ids_and_digests() {
        let id = format!("sha256:{HEX}");
        assert_eq!(parse(&id).unwrap(), Reference::Id(id.clone()));
        assert_eq!(parse(HEX).unwrap(), Reference::Id(id.clone()));
        assert_eq!(parse(&format!("busybox@{id}")).unwrap(), Reference::Id(id.clone()));
        assert_eq!(parse(&format!("docker.io/library/busybox:1@{id}")).unwrap(), Reference::Id(id.clone()));
        assert_eq!(
            parse("0123456789ab").unwrap(),
            Reference::Prefix { name: Some("0123456789ab:latest".to_owned()), prefix: "0123456789ab".to_owned() }
        );
        // 11 hex chars is just a name.
        assert_eq!(parse("0123456789a").unwrap(), Reference::Name("0123456789a:latest".to_owned()));
        assert!(parse("sha256:abc").is_err());
        assert!(parse(&format!("sha256:{}", HEX.to_uppercase())).is_err());
        assert!(parse("busybox@sha512:00").is_err());
    }
}
