//! Storage faults through the API (docs/apiserver.md, "Storage faults"): when
//! the backend refuses writes — the embedded store's disk is full, etcd hits
//! its space quota (NOSPACE) — creates answer 503 at once, `/readyz` answers
//! 503, and once space is freed writes succeed again within 5 s, `/readyz`
//! is 200 again, and no acknowledged write is lost.
//!
//! The embedded run puts the store on a small tmpfs it mounts (root), fills
//! the file system with a filler file, and restarts the server on the same
//! file at the end; the etcd run starts its own etcd with a small
//! `--quota-backend-bytes` and clears the alarm as an operator would (delete,
//! compact, defrag, `etcdctl alarm disarm`), then kills etcd and starts it
//! again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cozyplane_apiserver::ServerBuilder;
use cozyplane_store::testing::EtcdServer;
use cozyplane_store::{EmbeddedOptions, EmbeddedStore, EtcdStore, Storage};
use cozyplane_testkit::{eventually_async, needs, Tool};
use serde_json::Value;
use support::{vpcs, Harness};

const NS: &str = "faults";
/// The annotation that makes each object big, so the disk fills in few creates.
const FILL: usize = 200 << 10;
/// Writes must succeed again this soon after space is freed.
const RECOVERY: Duration = Duration::from_secs(5);

const MOUNT: Tool = Tool::new("mount", &["--version"], "mount");
const ETCDCTL: Tool = Tool::new("etcdctl", &["version"], "etcd-client");

/// A VPC carrying a `FILL`-byte annotation.
fn big_vpc(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
        "metadata": {"name": name, "annotations": {"fill": "x".repeat(FILL)}},
        "spec": {"cidrs": ["10.1.0.0/16"]}
    })
}

/// Serve `store` (standalone) with a kubeconfig in a fresh temp dir.
async fn serve(store: Arc<dyn Storage>) -> Harness {
    let dir = tempfile::Builder::new()
        .prefix("cozyplane-storage-faults-")
        .tempdir()
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let server = ServerBuilder::new(store.clone(), support::kinds())
        .standalone(true)
        .write_kubeconfig(kubeconfig.clone())
        .start()
        .await
        .unwrap_or_else(|e| panic!("server start: {e}"));
    let client = support::raw_client(&kubeconfig).await;
    Harness {
        server,
        client,
        kubeconfig,
        store,
        dir,
    }
}

/// The names of created (2xx) and refused (5xx) creates.
#[derive(Default)]
struct Ledger {
    acked: Vec<String>,
    failed: Vec<String>,
}

/// Create big VPCs until one is refused; it must be a 503 naming `cause`,
/// never a 4xx, a hang or a panic.
async fn create_until_refused(h: &Harness, ledger: &mut Ledger, cause: &str) {
    for i in 0..500 {
        let name = format!("fill-{i}");
        let r = h.post(&vpcs(NS), &big_vpc(&name)).await;
        match r.status {
            201 => ledger.acked.push(name),
            503 => {
                assert!(
                    r.text.contains(cause),
                    "the 503 names {cause:?}: {}",
                    r.text
                );
                ledger.failed.push(name);
                return;
            }
            s => panic!("create {name}: {s} {}", r.text),
        }
    }
    panic!("500 creates of {FILL} bytes all succeeded: the backend never filled up");
}

/// Expect `/readyz` to answer `status`.
async fn assert_readyz(h: &Harness, status: u16) {
    let r = h.get("/readyz").await;
    assert_eq!(r.status, status, "/readyz: {}", r.text);
}

/// Creates (new names) until one succeeds within [`RECOVERY`].
async fn create_until_accepted(h: &Harness, ledger: &mut Ledger, prefix: &str) {
    let tried = Mutex::new(Vec::<(String, u16)>::new());
    eventually_async(
        "a create to succeed after space was freed",
        RECOVERY,
        || {
            let name = format!("{prefix}-{}", tried.lock().unwrap().len());
            let tried = &tried;
            async move {
                let r = h.post(&vpcs(NS), &big_vpc(&name)).await;
                assert!(
                    r.status == 201 || r.status == 503,
                    "create {name}: {} {}",
                    r.status,
                    r.text
                );
                tried.lock().unwrap().push((name, r.status));
                r.status == 201
            }
        },
    )
    .await;
    for (name, status) in tried.into_inner().unwrap() {
        if status == 201 {
            ledger.acked.push(name);
        } else {
            ledger.failed.push(name);
        }
    }
}

/// Every acknowledged create is there, whole; a refused one is absent or
/// whole (a write whose error came after it reached the disk), never partial.
async fn assert_ledger(h: &Harness, ledger: &Ledger) {
    let whole = |r: &support::Resp| {
        r.body["metadata"]["annotations"]["fill"]
            .as_str()
            .map(str::len)
            == Some(FILL)
    };
    for name in &ledger.acked {
        let r = h.get(&format!("{}/{name}", vpcs(NS))).await;
        assert_eq!(r.status, 200, "acknowledged {name} lost: {}", r.text);
        assert!(whole(&r), "acknowledged {name} is not whole");
    }
    for name in &ledger.failed {
        let r = h.get(&format!("{}/{name}", vpcs(NS))).await;
        assert!(
            r.status == 404 || (r.status == 200 && whole(&r)),
            "refused {name} half-made: {} {}",
            r.status,
            r.text
        );
    }
}

/// Write a filler file until the file system is full.
fn fill_disk(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5a_u8; 256 << 10];
    loop {
        if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_data()) {
            assert_eq!(
                e.raw_os_error(),
                Some(28),
                "the filler stops at ENOSPC, not at {e}"
            );
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_embedded() {
    if !needs!().root().tools(&[MOUNT]).ready() {
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("cozyplane-disk-full-")
        .tempdir()
        .unwrap();
    let data = work.path().join("data");
    // dropped before `work`: unmounted, then the directory removed
    let _tmpfs = cozyplane_testkit::Tmpfs::mount(&data, "24m");
    let file = data.join("store.redb");
    let options = EmbeddedOptions {
        recovery_free_bytes: 4 << 20,
        ..EmbeddedOptions::default()
    };
    let store = EmbeddedStore::open_with(&file, options.clone()).unwrap();
    let h = serve(Arc::new(store)).await;
    h.namespace(NS).await;
    let mut ledger = Ledger::default();
    for i in 0..3 {
        let name = format!("before-{i}");
        let r = h.post(&vpcs(NS), &big_vpc(&name)).await;
        assert_eq!(r.status, 201, "{}", r.text);
        ledger.acked.push(name);
    }
    assert_readyz(&h, 200).await;

    let filler = data.join("filler");
    fill_disk(&filler);
    create_until_refused(&h, &mut ledger, "No space left on device").await;
    assert_readyz(&h, 503).await;
    // while the disk stays full, creates keep failing fast with 503
    let r = h.post(&vpcs(NS), &big_vpc("while-full")).await;
    assert_eq!(r.status, 503, "{}", r.text);
    ledger.failed.push("while-full".into());
    assert_readyz(&h, 503).await;

    std::fs::remove_file(&filler).unwrap();
    create_until_accepted(&h, &mut ledger, "after").await;
    assert_readyz(&h, 200).await;
    assert_ledger(&h, &ledger).await;

    // restart on the same file: the acknowledged writes are on disk
    h.server.shutdown().await;
    drop(h.client);
    drop(h.store);
    let reopened: Mutex<Option<EmbeddedStore>> = Mutex::new(None);
    eventually_async(
        "the store file to open again after the server stopped",
        Duration::from_secs(10),
        || {
            let got = EmbeddedStore::open_with(&file, options.clone()).ok();
            let ok = got.is_some();
            *reopened.lock().unwrap() = got;
            async move { ok }
        },
    )
    .await;
    let store = reopened.into_inner().unwrap().unwrap();
    let h = serve(Arc::new(store)).await;
    assert_readyz(&h, 200).await;
    assert_ledger(&h, &ledger).await;
    h.server.shutdown().await;
}

/// Run etcdctl against `endpoint`; its output.
fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_etcd() {
    let Some(mut etcd) = needs!()
        .tools(&[ETCDCTL])
        .ready_with(EtcdServer::start_with(&[
            "--quota-backend-bytes",
            &(8u64 << 20).to_string(),
        ]))
    else {
        return;
    };
    let endpoint = etcd.endpoint();
    let store = EtcdStore::connect(&[endpoint.as_str()], "/registry")
        .await
        .unwrap();
    let h = serve(Arc::new(store)).await;
    h.namespace(NS).await;
    let mut ledger = Ledger::default();
    for i in 0..3 {
        let name = format!("before-{i}");
        let r = h.post(&vpcs(NS), &big_vpc(&name)).await;
        assert_eq!(r.status, 201, "{}", r.text);
        ledger.acked.push(name);
    }
    assert_readyz(&h, 200).await;

    // fill etcd past its quota from a second client, under its own prefix
    let filler = EtcdStore::connect(&[endpoint.as_str()], "/filler")
        .await
        .unwrap();
    let mut full = false;
    for i in 0..200 {
        if let Err(e) = filler.create(&format!("f{i}"), vec![b'x'; 512 << 10]).await {
            assert!(
                e.to_string().contains("database space exceeded"),
                "filler stops at NOSPACE, not at {e}"
            );
            full = true;
            break;
        }
    }
    assert!(full, "200 filler writes of 512 KiB fit in an 8 MiB quota");
    create_until_refused(&h, &mut ledger, "database space exceeded").await;
    assert_readyz(&h, 503).await;

    // the operator's way out: free space, compact, defragment, disarm
    etcdctl(&endpoint, &["del", "--prefix", "/filler/"]);
    let rev = filler.current_revision().await.unwrap();
    filler.compact(rev).await.unwrap();
    etcdctl(&endpoint, &["defrag"]);
    etcdctl(&endpoint, &["alarm", "disarm"]);
    create_until_accepted(&h, &mut ledger, "after-disarm").await;
    assert_readyz(&h, 200).await;
    assert_ledger(&h, &ledger).await;

    // etcd gone: creates and /readyz answer 503; back: both recover
    etcd.kill().unwrap();
    let r = h.post(&vpcs(NS), &big_vpc("while-down")).await;
    assert_eq!(r.status, 503, "{}", r.text);
    ledger.failed.push("while-down".into());
    assert_readyz(&h, 503).await;
    etcd.restart().unwrap();
    create_until_accepted(&h, &mut ledger, "after-restart").await;
    assert_readyz(&h, 200).await;
    assert_ledger(&h, &ledger).await;
    h.server.shutdown().await;
}
