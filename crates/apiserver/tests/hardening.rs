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
    too_deep_results_are_refused,
    undecodable_objects_do_not_break_lists_and_can_be_deleted,
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

/// `n` nested arrays: `chain(1)` is `[]`, `chain(2)` is `[[]]`.
fn chain(n: usize) -> Value {
    (1..n).fold(json!([]), |inner, _| Value::Array(vec![inner]))
}

/// The deepest an object may be (`limits::MAX_OBJECT_DEPTH`).
const MAX_DEPTH: usize = 100;

fn assert_too_deep(r: &support::Resp, what: &str) {
    assert_eq!(
        r.status,
        422,
        "{what}: {}",
        &r.text[..r.text.len().min(300)]
    );
    assert_eq!(r.body["reason"], "Invalid", "{what}");
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!("more than the limit of {MAX_DEPTH}")),
        "{what}: {msg}"
    );
}

/// Every write path refuses an object nested deeper than the limit, before
/// it is stored (before the fix each was stored, and past serde_json's
/// recursion limit of 128 it could no longer be read back).
async fn too_deep_results_are_refused(h: &Harness) {
    // {"spec": {"x": chain(n)}} is n + 2 deep.
    let deep = |name: &str, n: usize| {
        let mut v = node(name, json!([]));
        v["spec"]["x"] = chain(n);
        v
    };
    let at_limit = h
        .post("/api/v1/nodes", &deep("at-limit", MAX_DEPTH - 2))
        .await;
    assert_eq!(at_limit.status, 201, "{}", at_limit.text);
    let r = h
        .post("/api/v1/nodes", &deep("too-deep", MAX_DEPTH - 1))
        .await;
    assert_too_deep(&r, "create");
    assert_eq!(h.get(&node_path("too-deep")).await.status, 404);

    let before = create_node(h, "d", json!(["10.0.0.0/24"])).await;
    let path = node_path("d");
    let r = h.put(&path, &deep("d", MAX_DEPTH)).await;
    assert_too_deep(&r, "update");
    let body = json!({"spec": {"x": chain(MAX_DEPTH)}});
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let r = h.patch(&path, ct, &body).await;
        assert_too_deep(&r, ct);
    }
    let r = h
        .patch(
            &format!("{path}?fieldManager=t"),
            "application/apply-patch+yaml",
            &deep("d", MAX_DEPTH),
        )
        .await;
    // Apply bodies are YAML, whose decoder already refuses nesting past 64
    // (and merged onto a stored object ≤ 100 deep, they cannot go deeper).
    assert_eq!(r.status, 400, "apply: {}", &r.text[..r.text.len().min(300)]);
    assert!(r.text.contains("Depth"), "{}", r.text);
    let r = h
        .patch(
            &path,
            JSON_PATCH,
            &json!([{"op": "add", "path": "/spec/x", "value": chain(MAX_DEPTH)}]),
        )
        .await;
    assert_too_deep(&r, "json patch add");
    // Copies that each nest the chain into its own leaf: depth doubles per
    // operation while the size stays tiny (refused at the first op past
    // the limit, whatever the later ones would do).
    let mut ops = vec![json!({"op": "add", "path": "/spec/x", "value": chain(60)})];
    let leaf = format!("/spec/x{}/-", "/0".repeat(59));
    ops.extend((0..30).map(|_| json!({"op": "copy", "from": "/spec/x", "path": leaf})));
    let r = h.patch(&path, JSON_PATCH, &Value::Array(ops)).await;
    assert_too_deep(&r, "json patch copy");
    assert_eq!(h.get(&path).await.body, before, "nothing is stored");
    let l = h.get("/api/v1/nodes?labelSelector=a!=b").await;
    assert_eq!(l.status, 200, "{}", l.text);
}

/// An object the server cannot decode (here nested past serde_json's limit,
/// written straight into the store as an older server could have) is left
/// out of every list and watch with a logged warning, and can be deleted.
async fn undecodable_objects_do_not_break_lists_and_can_be_deleted(h: &Harness) {
    let ns = support::vpcs("default");
    let c = h.post(&ns, &support::vpc("good", "10.1.0.0/16")).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let info = support::kinds()
        .into_iter()
        .find(|k| k.plural == "vpcs")
        .expect("vpcs are served");
    let key = cozyplane_apiserver::keys::object_key(&info, Some("default"), "bad");
    let raw = format!(
        r#"{{"metadata":{{"name":"bad","namespace":"default","uid":"u-bad","labels":{{"tier":"gold"}}}},"apiVersion":"sdn.cozystack.io/v1alpha1","kind":"VPC","spec":{{"cidrs":["10.2.0.0/16"],"x":{}}}}}"#,
        "[".repeat(200) + &"]".repeat(200)
    );
    h.store
        .create(&key, raw.into_bytes())
        .await
        .expect("raw write");

    let names = support::Resp::item_names;
    let all = "/apis/sdn.cozystack.io/v1alpha1/vpcs";
    for path in [
        ns.clone(),
        format!("{ns}?labelSelector=tier%3Dgold"),
        format!("{ns}?fieldSelector=metadata.name%3Dbad"),
        all.to_string(),
        format!("{all}?labelSelector=tier"),
    ] {
        let r = h.get(&path).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            &r.text[..r.text.len().min(300)]
        );
        let want: Vec<String> = if path.contains("metadata.name") {
            vec![]
        } else {
            vec!["good".into()]
        };
        assert_eq!(names(&r), want, "{path}");
    }
    // Paginated: a page may come back with fewer items than its limit (the
    // skipped object used its slot), the pages together hold the rest.
    let (mut paged, mut token) = (Vec::new(), String::new());
    for _ in 0..5 {
        let r = h.get(&format!("{ns}?limit=1&continue={token}")).await;
        assert_eq!(r.status, 200, "{}", &r.text[..r.text.len().min(300)]);
        paged.extend(names(&r));
        token = r.body["metadata"]["continue"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(paged, vec!["good".to_string()]);
    let table = h
        .get_accept(&ns, "application/json;as=Table;v=v1;g=meta.k8s.io")
        .await;
    assert_eq!(
        table.status,
        200,
        "{}",
        &table.text[..table.text.len().min(300)]
    );
    assert_eq!(table.body["rows"].as_array().map(Vec::len), Some(1));

    let mut watch = h.stream(&format!("{ns}?watch=true")).await;
    let ev = watch.next_change(Duration::from_secs(5)).await;
    assert_eq!(
        ev.as_ref().map(|e| e["object"]["metadata"]["name"].clone()),
        Some(json!("good")),
        "{ev:?}"
    );

    // Its UID cannot be read, so a UID precondition cannot hold.
    let pre = json!({"preconditions": {"uid": "u-bad"}})
        .to_string()
        .into_bytes();
    let d = h
        .call(
            "DELETE",
            &format!("{ns}/bad"),
            Some("application/json"),
            pre,
            None,
        )
        .await;
    assert_eq!(d.status, 409, "{}", d.text);
    assert!(h.store.get(&key).await.expect("store get").is_some());
    let d = h.delete(&format!("{ns}/bad")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["status"], "Success", "{}", d.text);
    assert!(h.store.get(&key).await.expect("store get").is_none());
    assert_eq!(h.get(&format!("{ns}/bad")).await.status, 404);
    // The watch lives on: the deletion it could not decode is skipped.
    let c = h.post(&ns, &support::vpc("later", "10.3.0.0/16")).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let ev = watch.next_change(Duration::from_secs(5)).await;
    assert_eq!(
        ev.as_ref()
            .map(|e| (e["type"].clone(), e["object"]["metadata"]["name"].clone())),
        Some((json!("ADDED"), json!("later"))),
        "{ev:?}"
    );
}
