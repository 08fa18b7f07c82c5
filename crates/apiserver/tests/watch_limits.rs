//! Watches against hostile or vanished clients (issue #9, "Hardening"), on
//! both backends: a watch whose client went away is dropped at once (not at
//! its timeout), a user may hold only so many open watches, and a watch at
//! a future resourceVersion answers 504 as a list does. Each test failed
//! before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::path::PathBuf;
use std::time::Duration;

use cozyplane_apiserver::tls;
use cozyplane_testkit::{eventually_async, poll_async};
use http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(
    a_watch_at_a_future_resource_version_is_504,
    a_watch_whose_client_went_away_is_dropped_at_once,
);

const PODS: &str = "/api/v1/namespaces/default/pods";

/// The current resourceVersion, from a list.
async fn current_rv(h: &Harness) -> u64 {
    let l = h.get(PODS).await;
    assert_eq!(l.status, 200, "{}", l.text);
    l.body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {}", l.text))
}

/// A GET that must answer in full within 10 s (a watch that streams fails it).
async fn get_within(h: &Harness, path: &str) -> support::Resp {
    match tokio::time::timeout(Duration::from_secs(10), h.get(path)).await {
        Ok(r) => r,
        Err(_) => panic!("GET {path} did not answer within 10 s (a watch was started)"),
    }
}

fn assert_too_large_rv(r: &support::Resp, what: &str) {
    assert_eq!(r.status, 504, "{what}: {}", r.text);
    assert_eq!(r.body["kind"], "Status", "{what}");
    assert_eq!(r.body["reason"], "Timeout", "{what}");
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with("Too large resource version"),
        "{what}: {msg}"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
        "{what}"
    );
}

async fn a_watch_at_a_future_resource_version_is_504(h: &Harness) {
    let rv = current_rv(h).await;
    let future = rv + 1000;
    // as list answers
    let list = get_within(h, &format!("{PODS}?resourceVersion={future}")).await;
    assert_too_large_rv(&list, "list");
    let watch = get_within(h, &format!("{PODS}?watch=true&resourceVersion={future}")).await;
    assert_too_large_rv(&watch, "watch");
    let streaming = get_within(
        h,
        &format!(
            "{PODS}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true\
             &resourceVersionMatch=NotOlderThan&resourceVersion={future}"
        ),
    )
    .await;
    assert_too_large_rv(&streaming, "watch with sendInitialEvents");
    assert_eq!(h.server.open_watches(), 0, "a refused watch holds nothing");
    // the current revision is no future one
    let mut ok = h
        .stream(&format!("{PODS}?watch=true&resourceVersion={rv}"))
        .await;
    let c = h.post(PODS, &pod("p")).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let ev = ok.next_change(Duration::from_secs(10)).await;
    assert_eq!(ev.map(|e| e["type"].clone()), Some(json!("ADDED")));
}

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "i"}]}})
}

async fn a_watch_whose_client_went_away_is_dropped_at_once(h: &Harness) {
    assert_eq!(h.server.open_watches(), 0);
    // no bookmarks and no changes: nothing is written to the gone client,
    // so only noticing the closed connection can end the watch
    let reader = h.stream(&format!("{PODS}?watch=true")).await;
    let reader2 = h
        .stream(&format!("{PODS}?watch=true&timeoutSeconds=1800"))
        .await;
    eventually_async("two open watches", Duration::from_secs(10), || async {
        h.server.open_watches() == 2
    })
    .await;
    let metrics = h.get("/metrics").await;
    assert!(
        metrics.text.contains("apiserver_registered_watchers 2\n"),
        "{}",
        metrics.text
    );
    drop(reader);
    eventually_async(
        "the watch of the gone client to end",
        Duration::from_secs(10),
        || async { h.server.open_watches() == 1 },
    )
    .await;
    drop(reader2);
    eventually_async(
        "the second watch of the gone client to end",
        Duration::from_secs(10),
        || async { h.server.open_watches() == 0 },
    )
    .await;
    let metrics = h.get("/metrics").await;
    assert!(
        metrics.text.contains("apiserver_registered_watchers 0\n"),
        "{}",
        metrics.text
    );
}

mod per_user_limit {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded() {
        if let Some(h) = support::start_with(Backend::Embedded, "per_user_limit_embedded", |b| {
            b.max_watches_per_user(2)
        })
        .await
        {
            watches_over_the_per_user_limit_answer_429(&h).await;
            h.server.shutdown().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd() {
        if let Some(h) = support::start_with(Backend::Etcd, "per_user_limit_etcd", |b| {
            b.max_watches_per_user(2)
        })
        .await
        {
            watches_over_the_per_user_limit_answer_429(&h).await;
            h.server.shutdown().await;
        }
    }
}

/// A client for `user` (a client certificate from the server's CA).
async fn client_for(h: &Harness, user: &str) -> kube::Client {
    let cert = tls::issue_client_cert(&h.server.tls, user, &["tenants"], 1).unwrap();
    let path: PathBuf = h.dir.path().join(format!("kubeconfig-{user}"));
    tls::write_kubeconfig(&path, &h.server.url, &h.server.ca_pem, &cert).unwrap();
    support::raw_client(&path).await
}

/// Start a watch; its status, headers, and the body (kept open).
async fn open_watch(
    client: &kube::Client,
    path: &str,
) -> (u16, http::HeaderMap, kube::client::Body) {
    let req = Request::get(path)
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client.send(req).await.unwrap();
    (
        resp.status().as_u16(),
        resp.headers().clone(),
        resp.into_body(),
    )
}

async fn watches_over_the_per_user_limit_answer_429(h: &Harness) {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "pod-watcher"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]});
    let c = h
        .post("/apis/rbac.authorization.k8s.io/v1/clusterroles", &role)
        .await;
    assert_eq!(c.status, 201, "{}", c.text);
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "tenants-watch-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-watcher"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "tenants"}]});
    let c = h
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &binding,
        )
        .await;
    assert_eq!(c.status, 201, "{}", c.text);
    let alice = client_for(h, "alice").await;
    let bob = client_for(h, "bob").await;
    let path = format!("{PODS}?watch=true");
    eventually_async("alice may list pods", Duration::from_secs(10), || async {
        let req = Request::get(PODS)
            .body(kube::client::Body::empty())
            .unwrap();
        alice.send(req).await.is_ok_and(|r| r.status() == 200)
    })
    .await;

    let (s1, _, w1) = open_watch(&alice, &path).await;
    let (s2, _, _w2) = open_watch(&alice, &path).await;
    assert_eq!((s1, s2), (200, 200));
    let (s3, headers, body) = open_watch(&alice, &path).await;
    assert_eq!(s3, 429, "a third watch of alice's");
    let body = body.collect().await.unwrap().to_bytes();
    let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    let msg = status["message"].as_str().unwrap_or("");
    assert!(msg.contains("alice") && msg.contains('2'), "{msg}");

    // per user: bob and the admin (system:masters, not limited) still watch
    let (b1, _, _bw1) = open_watch(&bob, &path).await;
    assert_eq!(b1, 200);
    let mut admin = Vec::new();
    for _ in 0..3 {
        admin.push(h.stream(&path).await);
    }
    assert_eq!(h.server.open_watches(), 2 + 1 + 3);

    // a slot comes back when its watch ends
    drop(w1);
    let _w4 = poll_async(
        "alice to get a slot back",
        Duration::from_secs(10),
        || async {
            match open_watch(&alice, &path).await {
                (200, _, body) => Ok(body),
                (s, _, _) => Err(s),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(h.server.open_watches(), 2 + 1 + 3);
}
