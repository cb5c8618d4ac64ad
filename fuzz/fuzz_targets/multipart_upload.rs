//! The broker's `/files/upload` body (`broker/src/execd/upload_parts.rs`,
//! included as it is): multipart parsing (axum's `Multipart`), the
//! `metadata`/`file` pairing, the metadata JSON and modes, turned into the
//! agent's upload stream.
//!
//! The first input byte picks how the body arrives (the size of its
//! pieces, 1 to 255 bytes, or all at once) and after how many chunks the
//! "agent" stops taking them; the rest is the body, with the boundary
//! [`BOUNDARY`].
//!
//! Invariants: a body that is accepted yields a header first and at least
//! one, valid modes, no more file data than the body holds; how the body is
//! split into pieces changes nothing (same outcome, same stream); once the
//! agent refuses a chunk, nothing more is sent and the upload reports it.
#![no_main]

// The broker's `mode_to_wire` is not used here.
#[allow(dead_code)]
#[path = "../../broker/src/execd/mode.rs"]
mod mode;
#[path = "../../broker/src/execd/upload_parts.rs"]
mod upload_parts;

use std::cell::RefCell;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart};
use axum::http::{header, Request};
use libfuzzer_sys::fuzz_target;
use pvisor_proto::agent::{upload_chunk::Kind, UploadChunk};

const BOUNDARY: &str = "pvisorfuzzboundary";

thread_local! {
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
}

/// What one upload gave: Ok(completed) or the error's code, and the stream.
type Outcome = (Result<bool, &'static str>, Vec<UploadChunk>);

fn upload(body: &[u8], piece: usize, refuse_after: Option<usize>) -> Outcome {
    let pieces: Vec<Result<Bytes, std::io::Error>> =
        body.chunks(piece.max(1)).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let req = Request::builder()
        .method("POST")
        .header(header::CONTENT_TYPE, format!("multipart/form-data; boundary={BOUNDARY}"))
        .body(Body::from_stream(futures::stream::iter(pieces)))
        .expect("a valid request");
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let mut mp = Multipart::from_request(req, &()).await.expect("the content type is multipart");
            let sent = RefCell::new(Vec::new());
            let refused = RefCell::new(false);
            let result = upload_parts::feed(&mut mp, |c| {
                assert!(!*refused.borrow(), "a chunk was sent after the agent refused one");
                let take = refuse_after.is_none_or(|n| sent.borrow().len() < n);
                if take {
                    sent.borrow_mut().push(c);
                } else {
                    *refused.borrow_mut() = true;
                }
                async move { take }
            })
            .await;
            if *refused.borrow() {
                assert!(matches!(result, Ok(false)), "a refused upload reported {result:?}");
            }
            (result.map_err(|e| e.code()), sent.into_inner())
        })
    })
}

fn check(body: &[u8], (result, chunks): &Outcome) {
    if let Ok(true) = result {
        assert!(matches!(chunks.first().and_then(|c| c.kind.as_ref()), Some(Kind::Header(_))), "no header first");
    }
    let mut data = 0;
    for c in chunks {
        match c.kind.as_ref().expect("every chunk has a kind") {
            Kind::Header(h) => assert!(h.mode.is_some_and(|m| m <= 0o7777), "mode {:?}", h.mode),
            Kind::Data(d) => data += d.len(),
        }
    }
    assert!(data <= body.len(), "{data} bytes of file data from a {}-byte body", body.len());
}

fuzz_target!(|input: &[u8]| {
    let Some((&how, body)) = input.split_first() else { return };
    let refuse_after = (how & 0x80 != 0).then_some(usize::from(how & 0x07));
    let whole = upload(body, body.len(), None);
    check(body, &whole);
    let piece = usize::from(how & 0x7f).max(1);
    let split = upload(body, piece, None);
    assert_eq!(whole.0, split.0, "the outcome depends on how the body is split ({piece}-byte pieces)");
    if whole.0.is_ok() {
        assert_eq!(data_of(&whole.1), data_of(&split.1), "the stream depends on how the body is split");
    }
    if refuse_after.is_some() {
        check(body, &upload(body, piece, refuse_after));
    }
});

/// The headers and each file's data, however it was chunked.
fn data_of(chunks: &[UploadChunk]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for c in chunks {
        match c.kind.as_ref() {
            Some(Kind::Header(h)) => out.push((format!("{h:?}"), Vec::new())),
            Some(Kind::Data(d)) => out.last_mut().expect("data after a header").1.extend_from_slice(d),
            None => {}
        }
    }
    out
}
