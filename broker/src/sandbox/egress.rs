//! Keeping a sandbox's netd in step with the policy the broker holds.
//!
//! The policy lives in the sandbox's record ([`SandboxEntry::egress`]), so
//! it survives pause and resume. Every change is pushed with
//! `Worker.SetEgressPolicy` while the record's lock is held; a paused
//! sandbox (whose netd may be frozen with it) is not pushed to, and gets the
//! current policy again when it resumes. Pause and resume take the same lock,
//! so a push never races a freeze.
use super::{SandboxEntry, State};
use crate::api::error::{ApiError, ApiResult};
use pvisor_net::policy::Policy;
use pvisor_proto::worker::worker_client::WorkerClient;

/// Sends `policy` to the sandbox's worker, unless the sandbox is paused.
pub async fn push(sb: &SandboxEntry, policy: &Policy) -> ApiResult<()> {
    if sb.status().state == State::Paused {
        return Ok(());
    }
    send(sb, policy).await
}

async fn send(sb: &SandboxEntry, policy: &Policy) -> ApiResult<()> {
    let mut client = WorkerClient::new(sb.channel()?);
    client.set_egress_policy(policy.to_proto()).await.map_err(|s| {
        ApiError::new(
            axum::http::StatusCode::BAD_GATEWAY,
            "EGRESS_POLICY_NOT_APPLIED",
            format!("the sandbox's network did not take the policy: {}", s.message()),
        )
    })?;
    Ok(())
}

/// Runs `call` (a worker pause or resume) with the policy locked; after a
/// resume (`then_push`), pushes the current policy again.
pub async fn with_policy_locked<F, T>(sb: &SandboxEntry, then_push: bool, call: F) -> ApiResult<T>
where
    F: std::future::Future<Output = ApiResult<T>>,
{
    let policy = sb.egress.lock().await;
    let out = call.await?;
    if then_push {
        if let Some(p) = policy.as_ref() {
            send(sb, p).await?;
        }
    }
    Ok(out)
}
