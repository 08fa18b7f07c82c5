//! Hostile clients (issue #9, "Hardening"), over HTTP on both backends:
//! JSON patch bombs, objects nested past the decoder's depth limit, and
//! `gracePeriodSeconds` overflow. Each test failed before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::sync::Arc;
use std::time::Duration;

use cozyplane_apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(
    self_doubling_copies_are_refused,
    too_many_json_patch_operations_are_refused,
    a_patch_result_over_the_body_limit_is_refused,
    huge_grace_periods_are_clamped,
);

const JSON_PATCH: &str = "application/json-patch+json";

fn node(name: &str, cidrs: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDRs": cidrs},
    })
}

fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

/// Create a node and return it as stored.
async fn create_node(h: &Harness, name: &str, cidrs: Value) -> Value {
    let c = h.post("/api/v1/nodes", &node(name, cidrs)).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let g = h.get(&node_path(name)).await;
    assert_eq!(g.status, 200, "{}", g.text);
    g.body
}

/// The patch of the report: 17 `copy` operations, each appending the list
/// to itself, so the object doubles 17 times (a ~1 KiB body, a 6 MB result).
async fn self_doubling_copies_are_refused(h: &Harness) {
    let before = create_node(h, "bomb", json!(["x".repeat(40)])).await;
    let op = json!({"op": "copy", "from": "/spec/podCIDRs", "path": "/spec/podCIDRs/-"});
    let patch = Value::Array(vec![op; 17]);
    assert!(patch.to_string().len() < 1500);
    let r = h.patch(&node_path("bomb"), JSON_PATCH, &patch).await;
    assert_eq!(r.status, 422, "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["reason"], "Invalid");
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("copy") && msg.contains(&format!("limit of {}", 3 * 1024 * 1024)),
        "{msg}"
    );
    let after = h.get(&node_path("bomb")).await;
    assert_eq!(after.body, before, "nothing is stored");
}

async fn too_many_json_patch_operations_are_refused(h: &Harness) {
    let before = create_node(h, "many", json!(["10.0.0.0/24"])).await;
    let op = json!({"op": "test", "path": "/metadata/name", "value": "many"});
    let r = h
        .patch(
            &node_path("many"),
            JSON_PATCH,
            &Value::Array(vec![op.clone(); 10_001]),
        )
        .await;
    assert_eq!(r.status, 413, "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.body["reason"], "RequestEntityTooLarge");
    assert_eq!(
        r.body["message"],
        "The allowed maximum operations in a JSON patch is 10000, got 10001"
    );
    // Exactly the limit is fine.
    let ok = h
        .patch(
            &node_path("many"),
            JSON_PATCH,
            &Value::Array(vec![op; 10_000]),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", &ok.text[..ok.text.len().min(300)]);
    assert_eq!(h.get(&node_path("many")).await.body, before);
}

/// A patch that fits in the body limit but makes the object larger than it.
async fn a_patch_result_over_the_body_limit_is_refused(h: &Harness) {
    let before = create_node(h, "big", json!(["a".repeat(1024 * 1024)])).await;
    let patch =
        json!([{"op": "add", "path": "/spec/podCIDRs/-", "value": "b".repeat(5 * 512 * 1024)}]);
    let r = h.patch(&node_path("big"), JSON_PATCH, &patch).await;
    assert_eq!(r.status, 413, "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.body["reason"], "RequestEntityTooLarge");
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!("limit of {} bytes", 3 * 1024 * 1024)),
        "{msg}"
    );
    let after = h.get(&node_path("big")).await;
    assert_eq!(after.body, before, "nothing is stored");
}

/// A bound, running pod in `default`.
async fn running_pod(h: &Harness, name: &str, spec_grace: Option<i64>) -> String {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "probe"}]},
    });
    if let Some(g) = spec_grace {
        p["spec"]["terminationGracePeriodSeconds"] = json!(g);
    }
    let c = h.post("/api/v1/namespaces/default/pods", &p).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let path = format!("/api/v1/namespaces/default/pods/{name}");
    let s = h
        .patch(
            &format!("{path}/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(s.status, 200, "{}", s.text);
    path
}

/// `gracePeriodSeconds` = i64::MAX (query, body, or the pod's
/// `terminationGracePeriodSeconds`) overflowed the deletion timestamp and
/// panicked the handler; it is clamped to 100 years.
async fn huge_grace_periods_are_clamped(h: &Harness) {
    const CLAMPED: i64 = 100 * 365 * 24 * 3600;
    let huge = i64::MAX;
    let q = running_pod(h, "huge-query", None).await;
    let d = h.delete(&format!("{q}?gracePeriodSeconds={huge}")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], CLAMPED);
    assert!(d.body["metadata"]["deletionTimestamp"].is_string());

    let b = running_pod(h, "huge-body", None).await;
    let body = json!({"gracePeriodSeconds": huge}).to_string().into_bytes();
    let d = h
        .call("DELETE", &b, Some("application/json"), body, None)
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], CLAMPED);

    let s = running_pod(h, "huge-spec", Some(huge)).await;
    let d = h.delete(&s).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], CLAMPED);
    // ...and a later, shorter delete still works from the clamped mark.
    let d = h.delete(&format!("{s}?gracePeriodSeconds=0")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(h.get(&s).await.status, 404);

    let n = running_pod(h, "most-negative", None).await;
    let d = h
        .delete(&format!("{n}?gracePeriodSeconds={}", i64::MIN))
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 1);
}

/// Panics in the authorizer for any path containing `boom`: a stand-in for
/// a handler bug.
struct PanicOnBoom;

#[async_trait::async_trait]
impl Authorizer for PanicOnBoom {
    async fn authorize(&self, _user: &UserInfo, attrs: &Attributes) -> Decision {
        assert!(!attrs.path.contains("boom"), "injected handler panic");
        Decision::Allow
    }
}

/// A panicking handler answers 500 with a Status, and the other requests
/// and open watches of the server go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_500_and_nothing_else_breaks() {
    let Some(h) = support::start_with(Backend::Embedded, "panicking_handler", |b| {
        b.authorizer(Arc::new(PanicOnBoom))
    })
    .await
    else {
        return;
    };
    let ns = support::vpcs("default");
    let mut watch = h.stream(&format!("{ns}?watch=true")).await;
    for _ in 0..2 {
        let r = h.get(&format!("{ns}/boom")).await;
        assert_eq!(r.status, 500, "{}", r.text);
        assert_eq!(r.body["kind"], "Status");
        assert_eq!(r.body["reason"], "InternalError");
    }
    let c = h.post(&ns, &support::vpc("after", "10.9.0.0/16")).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let ev = watch.next_change(Duration::from_secs(5)).await;
    assert_eq!(
        ev.as_ref()
            .map(|e| (e["type"].clone(), e["object"]["metadata"]["name"].clone())),
        Some((json!("ADDED"), json!("after"))),
        "{ev:?}"
    );
    h.server.shutdown().await;
}
