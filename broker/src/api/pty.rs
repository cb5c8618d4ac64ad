//! `GET /pvisor/sandboxes/{id}/pty` with `Upgrade: pvisor-pty`: an
//! interactive terminal in a sandbox for `pvisor exec -it` (the OpenSandbox
//! data plane's own `/pty` stays unsupported).
//!
//! After the `101`, the connection carries length-delimited protobuf
//! messages both ways: `pvisor.agent.v1.PtyInput` from the client (the first
//! one `start`), `PtyOutput` to it (output, then the exit). The broker
//! relays them to the agent's `Pty` call, message for message. A refused
//! start (no such sandbox, paused, the agent's error) is an ordinary JSON
//! error before the upgrade or, after it, the stream's end without an exit.
use super::error::{ApiError, ApiResult};
use crate::server::Ctx;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BytesMut};
use hyper_util::rt::TokioIo;
use prost::Message;
use pvisor_proto::agent::{PtyInput, PtyOutput};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// The `Upgrade` protocol name.
pub const PROTOCOL: &str = "pvisor-pty";
/// Largest message either way (input is typed, output comes in 16 KiB reads).
const MAX_MESSAGE: usize = 1 << 20;

/// Reads one length-delimited message of type `M` (None at a clean end).
pub async fn read_message<M: Message + Default, R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
) -> std::io::Result<Option<M>> {
    let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    loop {
        if !buf.is_empty() {
            let mut peek = &buf[..];
            if let Ok(len) = prost::decode_length_delimiter(&mut peek) {
                if len > MAX_MESSAGE {
                    return Err(invalid(format!("a message of {len} bytes")));
                }
                let head = buf.len() - peek.len();
                if peek.len() >= len {
                    buf.advance(head);
                    let msg = M::decode(buf.split_to(len).freeze()).map_err(|e| invalid(e.to_string()))?;
                    return Ok(Some(msg));
                }
            } else if buf.len() >= 10 {
                return Err(invalid("a bad length prefix".into()));
            }
        }
        if r.read_buf(buf).await? == 0 {
            return if buf.is_empty() { Ok(None) } else { Err(invalid("a message cut short".into())) };
        }
    }
}

/// Writes one length-delimited message.
pub async fn write_message<M: Message, W: AsyncWrite + Unpin>(w: &mut W, m: &M) -> std::io::Result<()> {
    w.write_all(&m.encode_length_delimited_to_vec()).await?;
    w.flush().await
}

pub async fn pty(State(ctx): State<Arc<Ctx>>, Path(id): Path<String>, mut req: Request) -> ApiResult<Response> {
    let entry = ctx.registry.get(&id).ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    let agent = crate::execd::agent(&entry)?;
    let asked = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    if !asked.is_some_and(|p| p.eq_ignore_ascii_case(PROTOCOL)) {
        return Err(ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "UPGRADE_REQUIRED",
            format!("this route is a terminal: send `Connection: upgrade` and `Upgrade: {PROTOCOL}`"),
        ));
    }
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(io) => {
                if let Err(e) = relay(TokioIo::new(io), agent).await {
                    tracing::debug!(sandbox = %id, "pty: {e}");
                }
            }
            Err(e) => tracing::debug!(sandbox = %id, "pty upgrade: {e}"),
        }
    });
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    resp.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    Ok(resp)
}

async fn relay<S: AsyncRead + AsyncWrite + Send + 'static>(
    io: S,
    mut agent: pvisor_proto::agent::agent_client::AgentClient<tonic::transport::Channel>,
) -> Result<(), String> {
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut buf = BytesMut::new();
    let first: PtyInput = read_message(&mut rd, &mut buf).await.map_err(|e| e.to_string())?.ok_or("no start")?;
    let (tx, rx) = mpsc::channel::<PtyInput>(64);
    tx.send(first).await.map_err(|e| e.to_string())?;
    // Client to agent, until the client closes its side.
    tokio::spawn(async move {
        while let Ok(Some(m)) = read_message::<PtyInput, _>(&mut rd, &mut buf).await {
            if tx.send(m).await.is_err() {
                break;
            }
        }
    });
    let mut out =
        agent.pty(tokio_stream::wrappers::ReceiverStream::new(rx)).await.map_err(|s| s.to_string())?.into_inner();
    while let Some(m) = out.next().await {
        let m: PtyOutput = m.map_err(|s| s.to_string())?;
        write_message(&mut wr, &m).await.map_err(|e| e.to_string())?;
    }
    wr.shutdown().await.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvisor_proto::agent::{pty_input, PtySize};

    #[tokio::test]
    async fn messages_survive_the_framing_whatever_the_read_sizes() {
        let msgs = vec![
            PtyInput { kind: Some(pty_input::Kind::Data(vec![3; 300])) },
            PtyInput { kind: Some(pty_input::Kind::Resize(PtySize { rows: 40, cols: 120 })) },
            PtyInput { kind: Some(pty_input::Kind::Data(b"echo hi\r".to_vec())) },
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            write_message(&mut wire, m).await.unwrap();
        }
        // One byte per read: every split of a length prefix and a body.
        let mut r = tokio_test_reader(wire);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        while let Some(m) = read_message::<PtyInput, _>(&mut r, &mut buf).await.unwrap() {
            got.push(m);
        }
        assert_eq!(got, msgs);
    }

    #[tokio::test]
    async fn a_cut_message_is_an_error() {
        let mut wire = Vec::new();
        write_message(&mut wire, &PtyInput { kind: Some(pty_input::Kind::Data(vec![1; 50])) }).await.unwrap();
        wire.truncate(20);
        let mut buf = BytesMut::new();
        assert!(read_message::<PtyInput, _>(&mut &wire[..], &mut buf).await.is_err());
    }

    /// A reader that hands out one byte per read.
    fn tokio_test_reader(data: Vec<u8>) -> impl AsyncRead + Unpin {
        let (mut a, b) = tokio::io::duplex(1);
        tokio::spawn(async move {
            a.write_all(&data).await.unwrap();
        });
        b
    }
}
