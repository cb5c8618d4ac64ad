//! One run of a hook: its command through [`Commands`], its outcome and
//! the tail of its output.
use crate::commands::Commands;
use pvisor_proto::agent::{exec_event, ExecRequest, Hook};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Output kept of a run: its last lines, at most this many bytes.
const OUTPUT_TAIL: usize = 4096;

/// How a run ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Exit status (128 + the signal when killed); -1 when it did not start.
    pub exit_code: i32,
    /// It ran past its timeout and was killed.
    pub timed_out: bool,
    /// Why it did not start, if it did not.
    pub spawn_error: Option<String>,
    /// The last lines of its stdout and stderr, interleaved as they came.
    pub output: String,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.exit_code == 0 && !self.timed_out && self.spawn_error.is_none()
    }

    /// What happened, in words ("exited with status 3").
    pub fn describe(&self, timeout_secs: u32) -> String {
        match (&self.spawn_error, self.timed_out) {
            (Some(e), _) => format!("did not start: {e}"),
            (None, true) => format!("did not finish within {timeout_secs} s and was killed"),
            (None, false) => format!("exited with status {}", self.exit_code),
        }
    }
}

/// Keeps the newest lines within [`OUTPUT_TAIL`] bytes.
#[derive(Default)]
struct Tail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl Tail {
    fn push(&mut self, mut line: String) {
        if line.len() > OUTPUT_TAIL {
            let mut cut = line.len() - OUTPUT_TAIL;
            while !line.is_char_boundary(cut) {
                cut += 1;
            }
            line.drain(..cut);
        }
        self.bytes += line.len() + 1;
        self.lines.push_back(line);
        while self.bytes > OUTPUT_TAIL {
            let Some(old) = self.lines.pop_front() else { break };
            self.bytes -= old.len() + 1;
        }
    }

    fn text(self) -> String {
        Vec::from(self.lines).join("\n")
    }
}

/// Runs `hook` to its end (or its timeout) and says how it ended.
pub async fn run(commands: &Arc<Commands>, hook: &Hook) -> Outcome {
    let req = ExecRequest {
        argv: hook.command.clone(),
        timeout_ms: u64::from(hook.timeout_secs) * 1000,
        ..Default::default()
    };
    let (tx, mut rx) = mpsc::channel(64);
    if let Err(e) = commands.exec_unlisted(req, tx) {
        return Outcome { exit_code: -1, spawn_error: Some(e.to_string()), ..Default::default() };
    }
    let mut tail = Tail::default();
    let mut outcome = Outcome { exit_code: -1, ..Default::default() };
    while let Some(Ok(ev)) = rx.recv().await {
        match ev.kind {
            Some(exec_event::Kind::Stdout(l) | exec_event::Kind::Stderr(l)) => tail.push(l),
            Some(exec_event::Kind::Exit(x)) => {
                outcome.exit_code = x.code;
                outcome.timed_out = x.timed_out;
            }
            _ => {}
        }
    }
    outcome.output = tail.text();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_newest_output_within_its_bound() {
        let mut t = Tail::default();
        for i in 0..2000 {
            t.push(format!("line {i}"));
        }
        let text = t.text();
        assert!(text.len() <= OUTPUT_TAIL, "{}", text.len());
        assert!(text.ends_with("line 1999"), "{text}");
        assert!(!text.contains("line 0\n"));
        let mut t = Tail::default();
        t.push("é".repeat(OUTPUT_TAIL));
        let text = t.text();
        assert!(text.len() <= OUTPUT_TAIL && text.chars().all(|c| c == 'é'), "cut on a character boundary");
    }

    #[test]
    fn outcomes_in_words() {
        let exited = Outcome { exit_code: 3, ..Default::default() };
        assert!(!exited.succeeded());
        assert_eq!(exited.describe(60), "exited with status 3");
        let killed = Outcome { exit_code: 137, timed_out: true, ..Default::default() };
        assert_eq!(killed.describe(2), "did not finish within 2 s and was killed");
        let missing = Outcome { exit_code: -1, spawn_error: Some("no such file".into()), ..Default::default() };
        assert_eq!(missing.describe(60), "did not start: no such file");
        assert!(Outcome::default().succeeded());
    }
}
