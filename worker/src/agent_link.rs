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
