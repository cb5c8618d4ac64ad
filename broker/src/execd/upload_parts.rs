//! Reading a `/files/upload` body: multipart `metadata` and `file` parts in
//! pairs, turned into the agent's upload stream (each file's header, then
//! its data as it arrives), and the `{mode, owner, group}` permissions the
//! file API takes.
//!
//! Depends on nothing else of the broker (only [`super::mode`]), so the
//! `multipart_upload` fuzz target (fuzz/) includes this file as it is.
use std::collections::VecDeque;
use std::future::Future;

use axum::extract::multipart::{Multipart, MultipartError};
use pvisor_proto::agent::{upload_chunk, PermissionEntry, UploadChunk, UploadHeader};
use serde::Deserialize;

use super::mode::mode_from_wire;

/// Mode of an uploaded file whose metadata gives none.
pub const DEFAULT_MODE: u32 = 0o644;

/// Why an upload body is refused (each a 400).
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("invalid multipart body: {0}")]
    Multipart(#[from] MultipartError),
    #[error("request body is empty")]
    EmptyMetadata,
    #[error("invalid JSON body: {0}")]
    Metadata(serde_json::Error),
    #[error("{0}")]
    Mode(String),
    #[error("file part without a preceding metadata part")]
    FileWithoutMetadata,
    #[error("no file part in the upload")]
    NoFile,
    #[error("metadata part without a file part")]
    MetadataWithoutFile,
}

impl UploadError {
    /// The API error code: a metadata part that is no JSON is a bad body, as
    /// any JSON body is; the rest is a bad request.
    pub fn code(&self) -> &'static str {
        match self {
            UploadError::EmptyMetadata | UploadError::Metadata(_) => "INVALID_REQUEST_BODY",
            _ => "INVALID_REQUEST",
        }
    }
}

/// `{"mode": 755, "owner": null, "group": null}` as sent by the SDK.
#[derive(Debug, Default, Deserialize)]
pub struct Perms {
    #[serde(default)]
    pub mode: Option<u64>,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub group: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UploadMeta {
    path: String,
    #[serde(flatten)]
    perms: Perms,
}

/// The agent's permission entry for `path`; a mode that is no octal mode is an error.
pub fn entry(path: String, p: Perms) -> Result<PermissionEntry, String> {
    let mode = p.mode.map(mode_from_wire).transpose()?;
    Ok(PermissionEntry { path, mode, owner: p.owner, group: p.group })
}

fn chunk(kind: upload_chunk::Kind) -> UploadChunk {
    UploadChunk { kind: Some(kind) }
}

/// Reads `mp` to its end and hands `send` the agent's upload stream: for
/// each `file` part, a header (path and permissions from the `metadata` part
/// before it, mode [`DEFAULT_MODE`] if none), then its data as it arrives.
/// Parts with other names are read and dropped. `Ok(false)`: `send` refused
/// a chunk (the agent call ended) and reading stopped; `Ok(true)`: the body
/// held at least one file and no metadata part without its file.
pub async fn feed<F, Fut>(mp: &mut Multipart, mut send: F) -> Result<bool, UploadError>
where
    F: FnMut(UploadChunk) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut metas: VecDeque<UploadMeta> = VecDeque::new();
    let mut files = 0usize;
    while let Some(mut field) = mp.next_field().await? {
        match field.name() {
            Some("metadata") => {
                let bytes = field.bytes().await?;
                if bytes.is_empty() {
                    return Err(UploadError::EmptyMetadata);
                }
                metas.push_back(serde_json::from_slice(&bytes).map_err(UploadError::Metadata)?);
            }
            Some("file") => {
                let m = metas.pop_front().ok_or(UploadError::FileWithoutMetadata)?;
                let e = entry(m.path, m.perms).map_err(UploadError::Mode)?;
                let h =
                    UploadHeader { path: e.path, mode: e.mode.or(Some(DEFAULT_MODE)), owner: e.owner, group: e.group };
                if !send(chunk(upload_chunk::Kind::Header(h))).await {
                    return Ok(false);
                }
                while let Some(data) = field.chunk().await? {
                    if !send(chunk(upload_chunk::Kind::Data(data.to_vec()))).await {
                        return Ok(false);
                    }
                }
                files += 1;
            }
            _ => while field.chunk().await?.is_some() {},
        }
    }
    if files == 0 {
        return Err(UploadError::NoFile);
    }
    if !metas.is_empty() {
        return Err(UploadError::MetadataWithoutFile);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::FromRequest;
    use axum::http::{header, Request};

    fn multipart(parts: &[(&str, &str)]) -> Multipart {
        let mut body = String::new();
        for (name, data) in parts {
            body += &format!("--b\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{data}\r\n");
        }
        body += "--b--\r\n";
        let req = Request::builder()
            .header(header::CONTENT_TYPE, "multipart/form-data; boundary=b")
            .body(Body::from(body))
            .expect("a request");
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        rt.block_on(Multipart::from_request(req, &())).expect("a multipart body")
    }

    /// Feeds `parts`, the sink taking at most `take` chunks.
    fn feed_all(parts: &[(&str, &str)], take: usize) -> (Result<bool, UploadError>, Vec<UploadChunk>) {
        let mut mp = multipart(parts);
        let mut sent = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let r = rt.block_on(feed(&mut mp, |c| {
            let ok = sent.len() < take;
            if ok {
                sent.push(c);
            }
            async move { ok }
        }));
        (r, sent)
    }

    fn header_of(c: &UploadChunk) -> &UploadHeader {
        match &c.kind {
            Some(upload_chunk::Kind::Header(h)) => h,
            other => panic!("expected a header, got {other:?}"),
        }
    }

    #[test]
    fn pairs_become_a_header_then_data() {
        let parts = [
            ("metadata", r#"{"path":"/a","mode":755}"#),
            ("file", "hello"),
            ("other", "ignored"),
            ("metadata", r#"{"path":"/b","owner":"1000"}"#),
            ("file", ""),
        ];
        let (r, sent) = feed_all(&parts, usize::MAX);
        assert!(matches!(r, Ok(true)), "{r:?}");
        assert_eq!(header_of(&sent[0]).path, "/a");
        assert_eq!(header_of(&sent[0]).mode, Some(0o755));
        assert_eq!(sent[1].kind, Some(upload_chunk::Kind::Data(b"hello".to_vec())));
        // The empty file's header is the last one (its data may come as one empty chunk).
        let b = sent.iter().rev().find(|c| matches!(c.kind, Some(upload_chunk::Kind::Header(_)))).expect("headers");
        let b = header_of(b);
        assert_eq!((b.path.as_str(), b.mode, b.owner.as_deref()), ("/b", Some(DEFAULT_MODE), Some("1000")));
    }

    #[test]
    fn refusals_name_the_problem() {
        let code = |parts: &[(&str, &str)]| feed_all(parts, usize::MAX).0.expect_err("refused").code();
        assert_eq!(code(&[("file", "x")]), "INVALID_REQUEST");
        assert_eq!(code(&[("metadata", "{not json")]), "INVALID_REQUEST_BODY");
        assert_eq!(code(&[("metadata", "")]), "INVALID_REQUEST_BODY");
        assert_eq!(code(&[("metadata", r#"{"path":"/a","mode":888}"#), ("file", "x")]), "INVALID_REQUEST");
        assert!(matches!(feed_all(&[("other", "x")], usize::MAX).0, Err(UploadError::NoFile)));
        let dangling = [("metadata", r#"{"path":"/a"}"#), ("file", "x"), ("metadata", r#"{"path":"/b"}"#)];
        assert!(matches!(feed_all(&dangling, usize::MAX).0, Err(UploadError::MetadataWithoutFile)));
    }

    #[test]
    fn a_refused_chunk_stops_the_upload() {
        let (r, sent) = feed_all(&[("metadata", r#"{"path":"/a"}"#), ("file", "data")], 1);
        assert!(matches!(r, Ok(false)), "{r:?}");
        assert_eq!(sent.len(), 1);
    }
}
