use super::testing::{vpc, Fake};
use super::*;
use crate::ipam::memory::MemoryClaimStore;
use crate::ipam::IpamError;

fn who(ns: &str, name: &str, uid: &str) -> Claimant {
    Claimant {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        container_id: format!("c-{uid}"),
        ifname: "eth0".into(),
        node: "n1".into(),
    }
}

/// Tenants t1 and t2 each own VPC `net` with the same CIDR; t1's `app`
/// namespace is bound to t1/net.
fn fixture() -> Fake {
    let mut f = Fake::default();
    f.vpcs.insert(
        ("t1".into(), "net".into()),
        vpc(
            "t1",
            "net",
            &["10.0.0.0/24", "fd00::/64"],
            Some(100),
            Some("Ready"),
        ),
    );
    f.vpcs.insert(
        ("t2".into(), "net".into()),
        vpc("t2", "net", &["10.0.0.0/24"], Some(101), Some("Ready")),
    );
    f.bindings.push(("app".into(), "t1".into(), "net".into()));
    f.bindings.push(("t2".into(), "t2".into(), "net".into()));
    f
}

fn attach(f: Fake) -> VpcAttach<Fake, MemoryClaimStore<Port>> {
    VpcAttach::new(f, MemoryClaimStore::new(), Some("192.0.2.1".into()))
}

#[tokio::test]
async fn a_pod_without_the_annotation_is_a_default_network_pod() {
    let mut f = fixture();
    f.pods
        .insert(("app".into(), "p".into()), ("u1".into(), None));
    assert_eq!(attach(f).resolve(&who("app", "p", "u1")).await, Ok(None));
}

#[tokio::test]
async fn joining_needs_a_binding_in_the_pods_own_namespace() {
    let mut f = fixture();
    // `evil` asks for t1/net without a binding; the annotation names the
    // VPC's namespace, which must not matter.
    f.pods.insert(
        ("evil".into(), "p".into()),
        ("u1".into(), Some("t1/net".into())),
    );
    // A binding in `evil` to another VPC grants nothing for this one.
    f.bindings.push(("evil".into(), "t2".into(), "net".into()));
    let a = attach(f);
    let err = a.resolve(&who("evil", "p", "u1")).await.unwrap_err();
    assert_eq!(
        err,
        AttachError::NotBound {
            pod_namespace: "evil".into(),
            vpc_namespace: "t1".into(),
            vpc: "net".into()
        }
    );
    assert!(
        err.to_string().contains("no VPCBinding in namespace evil"),
        "{err}"
    );
}

#[tokio::test]
async fn the_runtime_namespace_decides_not_the_annotation() {
    let mut f = fixture();
    // A pod in `app` (bound to t1/net) is resolved with the runtime's namespace.
    f.pods.insert(
        ("app".into(), "p".into()),
        ("u1".into(), Some("t1/net".into())),
    );
    let t = attach(f)
        .resolve(&who("app", "p", "u1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (t.namespace.as_str(), t.name.as_str(), t.vni),
        ("t1", "net", 100)
    );
    assert_eq!(t.mtu, Some(1400));
}

#[tokio::test]
async fn an_unqualified_name_is_the_pods_namespace() {
    let mut f = fixture();
    f.pods
        .insert(("t2".into(), "p".into()), ("u1".into(), Some("net".into())));
    let t = attach(f)
        .resolve(&who("t2", "p", "u1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((t.namespace.as_str(), t.vni), ("t2", 101));
}

#[tokio::test]
async fn each_failure_names_its_cause() {
    let mut f = fixture();
    f.vpcs.insert(
        ("t1".into(), "young".into()),
        vpc("t1", "young", &["10.1.0.0/24"], None, None),
    );
    f.bindings.push(("app".into(), "t1".into(), "young".into()));
    f.bindings.push(("app".into(), "t1".into(), "gone".into()));
    for (pod, ann) in [
        ("bad", "T1/Net"),
        ("young", "t1/young"),
        ("gone", "t1/gone"),
    ] {
        f.pods
            .insert(("app".into(), pod.into()), (pod.into(), Some(ann.into())));
    }
    let a = attach(f);
    assert!(matches!(
        a.resolve(&who("app", "bad", "bad")).await,
        Err(AttachError::BadAnnotation { .. })
    ));
    let young = a.resolve(&who("app", "young", "young")).await.unwrap_err();
    assert!(matches!(young, AttachError::NotReady { .. }), "{young}");
    assert!(young.is_transient());
    assert!(matches!(
        a.resolve(&who("app", "gone", "gone")).await,
        Err(AttachError::UnknownVpc { .. })
    ));
    // The runtime's UID must be the pod's: a re-created pod is another pod.
    assert!(matches!(
        a.resolve(&who("app", "young", "other-uid")).await,
        Err(AttachError::PodNotFound { .. })
    ));
}

#[tokio::test]
async fn twin_vpcs_hand_out_the_same_address_under_distinct_claims() {
    let mut f = fixture();
    f.pods.insert(
        ("app".into(), "a".into()),
        ("same".into(), Some("t1/net".into())),
    );
    f.pods.insert(
        ("t2".into(), "b".into()),
        ("same".into(), Some("net".into())),
    );
    f.labels.insert(
        ("app".into(), "a".into()),
        BTreeMap::from([("role".into(), "web".into()), ("app".into(), "shop".into())]),
    );
    let a = attach(f);
    let ta = a.resolve(&who("app", "a", "same")).await.unwrap().unwrap();
    let tb = a.resolve(&who("t2", "b", "same")).await.unwrap().unwrap();
    let la = a.allocate(&ta, &who("app", "a", "same")).await.unwrap();
    let lb = a.allocate(&tb, &who("t2", "b", "same")).await.unwrap();
    // Same UID offset, same CIDR: the same v4 address in both VPCs.
    assert_eq!(la[0].address, lb[0].address);
    assert_ne!(la[0].claim, lb[0].claim);
    assert!(la[0].claim.starts_with("v100."), "{}", la[0].claim);
    assert!(lb[0].claim.starts_with("v101."), "{}", lb[0].claim);
    // Dual-stack VPC: one Port per family; single-stack: one.
    assert_eq!((la.len(), lb.len()), (2, 1));
    let ports = a.store().snapshot();
    let port = &ports[&la[0].claim];
    assert_eq!(port.spec.vpc_ref.namespace.as_deref(), Some("t1"));
    assert_eq!(port.spec.pod_namespace.as_deref(), Some("app"));
    assert_eq!(port.spec.node.as_deref(), Some("n1"));
    assert_eq!(port.spec.node_ip.as_deref(), Some("192.0.2.1"));
    // The pod's labels at attach are on each of its Ports, as sorted JSON,
    // for every node's SecurityGroup compile; a pod without labels has `{}`.
    let labels = |p: &Port| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(cozyplane_api::labels::ANNOTATION_POD_LABELS))
            .cloned()
    };
    for l in &la {
        assert_eq!(
            labels(&ports[&l.claim]).as_deref(),
            Some(r#"{"app":"shop","role":"web"}"#)
        );
    }
    assert_eq!(labels(&ports[&lb[0].claim]).as_deref(), Some("{}"));
}

#[tokio::test]
async fn retries_reuse_and_release_frees_the_ports() {
    let mut f = fixture();
    f.pods.insert(
        ("app".into(), "a".into()),
        ("u1".into(), Some("t1/net".into())),
    );
    let a = attach(f);
    let w = who("app", "a", "u1");
    let t = a.resolve(&w).await.unwrap().unwrap();
    let first = a.allocate(&t, &w).await.unwrap();
    let again = a.allocate(&t, &w).await.unwrap();
    assert_eq!(
        first.iter().map(|l| l.address).collect::<Vec<_>>(),
        again.iter().map(|l| l.address).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|l| l.reused));
    let rel = Release {
        container_id: w.container_id.clone(),
        ifname: w.ifname.clone(),
        pod_uid: Some(w.uid.clone()),
        addresses: Vec::new(),
    };
    let held = a.held(100, &rel).await.unwrap();
    assert_eq!(held.len(), 2);
    assert!(held.iter().all(|h| h.net == 100));
    assert_eq!(a.release(100, &rel).await.unwrap(), 2);
    assert!(a.store().snapshot().is_empty());
}

#[tokio::test]
async fn the_gateway_address_is_held_back_and_exhaustion_is_reported() {
    let mut f = fixture();
    // /30: hosts .1 and .2, .1 held back for the gateway leg: room for one.
    f.vpcs.insert(
        ("t1".into(), "tiny".into()),
        vpc("t1", "tiny", &["10.9.0.0/30"], Some(120), Some("Ready")),
    );
    f.bindings.push(("app".into(), "t1".into(), "tiny".into()));
    for p in ["a", "b"] {
        f.pods
            .insert(("app".into(), p.into()), (p.into(), Some("t1/tiny".into())));
    }
    let a = attach(f);
    let t = a.resolve(&who("app", "a", "a")).await.unwrap().unwrap();
    let got = a.allocate(&t, &who("app", "a", "a")).await.unwrap();
    assert_eq!(got[0].address, "10.9.0.2".parse::<IpAddr>().unwrap());
    let full = a.allocate(&t, &who("app", "b", "b")).await.unwrap_err();
    assert!(matches!(full, IpamError::Exhausted { .. }), "{full}");
    assert_eq!(a.store().snapshot().len(), 1, "nothing left behind");
}

#[test]
fn annotations_parse_strictly() {
    assert_eq!(
        parse_vpc_annotation("t1/net", "app").unwrap(),
        ("t1".into(), "net".into())
    );
    assert_eq!(
        parse_vpc_annotation("net.a", "app").unwrap(),
        ("app".into(), "net.a".into())
    );
    for bad in [
        "", "/net", "t1/", "a/b/c", "T1/net", "t1/Net", "t1/net_x", " t1/net",
    ] {
        assert!(
            parse_vpc_annotation(bad, "app").is_err(),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn pools_take_the_first_cidr_of_each_family() {
    let p = vpc_pools(&[
        "10.0.0.0/24".into(),
        "10.1.0.0/24".into(),
        "fd00::/64".into(),
    ])
    .unwrap();
    let cidrs: Vec<String> = p.iter().map(|p| p.cidr().to_string()).collect();
    assert_eq!(cidrs, ["10.0.0.0/24", "fd00::/64"]);
    assert!(!p
        .iter()
        .next()
        .unwrap()
        .is_allocatable("10.0.0.1".parse().unwrap()));
    assert!(vpc_pools(&[]).is_err());
    assert!(vpc_pools(&["nonsense".into()]).is_err());
}
