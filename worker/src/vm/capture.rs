//! Capturing a vm template during a create (`VmConfig.template_capture`): once the guest's
//! agent first answers, and before it is configured (so every clone configures its own
//! sandbox), the machine is saved as an API snapshot is ([`Sandbox::snapshot`]: vCPUs
//! stopped, state written, the scratch disk copied, the vCPUs run on). The broker turns the
//! files into a template once the create is Ready. A capture that fails is logged and the
//! create goes on: a template is an optimisation.
use crate::agent_link::until_connected;
use crate::backend::{Sandbox, SnapshotFiles, SnapshotTaken};
use crate::config::TemplateCapture;
use pvisor_proto::agent::agent_client::AgentClient;
use std::sync::Arc;
use tonic::transport::Channel;

/// Waits for the agent's first answer, then captures (see the module). None if it failed.
pub async fn capture(
    client: &mut AgentClient<Channel>,
    sb: Arc<dyn Sandbox>,
    capture: TemplateCapture,
) -> Option<SnapshotTaken> {
    let pinged = until_connected(|| {
        let mut c = client.clone();
        async move { c.ping(pvisor_proto::agent::Empty {}).await }
    })
    .await;
    if let Err(s) = pinged {
        tracing::warn!("template capture: the agent: {}", s.message());
        return None;
    }
    let files = SnapshotFiles {
        state: capture.state_file.into(),
        memory: capture.memory_file.into(),
        scratch: capture.scratch_file.into(),
    };
    let saved = tokio::task::spawn_blocking(move || sb.snapshot(&files));
    match saved.await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(e)) => {
            tracing::warn!("template capture: {e}");
            None
        }
        Err(e) => {
            tracing::warn!("template capture: {e}");
            None
        }
    }
}
