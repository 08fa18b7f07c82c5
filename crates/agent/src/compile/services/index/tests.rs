use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::*;
use crate::compile::services::{compile_services, desired_frontend, to_desired};

/// A xorshift generator: the walk is the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

const NAMES: [(&str, &str); 6] = [
    ("a", "web"),
    ("a", "api"),
    ("b", "web"),
    ("b", "db"),
    ("c", "lb"),
    ("c", "np"),
];

/// Pod addresses the walk draws from; the first 8 start as cluster addresses.
fn pool(i: u64) -> String {
    if i % 5 == 4 {
        format!("fd00::{}", i + 1)
    } else {
        format!("10.0.0.{}", i + 1)
    }
}

fn random_service(rng: &mut Rng, (ns, name): (&str, &str), version: u64) -> Service {
    let ty = ["ClusterIP", "NodePort", "LoadBalancer"][rng.below(3) as usize];
    // a ClusterIP two Services may share: the conflict rule is exercised
    let vip = format!("10.96.0.{}", 10 + rng.below(4));
    let mut spec = json!({
        "type": ty,
        "clusterIP": vip,
        "clusterIPs": [vip, format!("fd96::{}", 10 + rng.below(4))],
        "ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30000 + rng.below(3)},
            {"name": "dns", "port": 53, "protocol": "UDP"}
        ],
        "externalTrafficPolicy": if rng.below(2) == 0 { "Local" } else { "Cluster" },
    });
    if rng.below(3) == 0 {
        spec["internalTrafficPolicy"] = json!("Local");
    }
    if rng.below(3) == 0 {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    if rng.below(4) == 0 {
        spec["loadBalancerSourceRanges"] = json!(["198.51.100.0/24"]);
    }
    let mut svc = json!({
        "metadata": {"namespace": ns, "name": name, "uid": format!("{ns}-{name}"),
                     "resourceVersion": version.to_string()},
        "spec": spec,
    });
    if ty == "LoadBalancer" {
        svc["status"] = json!({"loadBalancer": {"ingress": [
            {"ip": format!("203.0.113.{}", rng.below(3))}, {"ip": "2001:db8::1"}
        ]}});
    }
    serde_json::from_value(svc).unwrap()
}

fn random_slice(rng: &mut Rng, ns: &str, slice: &str, version: u64) -> EndpointSlice {
    let svc = ["web", "api", "db", "lb", "np"][rng.below(5) as usize];
    let v6 = rng.below(4) == 0;
    let node = |rng: &mut Rng| ["n1", "n2"][rng.below(2) as usize];
    let endpoints: Vec<serde_json::Value> = (0..rng.below(5))
        .map(|_| {
            let mut i = rng.below(12);
            if v6 {
                i = i / 5 * 5 + 4;
            } else if i % 5 == 4 {
                i -= 1;
            }
            json!({
                "addresses": [pool(i)],
                "nodeName": node(rng),
                "conditions": {
                    "ready": rng.below(4) != 0,
                    "serving": true,
                    "terminating": rng.below(4) == 0,
                },
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": slice, "uid": format!("{ns}-{slice}"),
                     "resourceVersion": version.to_string(),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": if v6 { "IPv6" } else { "IPv4" },
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 5353, "protocol": "UDP"}],
    }))
    .unwrap()
}

fn view(cluster: &BTreeSet<IpAddr>, addresses: &[&str]) -> NodeView {
    NodeView {
        name: "n1".into(),
        addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        cluster_addresses: cluster.clone(),
        external_backends: Vec::new(),
        proxy_name: None,
    }
}

/// Over a walk of Service, slice and view changes, the index compiles what
/// the full compile does, and names exactly the frontends that changed.
#[test]
fn the_index_agrees_with_a_full_compile_over_a_walk_of_changes() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cluster: BTreeSet<IpAddr> = (0..8).map(|i| pool(i).parse().unwrap()).collect();
    let mut addresses = vec!["192.168.0.1"];
    let mut index = ServiceIndex::new(view(&cluster, &addresses));
    let mut services: BTreeMap<(String, String), Service> = BTreeMap::new();
    let mut slices: BTreeMap<(String, String), EndpointSlice> = BTreeMap::new();
    let mut before = SvcDesired::new();
    let mut recompiled = 0;
    for version in 1..600u64 {
        match rng.below(10) {
            0..=2 => {
                let (ns, name) = NAMES[rng.below(6) as usize];
                let svc = random_service(&mut rng, (ns, name), version);
                index.apply_service(&svc);
                services.insert((ns.into(), name.into()), svc);
            }
            3 => {
                let (ns, name) = NAMES[rng.below(6) as usize];
                if let Some(svc) = services.remove(&(ns.to_string(), name.to_string())) {
                    index.delete_service(&svc);
                }
            }
            4..=6 => {
                let ns = ["a", "b", "c"][rng.below(3) as usize];
                let name = format!("s{}", rng.below(8));
                let slice = random_slice(&mut rng, ns, &name, version);
                index.apply_slice(&slice);
                slices.insert((ns.into(), name), slice);
            }
            7 => {
                let ns = ["a", "b", "c"][rng.below(3) as usize];
                let name = format!("s{}", rng.below(8));
                if let Some(slice) = slices.remove(&(ns.to_string(), name)) {
                    index.delete_slice(&slice);
                }
            }
            8 => {
                // a pod comes or goes
                let a: IpAddr = pool(rng.below(12)).parse().unwrap();
                if !cluster.remove(&a) {
                    cluster.insert(a);
                }
                index.set_view(view(&cluster, &addresses));
            }
            _ => {
                // a relist re-delivers an unchanged object: nothing to do
                if let Some(svc) = services.values().next() {
                    index.apply_service(svc);
                }
                if rng.below(10) == 0 {
                    addresses = if addresses.len() == 1 {
                        vec!["192.168.0.1", "192.168.1.1"]
                    } else {
                        vec!["192.168.0.1"]
                    };
                    index.set_view(view(&cluster, &addresses));
                }
            }
        }
        recompiled += index.compile();
        let all_services: Vec<Service> = services.values().cloned().collect();
        let all_slices: Vec<EndpointSlice> = slices.values().cloned().collect();
        let full = compile_services(&all_services, &all_slices, &view(&cluster, &addresses));
        assert_eq!(index.tables(), full, "at version {version}");
        let desired = to_desired(&full);
        assert_eq!(index.desired(), &desired, "at version {version}");
        let differ: BTreeSet<SvcKey> = desired
            .iter()
            .filter(|(k, d)| before.get(k) != Some(d))
            .map(|(k, _)| *k)
            .chain(before.keys().filter(|k| !desired.contains_key(k)).copied())
            .collect();
        assert_eq!(index.take_changes(), differ, "at version {version}");
        // every desired frontend names the Service that won it
        for (k, fe) in &full.frontends {
            let (svc, _) = desired_frontend(k, fe);
            let (owner, key) = index.owner(&svc).expect("an owner");
            assert_eq!(key, k);
            assert_eq!(
                (
                    owner.metadata.namespace.as_deref(),
                    owner.metadata.name.as_deref()
                ),
                (Some(fe.service.0.as_str()), Some(fe.service.1.as_str()))
            );
        }
        before = desired;
    }
    assert!(!before.is_empty());
    // incremental: far fewer recompiles than a full compile per step
    assert!(
        recompiled < 600 * NAMES.len() / 3,
        "{recompiled} recompiles"
    );
}

/// A relist re-delivers what the index holds: nothing is recompiled.
#[test]
fn an_unchanged_object_marks_nothing_dirty() {
    let mut rng = Rng(7);
    let cluster: BTreeSet<IpAddr> = (0..8).map(|i| pool(i).parse().unwrap()).collect();
    let mut index = ServiceIndex::new(view(&cluster, &["192.168.0.1"]));
    let svc = random_service(&mut rng, ("a", "web"), 1);
    let slice = random_slice(&mut rng, "a", "s1", 2);
    index.apply_service(&svc);
    index.apply_slice(&slice);
    assert!(index.compile() >= 1);
    assert!(!index.take_changes().is_empty());
    index.apply_service(&svc);
    index.apply_slice(&slice);
    index.set_view(view(&cluster, &["192.168.0.1"]));
    assert_eq!(index.compile(), 0);
    assert!(index.take_changes().is_empty());
    // a pod address no slice names recompiles nothing either
    let mut more = cluster.clone();
    more.insert("10.0.9.9".parse().unwrap());
    index.set_view(view(&more, &["192.168.0.1"]));
    assert_eq!(index.compile(), 0);
}
