//! The agent's start-up configuration: the image's defaults for commands.
use serde::{Deserialize, Serialize};

/// Passed by the backend as the agent's single argument (JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AgentConfig {
    /// `KEY=VALUE` environment of the image, plus the sandbox's own env.
    #[serde(default)]
    pub env: Vec<String>,
    /// Default working directory (the image's `WorkingDir`), `/` when empty.
    #[serde(default)]
    pub workdir: String,
    /// Default user (the image's `User`: `name`, `uid`, `name:group`, `uid:gid`).
    #[serde(default)]
    pub user: String,
    /// The sandbox's entrypoint, started in the background at boot when non-empty.
    #[serde(default)]
    pub entrypoint: Vec<String>,
}

impl AgentConfig {
    pub fn workdir(&self) -> &str {
        if self.workdir.is_empty() {
            "/"
        } else {
            &self.workdir
        }
    }
}
