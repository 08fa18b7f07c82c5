//! Compile time of the SecurityGroup compiler at the issue's scale: 5 000
//! Ports (with their pods) and 200 SecurityGroups in one VPC. Each group
//! selects `app=app<k>` and has two ingress rules (TCP 8000-8010 from the
//! next group, TCP 443 from 10.0.0.0/8) and one egress rule (anything to
//! the previous group). Measured, never asserted.
//!
//! The agent keeps the compile's input as an index its watches update per
//! event (`SgIndex`), so what it does on a change is: update the index for
//! the changed object, then compile from the index. The headline figure is
//! that compile; the bench reports the updates beside it (one Port's label
//! snapshot, one pod's labels, one SecurityGroup, an unchanged Port seen
//! again by a relist, and building the whole index from nothing, as at
//! start), the pure `compile_security_groups` over the object lists (index
//! built inside, measured), and the compiler before the rework
//! (`reference.rs`), alternating with the index compile on the same input.
//! Run with `cargo bench -p cozyplane-agent --bench compile_security_groups`;
//! with `COZYPLANE_BENCH_PROFILE=<n>` it runs only the index compile n
//! times, for a profile of it alone (`perf record`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use cozyplane_agent::compile::security_groups::{compile_security_groups, SgIndex};
// what the reference module takes from its parent
use cozyplane_agent::compile::security_groups::{CompiledSecurityGroups, SgDiagnostic};
use cozyplane_api::{Port, SecurityGroup, VPC};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// The compiler before the rework (the unit tests' oracle).
#[path = "../src/compile/security_groups/reference.rs"]
mod reference;

const PORTS: u32 = 5_000;
const GROUPS: u32 = 200;

/// The index as the agent's watches build it: one apply per object.
fn watched(vpcs: &[VPC], groups: &[SecurityGroup], ports: &[Port], pods: &[Pod]) -> SgIndex {
    let mut index = SgIndex::new();
    vpcs.iter().for_each(|o| index.apply(o));
    groups.iter().for_each(|o| index.apply(o));
    pods.iter().for_each(|o| index.apply(o));
    ports.iter().for_each(|o| index.apply(o));
    index
}

/// The median time of `f` over `runs` alternating calls with `a` and `b`
/// (an update and its undo, so the state stays the same).
fn median_alternating<T>(runs: usize, a: &T, b: &T, mut f: impl FnMut(&T)) -> Duration {
    let mut t: Vec<Duration> = (0..runs)
        .map(|i| {
            let o = if i % 2 == 0 { a } else { b };
            let s = Instant::now();
            f(o);
            s.elapsed()
        })
        .collect();
    t.sort();
    t[runs / 2]
}

fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut t: Vec<Duration> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed()
        })
        .collect();
    t.sort();
    t[runs / 2]
}

fn main() {
    let vpcs: Vec<VPC> = vec![serde_json::from_value(json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
        "metadata": {"namespace": "t1", "name": "net"},
        "spec": {"cidrs": ["10.0.0.0/16"]},
        "status": {"vni": 100},
    }))
    .unwrap()];
    let groups: Vec<SecurityGroup> = (0..GROUPS)
        .map(|k| {
            serde_json::from_value(json!({
                "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "SecurityGroup",
                "metadata": {"namespace": "t1", "name": format!("g{k}"), "uid": format!("uid-{k}"), "resourceVersion": "1"},
                "spec": {
                    "vpcRef": {"name": "net"},
                    "podSelector": {"matchLabels": {"app": format!("app{k}")}},
                    "ingress": [
                        {"from": {"group": format!("g{}", (k + 1) % GROUPS)},
                         "ports": [{"protocol": "TCP", "port": 8000, "endPort": 8010}]},
                        {"from": {"cidr": "10.0.0.0/8"}, "ports": [{"protocol": "TCP", "port": 443}]},
                    ],
                    "egress": [{"to": {"group": format!("g{}", (k + GROUPS - 1) % GROUPS)}}],
                },
            }))
            .unwrap()
        })
        .collect();
    let ports: Vec<Port> = (0..PORTS)
        .map(|i| {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + 2 + i));
            serde_json::from_value(json!({
                "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port",
                "metadata": {"name": cozyplane_api::names::port_name(100, ip), "resourceVersion": "1"},
                "spec": {
                    "vpcRef": {"namespace": "t1", "name": "net"},
                    "ip": ip.to_string(),
                    "podNamespace": "apps", "podName": format!("p{i}"),
                },
            }))
            .unwrap()
        })
        .collect();
    let pods: Vec<Pod> = (0..PORTS)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"namespace": "apps", "name": format!("p{i}"), "resourceVersion": "1", "labels": {
                    "app": format!("app{}", i % GROUPS),
                    "pod-template-hash": format!("h{i}"),
                }},
            }))
            .unwrap()
        })
        .collect();

    let mut index = watched(&vpcs, &groups, &ports, &pods);
    let c = index.compile();
    assert!(c.diagnostics.is_empty(), "{:?}", c.diagnostics);
    assert_eq!(c.desired.members.len(), PORTS as usize);
    assert_eq!(compile_security_groups(&vpcs, &groups, &ports, &pods), c);
    assert_eq!(
        reference::compile_security_groups(&vpcs, &groups, &ports, &pods),
        c
    );
    // `COZYPLANE_BENCH_PROFILE=<n>`: only the index compile, n times (for
    // `perf record` of it alone), no figures
    if let Some(n) = std::env::var("COZYPLANE_BENCH_PROFILE")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        for _ in 0..n {
            black_box(black_box(&index).compile());
        }
        return;
    }
    // alternately, so all three see the same load
    let (mut now, mut lists, mut before) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..21 {
        now.push(median(1, || {
            black_box(black_box(&index).compile());
        }));
        lists.push(median(1, || {
            black_box(compile_security_groups(
                black_box(&vpcs),
                black_box(&groups),
                black_box(&ports),
                black_box(&pods),
            ));
        }));
        before.push(median(1, || {
            black_box(reference::compile_security_groups(
                black_box(&vpcs),
                black_box(&groups),
                black_box(&ports),
                black_box(&pods),
            ));
        }));
    }
    now.sort();
    lists.sort();
    before.sort();
    let (t, lists, before) = (now[10], lists[10], before[10]);

    // what a change costs the index (each update undone by the next, so
    // every run sees the same state)
    let port = &ports[7];
    let mut moved = port.clone();
    moved.metadata.resource_version = Some("2".into());
    moved.metadata.annotations = Some(
        [(
            cozyplane_api::labels::ANNOTATION_POD_LABELS.to_string(),
            r#"{"app":"app9","pod-template-hash":"h7"}"#.to_string(),
        )]
        .into(),
    );
    let port_update = median_alternating(1000, &moved, port, |p| {
        index.apply(black_box(p));
    });
    let relisted = median(1001, || {
        index.apply(black_box(port));
    });
    let pod = &pods[7];
    let mut relabelled = pod.clone();
    relabelled.metadata.resource_version = Some("2".into());
    relabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app".into(), "app9".into());
    let pod_update = median_alternating(1000, &relabelled, pod, |p| {
        index.apply(black_box(p));
    });
    let group = &groups[7];
    let mut changed = group.clone();
    changed.metadata.resource_version = Some("2".into());
    changed.spec.ingress[1].ports[0].port = 8443;
    let group_update = median_alternating(1000, &changed, group, |g| {
        index.apply(black_box(g));
    });
    // a SecurityGroup change as the agent handles it: update, compile
    let change_and_compile = median_alternating(20, &changed, group, |g| {
        index.apply(black_box(g));
        black_box(index.compile());
    });
    assert_eq!(index.compile(), c);
    let build = median(21, || {
        black_box(watched(&vpcs, &groups, &ports, &pods));
    });

    let groups_only = watched(&vpcs, &groups, &[], &[]);
    let rules_only = median(21, || {
        black_box(groups_only.compile());
    });
    let no_pods_index = watched(&vpcs, &groups, &ports, &[]);
    let no_pods = median(21, || {
        black_box(no_pods_index.compile());
    });
    // as on a node: other nodes' pods are not given, their Ports' labels come
    // from the Port's snapshot annotation (parsed once, into the index)
    let snapshot_ports: Vec<Port> = ports
        .iter()
        .zip(&pods)
        .map(|(port, pod)| {
            let mut port = port.clone();
            let labels = serde_json::to_string(&pod.metadata.labels).unwrap();
            port.metadata.annotations = Some(
                [(
                    cozyplane_api::labels::ANNOTATION_POD_LABELS.to_string(),
                    labels,
                )]
                .into(),
            );
            port
        })
        .collect();
    let snapshot_index = watched(&vpcs, &groups, &snapshot_ports, &[]);
    assert_eq!(snapshot_index.compile().desired, c.desired);
    let snapshots = median(21, || {
        black_box(snapshot_index.compile());
    });
    let snapshot_build = median(21, || {
        black_box(watched(&vpcs, &groups, &snapshot_ports, &[]));
    });
    println!("  of which: groups and rules alone {rules_only:?}; Ports without pods {no_pods:?}");
    println!("  labels from the Ports' snapshots instead of pods (as on a node): {snapshots:?}");
    println!(
        "  index updates (median of 1000): one Port's label snapshot {port_update:?}; one pod's \
         labels {pod_update:?}; one SecurityGroup {group_update:?}; an unchanged Port relisted \
         {relisted:?}"
    );
    println!(
        "  a SecurityGroup change as the agent handles it (index update + compile): \
         {change_and_compile:?} (median of 20)"
    );
    println!(
        "  the index built from nothing (agent start): {build:?}; from snapshots, no pods: \
         {snapshot_build:?} (median of 21)"
    );
    println!(
        "  compile_security_groups over the object lists (index built inside), alternating: \
         {lists:?} (median of 21)"
    );
    println!(
        "  the compiler before its rework, same input, alternating runs: {before:?} (median of 21)"
    );
    println!(
        "compile {PORTS} Ports / {GROUPS} SecurityGroups from the index: {t:?} (median of 21; {} \
         members, {} rule entries, {} CIDR entries)",
        c.desired.members.len(),
        c.desired.rules.len(),
        c.desired.cidrs.len()
    );
}
