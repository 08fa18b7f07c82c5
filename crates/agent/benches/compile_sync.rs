//! Throughput of the agent's pure core at cluster scale, measured (never
//! asserted): compile a topology, sync it into a map, and allocate
//! addresses through the in-memory claim store. Run with
//! `cargo bench -p cozyplane-agent`; prints one line per figure.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use cozyplane_agent::compile::compile;
use cozyplane_agent::desired::{RemoteKey, TunnelEndpoint};
use cozyplane_agent::ipam::memory::MemoryClaimStore;
use cozyplane_agent::ipam::{Claimant, FabricIpam, Ipam, Pools};
use cozyplane_agent::sync::{sync, MemoryMap};
use cozyplane_api::FabricIP;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const NODES: u32 = 500;
const PODS: u32 = 50_000;

fn node(i: u32) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(format!("node-{i}")),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: Ipv4Addr::from(0xc0a8_0000 + i).to_string(),
            }]),
            ..NodeStatus::default()
        }),
    }
}

fn fip(i: u32) -> FabricIP {
    Claimant {
        namespace: "ns".into(),
        name: format!("p{i}"),
        uid: format!("u{i}"),
        container_id: format!("c{i}"),
        ifname: "eth0".into(),
        node: format!("node-{}", i % NODES),
    }
    .claim_for(IpAddr::V4(Ipv4Addr::from(0x0af4_0000 + i)))
}

/// Median of `runs` timings of `f`.
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

fn owns(_: &RemoteKey, _: &TunnelEndpoint) -> bool {
    true
}

fn main() {
    let nodes: Vec<Node> = (0..NODES).map(node).collect();
    let fips: Vec<FabricIP> = (0..PODS).map(fip).collect();

    let t = median(7, || {
        black_box(compile(black_box(&nodes), black_box(&fips), "node-0"));
    });
    println!("compile {NODES} nodes + {PODS} FabricIPs: {t:?} (median of 7)");

    let topo = compile(&nodes, &fips, "node-0");
    let desired: BTreeMap<RemoteKey, TunnelEndpoint> = topo.remotes;
    let t = median(7, || {
        let mut map = MemoryMap::default();
        black_box(sync(&mut map, &desired, owns).ok());
    });
    println!("sync {} remotes into an empty map: {t:?}", desired.len());

    let mut map = MemoryMap::default();
    let _ = sync(&mut map, &desired, owns);
    let t = median(7, || {
        black_box(sync(&mut map, &desired, owns).ok());
    });
    println!(
        "re-sync {} remotes, already converged: {t:?}",
        desired.len()
    );

    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    };
    let pools = match Pools::parse("10.244.0.0/16", &[]) {
        Ok(p) => p,
        Err(e) => panic!("pools: {e}"),
    };
    let ipam = FabricIpam::new(MemoryClaimStore::new(), pools);
    let n = 20_000u32;
    let start = Instant::now();
    rt.block_on(async {
        for i in 0..n {
            let who = Claimant {
                namespace: "ns".into(),
                name: format!("p{i}"),
                uid: format!("uid-{i}"),
                container_id: format!("c{i}"),
                ifname: "eth0".into(),
                node: "node-0".into(),
            };
            if let Err(e) = ipam.allocate(&who).await {
                panic!("allocate {i}: {e}");
            }
        }
    });
    let took = start.elapsed();
    println!(
        "allocate {n} pods into a /16 (memory store; time dominated by its linear label scan, \
         the API round trips are what counts): {:?} per pod, {:.2} creates per pod",
        took / n,
        ipam.store().create_calls() as f64 / f64::from(n)
    );
}
