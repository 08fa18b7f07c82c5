use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use cozyplane_api::labels::ANNOTATION_NODE_ADDRESSES;
use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::ipam::Claimant;

/// No claims (a typed empty slice for the generic `compile`).
const NO_CLAIMS: &[FabricIP] = &[];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ep(s: &str) -> TunnelEndpoint {
    TunnelEndpoint(s.parse::<Ipv4Addr>().unwrap())
}

fn node(name: &str, addrs: &[(&str, &str)], annotation: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: annotation
                .map(|a| BTreeMap::from([(ANNOTATION_NODE_ADDRESSES.to_string(), a.to_string())])),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(
                addrs
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: (*t).into(),
                        address: (*a).into(),
                    })
                    .collect(),
            ),
            ..NodeStatus::default()
        }),
    }
}

fn fip(addr: &str, node: &str) -> FabricIP {
    Claimant {
        namespace: "ns".into(),
        name: "p".into(),
        uid: format!("uid-{addr}"),
        container_id: "c".into(),
        ifname: "eth0".into(),
        node: node.into(),
    }
    .claim_for(ip(addr))
}

fn cluster() -> (Vec<Node>, Vec<FabricIP>) {
    let nodes = vec![
        node(
            "a",
            &[
                ("Hostname", "a"),
                ("InternalIP", "fd00::a"),
                ("InternalIP", "192.168.1.1"),
            ],
            None,
        ),
        node(
            "b",
            &[("InternalIP", "192.168.1.2"), ("ExternalIP", "203.0.113.2")],
            Some("10.10.0.2, fd00::b"),
        ),
        node("c", &[("InternalIP", "192.168.1.3")], None),
    ];
    let fips = vec![
        fip("10.244.0.5", "a"),
        fip("10.244.0.6", "b"),
        fip("fd00:10:244::6", "b"),
        fip("10.244.0.7", "c"),
    ];
    (nodes, fips)
}

#[test]
fn remotes_point_at_the_owning_node_and_skip_our_own_pods() {
    let (nodes, fips) = cluster();
    let t = compile(&nodes, &fips, "a");
    let want: BTreeMap<RemoteKey, TunnelEndpoint> = [
        (RemoteKey::host(0, ip("10.244.0.6")), ep("192.168.1.2")),
        (RemoteKey::host(0, ip("10.244.0.7")), ep("192.168.1.3")),
        (RemoteKey::host(0, ip("fd00:10:244::6")), ep("192.168.1.2")),
    ]
    .into();
    assert_eq!(t.remotes, want);
    assert_eq!(RemoteKey::host(0, ip("fd00:10:244::6")).prefix_len, 128);
    assert_eq!(RemoteKey::host(0, ip("10.244.0.6")).prefix_len, 32);
    assert!(t.diagnostics.is_empty(), "{:?}", t.diagnostics);

    // seen from b, a's pod is remote and b's are not
    let t = compile(&nodes, &fips, "b");
    assert_eq!(
        t.remotes.keys().map(|k| k.addr).collect::<Vec<_>>(),
        vec![ip("10.244.0.5"), ip("10.244.0.7")]
    );
    assert_eq!(
        t.remotes[&RemoteKey::host(0, ip("10.244.0.5"))],
        ep("192.168.1.1")
    );
}

#[test]
fn node_remotes_cover_every_other_nodes_addresses() {
    let (nodes, fips) = cluster();
    let t = compile(&nodes, &fips, "a");
    let want: BTreeMap<IpAddr, TunnelEndpoint> = [
        (ip("10.10.0.2"), ep("192.168.1.2")),
        (ip("192.168.1.2"), ep("192.168.1.2")),
        (ip("192.168.1.3"), ep("192.168.1.3")),
        (ip("203.0.113.2"), ep("192.168.1.2")),
        (ip("fd00::b"), ep("192.168.1.2")),
    ]
    .into();
    assert_eq!(t.node_remotes, want);
}

#[test]
fn endpoint_prefers_internal_ipv4_then_the_annotation() {
    let x = node(
        "x",
        &[("ExternalIP", "203.0.113.9"), ("InternalIP", "fd00::9")],
        Some("10.9.9.9"),
    );
    let t = compile(std::slice::from_ref(&x), NO_CLAIMS, "observer");
    assert_eq!(t.vteps, BTreeSet::from([ep("10.9.9.9")]));
    assert!(t.diagnostics.is_empty(), "{:?}", t.diagnostics);
    let y = node("y", &[("InternalIP", "fd00::9")], None);
    let t = compile(std::slice::from_ref(&y), NO_CLAIMS, "observer");
    assert!(t.vteps.is_empty());
    assert_eq!(
        t.diagnostics,
        vec![Diagnostic::NodeWithoutEndpoint { node: "y".into() }]
    );
    // an InternalIP comes first, whatever the annotation says
    let z = node("z", &[("InternalIP", "192.168.1.26")], Some("10.9.9.26"));
    let t = compile(&[x, z], NO_CLAIMS, "observer");
    assert_eq!(
        t.vteps,
        BTreeSet::from([ep("10.9.9.9"), ep("192.168.1.26")])
    );
}

#[test]
fn bad_objects_are_skipped_and_reported_without_hurting_the_rest() {
    let (mut nodes, mut fips) = cluster();
    nodes.push(node(
        "v6only",
        &[("InternalIP", "fd00::99")],
        Some("not-an-ip"),
    ));
    // a claim on a node with no endpoint, on an unknown node, on no node
    fips.push(fip("10.244.0.8", "v6only"));
    fips.push(fip("10.244.0.9", "ghost"));
    fips.push(fip("10.244.0.10", ""));
    // a claim whose spec.address disagrees with its name
    let mut bad = fip("10.244.0.11", "b");
    bad.spec.address = "10.244.0.12".into();
    fips.push(bad);
    let t = compile(&nodes, &fips, "a");
    assert_eq!(t.remotes.len(), 3, "the good entries survive");
    assert_eq!(
        t.diagnostics,
        vec![
            Diagnostic::NodeWithoutEndpoint {
                node: "v6only".into()
            },
            Diagnostic::BadNodeAddress {
                node: "v6only".into(),
                value: "not-an-ip".into()
            },
            Diagnostic::MalformedClaim {
                claim: "f-10-244-0-11".into()
            },
            Diagnostic::ClaimOnUnknownNode {
                claim: "f-10-244-0-10".into(),
                node: None
            },
            Diagnostic::ClaimOnUnknownNode {
                claim: "f-10-244-0-8".into(),
                node: Some("v6only".into())
            },
            Diagnostic::ClaimOnUnknownNode {
                claim: "f-10-244-0-9".into(),
                node: Some("ghost".into())
            },
        ]
    );
    // every diagnostic renders to a readable line
    for d in &t.diagnostics {
        assert!(!d.to_string().is_empty());
    }
    // the v6-only node's addresses are not programmed without an endpoint
    assert!(!t.node_remotes.contains_key(&ip("fd00::99")));
}

#[test]
fn contested_and_own_addresses() {
    let nodes = vec![
        node("a", &[("InternalIP", "192.168.1.1")], Some("10.0.0.100")),
        node("c", &[("InternalIP", "192.168.1.3")], Some("10.0.0.50")),
        node(
            "b",
            &[("InternalIP", "192.168.1.2")],
            Some("10.0.0.50,10.0.0.100"),
        ),
    ];
    let t = compile(&nodes, NO_CLAIMS, "a");
    // 10.0.0.50: b and c both only annotate it, so neither gets it (not b
    // for coming first by name); 10.0.0.100 is also claimed by us: never
    // encapsulated to b (the sync adds our own kernel addresses itself)
    assert!(!t.node_remotes.contains_key(&ip("10.0.0.50")));
    assert!(!t.node_remotes.contains_key(&ip("10.0.0.100")));
    assert_eq!(t.node_remotes[&ip("192.168.1.2")], ep("192.168.1.2"));
    assert_eq!(
        t.diagnostics,
        vec![
            Diagnostic::AddressConflict {
                address: ip("10.0.0.50"),
                kept: None,
                dropped: vec!["b".into(), "c".into()],
            },
            Diagnostic::AddressConflict {
                address: ip("10.0.0.100"),
                kept: None,
                dropped: vec!["a".into(), "b".into()],
            },
        ]
    );
    for d in &t.diagnostics {
        assert!(d.is_address_conflict());
        assert!(d.to_string().contains("routed to none of them"), "{d}");
    }
}

#[test]
fn status_addresses_win_over_another_nodes_annotation() {
    // "attacker" annotates victim's InternalIP and ExternalIP to attract
    // pod -> victim traffic; it sorts first by name, which used to win
    let nodes = vec![
        node(
            "victim",
            &[("InternalIP", "192.168.1.2"), ("ExternalIP", "203.0.113.2")],
            None,
        ),
        node(
            "attacker",
            &[("InternalIP", "192.168.1.66")],
            Some("203.0.113.2, 192.168.1.2, 10.66.0.1"),
        ),
        node("observer", &[("InternalIP", "192.168.1.9")], None),
    ];
    let t = compile(&nodes, NO_CLAIMS, "observer");
    assert_eq!(t.node_remotes[&ip("203.0.113.2")], ep("192.168.1.2"));
    assert_eq!(t.node_remotes[&ip("192.168.1.2")], ep("192.168.1.2"));
    // the attacker keeps what nobody else reports
    assert_eq!(t.node_remotes[&ip("10.66.0.1")], ep("192.168.1.66"));
    assert_eq!(
        t.diagnostics,
        vec![
            Diagnostic::AddressConflict {
                address: ip("192.168.1.2"),
                kept: Some("victim".into()),
                dropped: vec!["attacker".into()],
            },
            Diagnostic::AddressConflict {
                address: ip("203.0.113.2"),
                kept: Some("victim".into()),
                dropped: vec!["attacker".into()],
            },
        ]
    );
    assert_eq!(
        t.diagnostics[0].to_string(),
        "node victim reports 192.168.1.2 in its status, and attacker claim it through \
         cozyplane.io/node-addresses: kept victim"
    );
    // the same from every point of view, and whatever the input order
    let mut reversed = nodes.clone();
    reversed.reverse();
    assert_eq!(compile(&reversed, NO_CLAIMS, "observer"), t);
}

#[test]
fn two_nodes_reporting_one_status_address_get_neither() {
    let nodes = vec![
        node("a", &[("InternalIP", "192.168.1.1")], None),
        node(
            "b",
            &[("InternalIP", "192.168.1.2"), ("ExternalIP", "203.0.113.7")],
            None,
        ),
        node(
            "c",
            &[("InternalIP", "192.168.1.3"), ("ExternalIP", "203.0.113.7")],
            Some("203.0.113.7"),
        ),
    ];
    let t = compile(&nodes, NO_CLAIMS, "a");
    assert!(!t.node_remotes.contains_key(&ip("203.0.113.7")));
    assert_eq!(
        t.diagnostics,
        vec![Diagnostic::AddressConflict {
            address: ip("203.0.113.7"),
            kept: None,
            dropped: vec!["b".into(), "c".into()],
        }]
    );
}

#[test]
fn an_annotation_cannot_borrow_another_nodes_address_as_endpoint() {
    // "thief" has no InternalIP; its first annotated IPv4 is b's InternalIP
    let nodes = vec![
        node("a", &[("InternalIP", "192.168.1.1")], None),
        node("b", &[("InternalIP", "192.168.1.2")], None),
        node("thief", &[], Some("192.168.1.2, 10.7.0.7")),
        node("empty", &[], Some("192.168.1.1")),
    ];
    let fips = vec![fip("10.244.7.7", "thief"), fip("10.244.8.8", "empty")];
    let t = compile(&nodes, &fips, "a");
    // thief tunnels from the next address it owns, "empty" from none
    assert_eq!(
        t.remotes[&RemoteKey::host(0, ip("10.244.7.7"))],
        ep("10.7.0.7")
    );
    assert_eq!(t.vteps, BTreeSet::from([ep("10.7.0.7"), ep("192.168.1.2")]));
    assert!(t.diagnostics.contains(&Diagnostic::NodeWithoutEndpoint {
        node: "empty".into()
    }));
    assert!(t.diagnostics.contains(&Diagnostic::ClaimOnUnknownNode {
        claim: "f-10-244-8-8".into(),
        node: Some("empty".into()),
    }));
}

#[test]
fn output_is_independent_of_input_order() {
    let (nodes, fips) = cluster();
    let a = compile(&nodes, &fips, "c");
    let mut rn = nodes.clone();
    rn.reverse();
    let mut rf = fips.clone();
    rf.reverse();
    let b = compile(&rn, &rf, "c");
    assert_eq!(a, b);
}

#[test]
fn vteps_are_every_other_nodes_tunnel_endpoint() {
    let (mut nodes, fips) = cluster();
    let t = compile(&nodes, &fips, "a");
    assert_eq!(
        t.vteps,
        BTreeSet::from([ep("192.168.1.2"), ep("192.168.1.3")]),
        "the endpoints only: not ExternalIPs, annotations or IPv6"
    );
    // seen from c: a and b, never c itself
    let t = compile(&nodes, &fips, "c");
    assert_eq!(
        t.vteps,
        BTreeSet::from([ep("192.168.1.1"), ep("192.168.1.2")])
    );

    // a node without an endpoint contributes none (and is reported)
    nodes.push(node("d", &[("Hostname", "d")], None));
    // a node that claims our endpoint does not make us a trusted sender
    nodes.push(node("e", &[("InternalIP", "192.168.1.1")], None));
    // a node whose endpoint comes from the annotation
    nodes.push(node("f", &[], Some("10.10.0.6")));
    let t = compile(&nodes, &fips, "a");
    assert_eq!(
        t.vteps,
        BTreeSet::from([ep("10.10.0.6"), ep("192.168.1.2"), ep("192.168.1.3")])
    );
    assert!(t
        .diagnostics
        .contains(&Diagnostic::NodeWithoutEndpoint { node: "d".into() }));

    // no other nodes: no senders at all
    let alone = compile(&nodes[..1], NO_CLAIMS, "a");
    assert!(alone.vteps.is_empty());
}
