//! What one client may make the broker hold: the `pvisor serve` flags of the
//! HTTP front end, with their defaults. Each bound is enforced where it
//! belongs: connections and header timing by the accept loop
//! ([`super::conn`]), header sizes, bodies and open streams by the request
//! guard ([`super::guard`]), creates and sandboxes by admission
//! ([`super::admission`]).
use std::time::Duration;

/// `pvisor serve` flags bounding clients (flattened into `serve`).
#[derive(Debug, Clone, clap::Args)]
pub struct HttpLimits {
    /// Seconds a client has to send a request's headers, counted from the
    /// connection's start or the end of its previous response; it is also
    /// how long an idle keep-alive connection stays open.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub header_timeout_secs: u64,
    /// Longest pause, in seconds, between two pieces of a request body.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub body_timeout_secs: u64,
    /// Slowest average body rate accepted (bytes per second, after the first
    /// `--body-timeout-secs`): a trickled body cannot hold a request open.
    #[arg(long, default_value_t = 4096, value_name = "BYTES")]
    pub min_body_rate: u64,
    /// Open client connections at most; past it a connection is answered
    /// 503 and closed.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_connections: usize,
    /// Open connections from one peer address at most (0: only
    /// `--max-connections`; local clients all share 127.0.0.1).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_connections_per_peer: usize,
    /// Largest request head (request line and headers), in bytes: 431 past it.
    #[arg(long, default_value_t = 32 << 10, value_name = "BYTES")]
    pub max_header_bytes: usize,
    /// Most header fields in one request: 431 past it.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_headers: usize,
    /// Largest body of the lifecycle and admin API (`/v1`, `/pvisor`): 413 past it.
    #[arg(long, default_value_t = 1 << 20, value_name = "BYTES")]
    pub max_body_bytes: usize,
    /// Largest buffered body of the execd data plane (commands, file edits): 413 past it.
    #[arg(long, default_value_t = 16 << 20, value_name = "BYTES")]
    pub max_exec_body_bytes: usize,
    /// Largest file upload (`/files/upload` streams; this bounds one request).
    #[arg(long, default_value_t = 4 << 30, value_name = "BYTES")]
    pub max_upload_bytes: u64,
    /// Data-plane requests open at once (command and log streams, metrics
    /// watches, downloads, tunnels included): 429 past it.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_streams: usize,
    /// Creates in progress at once; the ones past it wait their turn in a
    /// FIFO queue.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_concurrent_creates: usize,
    /// Creates waiting for their turn at most: 429 `TOO_MANY_CREATES` (with
    /// Retry-After) past it.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub create_queue: usize,
    /// Longest wait of a queued create (inside the official SDK's 30 s
    /// request timeout): 429 `TOO_MANY_CREATES` (with Retry-After) past it.
    #[arg(long, default_value_t = 20, value_name = "SECS")]
    pub create_queue_wait_secs: u64,
    /// Sandboxes this server holds at most (creating ones included): 429
    /// `SANDBOX_LIMIT_REACHED` past it.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub max_sandboxes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout_secs: 10,
            body_timeout_secs: 30,
            min_body_rate: 4096,
            max_connections: 4096,
            max_connections_per_peer: 0,
            max_header_bytes: 32 << 10,
            max_headers: 100,
            max_body_bytes: 1 << 20,
            max_exec_body_bytes: 16 << 20,
            max_upload_bytes: 4 << 30,
            max_streams: 1024,
            max_concurrent_creates: 8,
            create_queue: 256,
            create_queue_wait_secs: 20,
            max_sandboxes: 500,
        }
    }
}

impl HttpLimits {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_secs.max(1))
    }
    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.body_timeout_secs.max(1))
    }
    pub fn create_queue_wait(&self) -> Duration {
        Duration::from_secs(self.create_queue_wait_secs)
    }

    /// Refuses settings that would make the server unusable.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("--max-connections", self.max_connections),
            ("--max-header-bytes", self.max_header_bytes),
            ("--max-headers", self.max_headers),
            ("--max-streams", self.max_streams),
            ("--max-concurrent-creates", self.max_concurrent_creates),
            ("--max-sandboxes", self.max_sandboxes),
        ];
        match positive.iter().find(|(_, v)| *v == 0) {
            Some((name, _)) => Err(format!("{name} must be at least 1")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        limits: HttpLimits,
    }

    #[test]
    fn flag_defaults_are_the_documented_defaults() {
        let parsed = Cli::parse_from(["pvisor"]).limits;
        assert_eq!(format!("{parsed:?}"), format!("{:?}", HttpLimits::default()));
        assert!(parsed.check().is_ok());
    }

    #[test]
    fn zero_caps_are_refused() {
        let l = Cli::parse_from(["pvisor", "--max-sandboxes", "0"]).limits;
        assert!(l.check().unwrap_err().contains("--max-sandboxes"));
    }
}
