//! The JSON documents and names of a pull (`pvisor_images::fuzzing`,
//! `normalize_name`, `registry::ImageRef`): a registry's manifest or image
//! index (as served under any of the content types a registry sends), the
//! image config blob, and the image reference a client names.
//!
//! The first byte picks the content type and platform; the rest is the
//! document, also read as a config and as a reference.
//!
//! Invariants: a manifest that parses names only `sha256:<64 hex>` digests;
//! a platform picked from an index is one of its entries; a normalized name
//! is a fixed point of normalization and parses as a registry reference; a
//! parsed reference has a registry and a repository.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pvisor_images::fuzzing::{image_config, registry_manifest, ManifestSummary};
use pvisor_images::normalize_name;
use pvisor_images::registry::ImageRef;

const CONTENT_TYPES: [&str; 6] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/json",
    "",
];
const PLATFORMS: [(&str, &str); 3] = [("linux", "amd64"), ("linux", "arm64"), ("unknown", "unknown")];

fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, doc)) = data.split_first() else { return };
    let content_type = CONTENT_TYPES[usize::from(pick) % CONTENT_TYPES.len()];
    let platform = PLATFORMS[usize::from(pick >> 4) % PLATFORMS.len()];
    match registry_manifest(doc, content_type, platform) {
        Ok(ManifestSummary::Image { config, layers }) => {
            assert!(is_sha256(&config), "config digest {config:?}");
            assert!(layers.iter().all(|l| is_sha256(l)), "layer digests {layers:?}");
        }
        Ok(ManifestSummary::Index { entries, picked }) => {
            assert!(picked.is_none() || entries > 0);
            assert!(picked.as_deref().is_none_or(is_sha256), "picked {picked:?}");
        }
        Err(_) => {}
    }
    if let Ok((config, diff_ids)) = image_config(doc) {
        let _ = (config, diff_ids);
    }
    let Ok(name) = std::str::from_utf8(doc) else { return };
    if let Ok(normal) = normalize_name(name) {
        assert_eq!(normalize_name(&normal).ok().as_deref(), Some(normal.as_str()), "normalizing {name:?} twice");
        let r = ImageRef::parse(&normal).unwrap_or_else(|e| panic!("{normal:?} normalized but does not parse: {e}"));
        assert!(!r.registry.is_empty() && !r.repository.is_empty());
    }
    if let Ok(r) = ImageRef::parse(name) {
        assert!(!r.registry.is_empty() && !r.repository.is_empty(), "{name:?} parsed as {r:?}");
    }
});
