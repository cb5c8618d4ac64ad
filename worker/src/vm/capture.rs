//! Capturing a vm template during a create (`VmConfig.template_capture`): once the guest's
//! agent first answers, and before it is configured (so every clone configures its own
//! sandbox), the machine is saved as an API snapshot is ([`Sandbox::snapshot`]: vCPUs
//! stopped, state written), the scratch disk copied while they are stopped, and the vCPUs run
//! on. The broker turns the files into a template once the create is Ready. A capture that
//! fails is logged and the create goes on: a template is an optimisation.
use crate::agent_link::lost_connection;
use crate::backend::Sandbox;
use crate::config::TemplateCapture;
use crate::error::{Result, WorkerError};
use pvisor_proto::agent::agent_client::AgentClient;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// A captured template: the guest's kernel command line and how long the vCPUs were stopped.
pub struct Captured {
    pub cmdline: String,
    pub stopped: Duration,
}

/// Waits for the agent's first answer, then captures (see the module). None if it failed.
pub async fn capture(
    client: &mut AgentClient<Channel>,
    sb: Arc<dyn Sandbox>,
    capture: TemplateCapture,
    scratch: String,
) -> Option<Captured> {
    loop {
        match client.ping(pvisor_proto::agent::Empty {}).await {
            Ok(_) => break,
            Err(s) if lost_connection(&s) => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(s) => {
                tracing::warn!("template capture: the agent: {}", s.message());
                return None;
            }
        }
    }
    match tokio::task::spawn_blocking(move || save(sb.as_ref(), &capture, &scratch)).await {
        Ok(Ok(c)) => Some(c),
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

fn save(sb: &dyn Sandbox, capture: &TemplateCapture, scratch: &str) -> Result<Captured> {
    let t = Instant::now();
    let taken = sb.snapshot(Path::new(&capture.state_file));
    // The vCPUs were stopped (also after most failures): the disk is as the guest left it.
    let copied = match &taken {
        Ok(_) => crate::ns::disk::copy_sparse(Path::new(scratch), Path::new(&capture.scratch_file)),
        Err(_) => Ok(()),
    };
    let resumed = sb.resume();
    let taken = taken?;
    copied?;
    resumed.map_err(|e| WorkerError::Snapshot(format!("resuming after the capture: {e}")))?;
    Ok(Captured { cmdline: taken.cmdline, stopped: t.elapsed() })
}
