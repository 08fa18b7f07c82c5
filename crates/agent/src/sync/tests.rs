use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::desired::{RemoteKey, TunnelEndpoint};

type Map = MemoryMap<RemoteKey, TunnelEndpoint>;

fn key(net: u32, s: &str) -> RemoteKey {
    RemoteKey::host(net, s.parse::<IpAddr>().unwrap())
}

fn ep(last: u8) -> TunnelEndpoint {
    TunnelEndpoint(Ipv4Addr::new(192, 168, 1, last))
}

/// The net-0 remote sync owns net 0 and nothing else.
fn net0(k: &RemoteKey, _: &TunnelEndpoint) -> bool {
    k.net == 0
}

fn desired(entries: &[(RemoteKey, TunnelEndpoint)]) -> BTreeMap<RemoteKey, TunnelEndpoint> {
    entries.iter().cloned().collect()
}

#[test]
fn converges_and_is_idempotent() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.1"), ep(1)); // right
    map.entries.insert(key(0, "10.0.0.2"), ep(9)); // wrong endpoint
    map.entries.insert(key(0, "10.0.0.3"), ep(3)); // stale
    let want = desired(&[
        (key(0, "10.0.0.1"), ep(1)),
        (key(0, "10.0.0.2"), ep(2)),
        (key(0, "fd00::4"), ep(4)),
    ]);
    let r = sync(&mut map, &want, net0).unwrap();
    assert_eq!(
        (r.inserted, r.replaced, r.removed, r.unchanged),
        (1, 1, 1, 1)
    );
    assert!(r.converged() && r.changed());
    assert_eq!(map.entries, want);

    let before = map.log.len();
    let r = sync(&mut map, &want, net0).unwrap();
    assert_eq!(
        (r.inserted, r.replaced, r.removed, r.unchanged),
        (0, 0, 0, 3)
    );
    assert!(!r.changed());
    assert_eq!(map.log.len(), before, "a converged map gets no writes");
}

#[test]
fn prunes_only_what_it_owns() {
    let mut map = Map::default();
    // a VPC writer's entry and a stale net-0 one
    map.entries.insert(key(100, "10.0.0.9"), ep(7));
    map.entries.insert(key(0, "10.0.0.9"), ep(7));
    let r = sync(&mut map, &BTreeMap::new(), net0).unwrap();
    assert_eq!(r.removed, 1);
    assert_eq!(map.entries.len(), 1);
    assert!(map.entries.contains_key(&key(100, "10.0.0.9")));
}

#[test]
fn a_desired_key_held_by_a_foreign_entry_is_not_overwritten() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.5"), ep(5));
    // ownership by value: entries pointing at .5 belong to someone else
    let owns = |_: &RemoteKey, v: &TunnelEndpoint| *v != ep(5);
    let r = sync(&mut map, &desired(&[(key(0, "10.0.0.5"), ep(6))]), owns).unwrap();
    assert_eq!(
        r.failures,
        vec![Failure::NotOwned {
            key: key(0, "10.0.0.5")
        }]
    );
    assert_eq!(map.entries[&key(0, "10.0.0.5")], ep(5));
}

#[test]
fn partial_failures_are_reported_and_do_not_stop_the_rest() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.7"), ep(7)); // stale, removal fails
    map.entries.insert(key(0, "10.0.0.8"), ep(8)); // stale, removal works
    map.failing = vec![key(0, "10.0.0.2"), key(0, "10.0.0.7")];
    let want = desired(&[(key(0, "10.0.0.1"), ep(1)), (key(0, "10.0.0.2"), ep(2))]);
    let r = sync(&mut map, &want, net0).unwrap();
    assert!(!r.converged());
    assert_eq!((r.inserted, r.removed), (1, 1));
    assert_eq!(
        r.failures,
        vec![
            Failure::Kernel {
                key: key(0, "10.0.0.2"),
                op: Op::Insert,
                error: "injected insert failure".into()
            },
            Failure::Kernel {
                key: key(0, "10.0.0.7"),
                op: Op::Remove,
                error: "injected remove failure".into()
            },
        ]
    );
    // once the kernel recovers, the next sync finishes the job
    map.failing.clear();
    let r = sync(&mut map, &want, net0).unwrap();
    assert!(r.converged());
    assert_eq!((r.inserted, r.removed), (1, 1));
    assert_eq!(map.entries, want);
}

#[test]
fn a_full_map_reports_the_entries_that_did_not_fit() {
    let mut map = Map {
        capacity: 2,
        ..Map::default()
    };
    let want = desired(&[
        (key(0, "10.0.0.1"), ep(1)),
        (key(0, "10.0.0.2"), ep(1)),
        (key(0, "10.0.0.3"), ep(1)),
    ]);
    let r = sync(&mut map, &want, net0).unwrap();
    assert_eq!(r.inserted, 2);
    assert!(matches!(
        &r.failures[..],
        [Failure::Kernel { op: Op::Insert, error, .. }] if error.0 == "map full"
    ));
}

#[test]
fn inserts_happen_before_removals() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.1"), ep(1));
    let want = desired(&[(key(0, "10.0.0.2"), ep(1))]);
    sync(&mut map, &want, net0).unwrap();
    assert_eq!(
        map.log,
        vec![
            (Op::Insert, key(0, "10.0.0.2")),
            (Op::Remove, key(0, "10.0.0.1"))
        ]
    );
}

#[test]
fn an_unreadable_map_is_left_untouched() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.1"), ep(1));
    map.unreadable = true;
    let err = sync(&mut map, &BTreeMap::new(), net0).unwrap_err();
    assert_eq!(err.to_string(), "cannot read the map");
    assert_eq!(
        cozyplane_errors::Chain(&err).to_string(),
        "cannot read the map: injected read failure"
    );
    assert!(map.log.is_empty());
    assert_eq!(map.entries.len(), 1);
}

#[test]
fn compile_then_sync_end_to_end() {
    // a topology change moves a pod between nodes and removes another: one
    // sync replaces and prunes exactly those
    use crate::compile::compile;
    use crate::ipam::Claimant;
    use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    let node = |name: &str, addr: &str| Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: addr.into(),
            }]),
            ..NodeStatus::default()
        }),
    };
    let fip = |addr: &str, node: &str| {
        Claimant {
            namespace: "ns".into(),
            name: "p".into(),
            uid: "u".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            node: node.into(),
        }
        .claim_for(addr.parse().unwrap())
    };
    let nodes = vec![
        node("a", "192.168.1.1"),
        node("b", "192.168.1.2"),
        node("c", "192.168.1.3"),
    ];
    let mut map = Map::default();
    map.entries.insert(key(100, "10.9.0.1"), ep(3)); // a VPC entry
    let t1 = compile(&nodes, &[fip("10.0.0.1", "b"), fip("10.0.0.2", "b")], "a");
    let r = sync(&mut map, &t1.remotes, net0).unwrap();
    assert_eq!(r.inserted, 2);
    let t2 = compile(&nodes, &[fip("10.0.0.1", "c")], "a");
    let r = sync(&mut map, &t2.remotes, net0).unwrap();
    assert_eq!((r.inserted, r.replaced, r.removed), (0, 1, 1));
    assert_eq!(map.entries[&key(0, "10.0.0.1")], ep(3));
    assert_eq!(map.entries.len(), 2, "VPC entry kept, stale pod pruned");
}

#[test]
fn a_mirrored_sync_writes_only_the_difference_and_reads_the_map_only_when_full() {
    let mut map = Map::default();
    map.entries.insert(key(0, "10.0.0.9"), ep(9)); // left by an earlier agent
    let mut mirror = Mirror::default();
    let mut want = desired(&[(key(0, "10.0.0.1"), ep(1)), (key(0, "10.0.0.2"), ep(2))]);
    // the first sync is full: it reads the map and prunes what it holds
    let r = mirror.sync(&mut map, &want).unwrap();
    assert_eq!((r.inserted, r.removed), (2, 1));
    // now unreadable: a mirrored sync never reads it
    map.unreadable = true;
    map.log.clear();
    want.insert(key(0, "10.0.0.3"), ep(3));
    want.insert(key(0, "10.0.0.1"), ep(7));
    want.remove(&key(0, "10.0.0.2"));
    let r = mirror.sync(&mut map, &want).unwrap();
    assert_eq!(
        (r.inserted, r.replaced, r.removed, r.unchanged),
        (1, 1, 1, 0)
    );
    assert_eq!(
        map.log,
        vec![
            (Op::Replace, key(0, "10.0.0.1")),
            (Op::Insert, key(0, "10.0.0.3")),
            (Op::Remove, key(0, "10.0.0.2")),
        ],
        "make before break, and nothing unchanged rewritten"
    );
    let r = mirror.sync(&mut map, &want).unwrap();
    assert_eq!((r.unchanged, r.changed()), (2, false));
    assert_eq!(map.entries, want);
}

#[test]
fn a_failed_write_or_an_old_mirror_makes_the_next_sync_full() {
    let mut map = Map::default();
    let mut mirror = Mirror::default();
    let want = desired(&[(key(0, "10.0.0.1"), ep(1)), (key(0, "10.0.0.2"), ep(2))]);
    map.failing.push(key(0, "10.0.0.2"));
    assert!(!mirror.sync(&mut map, &want).unwrap().converged());
    map.failing.clear();
    // somebody else removed an entry meanwhile: only a full sync sees it
    map.entries.remove(&key(0, "10.0.0.1"));
    assert!(mirror.sync(&mut map, &want).unwrap().converged());
    assert_eq!(map.entries, want);

    // a trusted mirror does not see drift; once it is old, a full sync does
    let mut mirror = Mirror::with_full_every(std::time::Duration::ZERO);
    assert!(mirror.sync(&mut map, &want).unwrap().converged());
    map.entries.insert(key(0, "10.0.0.1"), ep(9)); // drift
    let r = mirror.sync(&mut map, &want).unwrap();
    assert_eq!(r.replaced, 1, "the drift was read and corrected");
    assert_eq!(map.entries, want);

    let mut mirror = Mirror::default();
    assert!(mirror.sync(&mut map, &want).unwrap().converged());
    map.entries.insert(key(0, "10.0.0.1"), ep(9));
    let r = mirror.sync(&mut map, &want).unwrap();
    assert_eq!(r.unchanged, 2, "trusted: the drift is not read");
    // an unreadable map fails the full sync and drops the mirror
    let mut mirror = Mirror::with_full_every(std::time::Duration::ZERO);
    map.unreadable = true;
    assert!(mirror.sync(&mut map, &want).is_err());
    map.unreadable = false;
    assert!(mirror.sync(&mut map, &want).unwrap().converged());
    assert_eq!(map.entries, want);
}
