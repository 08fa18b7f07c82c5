//! Shared fixtures for the HTTP-level tests: a server started in-process
//! over a real backend (embedded store in a temp dir, or the store crate's
//! throw-away etcd), a kube-rs client built from the kubeconfig the server
//! wrote, and raw-HTTP helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cozyplane_apiserver::{RunningServer, ServerBuilder};
use cozyplane_store::Storage;
use http::{HeaderMap, Request};
use http_body_util::BodyExt;
use serde_json::Value;

/// Which storage backend a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Embedded,
    Etcd,
}

/// A running server plus a client.
pub struct Harness {
    pub server: RunningServer,
    pub client: kube::Client,
    pub kubeconfig: PathBuf,
    pub store: Arc<dyn Storage>,
    pub dir: tempfile::TempDir,
}

/// A raw HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
    pub body: Value,
}

impl Resp {
    /// The `metadata.name` of each item of a list response, in order.
    pub fn item_names(&self) -> Vec<String> {
        self.body["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn tempdir() -> tempfile::TempDir {
    match tempfile::Builder::new()
        .prefix("cozyplane-apiserver-test-")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

/// Open a backend; `None` means "skip" (only outside CI: under CI the test
/// kit's gate panics when etcd is missing).
pub async fn open_store(
    backend: Backend,
    test: &str,
    dir: &std::path::Path,
) -> Option<Arc<dyn Storage>> {
    match backend {
        Backend::Embedded => match cozyplane_store::EmbeddedStore::open(dir.join("store.redb")) {
            Ok(s) => Some(Arc::new(s)),
            Err(e) => panic!("embedded store: {e}"),
        },
        Backend::Etcd => {
            let endpoint = cozyplane_testkit::Needs::new(test)
                .ready_with(cozyplane_store::testing::shared_etcd())?;
            let prefix = cozyplane_store::testing::unique_prefix(test);
            match cozyplane_store::EtcdStore::connect(&[endpoint], &prefix).await {
                Ok(s) => Some(Arc::new(s)),
                Err(e) => panic!("{test}: etcd connect: {e}"),
            }
        }
    }
}

/// The kinds every test server serves (plus core kinds: standalone).
pub fn kinds() -> Vec<cozyplane_api::kinds::KindInfo> {
    cozyplane_apiserver::args::served_kinds(true)
}

/// Start a standalone server over `backend`.
pub async fn start(backend: Backend, test: &str) -> Option<Harness> {
    start_with(backend, test, |b| b).await
}

/// Start a server, letting the caller adjust the builder.
pub async fn start_with(
    backend: Backend,
    test: &str,
    f: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> Option<Harness> {
    let dir = tempdir();
    let store = open_store(backend, test, dir.path()).await?;
    let kubeconfig = dir.path().join("kubeconfig");
    let builder = ServerBuilder::new(store.clone(), kinds())
        .standalone(true)
        .bookmark_interval(Duration::from_millis(500))
        .write_kubeconfig(kubeconfig.clone());
    let server = match f(builder).start().await {
        Ok(s) => s,
        Err(e) => panic!("{test}: server start: {e}"),
    };
    let client = raw_client(&kubeconfig).await;
    Some(Harness {
        server,
        client,
        kubeconfig,
        store,
        dir,
    })
}

/// A client for raw-HTTP assertions: no automatic retries, so a 504 or 503
/// reaches the test as the server sent it.
pub async fn raw_client(path: &std::path::Path) -> kube::Client {
    let mut cfg = config(path).await;
    cfg.default_retry = false;
    match kube::Client::try_from(cfg) {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    }
}

async fn config(path: &std::path::Path) -> kube::Config {
    let kc = match kube::config::Kubeconfig::read_from(path) {
        Ok(k) => k,
        Err(e) => panic!("read kubeconfig: {e}"),
    };
    match kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
    {
        Ok(c) => c,
        Err(e) => panic!("kubeconfig: {e}"),
    }
}

/// A kube client from a kubeconfig file, the way users connect.
pub async fn client_from_kubeconfig(path: &std::path::Path) -> kube::Client {
    let kc = match kube::config::Kubeconfig::read_from(path) {
        Ok(k) => k,
        Err(e) => panic!("read kubeconfig: {e}"),
    };
    let cfg =
        match kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
        {
            Ok(c) => c,
            Err(e) => panic!("kubeconfig: {e}"),
        };
    match kube::Client::try_from(cfg) {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    }
}

impl Harness {
    /// Send a raw request and read the whole response.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
        accept: Option<&str>,
    ) -> Resp {
        let mut b = Request::builder().method(method).uri(path);
        if let Some(ct) = content_type {
            b = b.header(http::header::CONTENT_TYPE, ct);
        }
        if let Some(a) = accept {
            b = b.header(http::header::ACCEPT, a);
        }
        let req = match b.body(kube::client::Body::from(body)) {
            Ok(r) => r,
            Err(e) => panic!("request: {e}"),
        };
        let resp = match self.client.send(req).await {
            Ok(r) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = match resp.into_body().collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) => panic!("{method} {path}: reading body: {e}"),
        };
        let text = String::from_utf8_lossy(&bytes).to_string();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            text,
            body,
        }
    }

    /// GET returning only the status and the raw body (no parsing).
    pub async fn get_raw(&self, path: &str) -> (u16, Bytes) {
        let req = match Request::builder()
            .method("GET")
            .uri(path)
            .body(kube::client::Body::empty())
        {
            Ok(r) => r,
            Err(e) => panic!("request: {e}"),
        };
        let resp = match self.client.send(req).await {
            Ok(r) => r,
            Err(e) => panic!("GET {path}: {e}"),
        };
        let status = resp.status().as_u16();
        match resp.into_body().collect().await {
            Ok(c) => (status, c.to_bytes()),
            Err(e) => panic!("GET {path}: reading body: {e}"),
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.call("GET", path, None, Vec::new(), None).await
    }

    pub async fn get_accept(&self, path: &str, accept: &str) -> Resp {
        self.call("GET", path, None, Vec::new(), Some(accept)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.call(
            "POST",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
            None,
        )
        .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Resp {
        self.call(
            "PUT",
            path,
            Some("application/json"),
            body.to_string().into_bytes(),
            None,
        )
        .await
    }

    pub async fn patch(&self, path: &str, content_type: &str, body: &Value) -> Resp {
        self.call(
            "PATCH",
            path,
            Some(content_type),
            body.to_string().into_bytes(),
            None,
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.call("DELETE", path, None, Vec::new(), None).await
    }

    /// Open a watch (or any streaming GET) and return a line reader.
    pub async fn stream(&self, path: &str) -> WatchReader {
        let req = match Request::builder()
            .method("GET")
            .uri(path)
            .body(kube::client::Body::empty())
        {
            Ok(r) => r,
            Err(e) => panic!("request: {e}"),
        };
        let resp = match self.client.send(req).await {
            Ok(r) => r,
            Err(e) => panic!("GET {path}: {e}"),
        };
        assert_eq!(resp.status().as_u16(), 200, "watch {path}");
        WatchReader {
            body: resp.into_body(),
            buf: Vec::new(),
        }
    }
}

/// Reads newline-delimited watch events.
pub struct WatchReader {
    body: kube::client::Body,
    buf: Vec<u8>,
}

impl WatchReader {
    /// The next event, or `None` when the stream ends or nothing comes
    /// within `within`.
    pub async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return serde_json::from_slice(&line).ok();
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(data) = frame.map(|f| f.into_data().unwrap_or_else(|_| Bytes::new())) {
                self.buf.extend_from_slice(&data);
            } else {
                return None;
            }
        }
    }

    /// Skip BOOKMARK events.
    pub async fn next_change(&mut self, within: Duration) -> Option<Value> {
        loop {
            let ev = self.next(within).await?;
            if ev["type"] != "BOOKMARK" {
                return Some(ev);
            }
        }
    }
}

/// A VPC object.
pub fn vpc(name: &str, cidr: &str) -> Value {
    serde_json::json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
        "metadata": {"name": name, "labels": {"tier": "gold"}},
        "spec": {"cidrs": [cidr]}
    })
}

/// The VPC collection path in namespace `ns`.
pub fn vpcs(ns: &str) -> String {
    format!("/apis/sdn.cozystack.io/v1alpha1/namespaces/{ns}/vpcs")
}

/// Runs each named `async fn(&Harness)` of the invoking test file twice, as
/// `<name>::embedded` and `<name>::etcd`: every HTTP-level behaviour is
/// proven on both storage backends. (`#[macro_use] mod support;` to use it.)
#[allow(unused_macros)] // not every test file runs on both backends
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                if let Some(h) = support::start(Backend::Embedded, concat!(stringify!($name), "_embedded")).await {
                    super::$name(&h).await;
                    h.server.shutdown().await;
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                if let Some(h) = support::start(Backend::Etcd, concat!(stringify!($name), "_etcd")).await {
                    super::$name(&h).await;
                    h.server.shutdown().await;
                }
            }
        }
    )*};
}

impl Harness {
    /// Create namespace `ns` (creates into a namespace that does not exist
    /// answer 404, as in kube); one that exists already is fine.
    pub async fn namespace(&self, ns: &str) {
        let r = self
            .post(
                "/api/v1/namespaces",
                &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await;
        assert!(
            r.status == 201 || r.status == 409,
            "create namespace {ns}: {} {}",
            r.status,
            r.text
        );
    }
}

/// What a kubectl run printed.
pub struct KubectlOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the real kubectl `bin` with `kubeconfig` (HOME and the discovery
/// cache in the harness's temp dir), at most 60 s.
pub async fn kubectl_as(
    bin: &std::path::Path,
    h: &Harness,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> KubectlOut {
    let run = tokio::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("HOME", h.dir.path())
        .env("KUBECACHEDIR", h.dir.path().join("cache"))
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(60), run).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => panic!("kubectl {args:?}: {e}"),
        Err(_) => panic!("kubectl {args:?} timed out"),
    };
    KubectlOut {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}
