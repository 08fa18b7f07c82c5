//! ResourceQuota object-count quota (issue #9, "Quota"), over HTTP on both
//! backends: exact under concurrent creates, given back by failed creates
//! and deletes, started from the objects that already exist, and written
//! back to `status`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use futures::future::join_all;
use serde_json::{json, Value};
use support::{vpc, vpcs, Backend, Harness};

both_backends!(
    concurrent_creates_stop_exactly_at_the_quota,
    failed_creates_and_deletes_give_quota_back,
    a_new_quota_counts_the_objects_that_exist,
    any_namespaced_kind_can_be_counted,
    count_limits_must_be_integers,
);

const VPC_COUNT: &str = "count/vpcs.sdn.cozystack.io";

fn quotas(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/resourcequotas")
}

fn quota(name: &str, hard: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name}, "spec": {"hard": hard}})
}

async fn create_quota(h: &Harness, ns: &str, name: &str, hard: Value) {
    let r = h.post(&quotas(ns), &quota(name, hard)).await;
    assert_eq!(r.status, 201, "create quota: {}", r.text);
}

async fn used(h: &Harness, ns: &str, name: &str, resource: &str) -> Value {
    let r = h.get(&format!("{}/{name}", quotas(ns))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.body["status"]["used"][resource].clone()
}

fn assert_exceeded(r: &support::Resp, quota: &str, used: u64, hard: u64) {
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.body["reason"], "Forbidden", "{}", r.text);
    let want = format!(
        "exceeded quota: {quota}, requested: {VPC_COUNT}=1, used: {VPC_COUNT}={used}, limited: {VPC_COUNT}={hard}"
    );
    let msg = r.body["message"].as_str().unwrap_or("");
    assert!(msg.contains(&want), "{msg:?} does not contain {want:?}");
}

async fn concurrent_creates_stop_exactly_at_the_quota(h: &Harness) {
    h.namespace("q").await;
    create_quota(h, "q", "vpc-quota", json!({VPC_COUNT: "5"})).await;
    let path = vpcs("q");
    let creates = (0..20).map(|i| {
        let path = path.clone();
        async move {
            h.post(&path, &vpc(&format!("v{i}"), &format!("10.{i}.0.0/16")))
                .await
        }
    });
    let results = join_all(creates).await;
    let created = results.iter().filter(|r| r.status == 201).count();
    assert_eq!(created, 5, "exactly the quota is created");
    for r in results.iter().filter(|r| r.status != 201) {
        assert_exceeded(r, "vpc-quota", 5, 5);
    }
    assert_eq!(h.get(&path).await.item_names().len(), 5);
    let q = h.get(&format!("{}/vpc-quota", quotas("q"))).await;
    assert_eq!(q.body["status"]["used"][VPC_COUNT], "5", "{}", q.text);
    assert_eq!(q.body["status"]["hard"][VPC_COUNT], "5", "{}", q.text);
}

async fn failed_creates_and_deletes_give_quota_back(h: &Harness) {
    h.namespace("g").await;
    create_quota(h, "g", "two", json!({VPC_COUNT: 2})).await;
    let path = vpcs("g");
    assert_eq!(h.post(&path, &vpc("a", "10.1.0.0/16")).await.status, 201);
    // A create that fails after its charge (the name exists) gives it back.
    assert_eq!(h.post(&path, &vpc("a", "10.1.0.0/16")).await.status, 409);
    assert_eq!(used(h, "g", "two", VPC_COUNT).await, "1");
    // A dryRun create is checked but not charged.
    let dry = h
        .post(&format!("{path}?dryRun=All"), &vpc("dry", "10.3.0.0/16"))
        .await;
    assert_eq!(dry.status, 201, "{}", dry.text);
    assert_eq!(used(h, "g", "two", VPC_COUNT).await, "1");
    assert_eq!(h.post(&path, &vpc("b", "10.2.0.0/16")).await.status, 201);
    assert_exceeded(&h.post(&path, &vpc("c", "10.3.0.0/16")).await, "two", 2, 2);
    assert_exceeded(
        &h.post(&format!("{path}?dryRun=All"), &vpc("c", "10.3.0.0/16"))
            .await,
        "two",
        2,
        2,
    );
    // A delete gives its object back ...
    assert_eq!(h.delete(&format!("{path}/a")).await.status, 200);
    assert_eq!(used(h, "g", "two", VPC_COUNT).await, "1");
    assert_eq!(h.post(&path, &vpc("c", "10.3.0.0/16")).await.status, 201);
    // ... and so does the update that drops the last finalizer of an
    // object being deleted.
    let mut held = vpc("held", "10.4.0.0/16");
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    assert_eq!(h.delete(&format!("{path}/b")).await.status, 200);
    assert_eq!(h.post(&path, &held).await.status, 201);
    assert_eq!(h.delete(&format!("{path}/held")).await.status, 200);
    assert_eq!(used(h, "g", "two", VPC_COUNT).await, "2");
    let r = h
        .patch(
            &format!("{path}/held"),
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(h.get(&format!("{path}/held")).await.status, 404);
    assert_eq!(used(h, "g", "two", VPC_COUNT).await, "1");
}

async fn a_new_quota_counts_the_objects_that_exist(h: &Harness) {
    h.namespace("e").await;
    let path = vpcs("e");
    for (i, n) in ["x", "y"].iter().enumerate() {
        let r = h.post(&path, &vpc(n, &format!("10.{i}.0.0/16"))).await;
        assert_eq!(r.status, 201, "{}", r.text);
    }
    create_quota(h, "e", "late", json!({VPC_COUNT: "2", "cpu": "1"})).await;
    // The new quota's status is filled at once, as kube's controller does.
    let q = h.get(&format!("{}/late", quotas("e"))).await;
    assert_eq!(
        q.body["status"],
        json!({"hard": {VPC_COUNT: "2", "cpu": "1"}, "used": {VPC_COUNT: "2"}}),
        "{}",
        q.text
    );
    assert_exceeded(&h.post(&path, &vpc("z", "10.9.0.0/16")).await, "late", 2, 2);
    // Quotas of other namespaces do not apply.
    h.namespace("other").await;
    let r = h.post(&vpcs("other"), &vpc("z", "10.9.0.0/16")).await;
    assert_eq!(r.status, 201, "{}", r.text);
}

async fn any_namespaced_kind_can_be_counted(h: &Harness) {
    h.namespace("l").await;
    let resource = "count/leases.coordination.k8s.io";
    create_quota(h, "l", "leases", json!({resource: "1", VPC_COUNT: "10"})).await;
    let leases = "/apis/coordination.k8s.io/v1/namespaces/l/leases";
    let lease = |n: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": n}});
    assert_eq!(h.post(leases, &lease("one")).await.status, 201);
    let r = h.post(leases, &lease("two")).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body["message"]
        .as_str()
        .unwrap_or("")
        .contains(&format!("exceeded quota: leases, requested: {resource}=1, used: {resource}=1, limited: {resource}=1")), "{}", r.text);
    // The other kind's limit is not touched by leases.
    assert_eq!(used(h, "l", "leases", VPC_COUNT).await, "0");
    assert_eq!(
        h.post(&vpcs("l"), &vpc("v", "10.0.0.0/16")).await.status,
        201
    );
    assert_eq!(used(h, "l", "leases", VPC_COUNT).await, "1");
}

async fn count_limits_must_be_integers(h: &Harness) {
    h.namespace("i").await;
    let r = h
        .post(&quotas("i"), &quota("bad", json!({VPC_COUNT: "1.5"})))
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        format!("spec.hard[{VPC_COUNT}]")
    );
}
