//! The real agent binary, served on a Unix socket on the host (no sandbox
//! around it): commands, ordering, exit codes, timeouts, background commands,
//! sessions, files and tunnels, through its gRPC API.
mod common;

use common::{connect, start_unconfigured, Agent};
use pvisor_proto::agent::agent_client::AgentClient;
use pvisor_proto::agent::*;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

fn image_config() -> AgentConfig {
    AgentConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "IMAGE_VAR=from-image".into()],
        workdir: "/tmp".into(),
        ..Default::default()
    }
}

/// Starts the agent and configures it with the test image's defaults.
async fn start() -> Agent {
    let mut a = start_unconfigured().await;
    a.client.configure(image_config()).await.unwrap();
    a
}

#[derive(Default, Debug)]
struct Run {
    id: String,
    stdout: Vec<String>,
    stderr: Vec<String>,
    exit: Option<ExitStatus>,
}

async fn run(c: &mut AgentClient<Channel>, req: ExecRequest) -> Run {
    let mut s = c.exec(req).await.unwrap().into_inner();
    let mut r = Run::default();
    while let Some(ev) = s.message().await.unwrap() {
        assert!(ev.timestamp_ms > 0, "every event carries a timestamp");
        match ev.kind.unwrap() {
            exec_event::Kind::Init(id) => r.id = id,
            exec_event::Kind::Stdout(l) => r.stdout.push(l),
            exec_event::Kind::Stderr(l) => r.stderr.push(l),
            exec_event::Kind::Exit(x) => r.exit = Some(x),
        }
    }
    r
}

fn sh(cmd: &str) -> ExecRequest {
    ExecRequest { command: cmd.into(), ..Default::default() }
}

#[tokio::test]
async fn output_order_exit_codes_env_and_cwd() {
    let mut a = start().await;
    let r = run(&mut a.client, sh("seq 1 2000")).await;
    assert_eq!(r.stdout, (1..=2000).map(|i| i.to_string()).collect::<Vec<_>>());
    assert_eq!(r.exit.as_ref().unwrap().code, 0);
    assert!(!r.id.is_empty());

    let r = run(&mut a.client, sh("echo out; echo err >&2; exit 7")).await;
    assert_eq!((r.stdout.as_slice(), r.stderr.as_slice()), (&["out".to_string()][..], &["err".to_string()][..]));
    assert_eq!(r.exit.unwrap().code, 7);

    let mut req = sh("echo $IMAGE_VAR $REQ_VAR; pwd");
    req.envs.insert("REQ_VAR".into(), "from-request".into());
    let r = run(&mut a.client, req).await;
    assert_eq!(r.stdout, vec!["from-image from-request", "/tmp"]);

    let req = ExecRequest { argv: vec!["/bin/echo".into(), "a b".into()], cwd: "/".into(), ..Default::default() };
    assert_eq!(run(&mut a.client, req).await.stdout, vec!["a b"]);

    let r = run(&mut a.client, sh("printf 'no newline'")).await;
    assert_eq!(r.stdout, vec!["no newline"]);
}

#[tokio::test]
async fn bad_requests_are_refused_before_running() {
    let mut a = start().await;
    let e = a.client.exec(ExecRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = a
        .client
        .exec(ExecRequest { command: "true".into(), cwd: "/no/such/dir".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("/no/such/dir"));
    let e = a.client.stat(PathsRequest { paths: vec!["/../etc/passwd".into()] }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = a.client.stat(PathsRequest { paths: vec!["/no/such/file".into()] }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn timeouts_kill_and_leftover_daemons_do_not_hang() {
    let mut a = start().await;
    let t = Instant::now();
    let r = run(&mut a.client, ExecRequest { command: "sleep 30".into(), timeout_ms: 300, ..Default::default() }).await;
    let x = r.exit.unwrap();
    assert_eq!(x.code, 137);
    assert!(x.error.contains("timed out"), "{x:?}");
    assert!(t.elapsed() < Duration::from_secs(5));

    let t = Instant::now();
    let r = run(&mut a.client, sh("sleep 60 & echo started")).await;
    assert_eq!(r.stdout, vec!["started"]);
    assert!(t.elapsed() < Duration::from_secs(5), "a background child holding the pipe must not block the command");
}

#[tokio::test]
async fn background_status_logs_and_interrupt() {
    let mut a = start().await;
    let r = run(
        &mut a.client,
        ExecRequest { command: "echo one; echo two >&2; sleep 30".into(), background: true, ..Default::default() },
    )
    .await;
    assert!(r.exit.is_none(), "background commands return after init");
    let id = r.id;
    let deadline = Instant::now() + Duration::from_secs(5);
    let logs = loop {
        let l = a.client.command_logs(LogsRequest { id: id.clone(), cursor: 0 }).await.unwrap().into_inner();
        if l.cursor >= 2 || Instant::now() > deadline {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(logs.cursor, 2);
    assert!(logs.text.contains("one\n") && logs.text.contains("two\n"));
    let tail = a.client.command_logs(LogsRequest { id: id.clone(), cursor: 2 }).await.unwrap().into_inner();
    assert_eq!(tail.text, "");
    let st = a.client.command_status(CommandRef { id: id.clone() }).await.unwrap().into_inner();
    assert!(st.running && st.exit_code.is_none());
    a.client.interrupt(CommandRef { id: id.clone() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st = a.client.command_status(CommandRef { id: id.clone() }).await.unwrap().into_inner();
        if !st.running {
            assert_eq!(st.exit_code, Some(137));
            assert!(st.finished_at_ms.is_some());
            break;
        }
        assert!(Instant::now() < deadline, "interrupt did not stop the command");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = a.client.command_status(CommandRef { id: "nope".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn sessions_keep_cwd_and_variables() {
    let mut a = start().await;
    let sid = a.client.create_session(CreateSessionRequest { cwd: "/".into() }).await.unwrap().into_inner().id;
    let collect = |mut s: tonic::Streaming<ExecEvent>| async move {
        let mut out = Vec::new();
        let mut code = None;
        while let Some(ev) = s.message().await.unwrap() {
            match ev.kind.unwrap() {
                exec_event::Kind::Stdout(l) => out.push(l),
                exec_event::Kind::Exit(x) => code = Some(x.code),
                _ => {}
            }
        }
        (out, code)
    };
    let s = a
        .client
        .run_in_session(SessionRunRequest {
            session_id: sid.clone(),
            command: "cd /tmp && X=42".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(collect(s).await, (vec![], Some(0)));
    let s = a
        .client
        .run_in_session(SessionRunRequest {
            session_id: sid.clone(),
            command: "pwd; echo $X; printf tail; false".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(collect(s).await, (vec!["/tmp".to_string(), "42".to_string(), "tail".to_string()], Some(1)));
    a.client.delete_session(SessionRef { id: sid.clone() }).await.unwrap();
    let e = a
        .client
        .run_in_session(SessionRunRequest { session_id: sid, command: "true".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn upload_download_and_file_operations() {
    let mut a = start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/blob.bin").display().to_string();
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let mut msgs = vec![UploadChunk {
        kind: Some(upload_chunk::Kind::Header(UploadHeader {
            path: path.clone(),
            mode: Some(0o600),
            ..Default::default()
        })),
    }];
    msgs.extend(data.chunks(100_000).map(|c| UploadChunk { kind: Some(upload_chunk::Kind::Data(c.to_vec())) }));
    a.client.upload(tokio_stream::iter(msgs)).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);

    let mut got = Vec::new();
    let mut s = a
        .client
        .download(DownloadRequest { path: path.clone(), offset: 1000, limit: 5000, lines: None })
        .await
        .unwrap()
        .into_inner();
    while let Some(c) = s.message().await.unwrap() {
        got.extend(c.data);
    }
    assert_eq!(got, data[1000..6000]);

    // Line mode: lines 2 and 3, bytes as in the file (CRLF kept, no newline at the end).
    let text = dir.path().join("lines.txt").display().to_string();
    std::fs::write(&text, "one\ntwo\r\nthree").unwrap();
    let lines = Some(LineRange { first: 2, count: 2 });
    let mut s = a
        .client
        .download(DownloadRequest { path: text.clone(), lines, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(c) = s.message().await.unwrap() {
        got.extend(c.data);
    }
    assert_eq!(got, b"two\r\nthree");

    let info = a.client.stat(PathsRequest { paths: vec![path.clone()] }).await.unwrap().into_inner().files;
    assert_eq!((info[0].size, info[0].mode, info[0].r#type.as_str()), (data.len() as u64, 0o600, "file"));

    let root = dir.path().display().to_string();
    let found = a
        .client
        .search(SearchRequest { path: root.clone(), pattern: "*.bin".into() })
        .await
        .unwrap()
        .into_inner()
        .files;
    assert_eq!(found.len(), 1);
    let dest = format!("{root}/moved/blob.bin");
    a.client.r#move(MoveRequest { moves: vec![MovePair { src: path.clone(), dest: dest.clone() }] }).await.unwrap();
    assert!(!std::path::Path::new(&path).exists() && std::path::Path::new(&dest).exists());
    a.client.remove_files(PathsRequest { paths: vec![dest.clone()] }).await.unwrap();
    assert!(!std::path::Path::new(&dest).exists());
}

#[tokio::test]
async fn tunnel_reaches_a_local_port() {
    let mut a = start().await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&buf.to_ascii_uppercase()).await.unwrap();
    });
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(TunnelData { port: port as u32, data: b"hello".to_vec() }).await.unwrap();
    let mut s = a.client.tunnel(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let m = s.message().await.unwrap().unwrap();
    assert_eq!(m.data, b"HELLO");
    drop(tx);

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(TunnelData { port: 1, data: vec![] }).await.unwrap();
    let e = a.client.tunnel(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn nothing_but_ping_answers_before_configure() {
    let mut a = start_unconfigured().await;
    a.client.ping(Empty {}).await.expect("ping answers unconfigured");
    let e = a.client.exec(sh("echo hi")).await.expect_err("exec before Configure");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let e = a.client.stat(PathsRequest { paths: vec!["/".into()] }).await.expect_err("stat before Configure");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    a.client.configure(image_config()).await.unwrap();
    let r = run(&mut a.client, sh("echo $IMAGE_VAR; pwd")).await;
    assert_eq!(r.stdout, ["from-image", "/tmp"]);
}

#[tokio::test]
async fn configure_once_entrypoint_starts_and_a_different_config_is_refused() {
    let mut a = start_unconfigured().await;
    let dir = a._dir.path().to_path_buf();
    let marker = dir.join("entrypoint-ran");
    let cfg = AgentConfig {
        entrypoint: vec!["/bin/sh".into(), "-c".into(), format!("echo x >> {}", marker.display())],
        ..image_config()
    };
    a.client.configure(cfg.clone()).await.unwrap();
    // The same configuration again (a reconnecting worker) is accepted and
    // does not start the entrypoint a second time.
    a.client.configure(cfg.clone()).await.unwrap();
    let other = AgentConfig { workdir: "/".into(), ..cfg };
    let e = a.client.configure(other).await.expect_err("a different configuration");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the entrypoint did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n", "the entrypoint ran exactly once");
}

#[tokio::test]
async fn a_new_connection_finds_the_state_of_the_last() {
    let mut a = start().await;
    let r = run(&mut a.client, ExecRequest { background: true, ..sh("sleep 30") }).await;
    assert!(!r.id.is_empty());
    drop(std::mem::replace(&mut a.client, AgentClient::new(connect(&a.sock).await)));
    let st = a.client.command_status(CommandRef { id: r.id.clone() }).await.unwrap().into_inner();
    assert!(st.running, "the background command is still known and running after a reconnect");
    a.client.interrupt(CommandRef { id: r.id }).await.unwrap();
}
