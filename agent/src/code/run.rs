//! Running one cell on a driver: output chunks, results, the end event,
//! interrupt and the kill 3 s after it.
//!
//! Ordering: the driver flushes fds 1/2 before each control message, so on
//! reading one the agent first drains what fds 1/2 hold (non-blocking) and
//! emits it; output thus keeps its place relative to results and the end.
//! Both output pipes are read while the cell runs, so a cell writing a lot
//! to either never blocks on a full pipe. Chunks are at most [`CHUNK`] bytes.
use super::driver::{Control, Driver};
use super::events::{ename, Events};
use super::protocol::{bundle, FromDriver, ToDriver};
use super::utf8::Utf8Chunks;
use pvisor_proto::agent::{code_event::Kind, CodeResult};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Largest output chunk (a read is a little smaller so a carried partial
/// UTF-8 sequence fits).
pub const CHUNK: usize = 64 << 10;
/// How often SIGINT is repeated for drivers that want it, until the cell
/// ends or the grace is over.
pub const INTERRUPT_REPEAT: Duration = Duration::from_millis(250);
/// How long a chunk ending mid-line waits for the rest of its line.
const LINE_WAIT: Duration = Duration::from_millis(2);
/// How long a cell may go on after SIGINT before its driver is killed.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

/// What is left of the driver after the cell.
pub enum After {
    /// Alive and idle.
    Keep,
    /// Killed after an interrupt, or dead: start a fresh one next time.
    Gone,
}

#[derive(Clone, Copy)]
enum Stream {
    Out,
    Err,
}

struct Output {
    out: Utf8Chunks,
    err: Utf8Chunks,
}

impl Output {
    async fn emit(&mut self, ev: &Events, which: Stream, bytes: &[u8]) {
        let dec = match which {
            Stream::Out => &mut self.out,
            Stream::Err => &mut self.err,
        };
        if let Some(text) = dec.push(bytes) {
            ev.send(kind(which, text)).await;
        }
    }

    async fn flush(&mut self, ev: &Events) {
        if let Some(t) = self.out.flush() {
            ev.send(kind(Stream::Out, t)).await;
        }
        if let Some(t) = self.err.flush() {
            ev.send(kind(Stream::Err, t)).await;
        }
    }

    /// Emits what both pipes hold right now, without waiting.
    async fn drain(&mut self, stdout: &pipe::Receiver, stderr: &pipe::Receiver, ev: &Events) {
        for (which, r) in [(Stream::Out, stdout), (Stream::Err, stderr)] {
            let mut buf = vec![0u8; CHUNK - 4];
            while let Ok(n) = read_now(r, &mut buf) {
                if n == 0 {
                    break;
                }
                self.emit(ev, which, &buf[..n]).await;
            }
        }
    }
}

fn kind(which: Stream, text: String) -> Kind {
    match which {
        Stream::Out => Kind::Stdout(text),
        Stream::Err => Kind::Stderr(text),
    }
}

/// One non-blocking read (the pipe is O_NONBLOCK): bytes already in the
/// pipe are returned even if tokio has not seen its readiness yet.
fn read_now(r: &pipe::Receiver, buf: &mut [u8]) -> nix::Result<usize> {
    nix::unistd::read(r.as_raw_fd(), buf)
}

/// Runs `code` on `d`, sending its events and exactly one end event
/// (Complete or Error) to `ev`. `interrupts` yields once per interrupt request.
/// `deleted` tells a driver killed by the context's deletion from one that died.
pub async fn run_cell(
    d: &mut Driver,
    code: &str,
    ev: &Events,
    interrupts: &mut mpsc::UnboundedReceiver<()>,
    deleted: &AtomicBool,
) -> After {
    let mut output = Output { out: Utf8Chunks::default(), err: Utf8Chunks::default() };
    if d.send(&ToDriver::Exec { code }).await.is_err() {
        ev.error(ename::RESTARTED, "the interpreter is gone; the context starts afresh on its next run", vec![], 0)
            .await;
        return After::Gone;
    }
    let count = d.count + 1;
    let pid = d.pid;
    let repeat = d.repeat_interrupt;
    let mut again_at: Option<Instant> = None;
    let Driver { stdout, stderr, control_out, count: last_count, .. } = d;
    let mut error: Option<(String, String, Vec<String>)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut obuf = vec![0u8; CHUNK - 4];
    let mut ebuf = vec![0u8; CHUNK - 4];
    let (mut out_open, mut err_open) = (true, true);
    loop {
        tokio::select! {
            biased;
            n = stdout.read(&mut obuf), if out_open => match n {
                Ok(n) if n > 0 => {
                    let n = top_up(stdout, &mut obuf, n).await;
                    output.emit(ev, Stream::Out, &obuf[..n]).await
                }
                _ => out_open = false,
            },
            n = stderr.read(&mut ebuf), if err_open => match n {
                Ok(n) if n > 0 => {
                    let n = top_up(stderr, &mut ebuf, n).await;
                    output.emit(ev, Stream::Err, &ebuf[..n]).await
                }
                _ => err_open = false,
            },
            m = control_out.next() => {
                output.drain(stdout, stderr, ev).await;
                match m {
                    Ok(Some(Control::Message(FromDriver::Result { data, main }))) => {
                        let r = CodeResult { execution_count: count, data: bundle(data), is_main_result: main };
                        ev.send(Kind::Result(r)).await;
                    }
                    Ok(Some(Control::Message(FromDriver::Error { ename, evalue, traceback }))) => {
                        error = Some((ename, evalue, traceback));
                    }
                    Ok(Some(Control::Message(FromDriver::Done { count }))) => {
                        output.flush(ev).await;
                        *last_count = count;
                        match error {
                            Some((n, v, tb)) => ev.error(&n, v, tb, count).await,
                            None => ev.complete(count).await,
                        }
                        return After::Keep;
                    }
                    Ok(Some(Control::Bad(why))) => {
                        ev.send(Kind::Stderr(format!("pvisor: dropped {why}\n"))).await;
                    }
                    Ok(Some(Control::Message(_))) => {}
                    Ok(None) | Err(_) => {
                        output.flush(ev).await;
                        if deleted.load(Ordering::SeqCst) {
                            ev.error(ename::DELETED, "the context was deleted", vec![], count).await;
                        } else {
                            let why = "the interpreter exited during the cell; its state is lost and the \
                                       context starts afresh on its next run";
                            ev.error(ename::RESTARTED, why, vec![], count).await;
                        }
                        return After::Gone;
                    }
                }
            },
            Some(()) = interrupts.recv() => {
                super::driver::interrupt(pid);
                kill_at.get_or_insert(Instant::now() + INTERRUPT_GRACE);
                again_at = repeat.then(|| Instant::now() + INTERRUPT_REPEAT);
            },
            _ = sleep_until(again_at), if again_at.is_some() => {
                super::driver::interrupt(pid);
                again_at = Some(Instant::now() + INTERRUPT_REPEAT);
            },
            _ = sleep_until(kill_at), if kill_at.is_some() => {
                output.drain(stdout, stderr, ev).await;
                output.flush(ev).await;
                let why = format!(
                    "the cell ignored the interrupt for {}s and was killed; the context's state is lost",
                    INTERRUPT_GRACE.as_secs()
                );
                ev.error(ename::RESTARTED, why, vec![], count).await;
                return After::Gone;
            },
        }
    }
}

/// Completes a chunk that ends mid-line with what follows within
/// [`LINE_WAIT`] (`print` writes a line's text and its newline separately),
/// so lines mostly arrive whole; returns the chunk's new length.
async fn top_up(r: &mut pipe::Receiver, buf: &mut [u8], mut n: usize) -> usize {
    let deadline = Instant::now() + LINE_WAIT;
    while n < buf.len() && buf[n - 1] != b'\n' {
        match tokio::time::timeout_at(deadline, r.read(&mut buf[n..])).await {
            Ok(Ok(m)) if m > 0 => n += m,
            _ => break,
        }
    }
    n
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
