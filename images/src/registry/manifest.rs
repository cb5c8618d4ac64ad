//! Manifest documents: media types, parsing of image manifests and manifest
//! lists / image indexes, validation of their descriptors, and the choice of
//! a platform's entry in a list.

use serde::Deserialize;

use super::error::RegistryError;
use super::reference::is_sha256_digest;

pub(crate) const MT_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const MT_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const MT_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const MT_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// `Accept` header of manifest requests.
pub(crate) const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// Largest manifest or index accepted.
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;
/// Largest image config accepted.
pub(crate) const MAX_CONFIG: u64 = 32 << 20;

const CONFIG_TYPES: [&str; 2] =
    ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];
const LAYER_TYPES: [&str; 6] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];

/// A content descriptor (validated: sha256 digest).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform of a manifest list entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub(crate) struct Platform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl Platform {
    /// `os/arch[/variant]`.
    fn label(&self) -> String {
        match self.variant.as_deref().filter(|v| !v.is_empty()) {
            Some(v) => format!("{}/{}/{v}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        }
    }
}

/// A parsed manifest document.
#[derive(Debug)]
pub(crate) enum Manifest {
    /// A manifest list / image index: one entry per platform.
    Index(Vec<Descriptor>),
    /// An image manifest.
    Image {
        /// [`MT_OCI_MANIFEST`] or [`MT_DOCKER_MANIFEST`].
        media_type: String,
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

/// Just enough to tell which kind of document this is.
#[derive(Deserialize)]
struct Probe {
    #[serde(rename = "schemaVersion", default)]
    schema_version: Option<u64>,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
    #[serde(default)]
    config: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct IndexDoc {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ImageDoc {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// Parses and validates a manifest. `content_type` is the response's
/// `Content-Type`, used when the document does not name its media type;
/// `what` names the document in errors.
pub(crate) fn parse(bytes: &[u8], content_type: &str, what: &str) -> Result<Manifest, RegistryError> {
    let invalid =
        |reason: String| RegistryError::BadResponse { url: what.to_owned(), what: "manifest".to_owned(), reason };
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    let media_type = probe.media_type.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| content_type.to_owned());
    let is_index = match media_type.as_str() {
        MT_OCI_INDEX | MT_DOCKER_LIST => true,
        MT_OCI_MANIFEST | MT_DOCKER_MANIFEST => false,
        // Untyped OCI documents (the field is optional there), served as plain JSON.
        "" | "application/json" | "application/octet-stream" if probe.schema_version == Some(2) => {
            match (&probe.manifests, &probe.config) {
                (Some(_), None) => true,
                (None, Some(_)) => false,
                _ => return Err(unsupported(what, &media_type)),
            }
        }
        _ => return Err(unsupported(what, &media_type)),
    };
    if probe.schema_version != Some(2) {
        return Err(invalid(format!("schemaVersion {:?} (only 2 is supported)", probe.schema_version)));
    }
    if is_index {
        let doc: IndexDoc = serde_json::from_slice(bytes).map_err(|e| invalid(format!("invalid index: {e}")))?;
        for d in &doc.manifests {
            check_digest(d, &format!("{what} entry"))?;
        }
        return Ok(Manifest::Index(doc.manifests));
    }
    let doc: ImageDoc = serde_json::from_slice(bytes).map_err(|e| invalid(format!("invalid image manifest: {e}")))?;
    check_digest(&doc.config, "image config")?;
    if !CONFIG_TYPES.contains(&doc.config.media_type.as_str()) {
        return Err(RegistryError::UnsupportedMediaType {
            what: format!("the config of {what} (not a container image?)"),
            media_type: doc.config.media_type,
        });
    }
    if doc.config.size > MAX_CONFIG {
        return Err(RegistryError::TooLarge {
            what: format!("image config {}", doc.config.digest),
            size: doc.config.size,
            limit: MAX_CONFIG,
        });
    }
    for (i, layer) in doc.layers.iter().enumerate() {
        let label = format!("layer {}/{}", i + 1, doc.layers.len());
        check_digest(layer, &label)?;
        if !LAYER_TYPES.contains(&layer.media_type.as_str()) {
            return Err(RegistryError::UnsupportedMediaType {
                what: format!("{label} {} of {what}", layer.digest),
                media_type: layer.media_type.clone(),
            });
        }
    }
    let media_type = if media_type == MT_DOCKER_MANIFEST { MT_DOCKER_MANIFEST } else { MT_OCI_MANIFEST };
    Ok(Manifest::Image { media_type: media_type.to_owned(), config: doc.config, layers: doc.layers })
}

fn unsupported(what: &str, media_type: &str) -> RegistryError {
    RegistryError::UnsupportedMediaType { what: what.to_owned(), media_type: media_type.to_owned() }
}

fn check_digest(d: &Descriptor, what: &str) -> Result<(), RegistryError> {
    if is_sha256_digest(&d.digest) {
        Ok(())
    } else {
        Err(RegistryError::UnsupportedDigest { what: what.to_owned(), digest: d.digest.clone() })
    }
}

/// The entry of a manifest list for `os`/`arch` (the first if several,
/// e.g. ARM variants). `reference` names the list in the error.
pub(crate) fn select_platform<'a>(
    entries: &'a [Descriptor],
    (os, arch): (&str, &str),
    reference: &str,
) -> Result<&'a Descriptor, RegistryError> {
    entries.iter().find(|d| d.platform.as_ref().is_some_and(|p| p.os == os && p.architecture == arch)).ok_or_else(
        || RegistryError::NoMatchingPlatform {
            reference: reference.to_owned(),
            wanted: format!("{os}/{arch}"),
            available: entries
                .iter()
                .filter_map(|d| d.platform.as_ref())
                // Attestation manifests are listed as unknown/unknown.
                .filter(|p| !(p.os == "unknown" && p.architecture == "unknown"))
                .map(Platform::label)
                .collect(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn image_doc(media_type: Option<&str>, layer_type: &str) -> String {
        let mt = media_type.map(|m| format!(r#""mediaType":"{m}","#)).unwrap_or_default();
        format!(
            r#"{{"schemaVersion":2,{mt}"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":10}},"layers":[{{"mediaType":"{layer_type}","digest":"{}","size":20}}]}}"#,
            digest('a'),
            digest('b')
        )
    }

    #[test]
    fn image_manifests() {
        let doc = image_doc(Some(MT_OCI_MANIFEST), "application/vnd.oci.image.layer.v1.tar+gzip");
        match parse(doc.as_bytes(), "application/json", "m").unwrap() {
            Manifest::Image { media_type, config, layers } => {
                assert_eq!(media_type, MT_OCI_MANIFEST);
                assert_eq!(config.size, 10);
                assert_eq!(layers.len(), 1);
                assert_eq!(layers[0].digest, digest('b'));
            }
            other => panic!("{other:?}"),
        }
        // Untyped documents: the Content-Type decides, or the structure.
        let untyped = image_doc(None, "application/vnd.docker.image.rootfs.diff.tar.gzip");
        assert!(matches!(
            parse(untyped.as_bytes(), MT_DOCKER_MANIFEST, "m").unwrap(),
            Manifest::Image { media_type, .. } if media_type == MT_DOCKER_MANIFEST
        ));
        assert!(matches!(
            parse(untyped.as_bytes(), "application/json", "m").unwrap(),
            Manifest::Image { media_type, .. } if media_type == MT_OCI_MANIFEST
        ));
    }

    #[test]
    fn refused_manifests() {
        let foreign = image_doc(Some(MT_DOCKER_MANIFEST), "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip");
        let err = parse(foreign.as_bytes(), "", "m").unwrap_err();
        assert!(matches!(err, RegistryError::UnsupportedMediaType { .. }), "{err}");
        let schema1 = r#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        let err = parse(schema1.as_bytes(), "application/vnd.docker.distribution.manifest.v1+prettyjws", "m");
        assert!(matches!(err, Err(RegistryError::UnsupportedMediaType { .. })));
        let helm = image_doc(Some(MT_OCI_MANIFEST), "application/vnd.oci.image.layer.v1.tar")
            .replace("application/vnd.oci.image.config.v1+json", "application/vnd.cncf.helm.config.v1+json");
        assert!(matches!(parse(helm.as_bytes(), "", "m"), Err(RegistryError::UnsupportedMediaType { .. })));
        let bad_digest = image_doc(Some(MT_OCI_MANIFEST), "application/vnd.oci.image.layer.v1.tar")
            .replace(&digest('b'), "sha256:../../../etc/passwd");
        assert!(matches!(parse(bad_digest.as_bytes(), "", "m"), Err(RegistryError::UnsupportedDigest { .. })));
        let huge = image_doc(Some(MT_OCI_MANIFEST), "application/vnd.oci.image.layer.v1.tar")
            .replace(r#""size":10"#, r#""size":999999999999"#);
        assert!(matches!(parse(huge.as_bytes(), "", "m"), Err(RegistryError::TooLarge { .. })));
        assert!(matches!(parse(b"not json", MT_OCI_MANIFEST, "m"), Err(RegistryError::BadResponse { .. })));
    }

    #[test]
    fn index_and_platforms() {
        let doc = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MT_DOCKER_LIST}","manifests":[
                {{"mediaType":"{MT_DOCKER_MANIFEST}","digest":"{}","size":1,"platform":{{"os":"linux","architecture":"arm","variant":"v7"}}}},
                {{"mediaType":"{MT_DOCKER_MANIFEST}","digest":"{}","size":2,"platform":{{"os":"linux","architecture":"amd64"}}}},
                {{"mediaType":"{MT_OCI_MANIFEST}","digest":"{}","size":3,"platform":{{"os":"unknown","architecture":"unknown"}}}}]}}"#,
            digest('1'),
            digest('2'),
            digest('3')
        );
        let Manifest::Index(entries) = parse(doc.as_bytes(), "", "list").unwrap() else { panic!("not an index") };
        assert_eq!(entries.len(), 3);
        assert_eq!(select_platform(&entries, ("linux", "amd64"), "r").unwrap().digest, digest('2'));
        assert_eq!(select_platform(&entries, ("linux", "arm"), "r").unwrap().digest, digest('1'));
        match select_platform(&entries, ("linux", "s390x"), "r") {
            Err(RegistryError::NoMatchingPlatform { wanted, available, .. }) => {
                assert_eq!(wanted, "linux/s390x");
                assert_eq!(available, vec!["linux/arm/v7".to_owned(), "linux/amd64".to_owned()]);
            }
            other => panic!("{other:?}"),
        }
        let untyped_index = r#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(parse(untyped_index.as_bytes(), "", "i").unwrap(), Manifest::Index(v) if v.is_empty()));
    }
}
