//! Strategic merge patch against hostile sizes (issue #9, "Hardening"), over
//! HTTP: a large merge gives kube's result, a list over the limit answers
//! 413 with nothing stored, and the merge runs off the async workers, so a
//! concurrent `/livez` is answered while it computes. The merge's
//! semantics and the 300 000-finalizer case are unit tests in
//! `src/patch.rs`; its speed is `benches/smp.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cozyplane_apiserver::ServerBuilder;
use cozyplane_store::{
    KeyValue, ListOptions, ListResult, Revision, Storage, StoreError, WatchStream,
};
use http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(
    a_large_strategic_merge_gives_kubes_result,
    a_strategic_merge_list_over_the_limit_is_refused,
);

const SMP: &str = "application/strategic-merge-patch+json";

/// The list cap (`limits::MAX_SMP_LIST_ITEMS`).
const MAX_LIST: usize = 1 << 20;

fn finalizers(from: usize, n: usize) -> Value {
    Value::Array(
        (from..from + n)
            .map(|i| Value::String(format!("example.com/f-{i}")))
            .collect(),
    )
}

fn node(name: &str, finalizers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "finalizers": finalizers}})
}

async fn create(h: &Harness, obj: &Value) -> Value {
    let c = h.post("/api/v1/nodes", obj).await;
    assert_eq!(c.status, 201, "{}", &c.text[..c.text.len().min(300)]);
    c.body
}

/// 40 000 finalizers merged into 40 000, half of them there already: the
/// union in kube's order — here the server's first, since every new one
/// follows the patch's last old one — within the etcd backend's 2 MiB value
/// limit. A new one the server did not have goes before the server's.
async fn a_large_strategic_merge_gives_kubes_result(h: &Harness) {
    const N: usize = 40_000;
    create(h, &node("big", finalizers(0, N))).await;
    let patch = json!({"metadata": {"finalizers": finalizers(N / 2, N)}});
    let r = h.patch("/api/v1/nodes/big", SMP, &patch).await;
    assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(300)]);
    let want = finalizers(0, N + N / 2);
    let got = &r.body["metadata"]["finalizers"];
    assert!(
        *got == want,
        "{} finalizers, from {} to {}",
        got.as_array().map_or(0, Vec::len),
        got[0],
        got[N + N / 2 - 1]
    );
    let stored = h.get("/api/v1/nodes/big").await;
    assert!(stored.body["metadata"]["finalizers"] == want);

    let patch = json!({"metadata": {"finalizers": ["example.com/new", "example.com/f-1"]}});
    let r = h.patch("/api/v1/nodes/big", SMP, &patch).await;
    assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(300)]);
    let got = r.body["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(got.len(), N + N / 2 + 1);
    assert_eq!(
        got[..4],
        [
            json!("example.com/new"),
            json!("example.com/f-0"),
            json!("example.com/f-1"),
            json!("example.com/f-2")
        ]
    );
}

async fn a_strategic_merge_list_over_the_limit_is_refused(h: &Harness) {
    let before = create(h, &node("capped", json!(["example.com/keep"]))).await;
    // 2 bytes an element: the body fits in its 3 MiB limit, the list not in its own.
    let patch = json!({"metadata": {"finalizers": vec![0; MAX_LIST + 1]}});
    let r = h.patch("/api/v1/nodes/capped", SMP, &patch).await;
    assert_eq!(r.status, 413, "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.body["reason"], "RequestEntityTooLarge");
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("metadata.finalizers")
            && msg.contains(&format!("has {} items", MAX_LIST + 1))
            && msg.contains(&format!("limit of {MAX_LIST}")),
        "{msg}"
    );
    let after = h.get("/api/v1/nodes/capped").await;
    assert_eq!(after.body, before, "nothing is stored");
}

/// A store that tells when the patch of `key` has read the object (the
/// merge starts right after, with no await in between) and, when it writes
/// the result, whether `/livez` had been answered by then.
struct Gate {
    inner: Arc<dyn Storage>,
    key: String,
    armed: AtomicBool,
    read: tokio::sync::Notify,
    livez_answered: AtomicBool,
    livez_before_result: Mutex<Option<bool>>,
}

#[async_trait::async_trait]
impl Storage for Gate {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let got = self.inner.get(key).await;
        if key == self.key && self.armed.swap(false, Ordering::SeqCst) {
            self.read.notify_one();
        }
        got
    }
    async fn list(&self, opts: &ListOptions) -> Result<ListResult, StoreError> {
        self.inner.list(opts).await
    }
    async fn count(&self, prefix: &str) -> Result<u64, StoreError> {
        self.inner.count(prefix).await
    }
    async fn create(&self, key: &str, value: Vec<u8>) -> Result<Revision, StoreError> {
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: Vec<u8>,
        expected: Revision,
    ) -> Result<Revision, StoreError> {
        if key == self.key {
            let answered = self.livez_answered.load(Ordering::SeqCst);
            *self.livez_before_result.lock().unwrap() = Some(answered);
        }
        self.inner.update(key, value, expected).await
    }
    async fn delete(
        &self,
        key: &str,
        expected: Option<Revision>,
    ) -> Result<(KeyValue, Revision), StoreError> {
        self.inner.delete(key, expected).await
    }
    async fn watch(&self, prefix: &str, after: Revision) -> Result<WatchStream, StoreError> {
        self.inner.watch(prefix, after).await
    }
    async fn current_revision(&self) -> Result<Revision, StoreError> {
        self.inner.current_revision().await
    }
    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        self.inner.compact(revision).await
    }
}

async fn status_of(client: &kube::Client, path: &str) -> u16 {
    let req = Request::builder()
        .method("GET")
        .uri(path)
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    resp.into_body().collect().await.unwrap();
    status
}

/// On a runtime with one thread for the server and its clients, `/livez`
/// is answered while a large strategic merge computes: the merge runs on a
/// blocking thread. Before, it ran on the async worker and nothing else
/// moved until it was done (the write of its result came first).
#[tokio::test(flavor = "current_thread")]
async fn livez_answers_while_a_large_strategic_merge_computes() {
    let dir = tempfile::tempdir().unwrap();
    let test = "livez_during_smp";
    let inner = support::open_store(Backend::Embedded, test, dir.path())
        .await
        .expect("the embedded store is always available");
    let info = cozyplane_apiserver::core_kinds::nodes();
    let gate = Arc::new(Gate {
        inner,
        key: cozyplane_apiserver::keys::object_key(&info, None, "slow"),
        armed: AtomicBool::new(false),
        read: tokio::sync::Notify::new(),
        livez_answered: AtomicBool::new(false),
        livez_before_result: Mutex::new(None),
    });
    let kubeconfig = dir.path().join("kubeconfig");
    let server = ServerBuilder::new(gate.clone(), support::kinds())
        .standalone(true)
        .write_kubeconfig(kubeconfig.clone())
        .start()
        .await
        .unwrap();
    let h = Harness {
        server,
        client: support::raw_client(&kubeconfig).await,
        kubeconfig: kubeconfig.clone(),
        store: gate.clone(),
        dir,
    };
    // A second client with its connection open, so /livez is one round trip.
    let probe = support::raw_client(&kubeconfig).await;
    assert_eq!(status_of(&probe, "/livez").await, 200);

    // 60 000 + 60 000: the largest merge within the 3 MiB object limit,
    // so it computes far longer than a /livez round trip takes.
    const N: usize = 60_000;
    create(&h, &node("slow", finalizers(0, N))).await;
    gate.armed.store(true, Ordering::SeqCst);
    let patch = json!({"metadata": {"finalizers": finalizers(N, N)}});
    let patching = h.patch("/api/v1/nodes/slow", SMP, &patch);
    let livez = async {
        gate.read.notified().await;
        let s = status_of(&probe, "/livez").await;
        gate.livez_answered.store(true, Ordering::SeqCst);
        s
    };
    let (patched, livez) = tokio::time::timeout(Duration::from_secs(120), async {
        tokio::join!(patching, livez)
    })
    .await
    .expect("the patch and /livez finish");
    assert_eq!(
        patched.status,
        200,
        "{}",
        &patched.text[..patched.text.len().min(300)]
    );
    assert_eq!(
        patched.body["metadata"]["finalizers"]
            .as_array()
            .map(Vec::len),
        Some(2 * N)
    );
    assert_eq!(livez, 200);
    assert_eq!(
        *gate.livez_before_result.lock().unwrap(),
        Some(true),
        "/livez was answered only after the merge was done"
    );
    h.server.shutdown().await;
}
