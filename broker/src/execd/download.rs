//! `GET /files/download`: a whole file, a byte range (`Range`), or lines
//! (`offset`/`limit`: the 1-based number of the first line and how many
//! lines, as SDK 1.1.1 and the upstream spec define them).
use super::identity::{request, Who};
use super::{agent, Sandbox};
use crate::api::error::{ApiError, ApiResult};
use crate::api::query::Query;
use axum::body::{Body, Bytes};
use axum::extract::RawQuery;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::StreamExt;
use pvisor_proto::agent::{DataChunk, DownloadRequest, LineRange, PathsRequest};

/// What a download asks for.
#[derive(Debug, PartialEq, Eq)]
enum Ask {
    Whole,
    /// A `Range` header's value.
    Range(String),
    /// Lines `first..first + count` (count 0: to the end).
    Lines {
        first: u64,
        count: u64,
    },
}

/// Reads the query's `offset`/`limit` and the `Range` header. Lines and a
/// byte range are mutually exclusive (the spec says so; both given is a 400,
/// not a silent choice). One of `offset`/`limit` alone is fine: from that
/// line to the end, or the first `limit` lines.
fn ask(q: &Query, headers: &HeaderMap) -> ApiResult<Ask> {
    let offset: Option<u64> = q.number("offset")?;
    let limit: Option<u64> = q.number("limit")?;
    let range = headers.get(header::RANGE).map(|h| h.to_str().unwrap_or_default().to_string());
    if offset.is_none() && limit.is_none() {
        return Ok(range.map_or(Ask::Whole, Ask::Range));
    }
    if range.is_some() {
        return Err(ApiError::bad_request(
            "offset/limit (a range of lines) and the Range header (a range of bytes) are mutually exclusive",
        ));
    }
    if offset == Some(0) {
        return Err(ApiError::bad_request("offset is a line number and starts at 1"));
    }
    if limit == Some(0) {
        return Err(ApiError::bad_request("limit is a number of lines and must be at least 1"));
    }
    Ok(Ask::Lines { first: offset.unwrap_or(1), count: limit.unwrap_or(0) })
}

/// Parses a single `Range: bytes=...` against `size` → (start, len).
fn parse_range(h: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = h.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let r = match (a.trim(), b.trim()) {
        ("", n) => {
            let n: u64 = n.parse().ok()?;
            if n == 0 || size == 0 {
                Err(())
            } else {
                Ok((size.saturating_sub(n), n.min(size)))
            }
        }
        (s, e) => {
            let s: u64 = s.parse().ok()?;
            let e: u64 = if e.is_empty() { size.saturating_sub(1) } else { e.parse().ok()? };
            if s >= size || e < s {
                Err(())
            } else {
                Ok((s, e.min(size - 1) - s + 1))
            }
        }
    };
    Some(r)
}

fn body(stream: tonic::Streaming<DataChunk>) -> Body {
    Body::from_stream(stream.map(|r| r.map(|c| Bytes::from(c.data)).map_err(std::io::Error::other)))
}

pub async fn download(
    Extension(sb): Sandbox,
    who: Who,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let q = Query::parse(raw.as_deref());
    let path = q.required("path")?.to_string();
    let ask = ask(&q, &headers)?;
    let mut client = agent(&sb)?;
    let info = client.stat(request(PathsRequest { paths: vec![path.clone()] }, &who)).await?.into_inner().files;
    let size = info.first().map(|f| f.size).unwrap_or(0);
    if info.first().is_some_and(|f| f.r#type == "directory") {
        return Err(ApiError::bad_request(format!("{path} is a directory")));
    }
    if let Ask::Lines { first, count } = ask {
        let req = DownloadRequest { path, lines: Some(LineRange { first, count }), ..Default::default() };
        let stream = client.download(request(req, &who)).await?.into_inner();
        // The length is known only once the lines are read: chunked.
        return Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body(stream)).into_response());
    }
    let range = match &ask {
        Ask::Range(h) => parse_range(h, size),
        _ => None,
    };
    let (status, start, len) = match range {
        None => (StatusCode::OK, 0, size),
        Some(Ok((s, n))) => (StatusCode::PARTIAL_CONTENT, s, n),
        Some(Err(())) => {
            let e = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "RANGE_NOT_SATISFIABLE",
                format!("range not satisfiable for a file of {size} bytes"),
            );
            let mut r = e.into_response();
            if let Ok(v) = format!("bytes */{size}").parse() {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
    };
    let body = if len == 0 {
        Body::empty()
    } else {
        let req = DownloadRequest { path, offset: start, limit: len, lines: None };
        body(client.download(request(req, &who)).await?.into_inner())
    };
    let mut resp = (
        status,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::ACCEPT_RANGES, "bytes".to_string()),
        ],
        body,
    )
        .into_response();
    if status == StatusCode::PARTIAL_CONTENT {
        if let Ok(cr) = format!("bytes {}-{}/{}", start, start + len - 1, size).parse() {
            resp.headers_mut().insert(header::CONTENT_RANGE, cr);
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::{ask, parse_range, Ask};
    use crate::api::query::Query;
    use axum::http::{header, HeaderMap};

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(parse_range("bytes=90-", 100), Some(Ok((90, 10))));
        assert_eq!(parse_range("bytes=-5", 100), Some(Ok((95, 5))));
        assert_eq!(parse_range("bytes=95-200", 100), Some(Ok((95, 5))));
        assert_eq!(parse_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(parse_range("bytes=5-1", 100), Some(Err(())));
        assert_eq!(parse_range("items=0-1", 100), None);
    }

    fn asked(query: &str, range: Option<&str>) -> Result<Ask, u16> {
        let mut h = HeaderMap::new();
        if let Some(r) = range {
            h.insert(header::RANGE, r.parse().unwrap());
        }
        ask(&Query::parse(Some(query)), &h).map_err(|e| e.status.as_u16())
    }

    #[test]
    fn offset_and_limit_are_lines() {
        assert_eq!(asked("path=/f", None), Ok(Ask::Whole));
        assert_eq!(asked("path=/f", Some("bytes=0-1")), Ok(Ask::Range("bytes=0-1".into())));
        assert_eq!(asked("path=/f&offset=3&limit=2", None), Ok(Ask::Lines { first: 3, count: 2 }));
        assert_eq!(asked("path=/f&offset=3", None), Ok(Ask::Lines { first: 3, count: 0 }));
        assert_eq!(asked("path=/f&limit=2", None), Ok(Ask::Lines { first: 1, count: 2 }));
        assert_eq!(asked("path=/f&offset=&limit=", None), Ok(Ask::Whole));
    }

    #[test]
    fn bad_line_ranges_are_refused() {
        assert_eq!(asked("path=/f&offset=0&limit=1", None), Err(400));
        assert_eq!(asked("path=/f&offset=1&limit=0", None), Err(400));
        assert_eq!(asked("path=/f&offset=-1", None), Err(400));
        assert_eq!(asked("path=/f&offset=x", None), Err(400));
        assert_eq!(asked("path=/f&offset=1&limit=1", Some("bytes=0-1")), Err(400));
    }
}
