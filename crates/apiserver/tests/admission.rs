//! Admission and limits for hostile clients (issue #9, "Hardening"), over
//! HTTP on both backends. Creates into missing or terminating namespaces
//! (failed before the namespace check: the creates answered 201) and the
//! total size of `Warning` headers (failed before the cap: 90 headers,
//! 14 940 bytes). Label and annotation limits as kube's validation were
//! already enforced by `meta.rs`; their test pins them at each bound.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use serde_json::{json, Value};
use support::{vpc, vpcs, Backend, Harness};

both_backends!(
    creates_into_a_missing_namespace_are_not_found,
    creates_into_a_terminating_namespace_are_forbidden,
    labels_and_annotations_are_limited_as_in_kube,
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

/// A VPC in `default` with these labels and annotations.
fn labelled(name: &str, labels: Value, annotations: Value) -> Value {
    let mut v = vpc(name, "10.0.0.0/16");
    v["metadata"]["labels"] = labels;
    v["metadata"]["annotations"] = annotations;
    v
}

/// The fields of the causes of a 422.
fn cause_fields(r: &support::Resp) -> Vec<String> {
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(r.body["reason"], "Invalid");
    r.body["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["field"].as_str().map(str::to_string))
        .collect()
}

async fn labels_and_annotations_are_limited_as_in_kube(h: &Harness) {
    let path = vpcs("default");
    let prefix_253 = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(prefix_253.len(), 253);
    let name_63 = "n".repeat(63);
    let value_63 = format!(
        "V{}9",
        "-_.".repeat(21).chars().take(61).collect::<String>()
    );
    assert_eq!(value_63.len(), 63);
    // At every limit: accepted.
    let ok = labelled(
        "at-limits",
        json!({format!("{prefix_253}/{name_63}"): value_63, "empty": ""}),
        json!({"note": "a".repeat(256 * 1024 - 4)}),
    );
    let r = h.post(&path, &ok).await;
    assert_eq!(r.status, 201, "{}", r.text);
    // One past each limit, and malformed: 422 naming the field.
    let bad_labels: [(&str, Value, &str); 8] = [
        (
            "long-prefix",
            json!({format!("a{prefix_253}/k"): "v"}),
            "metadata.labels",
        ),
        (
            "long-name",
            json!({format!("{name_63}n"): "v"}),
            "metadata.labels",
        ),
        (
            "empty-name",
            json!({"example.com/": "v"}),
            "metadata.labels",
        ),
        (
            "bad-prefix",
            json!({"Example.com/k": "v"}),
            "metadata.labels",
        ),
        (
            "long-value",
            json!({"k": format!("{value_63}x")}),
            "metadata.labels[k]",
        ),
        ("bad-start", json!({"k": "-v"}), "metadata.labels[k]"),
        ("bad-char", json!({"k": "a b"}), "metadata.labels[k]"),
        ("not-string", json!({"k": 1}), "metadata.labels[k]"),
    ];
    for (name, labels, field) in bad_labels {
        let r = h.post(&path, &labelled(name, labels, json!({}))).await;
        let fields = cause_fields(&r);
        assert!(fields.iter().any(|f| f == field), "{name}: {fields:?}");
        assert_eq!(h.get(&format!("{path}/{name}")).await.status, 404, "{name}");
    }
    let big = labelled(
        "big-notes",
        json!({}),
        json!({"note": "a".repeat(256 * 1024 - 3)}),
    );
    assert_eq!(
        cause_fields(&h.post(&path, &big).await),
        ["metadata.annotations"]
    );
    // Updates are held to the same rules.
    let r = h
        .patch(
            &format!("{path}/at-limits"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"k": format!("{value_63}x")}}}),
        )
        .await;
    assert_eq!(cause_fields(&r), ["metadata.labels[k]"]);
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
