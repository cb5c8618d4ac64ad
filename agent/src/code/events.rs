//! Building and sending a run's `CodeEvent`s.
use pvisor_proto::agent::{code_event::Kind, CodeComplete, CodeError as ErrorEvent, CodeEvent};
use pvisor_proto::now_ms;
use std::time::Instant;
use tokio::sync::mpsc;

/// Where a run's events go (the RunCode stream).
pub type CodeTx = mpsc::Sender<Result<CodeEvent, tonic::Status>>;

/// A run's event sink. A client that went away does not stop the run:
/// events are then dropped.
pub struct Events {
    tx: CodeTx,
    started: Instant,
}

impl Events {
    pub fn new(tx: CodeTx) -> Self {
        Events { tx, started: Instant::now() }
    }

    /// Restarts the clock of `execution_time_ms` (the run got its turn).
    pub fn start_clock(&mut self) {
        self.started = Instant::now();
    }

    pub async fn send(&self, kind: Kind) {
        let _ = self.tx.send(Ok(CodeEvent { kind: Some(kind), timestamp_ms: now_ms() })).await;
    }

    pub async fn complete(&self, count: u32) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.send(Kind::Complete(CodeComplete { execution_count: count, execution_time_ms: ms })).await;
    }

    pub async fn error(&self, ename: &str, evalue: impl Into<String>, traceback: Vec<String>, count: u32) {
        let e = ErrorEvent { ename: ename.into(), evalue: evalue.into(), traceback, execution_count: count };
        self.send(Kind::Error(e)).await;
    }
}

/// Error names of runs the agent itself ends.
pub mod ename {
    /// The cell ignored an interrupt and was killed; the context's state is gone.
    pub const RESTARTED: &str = "ContextRestarted";
    /// The context was deleted while the run waited or ran.
    pub const DELETED: &str = "ContextDeleted";
    /// The interpreter could not be started.
    pub const START: &str = "InterpreterStartError";
    /// A bash command exited non-zero (evalue: the status).
    pub const COMMAND: &str = "CommandExecError";
}
