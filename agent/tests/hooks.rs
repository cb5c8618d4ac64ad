//! Lifecycle hooks in the real agent binary (on the host, no sandbox): the
//! pre-start hook runs before the entrypoint and `Configure` answers after
//! it; its failure or timeout is ABORTED with a HookFailure and starts
//! nothing; periodic hooks run repeatedly, keep running when they fail and
//! never overlap a run of their own.
mod common;

use common::start_unconfigured;
use pvisor_proto::agent::*;
use std::path::Path;
use std::time::{Duration, Instant};

fn sh(script: String, timeout_secs: u32) -> Hook {
    Hook { command: vec!["/bin/sh".into(), "-c".into(), script], timeout_secs }
}

fn config(lifecycle: Lifecycle, entrypoint: Vec<String>) -> AgentConfig {
    AgentConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "IMAGE_VAR=from-image".into()],
        workdir: "/tmp".into(),
        entrypoint,
        lifecycle: Some(lifecycle),
        ..Default::default()
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Polls until `done` holds (a deadline, not a timing assertion).
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn pre_start_runs_first_with_the_image_env_and_configure_waits_for_it() {
    let mut a = start_unconfigured().await;
    let log = a._dir.path().join("order");
    let pre = sh(format!("sleep 0.3; echo pre-start $IMAGE_VAR $(pwd) >> {}", log.display()), 60);
    let entry = vec!["/bin/sh".into(), "-c".into(), format!("echo entrypoint >> {}", log.display())];
    let cfg = config(Lifecycle { pre_start: Some(pre), periodic: vec![] }, entry);
    a.client.configure(cfg.clone()).await.unwrap();
    // Configure answered: the hook has finished, and nothing else ran before it.
    assert!(read(&log).starts_with("pre-start from-image /tmp\n"), "{:?}", read(&log));
    wait_for("the entrypoint", || read(&log).contains("entrypoint")).await;
    // A reconnecting worker's identical configuration does not run it again.
    a.client.configure(cfg).await.unwrap();
    assert_eq!(read(&log), "pre-start from-image /tmp\nentrypoint\n");
    // The hook's run is not listed among the commands; the entrypoint is.
    assert!(a.client.command_status(CommandRef { id: "entrypoint".into() }).await.is_ok());
}

#[tokio::test]
async fn a_failing_pre_start_is_aborted_with_its_failure_and_starts_nothing() {
    let mut a = start_unconfigured().await;
    let marker = a._dir.path().join("entrypoint-ran");
    let entry = vec!["/bin/sh".into(), "-c".into(), format!("touch {}", marker.display())];
    let pre = sh("echo preparing; echo it broke >&2; exit 3".into(), 60);
    let cfg = config(Lifecycle { pre_start: Some(pre), periodic: vec![] }, entry);
    let e = a.client.configure(cfg.clone()).await.expect_err("the hook failed");
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    let f = pvisor_proto::hook_failure_of(&e).expect("a HookFailure in the details");
    assert_eq!((f.hook.as_str(), f.exit_code, f.timed_out), ("preStart", 3, false), "{f:?}");
    assert_eq!(f.output, "preparing\nit broke");
    assert!(e.message().contains("exited with status 3"), "{}", e.message());
    // The same answer again for a reconnecting worker; the entrypoint never ran.
    let again = a.client.configure(cfg).await.expect_err("the same outcome");
    assert_eq!(pvisor_proto::hook_failure_of(&again), Some(f));
    assert!(!marker.exists());
}

#[tokio::test]
async fn a_pre_start_past_its_timeout_is_killed_and_reported() {
    let mut a = start_unconfigured().await;
    let pid_file = a._dir.path().join("hook-pid");
    let pre = sh(format!("echo $$ > {}; exec sleep 600", pid_file.display()), 1);
    let e = a.client.configure(config(Lifecycle { pre_start: Some(pre), periodic: vec![] }, vec![])).await;
    let e = e.expect_err("the hook timed out");
    let f = pvisor_proto::hook_failure_of(&e).expect("a HookFailure");
    assert!(f.timed_out, "{f:?}");
    assert!(e.message().contains("did not finish within 1 s"), "{}", e.message());
    let pid = read(&pid_file).trim().to_string();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the hook's process {pid} was killed and reaped");
}

#[tokio::test]
async fn a_missing_pre_start_program_did_not_start() {
    let mut a = start_unconfigured().await;
    let pre = Hook { command: vec!["/no/such/program".into()], timeout_secs: 60 };
    let e = a.client.configure(config(Lifecycle { pre_start: Some(pre), periodic: vec![] }, vec![])).await;
    let f = pvisor_proto::hook_failure_of(&e.expect_err("no program")).expect("a HookFailure");
    assert_eq!(f.exit_code, -1);
    assert!(f.error.starts_with("did not start"), "{f:?}");
}

fn every_second(name: &str, script: String, timeout_secs: u32) -> PeriodicHook {
    PeriodicHook { name: name.into(), schedule: "@every 1s".into(), hook: Some(sh(script, timeout_secs)) }
}

#[tokio::test]
async fn periodic_hooks_run_repeatedly_and_failing_ones_keep_running() {
    let mut a = start_unconfigured().await;
    let dir = a._dir.path().to_path_buf();
    let (ticks, fails) = (dir.join("ticks"), dir.join("fails"));
    let periodic = vec![
        every_second("tick", format!("echo tick >> {}", ticks.display()), 10),
        every_second("fail", format!("echo x >> {}; exit 1", fails.display()), 10),
    ];
    a.client.configure(config(Lifecycle { pre_start: None, periodic }, vec![])).await.unwrap();
    wait_for("three ticks", || read(&ticks).lines().count() >= 3).await;
    wait_for("three failing runs", || read(&fails).lines().count() >= 3).await;
}

#[tokio::test]
async fn a_periodic_run_never_overlaps_its_previous_run() {
    let mut a = start_unconfigured().await;
    let log = a._dir.path().join("runs");
    // Each run takes longer than the interval: the firings meanwhile are skipped.
    let script = format!("echo start >> {0}; sleep 2.5; echo end >> {0}", log.display());
    let periodic = vec![every_second("slow", script, 10)];
    a.client.configure(config(Lifecycle { pre_start: None, periodic }, vec![])).await.unwrap();
    wait_for("three whole runs", || read(&log).matches("end").count() >= 3).await;
    let lines: Vec<String> = read(&log).lines().map(str::to_string).collect();
    for pair in lines.chunks(2) {
        assert_eq!(pair[0], "start", "{lines:?}");
        if pair.len() == 2 {
            assert_eq!(pair[1], "end", "a run started before the previous one ended: {lines:?}");
        }
    }
}

#[tokio::test]
async fn a_periodic_run_past_its_timeout_is_killed_and_the_next_runs() {
    let mut a = start_unconfigured().await;
    let log = a._dir.path().join("runs");
    let script = format!("echo start >> {0}; sleep 30; echo end >> {0}", log.display());
    let periodic = vec![every_second("stuck", script, 1)];
    a.client.configure(config(Lifecycle { pre_start: None, periodic }, vec![])).await.unwrap();
    wait_for("three runs started", || read(&log).matches("start").count() >= 3).await;
    assert!(!read(&log).contains("end"), "a run outlived its timeout: {:?}", read(&log));
}
