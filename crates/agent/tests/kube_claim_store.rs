//! `KubeClaimStore` and the allocator against the project's real API server
//! (in process, over TLS, with a kube client built from the kubeconfig it
//! writes), on the embedded store and on etcd. This is what proves the
//! error mapping (409 AlreadyExists, 404, 409 precondition conflict), the
//! label-selector lists and name-as-claim atomicity end to end.
//!
//! The etcd variant needs `/usr/bin/etcd` (package `etcd-server`): under CI
//! a missing etcd fails the test, elsewhere it is skipped with a `SKIP` line
//! (the test kit's gate).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_agent::ipam::kube_store::KubeClaimStore;
use cozyplane_agent::ipam::{
    ClaimStore, Claimant, Created, Deleted, FabricIpam, Ipam, IpamError, Pools, Release,
};
use cozyplane_testkit::apiserver::{standalone_on as start, TestServer as Harness};

fn who(uid: &str, container: &str, node: &str) -> Claimant {
    Claimant {
        namespace: "default".into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        container_id: container.into(),
        ifname: "eth0".into(),
        node: node.into(),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

async fn store_semantics(h: &Harness) {
    let store = KubeClaimStore::new(h.client.clone());
    let claim = who("u1", "c1", "node-a").claim_for(ip("10.244.0.7"));
    let created = match store.create(&claim).await.expect("create") {
        Created::Created(obj) => obj,
        Created::AlreadyExists => panic!("fresh name reported taken"),
    };
    let uid = created.metadata.uid.clone().expect("server-assigned uid");
    assert_eq!(created.metadata.name.as_deref(), Some("f-10-244-0-7"));
    // the name is the claim: a second create of the address loses
    let rival = who("u2", "c2", "node-b").claim_for(ip("10.244.0.7"));
    assert_eq!(
        store.create(&rival).await.expect("create"),
        Created::AlreadyExists
    );

    let got = store
        .get("f-10-244-0-7")
        .await
        .expect("get")
        .expect("present");
    assert_eq!(got.spec, claim.spec);
    assert_eq!(store.get("f-10-244-0-8").await.expect("get"), None);

    store
        .create(&who("u1", "c1", "node-a").claim_for(ip("fd00:10:244::7")))
        .await
        .expect("create v6");
    store
        .create(&who("u3", "c3", "node-b").claim_for(ip("10.244.0.9")))
        .await
        .expect("create");
    let mut by_pod: Vec<String> = store
        .list_by_pod_uid("u1")
        .await
        .expect("list")
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    by_pod.sort();
    assert_eq!(by_pod, vec!["f-10-244-0-7", "f-fd00-10-244--7"]);
    let by_node: Vec<String> = store
        .list_by_node("node-b")
        .await
        .expect("list")
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    assert_eq!(by_node, vec!["f-10-244-0-9"]);

    // the UID precondition: a wrong UID never deletes
    assert_eq!(
        store
            .delete("f-10-244-0-7", "not-the-uid")
            .await
            .expect("delete"),
        Deleted::UidMismatch
    );
    assert_eq!(
        store.delete("f-10-244-0-7", &uid).await.expect("delete"),
        Deleted::Deleted
    );
    assert_eq!(
        store.delete("f-10-244-0-7", &uid).await.expect("delete"),
        Deleted::NotFound
    );
}

async fn concurrent_allocation(h: &Harness) {
    let ipam = Arc::new(FabricIpam::new(
        KubeClaimStore::new(h.client.clone()),
        Pools::parse("10.9.0.0/27", &[]).expect("pools"),
    ));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let ipam = Arc::clone(&ipam);
            tokio::spawn(async move {
                let uid = format!("p{i}");
                let r = ipam.allocate(&who(&uid, "c", "node-c")).await;
                (uid, r)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut addresses = HashSet::new();
    let mut exhausted = 0;
    for t in tasks {
        match t.await.expect("join") {
            (uid, Ok(l)) => {
                assert!(
                    addresses.insert(l[0].address),
                    "{} handed out twice",
                    l[0].address
                );
                winners.push((uid, l[0].address));
            }
            (_, Err(IpamError::Exhausted { .. })) => exhausted += 1,
            (_, Err(e)) => panic!("unexpected {e}"),
        }
    }
    // a /27 holds 30 pods
    assert_eq!((winners.len(), exhausted), (30, 10));
    let on_node = ipam.store().list_by_node("node-c").await.expect("list");
    let names: HashSet<_> = on_node
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 30);

    // a re-ADD reuses its claim; releases free exactly the pod's claims
    let (uid0, addr0) = winners[0].clone();
    let again = ipam
        .allocate(&who(&uid0, "c", "node-c"))
        .await
        .expect("re-add");
    assert!(again[0].reused);
    assert_eq!(again[0].address, addr0);
    let released = ipam
        .release(&Release {
            container_id: "c".into(),
            ifname: "eth0".into(),
            pod_uid: None,
            addresses: vec![addr0],
        })
        .await
        .expect("release");
    assert_eq!(released, 1);
    assert_eq!(ipam.release_pod(&winners[1].0).await.expect("release"), 1);
    assert_eq!(
        ipam.store()
            .list_by_node("node-c")
            .await
            .expect("list")
            .len(),
        28
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_claim_store_on_the_embedded_store() {
    let h = start(false, "kube_claim_store_embedded")
        .await
        .expect("embedded always runs");
    store_semantics(&h).await;
    concurrent_allocation(&h).await;
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_claim_store_on_etcd() {
    let Some(h) = start(true, "kube_claim_store_etcd").await else {
        return; // skipped outside CI, with a note printed by `require`
    };
    store_semantics(&h).await;
    concurrent_allocation(&h).await;
    tokio::time::timeout(Duration::from_secs(10), h.server.shutdown())
        .await
        .expect("shutdown");
}
