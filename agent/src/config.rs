//! The agent's configuration: the image's defaults for commands and the
//! sandbox's entrypoint, received once through `Agent.Configure`
//! (`pvisor.agent.v1.AgentConfig`, the same message on every backend).
pub use pvisor_proto::agent::AgentConfig;

/// Defaults derived from the configuration.
pub trait ImageDefaults {
    /// Default working directory (the image's `WorkingDir`), `/` when empty.
    fn workdir(&self) -> &str;
}

impl ImageDefaults for AgentConfig {
    fn workdir(&self) -> &str {
        if self.workdir.is_empty() {
            "/"
        } else {
            &self.workdir
        }
    }
}
