//! HTTP-level conformance suite: every test runs against a server started
//! in-process over the embedded store and over a real etcd (the store
//! crate's fixture; under CI a missing etcd fails the test: the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{vpc, vpcs, Backend, Harness};

both_backends!(
    crud_and_metadata,
    status_subresource,
    list_selectors_and_pagination,
    patches,
    delete_and_finalizers,
    bad_input_leaves_store_unchanged,
    field_validation_and_dry_run,
    watch_semantics,
    watch_resume_and_expiry,
    discovery_openapi_table_metrics,
);

fn rv(v: &Value) -> String {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

const SECS: Duration = Duration::from_secs(5);

async fn crud_and_metadata(h: &Harness) {
    let path = vpcs("default");
    let created = h.post(&path, &vpc("a", "10.0.0.0/16")).await;
    assert_eq!(created.status, 201, "{}", created.text);
    let o = &created.body;
    assert_eq!(o["metadata"]["namespace"], "default");
    assert_eq!(o["metadata"]["generation"], 1);
    assert!(o["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert!(o["metadata"]["creationTimestamp"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    let rv1 = rv(o);
    assert!(rv1.parse::<u64>().is_ok_and(|r| r > 0));

    let got = h.get(&format!("{path}/a")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, created.body);

    let dup = h.post(&path, &vpc("a", "10.0.0.0/16")).await;
    assert_eq!(
        (dup.status, dup.body["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    assert_eq!(
        dup.body["message"],
        "vpcs.sdn.cozystack.io \"a\" already exists"
    );

    let mut gen = vpc("", "10.1.0.0/16");
    gen["metadata"] = json!({"generateName": "web-"});
    let g = h.post(&path, &gen).await;
    assert_eq!(g.status, 201, "{}", g.text);
    let gname = g.body["metadata"]["name"].as_str().unwrap_or_default();
    assert!(gname.starts_with("web-") && gname.len() == 9, "{gname}");

    // update: spec change bumps generation, rv changes
    let mut upd = got.body.clone();
    upd["spec"]["cidrs"] = json!(["10.0.0.0/15"]);
    let u = h.put(&format!("{path}/a"), &upd).await;
    assert_eq!(u.status, 200, "{}", u.text);
    assert_eq!(u.body["metadata"]["generation"], 2);
    assert_ne!(rv(&u.body), rv1);
    assert_eq!(u.body["metadata"]["uid"], o["metadata"]["uid"]);

    // stale resourceVersion → 409 Conflict, nothing written
    let stale = h.put(&format!("{path}/a"), &upd).await;
    assert_eq!(
        (stale.status, stale.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    assert!(stale.body["message"]
        .as_str()
        .is_some_and(|m| m.contains("the object has been modified")));

    // metadata-only change keeps generation; empty rv = unconditional
    let mut labels_only = u.body.clone();
    labels_only["metadata"]["labels"] = json!({"tier": "silver"});
    labels_only["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    let l = h.put(&format!("{path}/a"), &labels_only).await;
    assert_eq!(l.status, 200, "{}", l.text);
    assert_eq!(l.body["metadata"]["generation"], 2);
    assert_eq!(l.body["metadata"]["labels"]["tier"], "silver");

    // update of a missing object → 404 (no create-on-update)
    let missing = h
        .put(&format!("{path}/nope"), &vpc("nope", "10.9.0.0/16"))
        .await;
    assert_eq!(
        (missing.status, missing.body["reason"].as_str()),
        (404, Some("NotFound"))
    );

    // cluster-scoped kind: namespaces are served, URL has no namespace segment
    let ns = h
        .post(
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "team-a"}}),
        )
        .await;
    assert_eq!(ns.status, 201, "{}", ns.text);
    assert!(ns.body["metadata"].get("namespace").is_none());
    let def = h.get("/api/v1/namespaces/default").await;
    assert_eq!(
        def.status, 200,
        "standalone bootstraps the default namespace"
    );
}

async fn status_subresource(h: &Harness) {
    let path = vpcs("default");
    let mut with_status = vpc("s", "10.2.0.0/16");
    with_status["status"] = json!({"vni": 123, "phase": "Ready"});
    let c = h.post(&path, &with_status).await;
    assert_eq!(c.status, 201, "{}", c.text);
    assert!(
        c.body.get("status").is_none(),
        "create clears status: {}",
        c.body
    );

    // status write ignores spec changes
    let mut s = c.body.clone();
    s["status"] = json!({"vni": 101, "phase": "Ready"});
    s["spec"]["cidrs"] = json!(["10.3.0.0/16"]);
    let st = h.put(&format!("{path}/s/status"), &s).await;
    assert_eq!(st.status, 200, "{}", st.text);
    assert_eq!(st.body["status"]["vni"], 101);
    assert_eq!(st.body["spec"]["cidrs"], json!(["10.2.0.0/16"]));
    assert_eq!(st.body["metadata"]["generation"], 1);

    // main-resource write ignores status changes
    let mut m = st.body.clone();
    m["status"] = json!({"vni": 999});
    m["spec"]["mtu"] = json!(1400);
    let mu = h.put(&format!("{path}/s"), &m).await;
    assert_eq!(mu.status, 200, "{}", mu.text);
    assert_eq!(mu.body["status"]["vni"], 101);
    assert_eq!(mu.body["spec"]["mtu"], 1400);

    // PATCH on /status
    let p = h
        .patch(
            &format!("{path}/s/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Pending"}, "spec": {"mtu": 1500}}),
        )
        .await;
    assert_eq!(p.status, 200, "{}", p.text);
    assert_eq!(p.body["status"]["phase"], "Pending");
    assert_eq!(p.body["spec"]["mtu"], 1400);

    // status of a kind without the subresource → 404
    let b = h
        .get("/apis/sdn.cozystack.io/v1alpha1/namespaces/default/vpcbindings/x/status")
        .await;
    assert_eq!(b.status, 404);
}

async fn list_selectors_and_pagination(h: &Harness) {
    h.namespace("l1").await;
    h.namespace("l2").await;
    for (i, ns) in ["l1", "l1", "l1", "l2", "l2"].iter().enumerate() {
        let mut o = vpc(&format!("v{i}"), &format!("10.{i}.0.0/16"));
        o["metadata"]["labels"] =
            json!({"idx": i.to_string(), "team": if i % 2 == 0 { "even" } else { "odd" }});
        // an odd one carries `"team":"even"` in an annotation: the list's
        // pre-filter on the stored bytes lets it through, the match must not
        if i == 1 {
            o["metadata"]["annotations"] = json!({"team": "even"});
        }
        let r = h.post(&vpcs(ns), &o).await;
        assert_eq!(r.status, 201, "{}", r.text);
    }
    let names = support::Resp::item_names;
    let all = h.get("/apis/sdn.cozystack.io/v1alpha1/vpcs").await;
    assert_eq!(all.status, 200);
    assert_eq!(all.body["kind"], "VPCList");
    assert_eq!(names(&all), ["v0", "v1", "v2", "v3", "v4"]);
    assert_eq!(names(&h.get(&vpcs("l2")).await), ["v3", "v4"]);

    let q = |s: &str| format!("/apis/sdn.cozystack.io/v1alpha1/vpcs?labelSelector={s}");
    assert_eq!(names(&h.get(&q("team%3Deven")).await), ["v0", "v2", "v4"]);
    assert_eq!(names(&h.get(&q("team%3D%3Deven,idx%3D2")).await), ["v2"]);
    assert_eq!(
        names(&h.get(&q("team%3Deven,idx%3D1")).await),
        Vec::<String>::new()
    );
    assert_eq!(names(&h.get(&q("team!%3Deven")).await), ["v1", "v3"]);
    assert_eq!(names(&h.get(&q("idx+in+(1,3),team")).await), ["v1", "v3"]);
    assert_eq!(names(&h.get(&q("idx+notin+(0,1,2)")).await), ["v3", "v4"]);
    assert_eq!(names(&h.get(&q("!team")).await), Vec::<String>::new());
    let bad = h.get(&q("idx+in+(1")).await;
    assert_eq!(bad.status, 400, "{}", bad.text);

    let f = h.get("/apis/sdn.cozystack.io/v1alpha1/vpcs?fieldSelector=metadata.namespace%3Dl2,metadata.name!%3Dv3").await;
    assert_eq!(names(&f), ["v4"]);
    let unsupported = h
        .get("/apis/sdn.cozystack.io/v1alpha1/vpcs?fieldSelector=spec.foo%3Dx")
        .await;
    assert_eq!(unsupported.status, 400);
    assert_eq!(
        unsupported.body["message"],
        "field label not supported: spec.foo"
    );

    // pagination: pages of 2 over one consistent snapshot
    let p1 = h.get("/apis/sdn.cozystack.io/v1alpha1/vpcs?limit=2").await;
    assert_eq!(names(&p1), ["v0", "v1"]);
    assert_eq!(p1.body["metadata"]["remainingItemCount"], 3);
    let tok = p1.body["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!tok.is_empty());
    // a write between pages is not visible to the continued list
    let late = h.post(&vpcs("l1"), &vpc("v9", "10.9.0.0/16")).await;
    assert_eq!(late.status, 201);
    let p2 = h
        .get(&format!(
            "/apis/sdn.cozystack.io/v1alpha1/vpcs?limit=2&continue={tok}"
        ))
        .await;
    assert_eq!(names(&p2), ["v2", "v3"], "{}", p2.text);
    assert_eq!(
        p2.body["metadata"]["resourceVersion"],
        p1.body["metadata"]["resourceVersion"]
    );
    let tok2 = p2.body["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let p3 = h
        .get(&format!(
            "/apis/sdn.cozystack.io/v1alpha1/vpcs?limit=2&continue={tok2}"
        ))
        .await;
    assert_eq!(names(&p3), ["v4"]);
    assert!(p3.body["metadata"].get("continue").is_none());

    // paginated + filtered
    let fp = h.get(&format!("{}&limit=1", q("team%3Deven"))).await;
    assert_eq!(names(&fp), ["v0"]);
    let ftok = fp.body["metadata"]["continue"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let fp2 = h
        .get(&format!("{}&limit=5&continue={ftok}", q("team%3Deven")))
        .await;
    assert_eq!(names(&fp2), ["v2", "v4"]);

    // resourceVersion semantics
    let exact = h
        .get(&format!(
            "/apis/sdn.cozystack.io/v1alpha1/vpcs?resourceVersion={}&resourceVersionMatch=Exact",
            p1.body["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
        ))
        .await;
    assert_eq!(
        names(&exact),
        ["v0", "v1", "v2", "v3", "v4"],
        "exact read at the old revision"
    );
    let future = h
        .get("/apis/sdn.cozystack.io/v1alpha1/vpcs?resourceVersion=99999999999")
        .await;
    assert_eq!(future.status, 504, "{}", future.text);
    let bad_match = h
        .get("/apis/sdn.cozystack.io/v1alpha1/vpcs?resourceVersionMatch=Exact")
        .await;
    assert_eq!(bad_match.status, 400);

    // an expired continue token is 410 Expired
    let now = h.store.current_revision().await.unwrap_or(0);
    if let Err(e) = h.store.compact(now).await {
        panic!("compact: {e}");
    }
    let gone = h
        .get(&format!(
            "/apis/sdn.cozystack.io/v1alpha1/vpcs?limit=2&continue={tok}"
        ))
        .await;
    assert_eq!(
        (gone.status, gone.body["reason"].as_str()),
        (410, Some("Expired")),
        "{}",
        gone.text
    );
    assert!(gone.body["message"]
        .as_str()
        .is_some_and(|m| m.contains("continue token too old")));
}

async fn patches(h: &Harness) {
    let path = vpcs("default");
    assert_eq!(h.post(&path, &vpc("p", "10.4.0.0/16")).await.status, 201);
    let m = h
        .patch(
            &format!("{path}/p"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"x": "1", "tier": null}}, "spec": {"mtu": 1450}}),
        )
        .await;
    assert_eq!(m.status, 200, "{}", m.text);
    assert_eq!(m.body["metadata"]["labels"], json!({"x": "1"}));
    assert_eq!(m.body["spec"]["mtu"], 1450);
    assert_eq!(m.body["metadata"]["generation"], 2);

    let j = h.patch(&format!("{path}/p"), "application/json-patch+json", &json!([{"op": "replace", "path": "/spec/mtu", "value": 1500}, {"op": "add", "path": "/metadata/labels/y", "value": "2"}])).await;
    assert_eq!(j.status, 200, "{}", j.text);
    assert_eq!(j.body["spec"]["mtu"], 1500);
    assert_eq!(j.body["metadata"]["labels"]["y"], "2");

    let failed = h
        .patch(
            &format!("{path}/p"),
            "application/json-patch+json",
            &json!([{"op": "test", "path": "/spec/mtu", "value": 1}]),
        )
        .await;
    assert_eq!(failed.status, 422, "{}", failed.text);

    let stale = h
        .patch(
            &format!("{path}/p"),
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": "1"}, "spec": {"mtu": 1400}}),
        )
        .await;
    assert_eq!(stale.status, 409, "{}", stale.text);

    let invalid = h
        .patch(
            &format!("{path}/p"),
            "application/merge-patch+json",
            &json!({"spec": {"mtu": 10}}),
        )
        .await;
    assert_eq!(invalid.status, 422, "{}", invalid.text);
    assert_eq!(
        h.get(&format!("{path}/p")).await.body["spec"]["mtu"],
        1500,
        "failed patch wrote nothing"
    );

    let missing = h
        .patch(
            &format!("{path}/nope"),
            "application/merge-patch+json",
            &json!({}),
        )
        .await;
    assert_eq!(missing.status, 404);
    let unsupported = h
        .patch(&format!("{path}/p"), "text/plain", &json!({}))
        .await;
    assert_eq!(unsupported.status, 415);

    // server-side apply: create, then merge
    let apply = "apiVersion: sdn.cozystack.io/v1alpha1\nkind: VPC\nmetadata:\n  name: ap\nspec:\n  cidrs: [\"10.5.0.0/16\"]\n";
    let a1 = h
        .call(
            "PATCH",
            &format!("{path}/ap?fieldManager=test"),
            Some("application/apply-patch+yaml"),
            apply.as_bytes().to_vec(),
            None,
        )
        .await;
    assert_eq!(a1.status, 201, "{}", a1.text);
    let a2 = h
        .call(
            "PATCH",
            &format!("{path}/ap?fieldManager=test"),
            Some("application/apply-patch+yaml"),
            apply.replace("10.5.0.0/16", "10.6.0.0/16").into_bytes(),
            None,
        )
        .await;
    assert_eq!(a2.status, 200, "{}", a2.text);
    assert_eq!(a2.body["spec"]["cidrs"], json!(["10.6.0.0/16"]));
    let nofm = h
        .call(
            "PATCH",
            &format!("{path}/ap"),
            Some("application/apply-patch+yaml"),
            apply.as_bytes().to_vec(),
            None,
        )
        .await;
    assert_eq!(nofm.status, 400);

    // strategic merge patch on a core kind merges containers by name
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod1"},
        "spec": {"containers": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}]}});
    let pc = h.post("/api/v1/namespaces/default/pods", &pod).await;
    assert_eq!(pc.status, 201, "{}", pc.text);
    let smp = h
        .patch(
            "/api/v1/namespaces/default/pods/pod1",
            "application/strategic-merge-patch+json",
            &json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}}),
        )
        .await;
    assert_eq!(smp.status, 200, "{}", smp.text);
    assert_eq!(
        smp.body["spec"]["containers"],
        json!([{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:2"}])
    );
}

async fn delete_and_finalizers(h: &Harness) {
    let path = vpcs("default");
    let mut f = vpc("fin", "10.7.0.0/16");
    f["metadata"]["finalizers"] = json!(["sdn.cozystack.io/test"]);
    let c = h.post(&path, &f).await;
    assert_eq!(c.status, 201, "{}", c.text);

    let wrong_uid = h
        .call(
            "DELETE",
            &format!("{path}/fin"),
            Some("application/json"),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}})
                .to_string()
                .into_bytes(),
            None,
        )
        .await;
    assert_eq!(wrong_uid.status, 409, "{}", wrong_uid.text);

    let dry = h.delete(&format!("{path}/fin?dryRun=All")).await;
    assert_eq!(dry.status, 200);
    assert!(
        h.get(&format!("{path}/fin")).await.body["metadata"]
            .get("deletionTimestamp")
            .is_none(),
        "dry-run wrote nothing"
    );

    let d = h
        .call(
            "DELETE",
            &format!("{path}/fin"),
            Some("application/json"),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})
                .to_string()
                .into_bytes(),
            None,
        )
        .await;
    assert_eq!(d.status, 200, "{}", d.text);
    assert!(d.body["metadata"]["deletionTimestamp"].is_string());
    let still = h.get(&format!("{path}/fin")).await;
    assert_eq!(still.status, 200, "kept while a finalizer remains");
    let again = h.delete(&format!("{path}/fin")).await;
    assert_eq!(again.status, 200);
    assert_eq!(
        again.body["metadata"]["deletionTimestamp"],
        still.body["metadata"]["deletionTimestamp"]
    );

    let mut drop_fin = still.body.clone();
    drop_fin["metadata"]["finalizers"] = json!([]);
    let u = h.put(&format!("{path}/fin"), &drop_fin).await;
    assert_eq!(u.status, 200, "{}", u.text);
    assert_eq!(
        h.get(&format!("{path}/fin")).await.status,
        404,
        "removed with its last finalizer"
    );

    for (n, team) in [("c1", "x"), ("c2", "x"), ("c3", "y")] {
        let mut o = vpc(n, "10.8.0.0/16");
        o["metadata"]["labels"] = json!({"team": team});
        assert_eq!(h.post(&path, &o).await.status, 201);
    }
    let dc = h.delete(&format!("{path}?labelSelector=team%3Dx")).await;
    assert_eq!(dc.status, 200, "{}", dc.text);
    assert_eq!(dc.body["status"], "Success");
    assert_eq!(h.get(&format!("{path}/c1")).await.status, 404);
    assert_eq!(h.get(&format!("{path}/c2")).await.status, 404);
    assert_eq!(h.get(&format!("{path}/c3")).await.status, 200);
    let plain = h.delete(&format!("{path}/c3")).await;
    assert_eq!(plain.status, 200);
    let gone = h.delete(&format!("{path}/c3")).await;
    assert_eq!(
        (gone.status, gone.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
}

async fn bad_input_leaves_store_unchanged(h: &Harness) {
    let path = vpcs("default");
    assert_eq!(h.post(&path, &vpc("keep", "10.0.0.0/8")).await.status, 201);
    let before = h.get("/apis/sdn.cozystack.io/v1alpha1/vpcs").await.body["items"].clone();

    let bad_json = h
        .call(
            "POST",
            &path,
            Some("application/json"),
            b"{\"metadata\": ".to_vec(),
            None,
        )
        .await;
    assert_eq!(bad_json.status, 400);
    assert_eq!(bad_json.body["kind"], "Status");
    assert_eq!(bad_json.body["apiVersion"], "v1");
    assert_eq!(bad_json.body["status"], "Failure");
    assert_eq!(bad_json.body["reason"], "BadRequest");
    assert_eq!(bad_json.body["code"], 400);

    let bad_yaml = h
        .call(
            "POST",
            &path,
            Some("application/yaml"),
            b"metadata: [unclosed".to_vec(),
            None,
        )
        .await;
    assert_eq!(bad_yaml.status, 400, "{}", bad_yaml.text);

    let invalid = h.post(&path, &vpc("bad", "10.0.0.1/8")).await;
    assert_eq!(
        (invalid.status, invalid.body["reason"].as_str()),
        (422, Some("Invalid")),
        "{}",
        invalid.text
    );
    let causes = invalid.body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        causes.iter().any(|c| c["field"]
            .as_str()
            .is_some_and(|f| f.starts_with("spec.cidrs"))),
        "{causes:?}"
    );

    let bad_name = h.post(&path, &vpc("Bad_Name", "10.0.0.0/8")).await;
    assert_eq!(bad_name.status, 422);
    assert_eq!(
        bad_name.body["details"]["causes"][0]["field"],
        "metadata.name"
    );

    let mut wrong_av = vpc("x", "10.0.0.0/8");
    wrong_av["apiVersion"] = json!("sdn.cozystack.io/v1");
    assert_eq!(h.post(&path, &wrong_av).await.status, 400);
    let mut wrong_kind = vpc("x", "10.0.0.0/8");
    wrong_kind["kind"] = json!("Port");
    assert_eq!(h.post(&path, &wrong_kind).await.status, 400);
    let mut wrong_ns = vpc("x", "10.0.0.0/8");
    wrong_ns["metadata"]["namespace"] = json!("other");
    let wn = h.post(&path, &wrong_ns).await;
    assert_eq!(wn.status, 400);
    assert!(wn.body["message"]
        .as_str()
        .is_some_and(|m| m.contains("does not match the namespace")));

    let mut huge = vpc("huge", "10.0.0.0/8");
    huge["metadata"]["annotations"] = json!({"big": "x".repeat(3 * 1024 * 1024 + 10)});
    let big = h.post(&path, &huge).await;
    assert_eq!(
        (big.status, big.body["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );

    let unknown = h
        .get("/apis/sdn.cozystack.io/v1alpha1/namespaces/default/widgets")
        .await;
    assert_eq!(
        (unknown.status, unknown.body["kind"].as_str()),
        (404, Some("Status"))
    );
    assert_eq!(h.get("/apis/nope.example/v1").await.status, 404);

    // (the revision is global in a shared etcd, so compare the objects)
    let after = h.get("/apis/sdn.cozystack.io/v1alpha1/vpcs").await.body["items"].clone();
    assert_eq!(before, after, "failed requests must not write");

    let yaml = "apiVersion: sdn.cozystack.io/v1alpha1\nkind: VPC\nmetadata:\n  name: from-yaml\nspec:\n  cidrs:\n  - 10.10.0.0/16\n";
    let y = h
        .call(
            "POST",
            &path,
            Some("application/yaml"),
            yaml.as_bytes().to_vec(),
            None,
        )
        .await;
    assert_eq!(y.status, 201, "{}", y.text);
}

async fn field_validation_and_dry_run(h: &Harness) {
    let path = vpcs("default");
    let mut unknown = vpc("fv", "10.11.0.0/16");
    unknown["spec"]["foo"] = json!(1);
    let strict = h
        .post(&format!("{path}?fieldValidation=Strict"), &unknown)
        .await;
    assert_eq!(strict.status, 400, "{}", strict.text);
    assert!(
        strict.body["message"].as_str().is_some_and(
            |m| m.contains("strict decoding error") && m.contains("unknown field \"spec.foo\"")
        ),
        "{}",
        strict.text
    );

    let mut bad_meta = vpc("fvm", "10.11.0.0/16");
    bad_meta["metadata"]["lables"] = json!({"a": "b"});
    let strict_meta = h
        .post(&format!("{path}?fieldValidation=Strict"), &bad_meta)
        .await;
    assert_eq!(strict_meta.status, 400, "{}", strict_meta.text);
    let msg = strict_meta.body["message"].as_str().unwrap_or_default();
    assert!(msg.contains("unknown field \"metadata.lables\""), "{msg}");

    let warn = h
        .post(&format!("{path}?fieldValidation=Warn"), &unknown)
        .await;
    assert_eq!(warn.status, 201, "{}", warn.text);
    let warning = warn
        .headers
        .get("warning")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert_eq!(warning, "299 - \"unknown field \\\"spec.foo\\\"\"");

    let mut ignored = unknown.clone();
    ignored["metadata"]["name"] = json!("fv2");
    let ign = h
        .post(&format!("{path}?fieldValidation=Ignore"), &ignored)
        .await;
    assert_eq!(ign.status, 201);
    assert!(ign.headers.get("warning").is_none());
    assert_eq!(
        h.post(&format!("{path}?fieldValidation=Bogus"), &ignored)
            .await
            .status,
        400
    );

    let before = h.get(&path).await.body["items"].clone();
    let dry = h
        .post(&format!("{path}?dryRun=All"), &vpc("dry", "10.12.0.0/16"))
        .await;
    assert_eq!(dry.status, 201, "{}", dry.text);
    assert_eq!(dry.body["metadata"]["name"], "dry");
    let dry_invalid = h
        .post(&format!("{path}?dryRun=All"), &vpc("dry", "10.12.0.1/16"))
        .await;
    assert_eq!(dry_invalid.status, 422, "dry-run still validates");
    let dry_put = h
        .patch(
            &format!("{path}/fv?dryRun=All"),
            "application/merge-patch+json",
            &json!({"spec": {"mtu": 1300}}),
        )
        .await;
    assert_eq!(dry_put.status, 200);
    assert_eq!(dry_put.body["spec"]["mtu"], 1300);
    assert_eq!(
        h.get(&path).await.body["items"],
        before,
        "dryRun writes nothing"
    );
    assert_eq!(h.get(&format!("{path}/dry")).await.status, 404);
}

async fn watch_semantics(h: &Harness) {
    h.namespace("w").await;
    let path = vpcs("w");
    let c = h.post(&path, &vpc("w1", "10.13.0.0/16")).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let start_rv = rv(&c.body);

    // rv unset: synthetic ADDED for existing objects, then changes
    let mut all = h.stream(&format!("{path}?watch=true")).await;
    let first = all.next_change(SECS).await.unwrap_or_default();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("w1"))
    );

    // from a resourceVersion: only later changes, with selector transitions
    let mut gold = h.stream(&format!("{path}?watch=1&resourceVersion={start_rv}&labelSelector=tier%3Dgold&allowWatchBookmarks=true")).await;
    let m = h
        .patch(
            &format!("{path}/w1"),
            "application/merge-patch+json",
            &json!({"spec": {"mtu": 1400}}),
        )
        .await;
    assert_eq!(m.status, 200);
    let leave = h
        .patch(
            &format!("{path}/w1"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"tier": "bronze"}}}),
        )
        .await;
    assert_eq!(leave.status, 200);
    let back = h
        .patch(
            &format!("{path}/w1"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"tier": "gold"}}}),
        )
        .await;
    assert_eq!(back.status, 200);
    assert_eq!(h.delete(&format!("{path}/w1")).await.status, 200);
    let mut seen = Vec::new();
    for _ in 0..4 {
        let ev = gold.next_change(SECS).await.unwrap_or_default();
        seen.push(ev["type"].as_str().unwrap_or("none").to_string());
    }
    assert_eq!(seen, ["MODIFIED", "DELETED", "ADDED", "DELETED"]);
    // idle watch with bookmarks allowed gets a BOOKMARK carrying a resourceVersion
    let bm = gold.next(SECS).await.unwrap_or_default();
    assert_eq!(bm["type"], "BOOKMARK");
    assert!(bm["object"]["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|r| r.parse::<u64>().is_ok()));

    let seen_all: Vec<String> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(
                all.next_change(SECS).await.unwrap_or_default()["type"]
                    .as_str()
                    .unwrap_or("none")
                    .to_string(),
            );
        }
        v
    };
    assert_eq!(seen_all, ["MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]);

    // timeoutSeconds ends the stream
    let mut short = h
        .stream(&format!(
            "{path}?watch=true&timeoutSeconds=1&resourceVersion={start_rv}"
        ))
        .await;
    let mut ended = false;
    for _ in 0..10 {
        if short.next(Duration::from_secs(3)).await.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "watch must end after timeoutSeconds");

    // streaming list: initial ADDED then the initial-events-end bookmark
    assert_eq!(h.post(&path, &vpc("w2", "10.14.0.0/16")).await.status, 201);
    let mut init = h.stream(&format!("{path}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true")).await;
    let a = init.next(SECS).await.unwrap_or_default();
    assert_eq!(
        (a["type"].as_str(), a["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("w2"))
    );
    let end = init.next(SECS).await.unwrap_or_default();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let bad = h
        .get(&format!("{path}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(bad.status, 400);
}

async fn watch_resume_and_expiry(h: &Harness) {
    h.namespace("r").await;
    let path = vpcs("r");
    let mut rvs = Vec::new();
    for i in 0..3 {
        let c = h.post(&path, &vpc(&format!("r{i}"), "10.15.0.0/16")).await;
        assert_eq!(c.status, 201);
        rvs.push(rv(&c.body));
    }
    // resume after the first create: see exactly the later two
    let mut w = h
        .stream(&format!("{path}?watch=true&resourceVersion={}", rvs[0]))
        .await;
    let a = w.next_change(SECS).await.unwrap_or_default();
    let b = w.next_change(SECS).await.unwrap_or_default();
    assert_eq!(a["object"]["metadata"]["name"], "r1");
    assert_eq!(b["object"]["metadata"]["name"], "r2");
    assert_eq!(
        b["object"]["metadata"]["resourceVersion"].as_str(),
        Some(rvs[2].as_str())
    );

    // a forced break ends open watches
    h.server.break_watches();
    let mut ended = false;
    for _ in 0..10 {
        if w.next(Duration::from_secs(3)).await.is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended);

    // compacted history → ERROR event with 410 Expired
    let now = h.store.current_revision().await.unwrap_or(0);
    if let Err(e) = h.store.compact(now).await {
        panic!("compact: {e}");
    }
    let mut old = h
        .stream(&format!("{path}?watch=true&resourceVersion={}", rvs[0]))
        .await;
    let err = old.next(SECS).await.unwrap_or_default();
    assert_eq!(err["type"], "ERROR", "{err}");
    assert_eq!(err["object"]["code"], 410);
    assert_eq!(err["object"]["reason"], "Expired");
}

async fn discovery_openapi_table_metrics(h: &Harness) {
    let apis = h.get("/apis").await;
    let groups: Vec<&str> = apis.body["groups"]
        .as_array()
        .map(|g| g.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    for g in [
        "sdn.cozystack.io",
        "local.sdn.cozystack.io",
        "discovery.k8s.io",
        "networking.k8s.io",
        "coordination.k8s.io",
    ] {
        assert!(groups.contains(&g), "{g} in {groups:?}");
    }
    let api = h.get("/api").await;
    assert_eq!(api.body["versions"], json!(["v1"]));

    let rl = h.get("/apis/sdn.cozystack.io/v1alpha1").await;
    let res = rl.body["resources"].as_array().cloned().unwrap_or_default();
    let vpcs_r = res
        .iter()
        .find(|r| r["name"] == "vpcs")
        .cloned()
        .unwrap_or_default();
    assert_eq!(vpcs_r["kind"], "VPC");
    assert_eq!(vpcs_r["namespaced"], true);
    assert!(vpcs_r["verbs"]
        .as_array()
        .is_some_and(|v| v.contains(&json!("watch")) && v.contains(&json!("deletecollection"))));
    assert!(vpcs_r["categories"]
        .as_array()
        .is_some_and(|c| c.contains(&json!("cozyplane"))));
    assert!(res.iter().any(|r| r["name"] == "vpcs/status"));
    let pods = h.get("/api/v1").await;
    assert!(pods.body["resources"].as_array().is_some_and(|r| r
        .iter()
        .any(|x| x["name"] == "pods" && x["shortNames"] == json!(["po"]))));

    let agg_accept =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let agg = h.get_accept("/apis", agg_accept).await;
    assert_eq!(agg.status, 200);
    assert_eq!(
        agg.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    );
    assert_eq!(agg.body["kind"], "APIGroupDiscoveryList");
    let sdn = agg.body["items"]
        .as_array()
        .and_then(|i| {
            i.iter()
                .find(|g| g["metadata"]["name"] == "sdn.cozystack.io")
        })
        .cloned()
        .unwrap_or_default();
    let vpc_agg = sdn["versions"][0]["resources"]
        .as_array()
        .and_then(|r| r.iter().find(|x| x["resource"] == "vpcs"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(vpc_agg["scope"], "Namespaced");
    assert_eq!(vpc_agg["responseKind"]["kind"], "VPC");
    assert_eq!(vpc_agg["subresources"][0]["subresource"], "status");
    let core_agg = h.get_accept("/api", agg_accept).await;
    assert!(core_agg.body["items"][0]["versions"][0]["resources"]
        .as_array()
        .is_some_and(|r| r
            .iter()
            .any(|x| x["resource"] == "namespaces" && x["scope"] == "Cluster")));

    let idx = h.get("/openapi/v3").await;
    let url = idx.body["paths"]["apis/sdn.cozystack.io/v1alpha1"]["serverRelativeURL"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(url.starts_with("/openapi/v3/apis/sdn.cozystack.io/v1alpha1?hash="));
    let doc = h.get(&url).await;
    assert_eq!(doc.body["openapi"], "3.0.0");
    let schema = &doc.body["components"]["schemas"]["io.cozystack.sdn.v1alpha1.VPC"];
    assert_eq!(schema["x-kubernetes-group-version-kind"][0]["kind"], "VPC");
    assert!(schema["properties"]["spec"]["properties"]["cidrs"]["description"].is_string());
    let v2 = h.get("/openapi/v2").await;
    assert_eq!(v2.body["swagger"], "2.0");
    assert!(v2.body["definitions"]["io.k8s.api.core.v1.Pod"].is_object());
    assert!(v2.body["definitions"]["io.cozystack.sdn.v1alpha1.VPCList"].is_object());

    // Table output
    h.namespace("t").await;
    assert_eq!(
        h.post(&vpcs("t"), &vpc("tbl", "10.16.0.0/16")).await.status,
        201
    );
    let table_accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let t = h.get_accept(&vpcs("t"), table_accept).await;
    assert_eq!(t.body["kind"], "Table", "{}", t.text);
    let cols: Vec<&str> = t.body["columnDefinitions"]
        .as_array()
        .map(|c| c.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(cols.first(), Some(&"Name"));
    assert!(
        cols.iter().any(|c| c.eq_ignore_ascii_case("age")),
        "{cols:?}"
    );
    assert_eq!(t.body["rows"][0]["cells"][0], "tbl");
    assert_eq!(t.body["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let full = h
        .get_accept(&format!("{}?includeObject=Object", vpcs("t")), table_accept)
        .await;
    assert_eq!(
        full.body["rows"][0]["object"]["spec"]["cidrs"],
        json!(["10.16.0.0/16"])
    );
    let none = h
        .get_accept(
            &format!("{}/tbl?includeObject=None", vpcs("t")),
            table_accept,
        )
        .await;
    assert!(none.body["rows"][0].get("object").is_none());

    // health, version, metrics
    assert_eq!(h.get("/livez").await.text, "ok");
    assert_eq!(h.get("/readyz").await.text, "ok");
    assert_eq!(h.get("/version").await.body["major"], "1");
    let metrics = h.get("/metrics").await.text;
    assert!(
        metrics.contains("apiserver_request_total{verb=\"create\",resource=\"vpcs\",code=\"201\"}"),
        "{metrics}"
    );
    assert!(metrics.contains(
        "apiserver_request_duration_seconds_bucket{verb=\"list\",resource=\"vpcs\",le=\"+Inf\"}"
    ));
}
