//! Lifecycle hooks (OpenSandbox OSEP-0020, `AgentConfig.lifecycle`): the
//! pre-start hook, which `Configure` runs before the periodic hooks and the
//! entrypoint start ([`crate::service`]), and the periodic hooks, scheduled
//! from then on for the sandbox's life ([`periodic`]). Every run is a
//! command of [`Commands`](crate::commands::Commands), the path of
//! `Agent.Exec`, with the image's env, workdir and user; runs are not
//! listed among the commands.
//!
//! They live in the agent, as the reference's live in execd: they need no
//! broker (a restarted or absent one changes nothing), a paused sandbox's
//! are frozen with it, and a vm snapshot's clones go on running them.
pub mod periodic;
mod run;

pub use run::{run, Outcome};

use pvisor_proto::agent::{Hook, HookFailure};

/// The API's name of the pre-start hook.
pub const PRE_START: &str = "preStart";

/// What `Configure` answers when the pre-start hook failed.
pub fn pre_start_failure(hook: &Hook, outcome: &Outcome) -> tonic::Status {
    let failure = HookFailure {
        hook: PRE_START.into(),
        exit_code: outcome.exit_code,
        timed_out: outcome.timed_out,
        error: outcome.describe(hook.timeout_secs),
        output: outcome.output.clone(),
    };
    let message = format!("lifecycle.{PRE_START} {:?} {}", hook.command, failure.error);
    pvisor_proto::hook_failure_status(&failure, message)
}
