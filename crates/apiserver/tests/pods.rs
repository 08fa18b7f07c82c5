//! Pod semantics of the standalone server over HTTP, on both backends:
//! graceful deletion (bound running pods are only marked until a grace-0
//! delete) and the `pods/binding` subresource (authorized as `create` on
//! the subresource).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::sync::Arc;
use std::time::Duration;

use cozyplane_apiserver::auth::{Attributes, Authorizer, Decision, UserInfo};
use serde_json::{json, Value};
use support::{Backend, Harness};

both_backends!(
    graceful_delete_of_a_bound_running_pod,
    pods_deleted_at_once,
    second_delete_only_shortens_the_grace,
    graceful_delete_keeps_finalizers,
    binding_subresource,
);

both_backends!(termination_grace_period_is_normalized_as_kube_does);

const SECS: Duration = Duration::from_secs(5);

fn pods(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/pods")
}

fn pod(name: &str, node: Option<&str>, grace: Option<i64>) -> Value {
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "probe"}]},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    if let Some(g) = grace {
        p["spec"]["terminationGracePeriodSeconds"] = json!(g);
    }
    p
}

async fn create(h: &Harness, ns: &str, p: &Value, phase: Option<&str>) -> Value {
    let c = h.post(&pods(ns), p).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let Some(phase) = phase else {
        return c.body;
    };
    let name = c.body["metadata"]["name"].as_str().unwrap_or("");
    let s = h
        .patch(
            &format!("{}/{name}/status", pods(ns)),
            "application/merge-patch+json",
            &json!({"status": {"phase": phase}}),
        )
        .await;
    assert_eq!(s.status, 200, "{}", s.text);
    s.body
}

async fn delete_with(h: &Harness, path: &str, opts: Value) -> support::Resp {
    h.call(
        "DELETE",
        path,
        Some("application/json"),
        opts.to_string().into_bytes(),
        None,
    )
    .await
}

fn ts(v: &Value) -> chrono::DateTime<chrono::Utc> {
    let t = v["metadata"]["deletionTimestamp"].as_str().unwrap_or("");
    match chrono::DateTime::parse_from_rfc3339(t) {
        Ok(t) => t.with_timezone(&chrono::Utc),
        Err(e) => panic!("deletionTimestamp {t:?}: {e}"),
    }
}

async fn graceful_delete_of_a_bound_running_pod(h: &Harness) {
    let ns = "default";
    let created = create(h, ns, &pod("g1", Some("node1"), Some(20)), Some("Running")).await;
    let uid = created["metadata"]["uid"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let path = format!("{}/g1", pods(ns));
    let mut watch = h
        .stream(&format!(
            "{}?watch=true&resourceVersion={}",
            pods(ns),
            created["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
        ))
        .await;

    let before = chrono::Utc::now();
    let d = h.delete(&path).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["kind"], "Pod");
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 20);
    // deletionTimestamp is when the pod is due: now + the grace period
    let due = ts(&d.body);
    assert!(
        due >= before + chrono::Duration::seconds(19)
            && due <= chrono::Utc::now() + chrono::Duration::seconds(21),
        "deletionTimestamp {due} is not about now + 20 s"
    );
    let still = h.get(&path).await;
    assert_eq!(still.status, 200, "a terminating pod stays: {}", still.text);
    assert_eq!(still.body["metadata"]["deletionGracePeriodSeconds"], 20);

    // the kubelet may still write its status while the pod terminates
    let st = h
        .patch(
            &format!("{path}/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Succeeded"}}),
        )
        .await;
    assert_eq!(st.status, 200, "{}", st.text);
    assert_eq!(
        h.get(&path).await.status,
        200,
        "a status write removes nothing"
    );

    // the kubelet's final delete: grace 0 with a UID precondition
    let wrong = delete_with(
        h,
        &path,
        json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "other"}}),
    )
    .await;
    assert_eq!(wrong.status, 409, "{}", wrong.text);
    let fin = delete_with(
        h,
        &path,
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}),
    )
    .await;
    assert_eq!(fin.status, 200, "{}", fin.text);
    assert_eq!(h.get(&path).await.status, 404);

    let mut seen = Vec::new();
    for _ in 0..3 {
        let ev = watch.next_change(SECS).await.unwrap_or_default();
        seen.push((
            ev["type"].as_str().unwrap_or("none").to_string(),
            ev["object"]["metadata"]["deletionTimestamp"].is_string(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("MODIFIED".to_string(), true),
            ("MODIFIED".to_string(), true),
            ("DELETED".to_string(), true)
        ]
    );
}

async fn pods_deleted_at_once(h: &Harness) {
    let ns = "default";
    // unbound
    create(h, ns, &pod("u1", None, Some(30)), None).await;
    let d = h.delete(&format!("{}/u1", pods(ns))).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(h.get(&format!("{}/u1", pods(ns))).await.status, 404);
    // bound, grace 0 in the query (kubectl --grace-period=0 --force)
    create(h, ns, &pod("z1", Some("node1"), None), Some("Running")).await;
    let d = h
        .delete(&format!("{}/z1?gracePeriodSeconds=0", pods(ns)))
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(h.get(&format!("{}/z1", pods(ns))).await.status, 404);
    // bound, grace 0 in the body
    create(h, ns, &pod("z2", Some("node1"), None), Some("Running")).await;
    let d = delete_with(
        h,
        &format!("{}/z2", pods(ns)),
        json!({"gracePeriodSeconds": 0}),
    )
    .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(h.get(&format!("{}/z2", pods(ns))).await.status, 404);
    // terminal pods
    for (name, phase) in [("t1", "Succeeded"), ("t2", "Failed")] {
        create(h, ns, &pod(name, Some("node1"), Some(30)), Some(phase)).await;
        let d = h.delete(&format!("{}/{name}", pods(ns))).await;
        assert_eq!(d.status, 200, "{}", d.text);
        assert_eq!(
            h.get(&format!("{}/{name}", pods(ns))).await.status,
            404,
            "{phase}"
        );
    }
    // a bad grace period is a 400 and deletes nothing
    create(h, ns, &pod("b1", Some("node1"), None), Some("Running")).await;
    let bad = delete_with(
        h,
        &format!("{}/b1", pods(ns)),
        json!({"gracePeriodSeconds": "soon"}),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.text);
    let kept = h.get(&format!("{}/b1", pods(ns))).await;
    assert!(kept.body["metadata"].get("deletionTimestamp").is_none());
    // deleteCollection of pods is graceful too
    let dc = h.delete(&pods(ns)).await;
    assert_eq!(dc.status, 200, "{}", dc.text);
    let kept = h.get(&format!("{}/b1", pods(ns))).await;
    assert_eq!(kept.status, 200);
    assert_eq!(kept.body["metadata"]["deletionGracePeriodSeconds"], 30);
}

async fn second_delete_only_shortens_the_grace(h: &Harness) {
    let ns = "default";
    create(h, ns, &pod("s1", Some("node1"), Some(60)), Some("Running")).await;
    let path = format!("{}/s1", pods(ns));
    let first = h.delete(&path).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let due = ts(&first.body);

    // longer or equal (the spec default again): nothing changes
    for opts in [json!({"gracePeriodSeconds": 600}), json!({})] {
        let d = delete_with(h, &path, opts).await;
        assert_eq!(d.status, 200, "{}", d.text);
        assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 60);
        assert_eq!(ts(&d.body), due);
        assert_eq!(
            d.body["metadata"]["resourceVersion"], first.body["metadata"]["resourceVersion"],
            "not rewritten"
        );
    }
    // shorter: the timestamp moves earlier by the difference
    let d = delete_with(h, &path, json!({"gracePeriodSeconds": 10})).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 10);
    assert_eq!(ts(&d.body), due - chrono::Duration::seconds(50));
    let got = h.get(&path).await;
    assert_eq!(got.body["metadata"]["deletionGracePeriodSeconds"], 10);
    // a negative grace period means 1 second
    let d = h.delete(&format!("{path}?gracePeriodSeconds=-1")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 1);
    // dryRun changes nothing
    let dry = delete_with(
        h,
        &path,
        json!({"gracePeriodSeconds": 0, "dryRun": ["All"]}),
    )
    .await;
    assert_eq!(dry.status, 200, "{}", dry.text);
    assert_eq!(h.get(&path).await.status, 200);
    let d = h.delete(&format!("{path}?gracePeriodSeconds=0")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(h.get(&path).await.status, 404);
}

async fn graceful_delete_keeps_finalizers(h: &Harness) {
    let ns = "default";
    let mut p = pod("f1", Some("node1"), Some(5));
    p["metadata"]["finalizers"] = json!(["example.com/keep"]);
    create(h, ns, &p, Some("Running")).await;
    let path = format!("{}/f1", pods(ns));
    let d = h.delete(&path).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 5);
    // the grace-0 delete is due now, but the finalizer keeps the pod
    let d = h.delete(&format!("{path}?gracePeriodSeconds=0")).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 0);
    let kept = h.get(&path).await;
    assert_eq!(kept.status, 200, "{}", kept.text);
    let u = h
        .patch(
            &path,
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(u.status, 200, "{}", u.text);
    assert_eq!(
        h.get(&path).await.status,
        404,
        "gone with its last finalizer"
    );

    // a pod in graceful deletion is not removed by dropping its finalizers
    let mut p = pod("f2", Some("node1"), Some(30));
    p["metadata"]["finalizers"] = json!(["example.com/keep"]);
    create(h, ns, &p, Some("Running")).await;
    let path = format!("{}/f2", pods(ns));
    assert_eq!(h.delete(&path).await.status, 200);
    let u = h
        .patch(
            &path,
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(u.status, 200, "{}", u.text);
    assert_eq!(h.get(&path).await.status, 200, "still terminating");
    assert_eq!(
        h.delete(&format!("{path}?gracePeriodSeconds=0"))
            .await
            .status,
        200
    );
    assert_eq!(h.get(&path).await.status, 404);
}

fn binding(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
}

async fn binding_subresource(h: &Harness) {
    let ns = "default";
    let created = create(h, ns, &pod("b1", None, None), None).await;
    let path = format!("{}/b1", pods(ns));
    let mut watch = h
        .stream(&format!(
            "{}?watch=true&resourceVersion={}&fieldSelector=spec.nodeName%3Dnode2",
            pods(ns),
            created["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
        ))
        .await;

    let b = h
        .post(&format!("{path}/binding"), &binding("b1", "node2"))
        .await;
    assert_eq!(b.status, 201, "{}", b.text);
    assert_eq!(
        (
            b.body["kind"].as_str(),
            b.body["status"].as_str(),
            b.body["code"].as_i64()
        ),
        (Some("Status"), Some("Success"), Some(201))
    );
    let got = h.get(&path).await;
    assert_eq!(got.body["spec"]["nodeName"], "node2");
    assert_eq!(got.body["metadata"]["generation"], 2);
    let conds = got.body["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        conds
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True"),
        "{conds:?}"
    );
    // a field-selector watch on the node sees the pod arrive
    let ev = watch.next_change(SECS).await.unwrap_or_default();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b1"))
    );

    let again = h
        .post(&format!("{path}/binding"), &binding("b1", "node3"))
        .await;
    assert_eq!(again.status, 409, "{}", again.text);
    assert_eq!(again.body["reason"], "Conflict");
    assert!(
        again.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"node2\"")),
        "names the node: {}",
        again.text
    );
    assert_eq!(h.get(&path).await.body["spec"]["nodeName"], "node2");

    let missing = h
        .post(
            &format!("{}/nope/binding", pods(ns)),
            &binding("nope", "node2"),
        )
        .await;
    assert_eq!(missing.status, 404, "{}", missing.text);
    assert_eq!(missing.body["reason"], "NotFound");

    create(h, ns, &pod("b2", None, None), None).await;
    let b2 = format!("{}/b2", pods(ns));
    for bad in [
        json!({"kind": "Binding", "apiVersion": "v1", "metadata": {"name": "b2"}, "target": {"kind": "Pod", "name": "x"}}),
        json!({"kind": "Binding", "apiVersion": "v1", "metadata": {"name": "b2"}, "target": {"kind": "Node"}}),
    ] {
        let r = h.post(&format!("{b2}/binding"), &bad).await;
        assert_eq!(
            (r.status, r.body["reason"].as_str()),
            (422, Some("Invalid")),
            "{}",
            r.text
        );
    }
    let wrong_name = h
        .post(&format!("{b2}/binding"), &binding("other", "node2"))
        .await;
    assert_eq!(wrong_name.status, 400, "{}", wrong_name.text);
    assert!(
        h.get(&b2).await.body["spec"].get("nodeName").is_none(),
        "a refused binding changes nothing"
    );
    // binding is create-only; a pod being deleted cannot be bound
    let get = h.get(&format!("{b2}/binding")).await;
    assert_eq!(get.status, 405, "{}", get.text);
    let mut p3 = pod("b3", None, None);
    p3["metadata"]["finalizers"] = json!(["example.com/keep"]);
    create(h, ns, &p3, None).await;
    assert_eq!(h.delete(&format!("{}/b3", pods(ns))).await.status, 200);
    let r = h
        .post(&format!("{}/b3/binding", pods(ns)), &binding("b3", "node2"))
        .await;
    assert_eq!(r.status, 409, "{}", r.text);

    // discovery lists pods/binding with verb create
    let d = h.get("/api/v1").await;
    let res = d.body["resources"].as_array().cloned().unwrap_or_default();
    let b = res.iter().find(|r| r["name"] == "pods/binding").cloned();
    assert_eq!(
        b.map(|b| (b["kind"].clone(), b["verbs"].clone())),
        Some((json!("Binding"), json!(["create"])))
    );
}

/// Denies `create` on `pods/binding` for pod "denied"; records every check.
#[derive(Default)]
struct BindingGate(std::sync::Mutex<Vec<Attributes>>);

#[async_trait::async_trait]
impl Authorizer for BindingGate {
    async fn authorize(&self, _user: &UserInfo, attrs: &Attributes) -> Decision {
        if let Ok(mut seen) = self.0.lock() {
            seen.push(attrs.clone());
        }
        if attrs.subresource == "binding" && attrs.name == "denied" {
            Decision::Deny("binding denied pod".into())
        } else {
            Decision::Allow
        }
    }
}

/// The authorizer sees a binding as `create` on the `binding` subresource
/// of pods, and a denial changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_is_authorized_as_create_on_the_subresource() {
    let gate = Arc::new(BindingGate::default());
    let g = gate.clone();
    let Some(h) =
        support::start_with(Backend::Embedded, "binding_authz", move |b| b.authorizer(g)).await
    else {
        return;
    };
    let ns = "default";
    create(&h, ns, &pod("denied", None, None), None).await;
    create(&h, ns, &pod("allowed", None, None), None).await;
    let r = h
        .post(
            &format!("{}/denied/binding", pods(ns)),
            &binding("denied", "n1"),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(h.get(&format!("{}/denied", pods(ns))).await.body["spec"]
        .get("nodeName")
        .is_none());
    let r = h
        .post(
            &format!("{}/allowed/binding", pods(ns)),
            &binding("allowed", "n1"),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let seen = gate.0.lock().map(|s| s.clone()).unwrap_or_default();
    let bindings: Vec<(String, String, String, String, String)> = seen
        .iter()
        .filter(|a| a.subresource == "binding")
        .map(|a| {
            (
                a.verb.clone(),
                a.group.clone(),
                a.resource.clone(),
                a.namespace.clone(),
                a.name.clone(),
            )
        })
        .collect();
    let want = |name: &str| {
        (
            "create".to_string(),
            String::new(),
            "pods".to_string(),
            ns.to_string(),
            name.to_string(),
        )
    };
    assert_eq!(bindings, [want("denied"), want("allowed")]);
    h.server.shutdown().await;
}

/// A negative `spec.terminationGracePeriodSeconds` is stored as 1 on create
/// and on update, as kube-apiserver does since 1.27 (kubernetes#115606);
/// a non-int64 one is 400 (kube's decoder); a huge one is kept and the
/// delete clamps it. Before, -5 and 1e30 were stored as sent.
async fn termination_grace_period_is_normalized_as_kube_does(h: &Harness) {
    let path = format!("{}/neg", pods("default"));
    let c = create(
        h,
        "default",
        &pod("neg", Some("n1"), Some(-5)),
        Some("Running"),
    )
    .await;
    assert_eq!(c["spec"]["terminationGracePeriodSeconds"], 1);
    assert_eq!(
        h.get(&path).await.body["spec"]["terminationGracePeriodSeconds"],
        1
    );
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let r = h
            .patch(
                &path,
                ct,
                &json!({"spec": {"terminationGracePeriodSeconds": -7}}),
            )
            .await;
        assert_eq!(r.status, 200, "{ct}: {}", r.text);
        assert_eq!(r.body["spec"]["terminationGracePeriodSeconds"], 1, "{ct}");
    }
    let mut replaced = h.get(&path).await.body;
    replaced["spec"]["terminationGracePeriodSeconds"] = json!(i64::MIN);
    let r = h.put(&path, &replaced).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["spec"]["terminationGracePeriodSeconds"], 1);
    // The stored 1 is the grace a DELETE gets.
    let d = h.delete(&path).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 1);

    for bad in [json!(1e30), json!(2.5), json!("30")] {
        let mut p = pod("bad", Some("n1"), None);
        p["spec"]["terminationGracePeriodSeconds"] = bad.clone();
        let r = h.post(&pods("default"), &p).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
        assert!(
            r.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("spec.terminationGracePeriodSeconds")),
            "{bad}: {}",
            r.text
        );
        let r = h
            .patch(
                &format!("{}/neg", pods("default")),
                "application/merge-patch+json",
                &json!({"spec": {"terminationGracePeriodSeconds": bad}}),
            )
            .await;
        assert_eq!(r.status, 400, "patch {bad}: {}", r.text);
    }
    assert_eq!(h.get(&format!("{}/bad", pods("default"))).await.status, 404);

    // A grace period in a DELETE that is not an int64 is 400 too.
    let huge = create(
        h,
        "default",
        &pod("huge", Some("n1"), Some(i64::MAX)),
        Some("Running"),
    )
    .await;
    assert_eq!(huge["spec"]["terminationGracePeriodSeconds"], i64::MAX);
    let hp = format!("{}/huge", pods("default"));
    for q in ["1e30", "9223372036854775808", "-9223372036854775809"] {
        let r = h.delete(&format!("{hp}?gracePeriodSeconds={q}")).await;
        assert_eq!(r.status, 400, "{q}: {}", r.text);
    }
    let r = delete_with(h, &hp, json!({"gracePeriodSeconds": 1e30})).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let d = h.delete(&hp).await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert_eq!(
        d.body["metadata"]["deletionGracePeriodSeconds"],
        100 * 365 * 24 * 3600_i64
    );
}
