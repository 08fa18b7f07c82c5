//! The GC backstop for VPC Ports end to end against the real API server:
//! a Port whose pod is gone (its node died before the CNI DEL) or was
//! re-created with another UID is deleted; a live pod's Port and a young
//! Port are kept.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::labels::{LABEL_NODE, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use cozyplane_api::sdn::{PortSpec, VPCRef};
use cozyplane_api::Port;
use cozyplane_controller::gc::{Gc, GcConfig};
use cozyplane_controller::leader::Leadership;
use cozyplane_controller::metrics::Metrics;
use cozyplane_testkit::eventually_async;
use kube::api::{Api, PostParams};
use kube::Client;
use support::{create_pod, delete_pod};
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(30);

/// The Port the agent writes for pod `ns/pod` (UID `uid`) at `10.0.0.<n>`
/// of VPC 100; `spec` says which pod only through the labels when
/// `labels_only` (an older writer).
fn port(n: u8, ns: &str, pod: &str, uid: &str, labels_only: bool) -> Port {
    let ip = format!("10.0.0.{n}");
    let mut p = Port::new(
        &cozyplane_api::names::port_name(100, ip.parse().unwrap()),
        PortSpec {
            vpc_ref: VPCRef {
                namespace: Some("owner".into()),
                name: "net".into(),
            },
            ip,
            mac: None,
            node: Some("node-a".into()),
            node_ip: None,
            pod_namespace: (!labels_only).then(|| ns.into()),
            pod_name: (!labels_only).then(|| pod.into()),
            gateway: None,
        },
    );
    p.metadata.labels = Some(BTreeMap::from([
        (LABEL_POD_UID.into(), uid.into()),
        (LABEL_POD_NAMESPACE.into(), ns.into()),
        (LABEL_POD_NAME.into(), pod.into()),
        (LABEL_NODE.into(), "node-a".into()),
    ]));
    p
}

async fn exists(c: &Client, n: u8) -> bool {
    let name = cozyplane_api::names::port_name(100, format!("10.0.0.{n}").parse().unwrap());
    Api::<Port>::all(c.clone())
        .get_opt(&name)
        .await
        .expect("get port")
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_of_gone_pods_are_collected_live_ones_kept() {
    let h = support::start().await;
    let c = &h.client;
    let alive = create_pod(c, "default", "alive").await;
    let doomed = create_pod(c, "default", "doomed").await;
    let old = create_pod(c, "default", "web-0").await;
    let ports = Api::<Port>::all(c.clone());
    let pp = PostParams::default();
    for p in [
        port(1, "default", "alive", &alive, false),
        port(2, "default", "doomed", &doomed, false),
        port(3, "default", "web-0", &old, false),
        port(4, "default", "alive", &alive, true),
    ] {
        ports.create(&pp, &p).await.expect("create port");
    }

    let metrics = Arc::new(Metrics::default());
    let gc = Gc::new(
        c.clone(),
        GcConfig {
            grace: Duration::from_secs(2),
            resync: Duration::from_secs(3600),
            debounce: Duration::from_millis(50),
        },
        Arc::clone(&metrics),
        Leadership::unconditional(),
    );
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(gc.run(rx));
    eventually_async("a first pass", LIMIT, || async {
        Metrics::get(&metrics.passes) > 0
    })
    .await;

    // The node died: the pod is deleted, and no DEL ever runs. web-0 is
    // re-created with a new UID on another node.
    delete_pod(c, "default", "doomed").await;
    delete_pod(c, "default", "web-0").await;
    let new = create_pod(c, "default", "web-0").await;
    assert_ne!(new, old);
    eventually_async("the orphaned Port collected", LIMIT, || async {
        !exists(c, 2).await
    })
    .await;
    eventually_async("the stale Port collected", LIMIT, || async {
        !exists(c, 3).await
    })
    .await;
    assert!(exists(c, 1).await, "a live pod's Port was collected");
    assert!(
        exists(c, 4).await,
        "a Port naming its pod by labels only was collected"
    );

    // A Port made by an ADD in flight outlives its grace period, then goes.
    ports
        .create(&pp, &port(5, "default", "not-yet", "uid-not-yet", false))
        .await
        .expect("create port");
    assert!(exists(c, 5).await);
    eventually_async(
        "the young orphan collected after its grace",
        LIMIT,
        || async { !exists(c, 5).await },
    )
    .await;
    assert!(exists(c, 1).await && exists(c, 4).await);
    assert_eq!(Metrics::get(&metrics.deletions), 3);
    stop.send_replace(true);
    task.await.expect("gc task");
}
