//! A real worker running a real ns sandbox from a real image: readiness,
//! server reflection, commands through the worker's socket, isolation,
//! limits, pause, shutdown, and a failing start.
//!
//! Needs what `common` says.
use pvisor_proto::worker::worker_client::WorkerClient;
use pvisor_proto::worker::Empty;
use pvisor_worker::config::Limits;
use std::path::PathBuf;
use std::time::Duration;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

mod common;
use common::{env, sh, start, Spec};

#[tokio::test]
async fn reflection_lists_services_and_commands_run_through_the_worker() {
    let Some(env) = env() else { return };
    let w = start(&env, Spec::default()).await;
    let ready = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap().into_inner();
    assert_eq!(ready.backend, "ns");

    let mut refl = ServerReflectionClient::new(w.channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected reflection answer")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["pvisor.agent.v1.Agent", "pvisor.worker.v1.Worker", "grpc.reflection.v1.ServerReflection"] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }

    let (out, code) =
        sh(&w.channel, "cat /proc/1/comm; hostname; ls /proc | grep -c '^[0-9]'; cat /etc/hostname").await;
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "pvisor-agent", "the agent is PID 1");
    assert_eq!(lines[1], "sandbox-test");
    let pids: u32 = lines[2].parse().unwrap();
    assert!(pids < 10, "only sandbox processes are visible, saw {pids}");
    assert_eq!(lines[3], "sandbox-test");

    // The host's files are not reachable; writes land in the sandbox's upper layer.
    let marker = format!("/tmp/pvisor-host-marker-{}", std::process::id());
    std::fs::write(&marker, "host").unwrap();
    let (out, _) =
        sh(&w.channel, &format!("test -e {marker} && echo visible || echo absent; echo x > /root/new; cat /root/new"))
            .await;
    std::fs::remove_file(&marker).unwrap();
    assert_eq!(out, "absent\nx\n");

    // Mounting and new user namespaces are refused inside.
    let (_, code) = sh(&w.channel, "unshare -U true").await;
    assert_ne!(code, 0);
    let (out, _) = sh(&w.channel, "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status").await;
    assert_eq!(out, "NoNewPrivs:\t1\nSeccomp:\t2\n");
}

#[tokio::test]
async fn memory_limit_pause_and_shutdown() {
    let Some(env) = env() else { return };
    let limits = Limits { memory_bytes: 64 << 20, ..Limits::default() };
    let mut w = start(&env, Spec { limits, ..Spec::default() }).await;
    let _ = &mut w;
    let mut wc = WorkerClient::new(w.channel.clone());
    wc.ready(Empty {}).await.unwrap();
    if w.cgroup.is_some() {
        // 200 MiB held in a shell variable: the memory cgroup kills the shell.
        let (_, code) = sh(&w.channel, "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}").await;
        assert_ne!(code, 0, "allocation beyond the limit must fail");
        let (out, code) = sh(&w.channel, "echo still-alive").await;
        assert_eq!((out.as_str(), code), ("still-alive\n", 0), "the sandbox survives the OOM kill");
        let m = wc.metrics(Empty {}).await.unwrap().into_inner();
        assert_eq!(m.mem_total_bytes, 64 << 20);
        assert!(m.mem_used_bytes > 0);

        wc.pause(Empty {}).await.unwrap();
        let r = tokio::time::timeout(Duration::from_millis(300), sh(&w.channel, "echo hi")).await;
        assert!(r.is_err(), "a paused sandbox runs nothing");
        wc.resume(Empty {}).await.unwrap();
        let (out, _) = sh(&w.channel, "echo resumed").await;
        assert_eq!(out, "resumed\n");
    }
    wc.shutdown(Empty {}).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "worker did not exit after Shutdown");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(status.success(), "worker exits cleanly after Shutdown: {status}");
}

#[tokio::test]
async fn a_sandbox_that_cannot_start_reports_why() {
    let Some(env) = env() else { return };
    let w = start(&env, Spec { image_root: Some(PathBuf::from("/nonexistent/image/root")), ..Spec::default() }).await;
    let e = WorkerClient::new(w.channel.clone()).ready(Empty {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("/nonexistent/image/root"), "the reason names what failed: {}", e.message());
}
