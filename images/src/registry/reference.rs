//! Registry image references: `[registry[:port]/]repo[:tag][@sha256:<hex>]`.
//!
//! The first path component is a registry host when it contains a `.` or a
//! `:`, is `localhost`, is a bracketed IPv6 address or has uppercase letters
//! (Docker's rule). Without one the image lives on Docker Hub, where
//! single-component names are in `library/`.

use super::error::RegistryError;
pub(crate) use crate::reference::is_sha256_digest;
use crate::reference::{valid_path_component, valid_tag, HUB_ALIASES};

/// Host the Docker Hub registry API is served from.
pub const DOCKER_HUB: &str = "registry-1.docker.io";
const DEFAULT_TAG: &str = "latest";
/// Longest accepted repository name (without registry and tag).
const MAX_NAME_LEN: usize = 255;

/// A parsed reference to an image on a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Host (and port) the registry API is served from: `registry-1.docker.io`,
    /// `localhost:5000`, `[::1]:5000`.
    pub registry: String,
    /// Repository path on that registry: `library/busybox`, `org/app`.
    pub repository: String,
    /// The tag; `latest` when neither a tag nor a digest was given.
    pub tag: Option<String>,
    /// `sha256:<hex>` when the image is pinned by digest.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses and validates a reference.
    pub fn parse(reference: &str) -> Result<Self, RegistryError> {
        let invalid = |reason: &str| RegistryError::InvalidReference {
            reference: reference.to_owned(),
            reason: reason.to_owned(),
        };
        if reference.is_empty() {
            return Err(invalid("empty reference"));
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                if !is_sha256_digest(digest) {
                    return Err(invalid("the digest must be sha256:<64 lowercase hex characters>"));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (reference, None),
        };
        // The tag follows the last ':' unless a '/' comes after it (then the ':' is a port).
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(invalid("invalid tag (letters, digits, '_', '.', '-'; at most 128)"));
            }
        }
        let (domain, path) = match name.split_once('/') {
            Some((first, rest)) if is_domain(first) => (Some(first), rest),
            _ => (None, name),
        };
        if let Some(d) = domain {
            if !valid_domain(d) {
                return Err(invalid("invalid registry host"));
            }
        }
        if !path.split('/').all(valid_path_component) {
            return Err(invalid(
                "invalid repository name (lowercase letters, digits and separators '.', '_', '__', '-' only)",
            ));
        }
        if path.len() > MAX_NAME_LEN {
            return Err(invalid("repository name too long"));
        }
        let (registry, repository) = match domain {
            Some(d) if !HUB_ALIASES.contains(&d) => (d.to_owned(), path.to_owned()),
            _ if !path.contains('/') => (DOCKER_HUB.to_owned(), format!("library/{path}")),
            _ => (DOCKER_HUB.to_owned(), path.to_owned()),
        };
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, Some(_)) => None,
            (None, None) => Some(DEFAULT_TAG.to_owned()),
        };
        Ok(ImageRef { registry, repository, tag, digest })
    }

    /// What to ask the manifest endpoint for: the digest if pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or(DEFAULT_TAG)
    }

    /// The registry host without port (and without IPv6 brackets).
    pub fn host(&self) -> &str {
        let r = self.registry.as_str();
        if let Some(inner) = r.strip_prefix('[') {
            return inner.split_once(']').map_or(inner, |(h, _)| h);
        }
        r.split_once(':').map_or(r, |(h, _)| h)
    }

    /// Whether the registry is on this machine (plain http is always allowed there).
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// Whether the image lives on Docker Hub.
    pub fn is_docker_hub(&self) -> bool {
        self.registry == DOCKER_HUB
    }

    /// The repository as the local image store spells it: `busybox`,
    /// `org/app`, `localhost:5000/busybox`.
    pub fn short_repository(&self) -> String {
        if self.is_docker_hub() {
            match self.repository.strip_prefix("library/") {
                Some(rest) if !rest.contains('/') => rest.to_owned(),
                _ => self.repository.clone(),
            }
        } else {
            format!("{}/{}", self.registry, self.repository)
        }
    }

    /// Normalized name: `repo:tag` when a tag was given (or implied),
    /// otherwise `repo@sha256:<hex>`.
    pub fn name(&self) -> String {
        match (&self.tag, &self.digest) {
            (Some(tag), _) => format!("{}:{tag}", self.short_repository()),
            (None, Some(digest)) => format!("{}@{digest}", self.short_repository()),
            (None, None) => format!("{}:{DEFAULT_TAG}", self.short_repository()),
        }
    }

    /// Fully qualified `registry/repo:tag` (Docker Hub as `docker.io`), when
    /// a tag is known.
    pub fn qualified_name(&self) -> Option<String> {
        let registry = if self.is_docker_hub() { "docker.io" } else { self.registry.as_str() };
        self.tag.as_ref().map(|tag| format!("{registry}/{}:{tag}", self.repository))
    }

    /// Token scope for pulling this repository.
    pub fn pull_scope(&self) -> String {
        format!("repository:{}:pull", self.repository)
    }
}

fn is_domain(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost" || first.starts_with('[') || first.contains(char::is_uppercase)
}

/// `host[:port]` with DNS-style labels, or `[ipv6][:port]`.
fn valid_domain(d: &str) -> bool {
    let (host, port) = if let Some(inner) = d.strip_prefix('[') {
        let Some((addr, after)) = inner.split_once(']') else {
            return false;
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return false,
            },
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(p) = port {
        if !p.bytes().all(|b| b.is_ascii_digit()) || !p.parse::<u16>().is_ok_and(|n| n > 0) {
            return false;
        }
    }
    let Some(host) = host else {
        return true; // a valid IPv6 address
    };
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

    fn r(registry: &str, repository: &str, tag: Option<&str>, digest: Option<&str>) -> ImageRef {
        ImageRef {
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.map(Into::into),
            digest: digest.map(Into::into),
        }
    }

    #[test]
    fn parses_registry_repo_tag() {
        let d = format!("sha256:{HEX}");
        let table = [
            ("busybox", r(DOCKER_HUB, "library/busybox", Some("latest"), None)),
            ("busybox:1.36", r(DOCKER_HUB, "library/busybox", Some("1.36"), None)),
            ("library/busybox", r(DOCKER_HUB, "library/busybox", Some("latest"), None)),
            ("docker.io/busybox", r(DOCKER_HUB, "library/busybox", Some("latest"), None)),
            ("index.docker.io/foo/bar:v1", r(DOCKER_HUB, "foo/bar", Some("v1"), None)),
            ("foo/bar", r(DOCKER_HUB, "foo/bar", Some("latest"), None)),
            ("localhost/img", r("localhost", "img", Some("latest"), None)),
            ("localhost:5000/x", r("localhost:5000", "x", Some("latest"), None)),
            ("127.0.0.1:5000/x", r("127.0.0.1:5000", "x", Some("latest"), None)),
            ("127.0.0.1:5000/a/b/c:dev", r("127.0.0.1:5000", "a/b/c", Some("dev"), None)),
            ("[::1]:5000/x:1", r("[::1]:5000", "x", Some("1"), None)),
            ("ghcr.io/org/img", r("ghcr.io", "org/img", Some("latest"), None)),
            ("Registry/img", r("Registry", "img", Some("latest"), None)),
        ];
        for (input, want) in table {
            assert_eq!(ImageRef::parse(input).unwrap(), want, "input {input}");
        }
        let pinned = ImageRef::parse(&format!("busybox@{d}")).unwrap();
        assert_eq!(pinned, r(DOCKER_HUB, "library/busybox", None, Some(&d)));
        assert_eq!(pinned.manifest_reference(), d);
        let both = ImageRef::parse(&format!("localhost:5000/x:v2@{d}")).unwrap();
        assert_eq!(both, r("localhost:5000", "x", Some("v2"), Some(&d)));
        assert_eq!(both.manifest_reference(), d);
    }

    #[test]
    fn names_and_hosts() {
        let p = |s: &str| ImageRef::parse(s).unwrap();
        assert_eq!(p("busybox").name(), "busybox:latest");
        assert_eq!(p("docker.io/library/busybox:1").qualified_name().unwrap(), "docker.io/library/busybox:1");
        assert_eq!(p("library/foo/bar").name(), "library/foo/bar:latest");
        assert_eq!(p("foo/bar:2").name(), "foo/bar:2");
        assert_eq!(p("localhost:5000/busybox").name(), "localhost:5000/busybox:latest");
        let d = format!("sha256:{HEX}");
        assert_eq!(p(&format!("127.0.0.1:5000/b@{d}")).name(), format!("127.0.0.1:5000/b@{d}"));
        assert_eq!(p(&format!("127.0.0.1:5000/b@{d}")).qualified_name(), None);
        assert_eq!(p("localhost:5000/x").host(), "localhost");
        assert_eq!(p("[::1]:5000/x").host(), "::1");
        assert_eq!(p("ghcr.io/a/b").host(), "ghcr.io");
        for local in ["localhost/x", "localhost:5000/x", "127.0.0.1:5000/x", "127.0.0.9/x", "[::1]:5000/x", "[::1]/x"] {
            assert!(p(local).is_loopback(), "{local}");
        }
        for remote in ["busybox", "ghcr.io/a/b", "10.0.0.1:5000/x", "localhost.example.com/x"] {
            assert!(!p(remote).is_loopback(), "{remote}");
        }
        assert!(p("busybox").is_docker_hub());
        assert_eq!(p("ghcr.io/a/b").pull_scope(), "repository:a/b:pull");
    }

    #[test]
    fn refuses_malformed_references() {
        for bad in [
            "",
            "Busybox",
            "busybox:",
            "busybox:-x",
            "a//b",
            "/busybox",
            "busybox/",
            "bad_-sep",
            "foo bar",
            "has..dots",
            "x@sha256:1234",
            "x@sha512:00",
            "host:99999/x",
            "host:/x",
            "[::1/x",
            "[zz]:5000/x",
            "-host.com/x",
            "x:tag@",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(ImageRef::parse(&"a".repeat(300)).is_err());
        let err = ImageRef::parse("x@sha256:1234").unwrap_err().to_string();
        assert!(err.contains("sha256:<64"), "{err}");
    }

    #[test]
    fn sha256_digests() {
        assert!(is_sha256_digest(&format!("sha256:{HEX}")));
        assert!(!is_sha256_digest(&format!("sha256:{}", HEX.to_uppercase())));
        assert!(!is_sha256_digest("sha256:../../etc/passwd"));
        assert!(!is_sha256_digest(HEX));
    }
}
