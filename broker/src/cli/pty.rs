//! `pvisor exec -it ID -- CMD...`: an interactive terminal in a sandbox
//! (`/pvisor/sandboxes/{id}/pty`, see `api::pty`). The local terminal goes
//! to raw mode (restored on every way out), so keys, Ctrl-C included, reach
//! the sandbox's pty as bytes; its window size goes along at the start and
//! at each `SIGWINCH`. Exits with the command's exit code.
use super::client::Client;
use crate::api::pty::{read_message, write_message, PROTOCOL};
use bytes::BytesMut;
use hyper_util::rt::TokioIo;
use nix::sys::termios::{self, SetArg, Termios};
use pvisor_proto::agent::{pty_input, pty_output, PtyInput, PtyOutput, PtySize, PtyStart};
use std::io::Read;
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use tokio::signal::unix::{signal, SignalKind};

/// The local terminal in raw mode while this lives.
struct RawMode(Option<Termios>);

impl RawMode {
    fn enter() -> Result<RawMode, String> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(RawMode(None));
        }
        let saved = termios::tcgetattr(stdin.as_fd()).map_err(|e| format!("terminal: {e}"))?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw).map_err(|e| format!("terminal: {e}"))?;
        Ok(RawMode(Some(saved)))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

/// The local window size (of stdout, else stdin), if there is a terminal.
fn window_size() -> Option<PtySize> {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO] {
        let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes a winsize through the pointer, valid for the call.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_row > 0 {
            return Some(PtySize { rows: ws.ws_row.into(), cols: ws.ws_col.into() });
        }
    }
    None
}

fn input(kind: pty_input::Kind) -> PtyInput {
    PtyInput { kind: Some(kind) }
}

pub async fn exec_tty(c: &Client, id: &str, argv: &[String]) -> Result<i32, String> {
    let io = c.upgrade(&format!("/pvisor/sandboxes/{id}/pty"), PROTOCOL).await?;
    let (mut rd, mut wr) = tokio::io::split(TokioIo::new(io));
    let start = PtyStart {
        argv: argv.to_vec(),
        size: window_size(),
        term: std::env::var("TERM").unwrap_or_default(),
        ..Default::default()
    };
    write_message(&mut wr, &input(pty_input::Kind::Start(start))).await.map_err(|e| e.to_string())?;
    let _raw = RawMode::enter()?;
    let mut winch = signal(SignalKind::window_change()).map_err(|e| e.to_string())?;
    // Blocking reads of stdin on a thread of their own (it ends with the process).
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut b = vec![0u8; 4096];
        while let Ok(n @ 1..) = std::io::stdin().lock().read(&mut b) {
            if keys_tx.blocking_send(b[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut buf = BytesMut::new();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            msg = read_message::<PtyOutput, _>(&mut rd, &mut buf) => match msg.map_err(|e| e.to_string())? {
                Some(PtyOutput { kind: Some(pty_output::Kind::Data(d)) }) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&d).and_then(|_| out.flush()).map_err(|e| format!("stdout: {e}"))?;
                }
                Some(PtyOutput { kind: Some(pty_output::Kind::Exit(s)) }) => return Ok(s.code),
                Some(PtyOutput { kind: None }) => {}
                None => return Err("the terminal closed without an exit status".into()),
            },
            k = keys.recv(), if stdin_open => match k {
                None => stdin_open = false,
                Some(k) => write_message(&mut wr, &input(pty_input::Kind::Data(k))).await.map_err(|e| e.to_string())?,
            },
            _ = winch.recv() => {
                if let Some(size) = window_size() {
                    write_message(&mut wr, &input(pty_input::Kind::Resize(size))).await.map_err(|e| e.to_string())?;
                }
            }
        }
    }
}
