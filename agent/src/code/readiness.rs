//! The SDK's readiness probe: `CodeInterpreter.create` checks, with bash,
//! that 127.0.0.1:44771 accepts a connection inside the sandbox (the
//! reference's Jupyter port). The agent listens there, accepts and closes.
//! A bind failure (the port taken) is logged, not fatal.
use std::time::Duration;

/// The port the SDK probes (`JUPYTER_PORT`'s default).
pub const PORT: u16 = 44771;

/// Starts the listener in the background (on the current tokio runtime).
pub fn spawn() {
    tokio::spawn(async {
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", PORT)).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("code interpreter readiness port 127.0.0.1:{PORT}: {e}");
                return;
            }
        };
        loop {
            match listener.accept().await {
                Ok((conn, _)) => drop(conn),
                // Out of fds, say: do not spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
}
