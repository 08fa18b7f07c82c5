//! Watches against hostile or vanished clients (issue #9, "Hardening"), on
//! both backends: a watch at a future resourceVersion answers 504 as a list
//! does. Each test failed before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(a_watch_at_a_future_resource_version_is_504);

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
