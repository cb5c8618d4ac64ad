//! The code interpreter through the real agent binary's gRPC API (on a Unix
//! socket on the host): contexts, runs, results, errors, state, parallel and
//! queued runs, interrupts, bash and javascript contexts, the readiness port.
//! Python runs the real driver with the host's `python3`, javascript the
//! host's `node` (tests needing one that is absent skip visibly).
mod common;

use common::{start_unconfigured, Agent};
use pvisor_proto::agent::agent_client::AgentClient;
use pvisor_proto::agent::code_event::Kind;
use pvisor_proto::agent::*;
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

/// A test that waits longer than this has hung (a deadlock, a lost event).
const HANG: Duration = Duration::from_secs(60);

/// Starts the agent configured with `path` as the image's PATH.
async fn start_with_path(path: &str) -> Agent {
    let mut a = start_unconfigured().await;
    let cfg = AgentConfig { env: vec![format!("PATH={path}")], workdir: "/tmp".into(), ..Default::default() };
    a.client.configure(cfg).await.unwrap();
    a
}

/// The agent with the host's PATH (python3, node, bash).
async fn start() -> Agent {
    start_with_path(&std::env::var("PATH").unwrap()).await
}

fn on_path(program: &str) -> bool {
    std::env::var("PATH").unwrap().split(':').any(|d| Path::new(d).join(program).is_file())
}

/// All events of one run, in order.
#[derive(Debug, Default)]
struct Run {
    init: Vec<String>,
    events: Vec<Kind>,
}

impl Run {
    fn stdout(&self) -> String {
        self.events.iter().filter_map(|k| if let Kind::Stdout(s) = k { Some(s.as_str()) } else { None }).collect()
    }
    fn stderr(&self) -> String {
        self.events.iter().filter_map(|k| if let Kind::Stderr(s) = k { Some(s.as_str()) } else { None }).collect()
    }
    /// `text/plain` of each result.
    fn texts(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|k| if let Kind::Result(r) = k { r.data.get("text/plain").cloned() } else { None })
            .collect()
    }
    fn error(&self) -> Option<&CodeError> {
        match self.events.last() {
            Some(Kind::Error(e)) => Some(e),
            _ => None,
        }
    }
    fn completed(&self) -> bool {
        matches!(self.events.last(), Some(Kind::Complete(_)))
    }
    fn ename(&self) -> String {
        self.error().map(|e| e.ename.clone()).unwrap_or_else(|| format!("no error: {self:?}"))
    }
}

async fn collect(mut s: tonic::Streaming<CodeEvent>) -> Run {
    let mut r = Run::default();
    while let Some(ev) = tokio::time::timeout(HANG, s.message()).await.expect("run hung").unwrap() {
        assert!(ev.timestamp_ms > 0, "every event carries a timestamp");
        match ev.kind.unwrap() {
            Kind::Init(id) => r.init.push(id),
            Kind::Stdout(s) | Kind::Stderr(s) if s.is_empty() => panic!("an empty output chunk"),
            k => r.events.push(k),
        }
    }
    assert_eq!(r.init.len(), 1, "exactly one init: {r:?}");
    let ends = r.events.iter().filter(|k| matches!(k, Kind::Complete(_) | Kind::Error(_))).count();
    assert_eq!(ends, 1, "exactly one end event, last: {r:?}");
    assert!(matches!(r.events.last(), Some(Kind::Complete(_) | Kind::Error(_))), "the end comes last: {r:?}");
    r
}

fn req(ctx: &str, code: &str) -> RunCodeRequest {
    RunCodeRequest { code: code.into(), context_id: ctx.into(), ..Default::default() }
}

async fn run(c: &mut AgentClient<Channel>, ctx: &str, code: &str) -> Run {
    collect(c.run_code(req(ctx, code)).await.unwrap().into_inner()).await
}

async fn create(c: &mut AgentClient<Channel>, language: &str) -> String {
    let ctx = c.create_context(CreateContextRequest { language: language.into(), cwd: String::new() }).await.unwrap();
    ctx.into_inner().id
}

/// Starts a run and returns its stream once `marker` was printed (the cell
/// is then running).
async fn start_until(c: &mut AgentClient<Channel>, ctx: &str, code: &str, marker: &str) -> tonic::Streaming<CodeEvent> {
    let mut s = c.run_code(req(ctx, code)).await.unwrap().into_inner();
    let mut seen = String::new();
    while !seen.contains(marker) {
        let ev = tokio::time::timeout(HANG, s.message())
            .await
            .unwrap_or_else(|_| panic!("hung before {marker:?}: {seen:?}"))
            .unwrap()
            .expect("ended early");
        match ev.kind.unwrap() {
            Kind::Stdout(t) => seen.push_str(&t),
            Kind::Error(e) => panic!("cell failed: {e:?}"),
            _ => {}
        }
    }
    s
}

fn ids(list: &ContextList) -> Vec<&str> {
    list.contexts.iter().map(|c| c.id.as_str()).collect()
}

#[tokio::test]
async fn contexts_are_created_listed_and_deleted_and_the_default_is_reused() {
    let mut a = start().await;
    let c = &mut a.client;
    let id = create(c, "python").await;
    assert!(id.len() == 32 && id.chars().all(|ch| ch.is_ascii_hexdigit()), "{id}");
    let got = c.get_context(ContextRef { id: id.clone() }).await.unwrap().into_inner();
    assert_eq!((got.id.as_str(), got.language.as_str()), (id.as_str(), "python"));

    // A run without a context uses (and creates once) the language's default.
    let first = run(c, "", "1").await;
    let second = run(c, "", "2").await;
    assert_eq!(first.init, second.init, "the default context is reused");
    let default = first.init[0].clone();
    assert_ne!(default, id);
    let list = c.list_contexts(ListContextsRequest { language: "python".into() }).await.unwrap().into_inner();
    assert_eq!(ids(&list), vec![id.as_str(), default.as_str()]);
    let none = c.list_contexts(ListContextsRequest { language: "cobol".into() }).await.unwrap().into_inner();
    assert!(none.contexts.is_empty());

    c.delete_context(ContextRef { id: id.clone() }).await.unwrap();
    assert_eq!(c.get_context(ContextRef { id: id.clone() }).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(c.delete_context(ContextRef { id: id.clone() }).await.unwrap_err().code(), Code::NotFound);
    let e = c.run_code(req(&id, "1")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "an unknown context fails before the stream");

    let bash = create(c, "bash").await;
    c.delete_contexts(ListContextsRequest { language: "python".into() }).await.unwrap();
    let left = c.list_contexts(ListContextsRequest { language: String::new() }).await.unwrap().into_inner();
    assert_eq!(ids(&left), vec![bash.as_str()], "only python contexts were deleted");
    // A new default context replaces the deleted one.
    assert_ne!(run(c, "", "3").await.init[0], default);
}

#[tokio::test]
async fn python_results_output_order_state_and_errors() {
    let mut a = start().await;
    let c = &mut a.client;
    let ctx = create(c, "python").await;
    let r = run(c, &ctx, "result = 2 + 2\nresult").await;
    assert_eq!(r.texts(), vec!["4"]);
    assert!(r.completed());
    let Some(Kind::Result(res)) = r.events.first() else { panic!("{r:?}") };
    assert!(res.is_main_result);

    // Output keeps its place relative to results (chunk boundaries are the
    // pipe's: adjacent chunks are joined).
    let r = run(c, &ctx, "print('one')\ndisplay(2)\nprint('three')\nresult * 2").await;
    let mut order: Vec<String> = Vec::new();
    for k in &r.events {
        match (k, order.last_mut()) {
            (Kind::Stdout(s), Some(last)) if last.starts_with("out:") => last.push_str(s),
            (Kind::Stdout(s), _) => order.push(format!("out:{s}")),
            (Kind::Result(x), _) => order.push(format!("result:{}", x.data["text/plain"])),
            (Kind::Complete(_), _) => order.push("complete".into()),
            (other, _) => order.push(format!("{other:?}")),
        }
    }
    // Output written before a result comes before it. (Output written right
    // after a display() may overtake it: the two travel on different pipes.)
    let at = |what: &str| order.iter().position(|o| o.contains(what)).unwrap_or_else(|| panic!("{what}: {order:?}"));
    assert!(at("one") < at("result:2") && at("three") < at("result:8"), "{order:?}");
    assert_eq!(order.last().map(String::as_str), Some("complete"));

    let r = run(c, &ctx, "import sys\nprint('to stderr', file=sys.stderr)\n1/0").await;
    assert_eq!(r.stderr(), "to stderr\n");
    let e = r.error().unwrap();
    assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("ZeroDivisionError", "division by zero"));
    assert!(e.traceback.iter().any(|l| l.contains("<cell-")), "{:?}", e.traceback);
    // The context survives its error.
    assert_eq!(run(c, &ctx, "result").await.texts(), vec!["4"]);

    // Another context has its own state.
    let other = create(c, "python").await;
    assert_eq!(run(c, &other, "result").await.ename(), "NameError");
}

#[tokio::test]
async fn large_output_arrives_whole_in_bounded_chunks() {
    let mut a = start().await;
    let c = &mut a.client;
    let r = run(c, "", "import sys\nsys.stdout.write('x' * 3_000_000)\nsys.stderr.write('y' * 1_000_000)\n'end'").await;
    assert_eq!(r.stdout().len(), 3_000_000);
    assert_eq!(r.stderr().len(), 1_000_000);
    assert_eq!(r.texts(), vec!["'end'"]);
    for k in &r.events {
        if let Kind::Stdout(s) | Kind::Stderr(s) = k {
            assert!(s.len() <= 64 << 10, "a chunk of {} bytes", s.len());
        }
    }
}

#[tokio::test]
async fn contexts_run_in_parallel_and_a_busy_context_queues_fifo() {
    let mut a = start().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let (one, two) = (create(&mut a.client, "python").await, create(&mut a.client, "python").await);
    // `one` waits for a file that only `two` creates: this ends only if
    // both run at once.
    let wait = format!(
        "import os, time\norder = []\nprint('waiting', flush=True)\nwhile not os.path.exists({:?}): time.sleep(0.01)\norder.append(1)",
        flag.to_str().unwrap()
    );
    let waiting = start_until(&mut a.client, &one, &wait, "waiting").await;
    // Two more runs queue behind the busy one, in order.
    let mut queued = Vec::new();
    for n in [2, 3] {
        let mut s = a.client.run_code(req(&one, &format!("order.append({n})"))).await.unwrap().into_inner();
        let init = tokio::time::timeout(HANG, s.message()).await.unwrap().unwrap().unwrap();
        assert!(matches!(init.kind, Some(Kind::Init(_))));
        queued.push(s);
    }
    let r = run(&mut a.client, &two, &format!("open({:?}, 'w').close()", flag.to_str().unwrap())).await;
    assert!(r.completed(), "{r:?}");
    assert!(collect_rest(waiting).await.completed());
    for s in queued {
        assert!(collect_rest(s).await.completed());
    }
    assert_eq!(run(&mut a.client, &one, "order").await.texts(), vec!["[1, 2, 3]"]);
}

/// The rest of a run whose first events were read already.
async fn collect_rest(mut s: tonic::Streaming<CodeEvent>) -> Run {
    let mut r = Run { init: vec![String::new()], events: Vec::new() };
    while let Some(ev) = tokio::time::timeout(HANG, s.message()).await.expect("hung").unwrap() {
        r.events.push(ev.kind.unwrap());
    }
    r
}

#[tokio::test]
async fn a_run_whose_client_went_away_goes_on() {
    let mut a = start().await;
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let ctx = create(&mut a.client, "python").await;
    let code = format!(
        "import os, time\nprint('on', flush=True)\nwhile not os.path.exists({:?}): time.sleep(0.01)\nx = 'finished'",
        flag.to_str().unwrap()
    );
    drop(start_until(&mut a.client, &ctx, &code, "on").await);
    std::fs::write(&flag, b"").unwrap();
    // The next run waits for the abandoned one, which ran to its end.
    assert_eq!(run(&mut a.client, &ctx, "x").await.texts(), vec!["'finished'"]);
}

#[tokio::test]
async fn an_interrupt_stops_the_cell_and_keeps_the_context() {
    let mut a = start().await;
    let c = &mut a.client;
    let ctx = create(c, "python").await;
    // Idle: a no-op.
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    let s = start_until(c, &ctx, "import time\nx = 5\nprint('busy', flush=True)\nwhile True: time.sleep(0.05)", "busy")
        .await;
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    let r = collect_rest(s).await;
    assert_eq!(r.ename(), "KeyboardInterrupt");
    assert_eq!(run(c, &ctx, "x").await.texts(), vec!["5"]);
    let e = c.interrupt_code(ContextRef { id: "0".repeat(32) }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn a_cell_ignoring_the_interrupt_is_killed_and_its_context_restarted() {
    let mut a = start().await;
    let c = &mut a.client;
    let ctx = create(c, "python").await;
    assert!(run(c, &ctx, "y = 1").await.completed());
    let code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('deaf', flush=True)\nwhile True: time.sleep(0.05)";
    let s = start_until(c, &ctx, code, "deaf").await;
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    let r = collect_rest(s).await;
    assert_eq!(r.ename(), "ContextRestarted");
    // A fresh interpreter: working, without the old state.
    assert_eq!(run(c, &ctx, "1 + 1").await.texts(), vec!["2"]);
    assert_eq!(run(c, &ctx, "y").await.ename(), "NameError");
}

#[tokio::test]
async fn a_deleted_context_ends_its_running_cell() {
    let mut a = start().await;
    let c = &mut a.client;
    let ctx = create(c, "python").await;
    let s = start_until(c, &ctx, "import time\nprint('on', flush=True)\ntime.sleep(1000)", "on").await;
    c.delete_context(ContextRef { id: ctx.clone() }).await.unwrap();
    assert_eq!(collect_rest(s).await.ename(), "ContextDeleted");
}

#[tokio::test]
async fn unknown_languages_and_missing_interpreters_are_invalid_arguments() {
    let mut a = start().await;
    let e = a.client.create_context(CreateContextRequest { language: "cobol".into(), cwd: String::new() }).await;
    assert_eq!(e.unwrap_err().code(), Code::InvalidArgument);
    let e =
        a.client.run_code(RunCodeRequest { language: "cobol".into(), code: "1".into(), ..Default::default() }).await;
    assert_eq!(e.unwrap_err().code(), Code::InvalidArgument);

    // An image whose PATH holds no interpreter at all.
    let bare = tempfile::tempdir().unwrap();
    let mut a = start_with_path(bare.path().to_str().unwrap()).await;
    for (language, missing) in [("python", "python3"), ("javascript", "node"), ("bash", "bash")] {
        let r = RunCodeRequest { language: language.into(), code: "1".into(), ..Default::default() };
        let e = a.client.run_code(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{language}: {e:?}");
        assert!(e.message().contains(missing), "{language}: {}", e.message());
    }
    let list = a.client.list_contexts(ListContextsRequest::default()).await.unwrap().into_inner();
    assert!(list.contexts.is_empty(), "no default context was left behind: {list:?}");
}

#[tokio::test]
async fn bash_contexts_keep_env_and_cwd_and_report_failures() {
    let mut a = start().await;
    let c = &mut a.client;
    let dir = tempfile::tempdir().unwrap();
    let ctx = create(c, "bash").await;
    let r = run(c, &ctx, &format!("export FOO=bar\ncd {}\necho started", dir.path().display())).await;
    assert_eq!(r.stdout(), "started\n");
    assert!(r.completed(), "{r:?}");
    let r = run(c, &ctx, "echo $FOO; pwd").await;
    assert_eq!(r.stdout(), format!("bar\n{}\n", dir.path().display()));
    let r = run(c, &ctx, "echo oops >&2; false").await;
    assert_eq!(r.stderr(), "oops\n");
    let e = r.error().unwrap();
    assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("CommandExecError", "1"));

    let mut with_env = req(&ctx, "echo $RUN_VAR");
    with_env.envs.insert("RUN_VAR".into(), "it's here".into());
    assert_eq!(collect(c.run_code(with_env).await.unwrap().into_inner()).await.stdout(), "it's here\n");

    // An interrupt stops the running command; the shell and its state stay.
    let s = start_until(c, &ctx, "echo go; sleep 1000", "go").await;
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    collect_rest(s).await;
    assert_eq!(run(c, &ctx, "echo $FOO").await.stdout(), "bar\n");
}

#[tokio::test]
async fn javascript_contexts_keep_state_and_report_results_errors_and_interrupts() {
    if !on_path("node") {
        eprintln!("SKIPPED: no node on PATH");
        return;
    }
    let mut a = start().await;
    let c = &mut a.client;
    let ctx = create(c, "javascript").await;
    let r = run(c, &ctx, "let a = 40;\nconsole.log('hi');\na + 2").await;
    assert_eq!((r.stdout().as_str(), r.texts()), ("hi\n", vec!["42".to_string()]));
    assert_eq!(run(c, &ctx, "a").await.texts(), vec!["40"]);
    assert_eq!(run(c, &ctx, "({x: [1, 'two']})").await.texts(), vec!["{ x: [ 1, 'two' ] }"]);
    assert!(run(c, &ctx, "let nothing = 1;").await.texts().is_empty());

    let r = run(c, &ctx, "function f() { throw new TypeError('bad ' + a); }\nf()").await;
    let e = r.error().unwrap();
    assert_eq!((e.ename.as_str(), e.evalue.as_str()), ("TypeError", "bad 40"));
    assert!(e.traceback.iter().skip(1).all(|l| l.contains("<cell-")), "{:?}", e.traceback);

    // Top-level await; its declarations persist.
    let r = run(c, &ctx, "const b = await new Promise(r => setTimeout(() => r(a + 1), 1));\nb * 2").await;
    assert_eq!(r.texts(), vec!["82"]);
    assert_eq!(run(c, &ctx, "b").await.texts(), vec!["41"]);

    let s = start_until(c, &ctx, "console.log('spin'); while (true) {}", "spin").await;
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    assert_eq!(collect_rest(s).await.ename(), "KeyboardInterrupt");
    let s = start_until(c, &ctx, "console.log('wait'); await new Promise(() => {})", "wait").await;
    c.interrupt_code(ContextRef { id: ctx.clone() }).await.unwrap();
    assert_eq!(collect_rest(s).await.ename(), "KeyboardInterrupt");
    let r = run(c, &ctx, "a").await;
    assert_eq!(r.texts(), vec!["40"], "{r:?}");
}

#[tokio::test]
async fn the_readiness_port_accepts() {
    let _a = start().await;
    // The listener starts with the configuration; another agent of this
    // test run may hold the port, which answers the same.
    let deadline = Instant::now() + HANG;
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", 44771)).await {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "127.0.0.1:44771: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
