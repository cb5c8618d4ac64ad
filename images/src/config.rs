//! Parsing of the image config blob (shared by docker-archive and OCI).

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::ImageConfig;

#[derive(Deserialize)]
struct RawConfig {
    #[serde(default)]
    config: Option<RawRunConfig>,
    #[serde(default)]
    rootfs: Option<RawRootfs>,
}

#[derive(Deserialize)]
struct RawRunConfig {
    #[serde(rename = "Entrypoint", default)]
    entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    cmd: Option<Vec<String>>,
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
}

#[derive(Deserialize)]
struct RawRootfs {
    #[serde(default)]
    diff_ids: Option<Vec<String>>,
}

/// What the store needs from an image config.
pub(crate) struct ParsedConfig {
    pub config: ImageConfig,
    /// Uncompressed layer digests, in order.
    pub diff_ids: Vec<String>,
}

/// Parses a config blob; missing or null fields become empty.
pub(crate) fn parse(bytes: &[u8], member: &str) -> Result<ParsedConfig> {
    let raw: RawConfig = serde_json::from_slice(bytes)
        .map_err(|e| Error::bad(Some(member), format!("invalid image config JSON: {e}")))?;
    let run = raw.config;
    let config = match run {
        Some(r) => ImageConfig {
            entrypoint: r.entrypoint.unwrap_or_default(),
            cmd: r.cmd.unwrap_or_default(),
            env: r.env.unwrap_or_default(),
            working_dir: r.working_dir.unwrap_or_default(),
            user: r.user.unwrap_or_default(),
        },
        None => ImageConfig::default(),
    };
    let diff_ids = raw.rootfs.and_then(|r| r.diff_ids).unwrap_or_default();
    Ok(ParsedConfig { config, diff_ids })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_null_fields() {
        let full = br#"{"architecture":"amd64","config":{"Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"],
            "Env":["PATH=/usr/bin","A=b=c"],"WorkingDir":"/work","User":"1000:1000","Labels":{"x":"y"}},
            "rootfs":{"type":"layers","diff_ids":["sha256:aa","sha256:bb"]}}"#;
        let p = parse(full, "c").unwrap();
        assert_eq!(p.config.entrypoint, ["/bin/sh", "-c"]);
        assert_eq!(p.config.cmd, ["echo hi"]);
        assert_eq!(p.config.env, ["PATH=/usr/bin", "A=b=c"]);
        assert_eq!(p.config.working_dir, "/work");
        assert_eq!(p.config.user, "1000:1000");
        assert_eq!(p.diff_ids, ["sha256:aa", "sha256:bb"]);

        let nulls = br#"{"config":{"Entrypoint":null,"Cmd":null,"Env":null,"WorkingDir":null,"User":null},"rootfs":{"diff_ids":null}}"#;
        let p = parse(nulls, "c").unwrap();
        assert!(p.config.entrypoint.is_empty() && p.config.cmd.is_empty() && p.config.env.is_empty());
        assert_eq!(p.config.working_dir, "");
        assert!(p.diff_ids.is_empty());

        let p = parse(b"{}", "c").unwrap();
        assert!(p.config.cmd.is_empty());
        let p = parse(br#"{"config":null}"#, "c").unwrap();
        assert!(p.config.user.is_empty());

        assert!(matches!(parse(b"[1,2", "c"), Err(Error::BadArchive { .. })));
    }
}
