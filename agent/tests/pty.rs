//! The real agent's `Pty` (behind `pvisor exec -it`), on the host: a shell on
//! a pty sees the window size it was given and later resizes, Ctrl-C (the
//! byte 0x03) interrupts its foreground command, output arrives before the
//! exit status.
mod common;

use common::start_unconfigured;
use pvisor_proto::agent::*;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn data(b: &[u8]) -> PtyInput {
    PtyInput { kind: Some(pty_input::Kind::Data(b.to_vec())) }
}

#[tokio::test]
async fn a_shell_on_a_pty_gets_sizes_ctrl_c_and_its_exit() {
    let mut a = start_unconfigured().await;
    a.client
        .configure(AgentConfig { env: vec!["PATH=/usr/bin:/bin".into()], workdir: "/tmp".into(), ..Default::default() })
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(16);
    let start =
        PtyStart { argv: vec!["/bin/sh".into()], size: Some(PtySize { rows: 12, cols: 34 }), ..Default::default() };
    tx.send(PtyInput { kind: Some(pty_input::Kind::Start(start)) }).await.unwrap();
    let mut out = a.client.pty(ReceiverStream::new(rx)).await.unwrap().into_inner();
    let mut seen = Vec::new();
    // Reads output until `needle` shows (the test's deadline bounds it).
    macro_rules! expect {
        ($needle:expr) => {
            loop {
                if let Some(i) = seen.windows($needle.len()).position(|w| w == $needle) {
                    seen.drain(..i + $needle.len());
                    break;
                }
                match tokio::time::timeout(Duration::from_secs(30), out.message()).await {
                    Ok(Ok(Some(PtyOutput { kind: Some(pty_output::Kind::Data(d)) }))) => seen.extend(d),
                    other => panic!("waiting for {:?}: {other:?}, seen {:?}", $needle, String::from_utf8_lossy(&seen)),
                }
            }
        };
    }
    tx.send(data(b"PS1='> '; tty; stty size\r")).await.unwrap();
    expect!(b"/dev/pts/");
    expect!(b"12 34");
    tx.send(PtyInput { kind: Some(pty_input::Kind::Resize(PtySize { rows: 40, cols: 100 })) }).await.unwrap();
    tx.send(data(b"stty size\r")).await.unwrap();
    expect!(b"40 100");
    // The child says when it runs (the line's own echo has `$((1+1))`, not `2`).
    tx.send(data(b"sh -c 'echo sleeping-$((1+1)); exec sleep 100'\r")).await.unwrap();
    expect!(b"sleeping-2");
    tx.send(data(b"\x03")).await.unwrap();
    expect!(b"> ");
    tx.send(data(b"echo rc=$?; exit 5\r")).await.unwrap();
    expect!(b"rc=130");
    let exit = loop {
        match tokio::time::timeout(Duration::from_secs(30), out.message()).await.unwrap().unwrap() {
            Some(PtyOutput { kind: Some(pty_output::Kind::Exit(e)) }) => break e,
            Some(_) => {}
            None => panic!("the stream ended without an exit"),
        }
    };
    assert_eq!(exit.code, 5);
}

#[tokio::test]
async fn a_pty_must_start_with_start() {
    let mut a = start_unconfigured().await;
    a.client.configure(AgentConfig::default()).await.unwrap();
    let (tx, rx) = mpsc::channel(1);
    tx.send(data(b"ls\r")).await.unwrap();
    drop(tx);
    let e = a.client.pty(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
}
