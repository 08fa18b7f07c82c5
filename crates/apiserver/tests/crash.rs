//! Crash safety through the API: a server process is kill -9'd during a
//! stream of creates, restarted on the same data, and every create it
//! acknowledged must be there — over the embedded store and over etcd.
//!
//! The server runs in a child process: this test binary re-executes itself
//! with `--ignored --exact crash_server_child`, which serves until killed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use cozyplane_apiserver::{ServerBuilder, TlsSource};
use cozyplane_testkit::{eventually_async, Needs};
use support::{vpc, vpcs, Backend};
use tokio::sync::Mutex;

const TOKEN: &str = "crash-test-token";

/// The child: serve from `$COZYPLANE_CRASH_DIR` until killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the crash tests in a child process"]
async fn crash_server_child() {
    let Some(dir) = std::env::var_os("COZYPLANE_CRASH_DIR").map(PathBuf::from) else {
        return;
    };
    let store: Arc<dyn cozyplane_store::Storage> = match std::env::var("COZYPLANE_CRASH_ETCD") {
        Ok(endpoint) => {
            let prefix = std::env::var("COZYPLANE_CRASH_PREFIX").unwrap_or_default();
            match cozyplane_store::EtcdStore::connect(&[endpoint], &prefix).await {
                Ok(s) => Arc::new(s),
                Err(e) => panic!("etcd: {e}"),
            }
        }
        Err(_) => match cozyplane_store::EmbeddedStore::open(dir.join("store.redb")) {
            Ok(s) => Arc::new(s),
            Err(e) => panic!("embedded: {e}"),
        },
    };
    let kubeconfig = dir.join("kubeconfig.tmp");
    let server = ServerBuilder::new(store, support::kinds())
        .standalone(true)
        .tls(TlsSource::CertDir(dir.join("certs")))
        .token(TOKEN.into())
        .write_kubeconfig(kubeconfig.clone())
        .start()
        .await;
    let server = server.unwrap_or_else(|e| panic!("start: {e}"));
    // publish the kubeconfig atomically: the parent polls for it
    if let Err(e) = std::fs::rename(&kubeconfig, dir.join("kubeconfig")) {
        panic!("rename: {e}");
    }
    server.wait().await;
}

fn spawn_child(dir: &Path, etcd: Option<(&str, &str)>) -> Child {
    let _ = std::fs::remove_file(dir.join("kubeconfig"));
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let mut cmd = Command::new(exe);
    cmd.args(["--ignored", "--exact", "crash_server_child", "--nocapture"])
        .env("COZYPLANE_CRASH_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some((endpoint, prefix)) = etcd {
        cmd.env("COZYPLANE_CRASH_ETCD", endpoint)
            .env("COZYPLANE_CRASH_PREFIX", prefix);
    }
    cmd.spawn().unwrap_or_else(|e| panic!("spawn child: {e}"))
}

/// The kubeconfig the server child writes once it serves.
async fn wait_for_kubeconfig(dir: &Path) -> PathBuf {
    let p = dir.join("kubeconfig");
    eventually_async(
        "the server child to start (its kubeconfig)",
        Duration::from_secs(30),
        || {
            let written = p.exists();
            async move { written }
        },
    )
    .await;
    p
}

async fn crash_and_recover(backend: Backend, test: &str) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let etcd = match backend {
        Backend::Embedded => None,
        Backend::Etcd => {
            let Some(ep) = Needs::new(test).ready_with(cozyplane_store::testing::shared_etcd())
            else {
                return;
            };
            Some((ep, cozyplane_store::testing::unique_prefix(test)))
        }
    };
    let etcd_ref = etcd.as_ref().map(|(a, b)| (a.as_str(), b.as_str()));
    let mut child = spawn_child(dir.path(), etcd_ref);
    let kc = wait_for_kubeconfig(dir.path()).await;
    let client = support::raw_client(&kc).await;

    // 4 concurrent writers; record every acknowledged create
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let client = client.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let body = vpc(&name, "10.60.0.0/16").to_string().into_bytes();
                let req = http::Request::post(vpcs("default"))
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body));
                let Ok(req) = req else { return };
                match client.send(req).await {
                    Ok(resp) if resp.status().as_u16() == 201 => acked.lock().await.push(name),
                    _ => return,
                }
            }
        }));
    }
    eventually_async(
        "200 acknowledged creates",
        Duration::from_secs(60),
        || async { acked.lock().await.len() >= 200 },
    )
    .await;
    // kill -9 in the middle of the stream
    let _ = child.kill();
    let _ = child.wait();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().await.clone();
    assert!(acked.len() >= 200);

    let mut child = spawn_child(dir.path(), etcd_ref);
    let kc = wait_for_kubeconfig(dir.path()).await;
    let client = support::raw_client(&kc).await;
    let list: kube::api::ObjectList<cozyplane_api::VPC> = {
        let api: kube::Api<cozyplane_api::VPC> = kube::Api::namespaced(client, "default");
        api.list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("list after restart: {e}"))
    };
    let present: std::collections::HashSet<String> = list
        .items
        .iter()
        .filter_map(|v| v.metadata.name.clone())
        .collect();
    let lost: Vec<&String> = acked.iter().filter(|n| !present.contains(*n)).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged creates lost after kill -9: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write_embedded() {
    crash_and_recover(Backend::Embedded, "crash_embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write_etcd() {
    crash_and_recover(Backend::Etcd, "crash_etcd").await;
}
