//! The worker's gRPC client connection to its sandbox's agent.
use crate::backend::Sandbox;
use crate::error::{Result, WorkerError};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tonic::transport::{Channel, Endpoint};

/// Connects a channel to the agent through the backend's stream.
pub async fn connect(sandbox: Arc<dyn Sandbox>) -> Result<Channel> {
    let connector = tower::service_fn(move |_: http::Uri| {
        let sandbox = sandbox.clone();
        async move {
            // A vm backend may wait for its guest to boot: off the runtime.
            let std = tokio::task::spawn_blocking(move || sandbox.connect_agent())
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?;
            std.set_nonblocking(true)?;
            Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::from_std(std)?))
        }
    });
    Endpoint::from_static("http://agent")
        .connect_with_connector(connector)
        .await
        .map_err(|e| WorkerError::Agent(with_sources(&e)))
}

/// A call that failed because its connection went away (tonic reports a
/// connection reset mid-call as UNKNOWN "transport error", a refused
/// reconnect as UNAVAILABLE), not because the agent refused it.
pub fn lost_connection(s: &tonic::Status) -> bool {
    matches!(s.code(), tonic::Code::Unavailable)
        || (s.code() == tonic::Code::Unknown && s.message() == "transport error")
}

/// Runs `call` again while it fails because its connection went away ([`lost_connection`]):
/// a restored guest resets its vsock connections once it runs, and the channel reconnects.
/// Other outcomes are returned. The caller bounds the time.
pub async fn until_connected<T, F, Fut>(mut call: F) -> std::result::Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, tonic::Status>>,
{
    loop {
        match call().await {
            Err(s) if lost_connection(&s) => {
                tracing::debug!("agent call: {}; again", s.message());
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            r => return r,
        }
    }
}

/// An error with its chain of causes (tonic's own text is only "transport error").
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
