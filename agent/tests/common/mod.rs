//! The real agent binary on a Unix socket on the host, for the integration
//! tests that drive its gRPC API (`agent.rs`, `code.rs`).
#![allow(dead_code)] // each test crate uses a part of it

use hyper_util::rt::TokioIo;
use pvisor_proto::agent::agent_client::AgentClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// A running agent, killed and reaped on drop.
pub struct Agent {
    pub child: Child,
    pub sock: PathBuf,
    pub _dir: tempfile::TempDir,
    pub client: AgentClient<Channel>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the agent on a socket path, unconfigured.
pub async fn start_unconfigured() -> Agent {
    let dir = tempfile::tempdir().unwrap();
    let sock: PathBuf = dir.path().join("agent.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_pvisor-agent")).arg("--listen").arg(&sock).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "agent socket did not appear");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let client = AgentClient::new(connect(&sock).await);
    Agent { child, sock, _dir: dir, client }
}

/// A new gRPC channel to the agent's socket.
pub async fn connect(sock: &Path) -> Channel {
    let path = sock.to_path_buf();
    Endpoint::from_static("http://agent")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}
