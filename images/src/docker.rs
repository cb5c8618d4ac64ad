//! docker-archive (`docker save`) format: `manifest.json` lists, per image,
//! its config file, tags and layer tarballs. Layers are checked against the
//! config's `rootfs.diff_ids` (digests of the uncompressed tars).

use serde::Deserialize;

use crate::archive::{member_name, sha256_digest, Archive, ImagePlan, LayerCheck, LayerPlan};
use crate::config;
use crate::error::{Error, Result};
use crate::reference::{is_hex, normalize_name};

#[derive(Deserialize)]
struct ManifestEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Option<Vec<String>>,
}

/// The digest a member name encodes, if it follows docker's naming
/// (`<hex>.json`, `<hex>/layer.tar`'s config sibling, `blobs/sha256/<hex>`).
fn digest_from_name(name: &str) -> Option<String> {
    let hex = name.strip_suffix(".json").or_else(|| name.strip_prefix("blobs/sha256/"))?;
    (hex.len() == 64 && is_hex(hex)).then(|| format!("sha256:{hex}"))
}

/// Lists the images of a docker-archive.
pub(crate) fn plan(ar: &Archive) -> Result<Vec<ImagePlan>> {
    let manifest = ar.read_small("manifest.json")?;
    let entries: Vec<ManifestEntry> = serde_json::from_slice(&manifest)
        .map_err(|e| Error::bad(Some("manifest.json"), format!("invalid JSON: {e}")))?;
    if entries.is_empty() {
        return Err(Error::bad(Some("manifest.json"), "lists no images"));
    }
    let mut plans = Vec::with_capacity(entries.len());
    for entry in entries {
        let config_name = member_name(&entry.config);
        let bytes = ar.read_small(&config_name)?;
        let id = sha256_digest(&bytes);
        if let Some(expected) = digest_from_name(&config_name) {
            if expected != id {
                return Err(Error::DigestMismatch { blob: config_name, expected, actual: id });
            }
        }
        let parsed = config::parse(&bytes, &config_name)?;
        let layers = entry.layers.unwrap_or_default();
        if parsed.diff_ids.len() != layers.len() {
            return Err(Error::bad(
                Some(&config_name),
                format!(
                    "config lists {} layer diff_ids but manifest.json lists {} layers",
                    parsed.diff_ids.len(),
                    layers.len()
                ),
            ));
        }
        let layers = layers
            .iter()
            .zip(&parsed.diff_ids)
            .map(|(member, diff_id)| LayerPlan {
                member: member_name(member),
                check: LayerCheck::DiffId(diff_id.clone()),
            })
            .collect();
        let mut names = Vec::new();
        for tag in entry.repo_tags.unwrap_or_default() {
            let name = normalize_name(&tag)
                .map_err(|e| Error::bad(Some("manifest.json"), format!("invalid RepoTags entry: {e}")))?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
        plans.push(ImagePlan { id, names, config: parsed.config, manifest_digests: Vec::new(), layers });
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_names() {
        let hex = "ab".repeat(32);
        assert_eq!(digest_from_name(&format!("{hex}.json")), Some(format!("sha256:{hex}")));
        assert_eq!(digest_from_name(&format!("blobs/sha256/{hex}")), Some(format!("sha256:{hex}")));
        assert_eq!(digest_from_name("config.json"), None);
        assert_eq!(digest_from_name("blobs/sha256/abc"), None);
    }
}
