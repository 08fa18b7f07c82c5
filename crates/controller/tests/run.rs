//! `run(ControllerArgs)` as `cozyplane controller` runs it: flags parsed by
//! clap, a client from `--kubeconfig`, the endpoints on `--metrics-bind`,
//! and a clean exit on SIGTERM that releases the Lease.
//!
//! This binary holds a single test that signals its own process (SIGTERM
//! is caught by the controller's handler, installed before it starts), so
//! no other test can be disturbed. Needs `/usr/bin/kill` (procps).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::time::Duration;

use clap::Parser;
use cozyplane_controller::{run, ControllerArgs, ControllerError};
use cozyplane_testkit::eventually_async;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use support::start;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: ControllerArgs,
}

const LIMIT: Duration = Duration::from_secs(30);

async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_leads_serves_metrics_and_releases_on_sigterm() {
    let h = start().await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let kubeconfig = h.kubeconfig.to_str().expect("utf-8 path").to_string();
    let addr_s = addr.to_string();
    let cli = Cli::try_parse_from([
        "controller",
        "--kubeconfig",
        &kubeconfig,
        "--identity",
        "proc-a",
        "--lease-duration",
        "3",
        "--renew-interval",
        "1",
        "--metrics-bind",
        &addr_s,
    ])
    .expect("flags");
    let task = tokio::spawn(run(cli.args));

    eventually_async(
        "the controller leads and says so on /metrics",
        LIMIT,
        || async {
            http_get(addr, "/metrics")
                .await
                .is_some_and(|t| t.contains("\ncozyplane_controller_leader 1\n"))
        },
    )
    .await;
    eventually_async("/readyz turns 200", LIMIT, || async {
        http_get(addr, "/readyz")
            .await
            .is_some_and(|t| t.starts_with("HTTP/1.1 200"))
    })
    .await;
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), "kube-system");
    let held = leases.get("cozyplane-controller").await.expect("lease");
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("proc-a")
    );

    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill (procps)");
    assert!(status.success());
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("run returns after SIGTERM")
        .expect("join")
        .expect("clean exit");
    let released = leases.get("cozyplane-controller").await.expect("lease");
    assert_eq!(
        released
            .spec
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()),
        None
    );
    assert!(
        http_get(addr, "/healthz").await.is_none(),
        "endpoints still served after exit"
    );

    // A kubeconfig that does not exist is a clear startup error.
    let bad = Cli::try_parse_from(["controller", "--kubeconfig", "/nonexistent/kubeconfig"])
        .expect("flags");
    match run(bad.args).await {
        Err(ControllerError::Kubeconfig { path, .. }) => {
            assert_eq!(path.to_str(), Some("/nonexistent/kubeconfig"))
        }
        other => panic!("expected a kubeconfig error, got {other:?}"),
    }
    h.server.shutdown().await;
}
