//! OCI image layout: `index.json` → manifest (or image index, from which the
//! host platform's manifest is picked) → config and layer blobs, each
//! verified against its descriptor's sha256 digest and size.

use std::collections::HashMap;

use serde::Deserialize;

use crate::archive::{sha256_digest, Archive, ImagePlan, LayerCheck, LayerPlan, MAX_JSON};
use crate::config;
use crate::error::{Error, Result};
use crate::reference::{is_hex, normalize_name};

const ANN_REF_NAME: &str = "org.opencontainers.image.ref.name";
const ANN_CONTAINERD_NAME: &str = "io.containerd.image.name";
/// Nested image indexes followed at most.
const MAX_INDEX_DEPTH: u32 = 4;

const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const MT_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const CONFIG_TYPES: [&str; 2] =
    ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];

#[derive(Clone, Debug, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Clone, Debug, Deserialize)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// Just enough of a JSON blob to tell an index from a manifest.
#[derive(Deserialize)]
struct Probe {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
    #[serde(default)]
    config: Option<serde_json::Value>,
}

/// The architecture name OCI uses for this host.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn is_host_platform(p: &Platform) -> bool {
    p.os == "linux" && p.architecture == host_arch()
}

/// `blobs/<alg>/<hex>` for a digest; only sha256 is supported.
fn blob_path(digest: &str) -> Result<String> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && is_hex(hex) => Ok(format!("blobs/sha256/{hex}")),
        _ => Err(Error::bad(Some(digest), "unsupported or malformed digest (only sha256:<64 hex> is supported)")),
    }
}

/// Reads a small blob and checks its size and digest against the descriptor.
fn read_blob(ar: &Archive, desc: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(&desc.digest)?;
    let member = ar.member(&path)?;
    if member.size != desc.size {
        return Err(Error::bad(
            Some(&path),
            format!("blob is {} bytes but its descriptor says {}", member.size, desc.size),
        ));
    }
    if desc.size > MAX_JSON {
        return Err(Error::bad(Some(&path), "metadata blob too large"));
    }
    let bytes = ar.read_small(&path)?;
    let actual = sha256_digest(&bytes);
    if actual != desc.digest {
        return Err(Error::DigestMismatch { blob: path, expected: desc.digest.clone(), actual });
    }
    Ok(bytes)
}

/// The image name carried by a descriptor's annotations, if any.
///
/// `org.opencontainers.image.ref.name` may be a full reference or only a tag
/// (`latest`); a bare tag names no repository, so `io.containerd.image.name`
/// is used instead when present.
fn annotated_name(desc: &Descriptor) -> Result<Option<String>> {
    let Some(ann) = desc.annotations.as_ref() else {
        return Ok(None);
    };
    let candidate = match ann.get(ANN_REF_NAME) {
        Some(r) if r.contains(['/', ':']) => Some(r),
        _ => ann.get(ANN_CONTAINERD_NAME),
    };
    candidate
        .map(|n| {
            normalize_name(n).map_err(|e| Error::bad(Some("index.json"), format!("invalid image name annotation: {e}")))
        })
        .transpose()
}

enum Kind {
    Index,
    Manifest,
}

fn kind_of(desc: &Descriptor, bytes: &[u8], path: &str) -> Result<Kind> {
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| Error::bad(Some(path), format!("invalid JSON: {e}")))?;
    let media_type =
        if desc.media_type.is_empty() { probe.media_type.unwrap_or_default() } else { desc.media_type.clone() };
    match media_type.as_str() {
        MT_OCI_INDEX | MT_DOCKER_LIST => Ok(Kind::Index),
        MT_OCI_MANIFEST | MT_DOCKER_MANIFEST => Ok(Kind::Manifest),
        _ if probe.manifests.is_some() => Ok(Kind::Index),
        _ if probe.config.is_some() => Ok(Kind::Manifest),
        other => Err(Error::bad(Some(path), format!("unsupported media type {other:?}"))),
    }
}

/// Follows `desc` down to image manifests (picking the host platform in indexes).
fn manifests_of(ar: &Archive, desc: &Descriptor, depth: u32) -> Result<Vec<(Descriptor, Manifest)>> {
    let path = blob_path(&desc.digest)?;
    let bytes = read_blob(ar, desc)?;
    match kind_of(desc, &bytes, &path)? {
        Kind::Manifest => {
            let m: Manifest = serde_json::from_slice(&bytes)
                .map_err(|e| Error::bad(Some(&path), format!("invalid image manifest: {e}")))?;
            Ok(vec![(desc.clone(), m)])
        }
        Kind::Index => {
            if depth >= MAX_INDEX_DEPTH {
                return Err(Error::bad(Some(&path), "image indexes nested too deeply"));
            }
            let idx: Index = serde_json::from_slice(&bytes)
                .map_err(|e| Error::bad(Some(&path), format!("invalid image index: {e}")))?;
            let chosen = pick_platform(&idx.manifests).ok_or_else(|| {
                let available: Vec<String> = idx
                    .manifests
                    .iter()
                    .filter_map(|d| d.platform.as_ref())
                    .map(|p| format!("{}/{}", p.os, p.architecture))
                    .collect();
                Error::bad(
                    Some(&path),
                    format!("image index has no linux/{} manifest (available: {})", host_arch(), available.join(", ")),
                )
            })?;
            manifests_of(ar, chosen, depth + 1)
        }
    }
}

/// The host platform's entry of an index; else its only entry without a platform.
fn pick_platform(manifests: &[Descriptor]) -> Option<&Descriptor> {
    if let Some(d) = manifests.iter().find(|d| d.platform.as_ref().is_some_and(is_host_platform)) {
        return Some(d);
    }
    let mut unplatformed = manifests.iter().filter(|d| d.platform.is_none());
    match (unplatformed.next(), unplatformed.next()) {
        (Some(d), None) => Some(d),
        _ => None,
    }
}

/// Lists the images of an OCI image layout.
pub(crate) fn plan(ar: &Archive) -> Result<Vec<ImagePlan>> {
    let layout = ar.read_small("oci-layout")?;
    let layout: serde_json::Value =
        serde_json::from_slice(&layout).map_err(|e| Error::bad(Some("oci-layout"), format!("invalid JSON: {e}")))?;
    match layout.get("imageLayoutVersion").and_then(|v| v.as_str()) {
        Some(v) if v.starts_with("1.") => {}
        other => return Err(Error::bad(Some("oci-layout"), format!("unsupported imageLayoutVersion {other:?}"))),
    }
    let index_bytes = ar.read_small("index.json")?;
    let index: Index = serde_json::from_slice(&index_bytes)
        .map_err(|e| Error::bad(Some("index.json"), format!("invalid image index: {e}")))?;

    let mut plans = Vec::new();
    for top in &index.manifests {
        if let Some(p) = top.platform.as_ref().filter(|p| !is_host_platform(p)) {
            tracing::info!(digest = %top.digest, "skipping {}/{} image", p.os, p.architecture);
            continue;
        }
        let name = annotated_name(top)?;
        for (mdesc, manifest) in manifests_of(ar, top, 0)? {
            if !CONFIG_TYPES.contains(&manifest.config.media_type.as_str()) {
                tracing::info!(
                    digest = %mdesc.digest,
                    media_type = %manifest.config.media_type,
                    "skipping a manifest that is not a container image"
                );
                continue;
            }
            let config_path = blob_path(&manifest.config.digest)?;
            let config_bytes = read_blob(ar, &manifest.config)?;
            let parsed = config::parse(&config_bytes, &config_path)?;
            let layers = manifest
                .layers
                .iter()
                .map(|l| {
                    Ok(LayerPlan {
                        member: blob_path(&l.digest)?,
                        check: LayerCheck::Blob { digest: l.digest.clone(), size: l.size },
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            plans.push(ImagePlan {
                id: manifest.config.digest.clone(),
                names: name.iter().cloned().collect(),
                config: parsed.config,
                manifest_digests: vec![mdesc.digest.clone()],
                layers,
            });
        }
    }
    if plans.is_empty() {
        return Err(Error::bad(Some("index.json"), format!("no linux/{} container image found", host_arch())));
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(ann: &[(&str, &str)]) -> Descriptor {
        Descriptor {
            media_type: String::new(),
            digest: String::new(),
            size: 0,
            annotations: Some(ann.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            platform: None,
        }
    }

    #[test]
    fn names_from_annotations() {
        let n = |a: &[(&str, &str)]| annotated_name(&desc(a)).unwrap();
        assert_eq!(n(&[(ANN_REF_NAME, "docker.io/library/busybox:1.36")]).as_deref(), Some("busybox:1.36"));
        assert_eq!(n(&[(ANN_REF_NAME, "latest")]), None);
        assert_eq!(
            n(&[(ANN_REF_NAME, "latest"), (ANN_CONTAINERD_NAME, "docker.io/foo/bar:latest")]).as_deref(),
            Some("foo/bar:latest")
        );
        assert_eq!(n(&[(ANN_CONTAINERD_NAME, "alpine")]).as_deref(), Some("alpine:latest"));
        assert_eq!(n(&[]), None);
        assert!(annotated_name(&desc(&[(ANN_REF_NAME, "Bad/Name:x")])).is_err());
    }

    #[test]
    fn platform_choice() {
        let d = |os: &str, arch: &str| Descriptor {
            platform: Some(Platform { os: os.into(), architecture: arch.into() }),
            digest: format!("{os}/{arch}"),
            ..desc(&[])
        };
        let list = [d("linux", "arm64"), d("linux", host_arch()), d("unknown", "unknown")];
        assert_eq!(pick_platform(&list).unwrap().digest, format!("linux/{}", host_arch()));
        assert!(pick_platform(&[d("linux", "s390x-nope")]).is_none());
        assert!(pick_platform(&[desc(&[])]).is_some());
    }

    #[test]
    fn blob_paths() {
        let hex = "0f".repeat(32);
        assert_eq!(blob_path(&format!("sha256:{hex}")).unwrap(), format!("blobs/sha256/{hex}"));
        assert!(blob_path("sha512:00").is_err());
        assert!(blob_path("sha256:../../etc/passwd").is_err());
    }
}
