//! A guest `/init` built from the agent library, for tests and experiments
//! until the agent's own `main` dispatches guest mode (see
//! `pvisor_agent::guest`): boots into the sandbox's root (or runs the
//! self-test with `pvisor.selftest=1`), then serves the agent's gRPC API on
//! vsock with the default configuration.
//!
//! Build it static, like the agent:
//! `RUSTFLAGS="-C target-feature=+crt-static" cargo build --target x86_64-unknown-linux-gnu -p pvisor-agent --example guest_init`
use pvisor_agent::guest::{self, console, power, vsock};
use pvisor_agent::{config::AgentConfig, reaper, server::MAX_MESSAGE, service::AgentService};
use pvisor_proto::agent::agent_server::AgentServer;

fn main() {
    if !guest::is_guest_init() {
        eprintln!("guest_init: this is the /init of a microVM (PID 1, no arguments)");
        std::process::exit(2);
    }
    let cfg = guest::init();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            console::line(&format!("tokio runtime: {e}"));
            power::poweroff();
        }
    };
    let result = rt.block_on(async move {
        tokio::spawn(async {
            if let Err(e) = reaper::run().await {
                console::line(&format!("reaper: {e}"));
            }
        });
        let incoming = vsock::incoming(cfg.port)?;
        let agent = AgentServer::new(AgentService::new(AgentConfig::default()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        tonic::transport::Server::builder().add_service(agent).serve_with_incoming(incoming).await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    });
    if let Err(e) = result {
        console::line(&format!("serving on vsock port {}: {e}", cfg.port));
    }
    power::poweroff();
}
