//! One interpreter driver process (`PROTOCOL.md`): spawned like the
//! sandbox's commands ([`crate::spawn`]: the image's user, environment and
//! working directory, its own process group, reaped by [`crate::reaper`]),
//! with the control pipes as fds 3 (in) and 4 (out).
//!
//! A driver is a child of the agent, so it lives in the sandbox's cgroup and
//! its memory counts against the sandbox's limits like any command's; it
//! ends with the sandbox (the agent is its init).
use super::error::{CodeError, Result};
use super::protocol::{FromDriver, ToDriver};
use crate::config::AgentConfig;
use crate::spawn::{kill_group, spawn, SpawnSpec};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

/// Largest control message (a result bundle with an image); longer lines
/// are dropped whole.
pub const MAX_CONTROL_LINE: usize = 48 << 20;
/// How long a driver may take to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Startup stderr kept for the error message of a driver that fails to start.
const START_STDERR: usize = 4096;

/// How to start a driver.
pub struct DriverSpec {
    pub argv: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: String,
    /// Repeat SIGINT until the cell ends (see [`INTERRUPT_REPEAT`](super::run::INTERRUPT_REPEAT)).
    pub repeat_interrupt: bool,
}

/// A running driver.
pub struct Driver {
    pub pid: i32,
    control_in: pipe::Sender,
    pub(super) control_out: ControlReader,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    exit: oneshot::Receiver<i32>,
    /// The execution count of the last finished cell.
    pub count: u32,
    pub repeat_interrupt: bool,
}

/// A control message, or a line that was not one.
#[derive(Debug)]
pub enum Control {
    Message(FromDriver),
    /// Too long or not valid JSON: the reason.
    Bad(String),
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| CodeError::Agent(crate::error::AgentError::io("pipe", e.into())))
}

impl Driver {
    /// Spawns the driver and waits for its `ready`.
    pub async fn start(spec: &DriverSpec, cfg: &AgentConfig) -> Result<Driver> {
        let (ctl_in_r, ctl_in_w) = pipe_pair()?;
        let (ctl_out_r, ctl_out_w) = pipe_pair()?;
        let sspec = SpawnSpec {
            argv: spec.argv.clone(),
            envs: spec.envs.clone(),
            cwd: spec.cwd.clone(),
            extra_fds: vec![(ctl_in_r.as_raw_fd(), 3), (ctl_out_w.as_raw_fd(), 4)],
            ..Default::default()
        };
        let sp = spawn(&sspec, cfg)?;
        // The child's ends live on in the child only: EOF on fd 4 then means
        // the driver is gone.
        drop((ctl_in_r, ctl_out_w));
        let io_err = |e: io::Error| CodeError::Agent(crate::error::AgentError::io("driver pipe", e));
        let mut d = Driver {
            pid: sp.pid,
            control_in: pipe::Sender::from_owned_fd(ctl_in_w).map_err(io_err)?,
            control_out: ControlReader::new(pipe::Receiver::from_owned_fd(ctl_out_r).map_err(io_err)?),
            stdout: sp.stdout,
            stderr: sp.stderr,
            exit: sp.exit,
            count: 0,
            repeat_interrupt: spec.repeat_interrupt,
        };
        match tokio::time::timeout(START_TIMEOUT, d.wait_ready()).await {
            Ok(Ok(())) => Ok(d),
            Ok(Err(why)) => {
                let code = d.kill().await;
                Err(CodeError::DriverStart(format!("{why} (exit status {code})")))
            }
            Err(_) => {
                d.kill().await;
                Err(CodeError::DriverStart(format!("no ready message within {START_TIMEOUT:?}")))
            }
        }
    }

    /// Reads until `ready`, reading (and keeping some of) stdout/stderr so a
    /// chatty start cannot block on a full pipe.
    async fn wait_ready(&mut self) -> std::result::Result<(), String> {
        let mut err = Vec::new();
        let mut obuf = vec![0u8; 16 << 10];
        let mut buf = vec![0u8; 16 << 10];
        let mut out_open = true;
        let mut err_open = true;
        loop {
            tokio::select! {
                n = self.stdout.read(&mut obuf), if out_open => out_open = matches!(n, Ok(n) if n > 0),
                n = self.stderr.read(&mut buf), if err_open => match n {
                    Ok(n) if n > 0 => err.extend_from_slice(&buf[..n.min(START_STDERR.saturating_sub(err.len()))]),
                    _ => err_open = false,
                },
                m = self.control_out.next() => match m {
                    Ok(Some(Control::Message(FromDriver::Ready { .. }))) => return Ok(()),
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => {
                        // Collect what the dying driver still wrote.
                        drain_into(&self.stderr, &mut err, START_STDERR);
                        let msg = String::from_utf8_lossy(&err).trim().to_string();
                        return Err(if msg.is_empty() { "it exited".into() } else { format!("it exited: {msg}") });
                    }
                },
            }
        }
    }

    /// Sends one message.
    pub async fn send(&mut self, msg: &ToDriver<'_>) -> io::Result<()> {
        self.control_in.write_all(&msg.line()).await
    }

    /// The next control message; `None` at EOF (the driver is gone).
    /// Cancel-safe: a partly read line is kept for the next call.
    pub async fn next(&mut self) -> io::Result<Option<Control>> {
        self.control_out.next().await
    }

    /// SIGINT to the driver itself (not its group: children of user code
    /// keep running unless the cell stops them).
    pub fn interrupt(&self) {
        interrupt(self.pid)
    }

    /// Kills the driver's process group and waits until the driver is
    /// reaped; returns its exit status.
    pub async fn kill(self) -> i32 {
        kill_group(self.pid).await;
        self.exit.await.unwrap_or(-1)
    }
}

/// SIGINT to the driver `pid`.
pub fn interrupt(pid: i32) {
    // SAFETY: kill(2) on a pid we spawned; the reaper only reaps it after it
    // exited, and a driver's pid is dropped once it is reaped; no memory is
    // involved.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
}

/// Reads what `r` holds right now (non-blocking reads until EAGAIN or EOF),
/// appending up to `cap` bytes to `into`.
fn drain_into(r: &pipe::Receiver, into: &mut Vec<u8>, cap: usize) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = nix::unistd::read(r.as_raw_fd(), &mut buf) {
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(into.len());
        into.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// JSON lines from fd 4, bounded.
pub(super) struct ControlReader {
    r: pipe::Receiver,
    buf: Vec<u8>,
    /// Bytes of `buf` already searched for a newline.
    scanned: usize,
    /// Inside a line that grew past the limit: discard until its newline.
    skipping: bool,
    max: usize,
}

impl ControlReader {
    fn new(r: pipe::Receiver) -> Self {
        Self::with_limit(r, MAX_CONTROL_LINE)
    }

    fn with_limit(r: pipe::Receiver, max: usize) -> Self {
        ControlReader { r, buf: Vec::new(), scanned: 0, skipping: false, max }
    }

    pub(super) async fn next(&mut self) -> io::Result<Option<Control>> {
        loop {
            if let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + pos;
                let line: Vec<u8> = self.buf.drain(..=end).take(end).collect();
                self.scanned = 0;
                if std::mem::take(&mut self.skipping) || line.len() > self.max {
                    return Ok(Some(Control::Bad(format!("a control message over {} bytes", self.max))));
                }
                if line.is_empty() {
                    continue;
                }
                return Ok(Some(match FromDriver::parse(&line) {
                    Ok(m) => Control::Message(m),
                    Err(e) => Control::Bad(format!("a control line that is not a message: {e}")),
                }));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.max {
                self.buf.clear();
                self.scanned = 0;
                self.skipping = true;
            }
            self.buf.reserve(64 << 10);
            // read_buf is cancel-safe: bytes are in `buf` once it returns.
            if self.r.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn control_lines_are_bounded_and_split_reads_join() {
        let (tx, rx) = pipe::pipe().unwrap();
        let mut tx = tx;
        let mut r = ControlReader::with_limit(rx, 1024);
        let long = format!("{{\"t\":\"ready\",\"version\":\"{}\"}}\n", "x".repeat(5000));
        let writer = tokio::spawn(async move {
            tx.write_all(b"{\"t\":\"do").await.unwrap();
            tokio::task::yield_now().await;
            tx.write_all(b"ne\",\"count\":1}\n\nnot json\n").await.unwrap();
            tx.write_all(long.as_bytes()).await.unwrap();
            tx.write_all(b"{\"t\":\"done\",\"count\":2}\n").await.unwrap();
        });
        let mut got = Vec::new();
        while let Some(c) = r.next().await.unwrap() {
            got.push(match c {
                Control::Message(m) => format!("{m:?}"),
                Control::Bad(why) => format!("bad: {why}"),
            });
        }
        writer.await.unwrap();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], "Done { count: 1 }");
        assert!(got[1].starts_with("bad: a control line that is not a message"), "{}", got[1]);
        assert_eq!(got[2], "bad: a control message over 1024 bytes");
        assert_eq!(got[3], "Done { count: 2 }");
    }
}
