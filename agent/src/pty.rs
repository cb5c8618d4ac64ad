//! Interactive terminals (`Agent.Pty`, behind `pvisor exec -it`): a process
//! on a new pty of the sandbox's devpts, as the leader of its own session
//! with the pty as its controlling terminal, so job control, Ctrl-C (the
//! byte 0x03 through the line discipline) and window sizes work as in a
//! local terminal.
//!
//! The pty is opened without a path lookup of the slave: `/dev/ptmx`, then
//! `TIOCSPTLCK` (unlock) and `TIOCGPTPEER` (the slave as an fd), both ends
//! close-on-exec in the agent. Input and output are relayed by two tasks on
//! the non-blocking master; output ends when the process has exited and
//! what it wrote is read, then the exit follows. A client that goes away
//! hangs the session up (`SIGHUP` to its process group).
use crate::config::AgentConfig;
use crate::error::{AgentError, Result};
use crate::spawn::{spawn_on_pty, SpawnSpec};
use pvisor_proto::agent::{pty_input, pty_output, ExitStatus, PtyInput, PtyOutput, PtySize};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};
use tonic::{Status, Streaming};

pub type OutTx = mpsc::Sender<std::result::Result<PtyOutput, Status>>;

/// A new pty: (master, slave).
fn open_pty() -> Result<(OwnedFd, OwnedFd)> {
    let master: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open("/dev/ptmx")
        .map_err(|e| AgentError::io("/dev/ptmx", e))?
        .into();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int through the pointer, valid for the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(AgentError::io("pty unlock", std::io::Error::last_os_error()));
    }
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new fd.
    let slave =
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if slave < 0 {
        return Err(AgentError::io("pty peer", std::io::Error::last_os_error()));
    }
    // SAFETY: a non-negative return is a fresh fd that nothing else owns.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

fn set_size(master: &OwnedFd, size: &PtySize) {
    let clamp = |v: u32| v.clamp(1, u16::MAX as u32) as u16;
    let ws = libc::winsize { ws_row: clamp(size.rows), ws_col: clamp(size.cols), ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize through the pointer, valid for the call.
    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
}

/// Starts the terminal of the stream's first message and relays the rest.
pub async fn open(cfg: &AgentConfig, mut input: Streaming<PtyInput>, tx: OutTx) -> Result<()> {
    let first = input.message().await.map_err(|s| AgentError::InvalidArgument(s.message().to_string()))?;
    let Some(PtyInput { kind: Some(pty_input::Kind::Start(start)) }) = first else {
        return Err(AgentError::InvalidArgument("the first message of a pty must be `start`".into()));
    };
    let argv = if start.argv.is_empty() { vec!["/bin/sh".to_string()] } else { start.argv };
    let mut spec = SpawnSpec { argv, cwd: start.cwd, uid: start.uid, gid: start.gid, ..Default::default() };
    spec.envs = start.envs.into_iter().collect();
    let term = if start.term.is_empty() { "xterm".to_string() } else { start.term };
    spec.envs.entry("TERM".into()).or_insert(term);
    let (master, slave) = open_pty()?;
    if let Some(size) = &start.size {
        set_size(&master, size);
    }
    let started = Instant::now();
    let (pid, exit) = spawn_on_pty(&spec, cfg, &slave)?;
    drop(slave);
    // SAFETY: `master` is an open fd owned by the AsyncFd for its whole life
    // (an OwnedFd, closed only when the AsyncFd drops it).
    let master = unsafe { AsyncFd::register(master) }.map_err(|e| AgentError::io("pty", std::io::Error::from(e)))?;
    let master = Arc::new(master);
    tokio::spawn(relay_input(master.clone(), input, pid));
    tokio::spawn(relay_output(master, exit, tx, started));
    Ok(())
}

/// Writes all of `data` to the master.
async fn write_all(master: &AsyncFd<OwnedFd>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        let mut guard = master.writable().await?;
        // SAFETY: write(2) reads at most data.len() bytes from a live slice.
        let r = guard.try_io(|fd| match unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) } {
            n if n >= 0 => Ok(n as usize),
            _ => Err(std::io::Error::last_os_error()),
        });
        match r {
            Ok(Ok(n)) => data = &data[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

async fn relay_input(master: Arc<AsyncFd<OwnedFd>>, mut input: Streaming<PtyInput>, pid: i32) {
    while let Ok(Some(msg)) = input.message().await {
        match msg.kind {
            Some(pty_input::Kind::Data(d)) => {
                if write_all(&master, &d).await.is_err() {
                    return; // the terminal is gone (the process exited)
                }
            }
            Some(pty_input::Kind::Resize(size)) => {
                set_size(master.get_ref(), &size);
                // SAFETY: kill(2) on the session's process group; no memory involved.
                unsafe { libc::kill(-pid, libc::SIGWINCH) };
            }
            Some(pty_input::Kind::Signal(sig)) => {
                // SAFETY: as above; an invalid signal number is refused by the kernel.
                unsafe { libc::kill(-pid, sig) };
            }
            Some(pty_input::Kind::Start(_)) | None => {}
        }
    }
    // The client went away: hang the session up, as a closed terminal would.
    // SAFETY: as above.
    unsafe { libc::kill(-pid, libc::SIGHUP) };
}

/// Reads what is readable now; None once the slave side is closed (EIO).
fn read_now(master: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> Option<std::io::Result<usize>> {
    // SAFETY: read(2) writes at most buf.len() bytes into a live buffer.
    match unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } {
        0 => None,
        n if n > 0 => Some(Ok(n as usize)),
        _ => match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EIO) => None,
            e => Some(Err(e)),
        },
    }
}

async fn relay_output(master: Arc<AsyncFd<OwnedFd>>, mut exit: oneshot::Receiver<i32>, tx: OutTx, started: Instant) {
    let mut buf = vec![0u8; 16 << 10];
    let send = |d: &[u8]| PtyOutput { kind: Some(pty_output::Kind::Data(d.to_vec())) };
    let code = loop {
        tokio::select! {
            code = &mut exit => break code.unwrap_or(-1),
            guard = master.readable() => {
                let Ok(mut guard) = guard else { break (&mut exit).await.unwrap_or(-1) };
                match read_now(&master, &mut buf) {
                    Some(Ok(n)) => {
                        if tx.send(Ok(send(&buf[..n]))).await.is_err() {
                            break (&mut exit).await.unwrap_or(-1);
                        }
                    }
                    Some(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => guard.clear_ready(),
                    // Closed (every holder of the slave exited) or failed: wait for the exit.
                    _ => break (&mut exit).await.unwrap_or(-1),
                }
            }
        }
    };
    // Whatever the process wrote before it exited.
    while let Some(Ok(n)) = read_now(&master, &mut buf) {
        if tx.send(Ok(send(&buf[..n]))).await.is_err() {
            break;
        }
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let status = ExitStatus { code, error: String::new(), elapsed_ms, timed_out: false };
    let _ = tx.send(Ok(PtyOutput { kind: Some(pty_output::Kind::Exit(status)) })).await;
}
