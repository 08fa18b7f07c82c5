//! Admission and limits for hostile clients (issue #9, "Hardening"), over
//! HTTP on both backends. Creates into missing or terminating namespaces
//! (failed before the namespace check: the creates answered 201) and the
//! total size of `Warning` headers (failed before the cap: 90 headers,
//! 14 940 bytes).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use serde_json::json;
use support::{vpc, vpcs, Backend, Harness};

both_backends!(
    creates_into_a_missing_namespace_are_not_found,
    creates_into_a_terminating_namespace_are_forbidden,
    warning_headers_are_capped,
);

async fn creates_into_a_missing_namespace_are_not_found(h: &Harness) {
    let r = h.post(&vpcs("nowhere"), &vpc("v", "10.0.0.0/16")).await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.body["reason"], "NotFound");
    assert_eq!(r.body["message"], "namespaces \"nowhere\" not found");
    assert_eq!(r.body["details"]["kind"], "namespaces");
    assert_eq!(r.body["details"]["name"], "nowhere");
    // Nothing was stored, and dryRun and server-side apply answer the same.
    assert_eq!(h.get(&vpcs("nowhere")).await.item_names().len(), 0);
    let dry = h
        .post(
            &format!("{}?dryRun=All", vpcs("nowhere")),
            &vpc("v", "10.0.0.0/16"),
        )
        .await;
    assert_eq!(dry.status, 404, "{}", dry.text);
    let apply = h
        .patch(
            &format!("{}/v?fieldManager=t", vpcs("nowhere")),
            "application/apply-patch+yaml",
            &vpc("v", "10.0.0.0/16"),
        )
        .await;
    assert_eq!(apply.status, 404, "{}", apply.text);
    // Cluster-scoped kinds need no namespace; once it exists, creates work.
    h.namespace("nowhere").await;
    let r = h.post(&vpcs("nowhere"), &vpc("v", "10.0.0.0/16")).await;
    assert_eq!(r.status, 201, "{}", r.text);
}

async fn creates_into_a_terminating_namespace_are_forbidden(h: &Harness) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "ending", "finalizers": ["example.com/hold"]}});
    assert_eq!(h.post("/api/v1/namespaces", &ns).await.status, 201);
    assert_eq!(
        h.post(&vpcs("ending"), &vpc("before", "10.0.0.0/16"))
            .await
            .status,
        201
    );
    assert_eq!(h.delete("/api/v1/namespaces/ending").await.status, 200);
    let r = h.post(&vpcs("ending"), &vpc("after", "10.1.0.0/16")).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.body["reason"], "Forbidden");
    assert_eq!(
        r.body["message"],
        "vpcs.sdn.cozystack.io \"after\" is forbidden: unable to create new content in namespace ending because it is being terminated"
    );
    // Objects already in it can still be changed and deleted.
    let p = h
        .patch(
            &format!("{}/before", vpcs("ending")),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert_eq!(
        h.delete(&format!("{}/before", vpcs("ending"))).await.status,
        200
    );
}

async fn warning_headers_are_capped(h: &Harness) {
    // 90 distinct unknown fields with long names: ~13 KiB of warnings
    // uncapped (and few enough headers for the client to read them all).
    let mut v = vpc("noisy", "10.0.0.0/16");
    for i in 0..90 {
        v["spec"][format!("unknownField{i:03}{}", "x".repeat(120))] = json!(1);
    }
    let r = h
        .post(&format!("{}?fieldValidation=Warn", vpcs("default")), &v)
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let warnings: Vec<&str> = r
        .headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let total: usize = warnings.iter().map(|w| w.len()).sum();
    assert!(!warnings.is_empty(), "the first warnings are still sent");
    assert!(total <= 4096, "{} warnings, {total} bytes", warnings.len());
    assert!(
        warnings[0].starts_with("299 - \"unknown field \\\"spec.unknownField000"),
        "{}",
        warnings[0]
    );
}
