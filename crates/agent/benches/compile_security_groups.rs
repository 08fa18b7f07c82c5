//! Compile time of the SecurityGroup compiler at the scale: 5 000
//! Ports (with their pods) and 200 SecurityGroups in one VPC, the worst case
//! for member selection (every group is a candidate for every Port). Each
//! group selects `app=app<k>` and has two ingress rules (TCP 8000-8010 from
//! the next group, TCP 443 from 10.0.0.0/8) and one egress rule (anything to
//! the previous group). Measured, never asserted. Run with
//! `cargo bench -p cozyplane-agent --bench compile_security_groups`; with
//! `COZYPLANE_BENCH_PROFILE=<n>` it runs only the current compiler n times,
//! for a profile of it alone (`perf record`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use cozyplane_agent::compile::security_groups::compile_security_groups;
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
                "metadata": {"namespace": "t1", "name": format!("g{k}"), "uid": format!("uid-{k}")},
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
                "metadata": {"name": cozyplane_api::names::port_name(100, ip)},
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
                "metadata": {"namespace": "apps", "name": format!("p{i}"), "labels": {
                    "app": format!("app{}", i % GROUPS),
                    "pod-template-hash": format!("h{i}"),
                }},
            }))
            .unwrap()
        })
        .collect();

    let c = compile_security_groups(&vpcs, &groups, &ports, &pods);
    assert!(c.diagnostics.is_empty(), "{:?}", c.diagnostics);
    assert_eq!(c.desired.members.len(), PORTS as usize);
    assert_eq!(
        reference::compile_security_groups(&vpcs, &groups, &ports, &pods),
        c
    );
    // `COZYPLANE_BENCH_PROFILE=<n>`: only the current compiler, n times (for
    // `perf record` of it alone), no figures
    if let Some(n) = std::env::var("COZYPLANE_BENCH_PROFILE")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        for _ in 0..n {
            black_box(compile_security_groups(
                black_box(&vpcs),
                black_box(&groups),
                black_box(&ports),
                black_box(&pods),
            ));
        }
        return;
    }
    // alternately, so both see the same load
    let (mut now, mut before) = (Vec::new(), Vec::new());
    for _ in 0..21 {
        now.push(median(1, || {
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
    before.sort();
    let (t, before) = (now[10], before[10]);
    let rules_only = median(21, || {
        black_box(compile_security_groups(&vpcs, &groups, &[], &[]));
    });
    let no_pods = median(21, || {
        black_box(compile_security_groups(&vpcs, &groups, &ports, &[]));
    });
    // as on a node: other nodes' pods are not given, their Ports' labels come
    // from the Port's snapshot annotation (parsed per compile)
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
    assert_eq!(
        compile_security_groups(&vpcs, &groups, &snapshot_ports, &[]).desired,
        c.desired
    );
    let snapshots = median(21, || {
        black_box(compile_security_groups(
            &vpcs,
            &groups,
            &snapshot_ports,
            &[],
        ));
    });
    println!("  of which: groups and rules alone {rules_only:?}; Ports without pods {no_pods:?}");
    println!("  labels from the Ports' snapshots instead of pods (as on a node): {snapshots:?}");
    println!(
        "  the compiler before its rework, same input, alternating runs: {before:?} (median of 21)"
    );
    println!(
        "compile {PORTS} Ports / {GROUPS} SecurityGroups: {t:?} (median of 21; {} members, {} rule \
         entries, {} CIDR entries)",
        c.desired.members.len(),
        c.desired.rules.len(),
        c.desired.cidrs.len()
    );
}
