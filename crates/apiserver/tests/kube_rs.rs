//! Real-client conformance: kube-rs (kube 5, k8s-openapi 0.29) against a
//! server started in-process over the embedded store, connecting with the
//! kubeconfig the server wrote — as the agent and controller will.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::time::Duration;

use cozyplane_api::sdn::{VPCSpec, VPC};
use cozyplane_testkit::eventually_async;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;
use support::Backend;

fn new_vpc(name: &str, cidr: &str) -> VPC {
    VPC::new(
        name,
        VPCSpec {
            cidrs: vec![cidr.to_string()],
            mtu: None,
        },
    )
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(20), f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_crud_list_and_errors() {
    let Some(h) = support::start(Backend::Embedded, "kube_rs_crud").await else {
        return;
    };
    let client = support::client_from_kubeconfig(&h.kubeconfig).await;
    let version = client.apiserver_version().await.map(|v| v.major).ok();
    assert_eq!(version.as_deref(), Some("1"));

    let vpcs: Api<VPC> = Api::namespaced(client.clone(), "default");
    let created = vpcs
        .create(&PostParams::default(), &new_vpc("k1", "10.20.0.0/16"))
        .await;
    let created = created.unwrap_or_else(|e| panic!("create: {e}"));
    assert!(created.metadata.uid.is_some());
    let dup = vpcs
        .create(&PostParams::default(), &new_vpc("k1", "10.20.0.0/16"))
        .await;
    match dup {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected 409, got {other:?}"),
    }
    let invalid = vpcs
        .create(&PostParams::default(), &new_vpc("k2", "10.20.0.1/16"))
        .await;
    match invalid {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (422, "Invalid")),
        other => panic!("expected 422, got {other:?}"),
    }
    let patched = vpcs
        .patch(
            "k1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"mtu": 1400}})),
        )
        .await
        .unwrap_or_else(|e| panic!("patch: {e}"));
    assert_eq!(patched.spec.mtu, Some(1400));
    let applied = vpcs
        .patch(
            "k3",
            &PatchParams::apply("kube-rs-test"),
            &Patch::Apply(new_vpc("k3", "10.21.0.0/16")),
        )
        .await
        .unwrap_or_else(|e| panic!("apply: {e}"));
    assert_eq!(applied.spec.cidrs, vec!["10.21.0.0/16".to_string()]);

    let list = vpcs
        .list(&ListParams::default().labels("!missing"))
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    let names: Vec<String> = list
        .items
        .iter()
        .map(|v| v.metadata.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(names, ["k1", "k3"]);
    let paged = vpcs
        .list(&ListParams::default().limit(1))
        .await
        .unwrap_or_else(|e| panic!("list: {e}"));
    assert_eq!(paged.items.len(), 1);
    assert!(paged.metadata.continue_.is_some());

    // typed core objects with a field selector
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}))
            .unwrap_or_else(|e| panic!("pod: {e}"));
        pods.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod: {e}"));
    }
    let on_n2 = pods
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap_or_else(|e| panic!("list pods: {e}"));
    assert_eq!(on_n2.items.len(), 1);
    assert_eq!(on_n2.items[0].metadata.name.as_deref(), Some("p2"));

    vpcs.delete("k1", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete: {e}"));
    assert!(vpcs.get_opt("k1").await.ok().flatten().is_none());
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_changes_with_bookmarks_and_streaming_lists() {
    let Some(h) = support::start(Backend::Embedded, "kube_rs_watcher").await else {
        return;
    };
    let client = support::client_from_kubeconfig(&h.kubeconfig).await;
    let vpcs: Api<VPC> = Api::namespaced(client.clone(), "default");
    vpcs.create(&PostParams::default(), &new_vpc("a", "10.30.0.0/16"))
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));

    for cfg in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ] {
        let mut events = watcher(vpcs.clone(), cfg).boxed();
        let mut init_names = Vec::new();
        loop {
            match within("initial events", events.try_next()).await {
                Ok(Some(watcher::Event::InitApply(v))) => {
                    init_names.push(v.metadata.name.unwrap_or_default())
                }
                Ok(Some(watcher::Event::InitDone)) => break,
                Ok(Some(_)) => {}
                other => panic!("watcher: {other:?}"),
            }
        }
        assert!(init_names.contains(&"a".to_string()), "{init_names:?}");
        let name = format!("b{}", init_names.len());
        vpcs.create(&PostParams::default(), &new_vpc(&name, "10.31.0.0/16"))
            .await
            .unwrap_or_else(|e| panic!("create: {e}"));
        loop {
            match within("apply event", events.try_next()).await {
                Ok(Some(watcher::Event::Apply(v)))
                    if v.metadata.name.as_deref() == Some(name.as_str()) =>
                {
                    break
                }
                Ok(Some(_)) => {}
                other => panic!("watcher: {other:?}"),
            }
        }
    }
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_resumes_after_forced_watch_break_without_relisting() {
    let Some(h) = support::start(Backend::Embedded, "kube_rs_reflector").await else {
        return;
    };
    let client = support::client_from_kubeconfig(&h.kubeconfig).await;
    let vpcs: Api<VPC> = Api::namespaced(client.clone(), "default");
    vpcs.create(&PostParams::default(), &new_vpc("r0", "10.40.0.0/16"))
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));

    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(vpcs.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        let mut s = stream.boxed();
        while let Some(r) = s.next().await {
            if let Err(e) = r {
                eprintln!("reflector error: {e}");
            }
        }
    });
    within("initial sync", reader.wait_until_ready())
        .await
        .unwrap_or_else(|e| panic!("ready: {e}"));
    assert_eq!(reader.state().len(), 1);

    vpcs.create(&PostParams::default(), &new_vpc("r1", "10.41.0.0/16"))
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));
    // Let a bookmark carrying r1's revision reach the reflector's watch, then
    // break every watch. Every watch ticks on its own 500 ms interval, so once
    // the reflector holds r1, the first BOOKMARK of a watch opened after that
    // comes only after the reflector's watch has ticked too. (The probe watches
    // pods, leaving the vpcs request counts asserted below alone.)
    eventually_async("the reflector to hold r1", Duration::from_secs(20), || {
        let held = reader
            .state()
            .iter()
            .any(|v| v.metadata.name.as_deref() == Some("r1"));
        async move { held }
    })
    .await;
    let mut probe = h
        .stream("/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true")
        .await;
    let bookmark = within("a bookmark on the probe watch", async {
        loop {
            match probe.next(Duration::from_secs(5)).await {
                Some(ev) if ev["type"] == "BOOKMARK" => return true,
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await;
    assert!(bookmark, "no BOOKMARK within a bookmark interval");
    drop(probe);
    h.server.break_watches();
    vpcs.create(&PostParams::default(), &new_vpc("r2", "10.42.0.0/16"))
        .await
        .unwrap_or_else(|e| panic!("create: {e}"));
    vpcs.delete("r0", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete: {e}"));

    eventually_async(
        "the reflector to converge on r1, r2",
        Duration::from_secs(20),
        || {
            let mut names: Vec<String> = reader
                .state()
                .iter()
                .map(|v| v.metadata.name.clone().unwrap_or_default())
                .collect();
            names.sort();
            async move { names == ["r1", "r2"] }
        },
    )
    .await;

    // the watcher resumed with a watch from its last resourceVersion: one
    // list in total, at least two watches
    let metrics = h.get("/metrics").await.text;
    let count = |verb: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "apiserver_request_total{{verb=\"{verb}\",resource=\"vpcs\",code=\"200\"}}"
                ))
            })
            .filter_map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
            .sum()
    };
    assert_eq!(count("list"), 1, "{metrics}");
    assert!(count("watch") >= 2, "{metrics}");
    task.abort();
    h.server.shutdown().await;
}
