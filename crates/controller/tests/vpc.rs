//! The VPC controller against the real API server (in process): VNIs by
//! claim, never twice, kept while the VPC is used, released after.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cozyplane_api::sdn::{VPCBindingSpec, VPCRef, VPCSpec};
use cozyplane_api::{VNIClaim, VPCBinding, VPC};
use cozyplane_controller::leader::Leadership;
use cozyplane_controller::metrics::Metrics;
use cozyplane_controller::vpc::{held_vnis, VpcConfig, Vpcs};
use cozyplane_testkit::eventually_async;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::Client;
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(60);

fn config() -> VpcConfig {
    VpcConfig {
        resync: Duration::from_secs(3600),
        debounce: Duration::from_millis(20),
    }
}

async fn namespace(c: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
}

fn vpc(name: &str) -> VPC {
    VPC::new(
        name,
        VPCSpec {
            cidrs: vec!["10.0.0.0/16".into()],
            mtu: None,
        },
    )
}

/// Starts a worker that always acts (no election): the racing case.
fn worker(c: &Client) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, rx) = watch::channel(false);
    let w = Vpcs::new(
        c.clone(),
        config(),
        Arc::new(Metrics::default()),
        Leadership::unconditional(),
    );
    (stop, tokio::spawn(w.run(rx)))
}

/// Every VPC shows a distinct VNI that it, and only it, holds.
async fn all_ready_and_distinct(c: &Client, ns: &str, n: usize) -> bool {
    let vpcs = Api::<VPC>::namespaced(c.clone(), ns)
        .list(&Default::default())
        .await
        .expect("list vpcs")
        .items;
    let held = held_vnis(c).await.expect("list claims");
    let mut shown = BTreeSet::new();
    for v in &vpcs {
        let Some(s) = &v.status else { return false };
        let (Some(vni), Some("Ready")) = (s.vni, s.phase.as_deref()) else {
            return false;
        };
        let key = format!("{ns}/{}", v.metadata.name.as_deref().unwrap_or_default());
        if held.get(&key).map(Vec::as_slice) != Some(&[vni as u32][..]) {
            return false;
        }
        assert!(shown.insert(vni), "VNI {vni} shown by two VPCs");
    }
    vpcs.len() == n && held.values().map(Vec::len).sum::<usize>() == n
}

async fn race(h: support::Harness) {
    let c = &h.client;
    namespace(c, "t1").await;
    let api = Api::<VPC>::namespaced(c.clone(), "t1");
    // Two controllers that both believe they lead, started while VPCs arrive.
    let (stop_a, a) = worker(c);
    let (stop_b, b) = worker(c);
    for i in 0..100 {
        api.create(&PostParams::default(), &vpc(&format!("net-{i:03}")))
            .await
            .expect("create vpc");
    }
    eventually_async(
        "100 VPCs with 100 distinct VNIs, one claim each",
        LIMIT,
        || all_ready_and_distinct(c, "t1", 100),
    )
    .await;
    // A restart (a new worker, the old ones gone) reassigns nothing.
    let before: Vec<(String, Option<i32>)> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|v| (v.metadata.name.unwrap(), v.status.and_then(|s| s.vni)))
        .collect();
    for (stop, task) in [(stop_a, a), (stop_b, b)] {
        stop.send_replace(true);
        task.await.unwrap();
    }
    let (stop_c, c_task) = worker(c);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<(String, Option<i32>)> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|v| (v.metadata.name.unwrap(), v.status.and_then(|s| s.vni)))
        .collect();
    assert_eq!(before, after, "a restarted controller moved a VNI");
    stop_c.send_replace(true);
    c_task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_controllers_give_100_vpcs_100_distinct_vnis() {
    race(support::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_controllers_give_100_vpcs_100_distinct_vnis_on_etcd() {
    let Some(h) = support::start_on(true, "controller_vpc_etcd").await else {
        return; // skipped outside CI, with a note printed by `require`
    };
    race(h).await;
}

/// Deleting a VPC waits while a binding references it, then releases its
/// VNI; a VPC re-created under the same name is a new VPC with its own claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vpc_in_use_keeps_its_vni_until_released() {
    let h = support::start().await;
    let c = &h.client;
    namespace(c, "owner").await;
    namespace(c, "consumer").await;
    let vpcs = Api::<VPC>::namespaced(c.clone(), "owner");
    let claims = Api::<VNIClaim>::all(c.clone());
    let (stop, task) = worker(c);
    vpcs.create(&PostParams::default(), &vpc("blue"))
        .await
        .unwrap();
    eventually_async("blue is Ready", LIMIT, || {
        all_ready_and_distinct(c, "owner", 1)
    })
    .await;
    let vni = vpcs.get("blue").await.unwrap().status.unwrap().vni.unwrap();
    let binding = VPCBinding::new(
        "use-blue",
        VPCBindingSpec {
            vpc_ref: VPCRef {
                namespace: Some("owner".into()),
                name: "blue".into(),
            },
        },
    );
    Api::<VPCBinding>::namespaced(c.clone(), "consumer")
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    vpcs.delete("blue", &DeleteParams::default()).await.unwrap();
    eventually_async("the deletion waits, and says why", LIMIT, || async {
        let v = vpcs.get("blue").await.unwrap();
        v.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "False"
                    && c.reason == "InUse"
                    && c.message.contains("1 VPCBinding")
            })
        })
    })
    .await;
    let claim = format!("vni-{vni}");
    assert!(
        claims.get_opt(&claim).await.unwrap().is_some(),
        "VNI released while in use"
    );

    Api::<VPCBinding>::namespaced(c.clone(), "consumer")
        .delete("use-blue", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("blue gone and its VNI released", LIMIT, || async {
        vpcs.get_opt("blue").await.unwrap().is_none()
            && claims.get_opt(&claim).await.unwrap().is_none()
    })
    .await;
    vpcs.create(&PostParams::default(), &vpc("blue"))
        .await
        .unwrap();
    eventually_async("the new blue is Ready", LIMIT, || {
        all_ready_and_distinct(c, "owner", 1)
    })
    .await;
    stop.send_replace(true);
    task.await.unwrap();
}

fn half(ns: &str, vpc: &str, peer_ns: &str, peer: &str) -> cozyplane_api::VPCPeering {
    let mut p = cozyplane_api::VPCPeering::new(
        &format!("{vpc}-to-{peer_ns}-{peer}"),
        cozyplane_api::sdn::VPCPeeringSpec {
            vpc_ref: cozyplane_api::sdn::LocalVPCRef { name: vpc.into() },
            peer_ref: cozyplane_api::sdn::ObjectRef {
                namespace: peer_ns.into(),
                name: peer.into(),
            },
        },
    );
    p.metadata.namespace = Some(ns.into());
    p
}

async fn peering(c: &Client, ns: &str, name: &str) -> (String, Option<i32>, Vec<(String, String)>) {
    let p = Api::<cozyplane_api::VPCPeering>::namespaced(c.clone(), ns)
        .get(name)
        .await
        .expect("get peering");
    let s = p.status.unwrap_or_default();
    (
        s.phase.unwrap_or_default(),
        s.peer_vni,
        s.conditions
            .into_iter()
            .map(|c| (c.type_, c.status))
            .collect(),
    )
}

/// Peering status: Ready with the peer's VNI only while both halves
/// reference each other and the CIDRs are disjoint; deleting one half
/// turns the other back to Pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peerings_are_ready_only_reciprocated_and_disjoint() {
    let h = support::start().await;
    let c = &h.client;
    for ns in ["a", "b"] {
        namespace(c, ns).await;
    }
    let (stop, task) = worker(c);
    let mk = |name: &str, cidr: &str| {
        VPC::new(
            name,
            VPCSpec {
                cidrs: vec![cidr.into()],
                mtu: None,
            },
        )
    };
    Api::<VPC>::namespaced(c.clone(), "a")
        .create(&PostParams::default(), &mk("blue", "10.1.0.0/16"))
        .await
        .unwrap();
    let vpcs_b = Api::<VPC>::namespaced(c.clone(), "b");
    vpcs_b
        .create(&PostParams::default(), &mk("red", "10.2.0.0/16"))
        .await
        .unwrap();
    vpcs_b
        .create(&PostParams::default(), &mk("twin", "10.1.128.0/17"))
        .await
        .unwrap();
    let peerings = |ns: &str| Api::<cozyplane_api::VPCPeering>::namespaced(c.clone(), ns);
    let pp = PostParams::default();
    peerings("a")
        .create(&pp, &half("a", "blue", "b", "red"))
        .await
        .unwrap();
    eventually_async("one half alone waits for its peer", LIMIT, || async {
        let (phase, vni, conds) = peering(c, "a", "blue-to-b-red").await;
        phase == "Pending"
            && vni.is_none()
            && conds.contains(&("PeerMatched".into(), "False".into()))
    })
    .await;
    peerings("b")
        .create(&pp, &half("b", "red", "a", "blue"))
        .await
        .unwrap();
    let red_vni = || async { vpcs_b.get("red").await.unwrap().status.and_then(|s| s.vni) };
    eventually_async("both halves Ready with the peer's VNI", LIMIT, || async {
        let (phase, vni, _) = peering(c, "a", "blue-to-b-red").await;
        phase == "Ready" && vni.is_some() && vni == red_vni().await
    })
    .await;
    // Overlapping CIDRs: both halves exist, but never Ready.
    peerings("a")
        .create(&pp, &half("a", "blue", "b", "twin"))
        .await
        .unwrap();
    peerings("b")
        .create(&pp, &half("b", "twin", "a", "blue"))
        .await
        .unwrap();
    eventually_async("an overlapping peering is refused", LIMIT, || async {
        let (phase, vni, conds) = peering(c, "a", "blue-to-b-twin").await;
        phase == "Pending"
            && vni.is_none()
            && conds.contains(&("PeerMatched".into(), "True".into()))
            && conds.contains(&("CIDRsDisjoint".into(), "False".into()))
    })
    .await;
    // Either side revokes by deleting its half.
    peerings("b")
        .delete("red-to-a-blue", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async(
        "the remaining half falls back to Pending",
        LIMIT,
        || async {
            let (phase, vni, _) = peering(c, "a", "blue-to-b-red").await;
            phase == "Pending" && vni.is_none()
        },
    )
    .await;
    stop.send_replace(true);
    task.await.unwrap();
}

fn port(vni: u32, ip: &str, vpc_ns: &str, vpc: &str, pod_ns: &str) -> cozyplane_api::Port {
    let addr: std::net::IpAddr = ip.parse().unwrap();
    cozyplane_api::Port::new(
        &cozyplane_api::names::port_name(vni, addr),
        cozyplane_api::sdn::PortSpec {
            vpc_ref: VPCRef {
                namespace: Some(vpc_ns.into()),
                name: vpc.into(),
            },
            ip: ip.into(),
            mac: None,
            node: Some("n1".into()),
            node_ip: None,
            pod_namespace: Some(pod_ns.into()),
            pod_name: Some("p".into()),
            gateway: None,
        },
    )
}

/// Revocation: deleting a binding deletes the Ports of its namespace in its
/// VPC — only those, and not while another binding still grants the VPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_binding_severs_its_namespaces_ports_in_its_vpc() {
    let h = support::start().await;
    let c = &h.client;
    for ns in ["owner", "consumer", "other"] {
        namespace(c, ns).await;
    }
    let (stop, task) = worker(c);
    let pp = PostParams::default();
    let vpcs = Api::<VPC>::namespaced(c.clone(), "owner");
    vpcs.create(&pp, &vpc("blue")).await.unwrap();
    vpcs.create(&pp, &vpc("red")).await.unwrap();
    let bind = |name: &str, vpc: &str| {
        VPCBinding::new(
            name,
            VPCBindingSpec {
                vpc_ref: VPCRef {
                    namespace: Some("owner".into()),
                    name: vpc.into(),
                },
            },
        )
    };
    let bindings = |ns: &str| Api::<VPCBinding>::namespaced(c.clone(), ns);
    bindings("consumer")
        .create(&pp, &bind("blue", "blue"))
        .await
        .unwrap();
    bindings("consumer")
        .create(&pp, &bind("red", "red"))
        .await
        .unwrap();
    bindings("other")
        .create(&pp, &bind("blue", "blue"))
        .await
        .unwrap();
    eventually_async("every binding carries the finalizer", LIMIT, || async {
        let mut all = Vec::new();
        for ns in ["consumer", "other"] {
            all.extend(bindings(ns).list(&Default::default()).await.unwrap().items);
        }
        all.len() == 3
            && all.iter().all(|b| {
                b.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.iter().any(|x| x == "sdn.cozystack.io/sever"))
            })
    })
    .await;
    let ports = Api::<cozyplane_api::Port>::all(c.clone());
    let severed = port(100, "10.0.0.5", "owner", "blue", "consumer");
    let kept = [
        port(100, "10.0.0.6", "owner", "blue", "other"),
        port(101, "10.0.0.5", "owner", "red", "consumer"),
    ];
    for p in std::iter::once(&severed).chain(&kept) {
        ports.create(&pp, p).await.unwrap();
    }
    let exists = |name: String| {
        let ports = ports.clone();
        async move { ports.get_opt(&name).await.unwrap().is_some() }
    };
    let name = |p: &cozyplane_api::Port| p.metadata.name.clone().unwrap();

    // A second binding of consumer to blue keeps the grant: nothing severed.
    bindings("consumer")
        .create(&pp, &bind("blue-too", "blue"))
        .await
        .unwrap();
    bindings("consumer")
        .delete("blue", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the first binding is gone", LIMIT, || async {
        bindings("consumer")
            .get_opt("blue")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    assert!(exists(name(&severed)).await, "severed while still granted");
    // The last grant goes: consumer's blue Port goes with it, no other.
    bindings("consumer")
        .delete("blue-too", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("consumer's blue Port severed", LIMIT, || async {
        !exists(name(&severed)).await
            && bindings("consumer")
                .get_opt("blue-too")
                .await
                .unwrap()
                .is_none()
    })
    .await;
    for p in &kept {
        assert!(exists(name(p)).await, "{} was severed too", name(p));
    }
    // A binding deleted before any controller put its finalizer on (here: none
    // running) is gone at once; its Port is still severed when one runs.
    stop.send_replace(true);
    task.await.unwrap();
    bindings("consumer")
        .create(&pp, &bind("quick", "blue"))
        .await
        .unwrap();
    let late = port(100, "10.0.0.7", "owner", "blue", "consumer");
    ports.create(&pp, &late).await.unwrap();
    bindings("consumer")
        .delete("quick", &DeleteParams::default())
        .await
        .unwrap();
    assert!(bindings("consumer")
        .get_opt("quick")
        .await
        .unwrap()
        .is_none());
    let (stop, task) = worker(c);
    eventually_async("the quick binding's Port severed", LIMIT, || async {
        !exists(name(&late)).await
    })
    .await;
    for p in &kept {
        assert!(exists(name(p)).await, "{} was severed too", name(p));
    }
    stop.send_replace(true);
    task.await.unwrap();
}
