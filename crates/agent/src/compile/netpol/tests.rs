//! The compile against a reference model written from the API reference
//! (not from the compiler): a simulator answers, from the compiled maps
//! alone and with the datapath's lookups (identity, any, longest CIDR
//! class; LPM over protocol and port bits), whether a new flow is
//! admitted; the model answers from the objects. Targeted cases first,
//! then a random walk over policies, labels and namespaces.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use cozyplane_datapath::abi::{np_ep_key, NP_EGRESS, NP_INGRESS};
use serde_json::{json, Value};

use super::*;

const NODE: &str = "n1";
/// This node's address and another node's.
const NODE_IP: &str = "10.1.0.1";
const NODE2_IP: &str = "10.1.0.2";

fn hosts() -> NpHosts {
    NpHosts {
        nodes: vec![NODE_IP.parse().unwrap(), NODE2_IP.parse().unwrap()],
        local_node: vec![NODE_IP.parse().unwrap()],
        ..NpHosts::default()
    }
}

fn pod(ns: &str, name: &str, node: &str, ip: &str, labels: Value, ports: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "ports": ports}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }))
    .unwrap()
}

fn namespace(name: &str, labels: Value) -> Namespace {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn policy(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// The datapath's verdict for a new flow, from the compiled maps (the
/// datapath's lookups, [`explain::lookup`]): may the subject at `subj`
/// take (`dir` ingress) or send (`dir` egress) traffic with `peer` on
/// `proto`/`port`?
fn sim(c: &NpDesired, subj: IpAddr, peer: IpAddr, dir: u8, proto: u8, port: u16) -> bool {
    explain::lookup(c, &np_ep_key(subj), peer, dir, proto, port).passes()
}

/// [`sim`] for the node itself (the host's pseudo endpoint).
fn sim_host(c: &NpDesired, peer: IpAddr, dir: u8, proto: u8, port: u16) -> bool {
    let key = cozyplane_datapath::abi::np_host_key();
    explain::lookup(c, &key, peer, dir, proto, port).passes()
}

/// A rule's peers and ports, either direction.
type RuleParts = (
    Option<Vec<NetworkPolicyPeer>>,
    Option<Vec<NetworkPolicyPort>>,
);

/// The reference: the API reference's semantics over the objects.
struct Model<'a> {
    policies: &'a [NetworkPolicy],
    pods: &'a [Pod],
    namespaces: &'a [Namespace],
}

fn labels_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

impl Model<'_> {
    fn pod_at(&self, ip: IpAddr) -> Option<&Pod> {
        self.pods.iter().find(|p| pod_ips(p).contains(&ip))
    }

    fn ns_labels(&self, ns: &str) -> BTreeMap<String, String> {
        self.namespaces
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .map(|n| labels_of(&n.metadata))
            .unwrap_or_default()
    }

    fn peer_matches(
        &self,
        policy_ns: &str,
        peer: &NetworkPolicyPeer,
        ip: IpAddr,
        ingress: bool,
    ) -> bool {
        // entity peers: the label alone in the namespaceSelector
        if let Some(entity) = peer
            .namespace_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|m| m.get("policy.cozyplane.io/entity"))
        {
            let ip_s = ip.to_string();
            return match entity.as_str() {
                "nodes" => ingress && (ip_s == NODE_IP || ip_s == NODE2_IP),
                "local-node" => ingress && ip_s == NODE_IP,
                "local-pods" => self
                    .pod_at(ip)
                    .is_some_and(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(NODE)),
                _ => false,
            };
        }
        if let Some(b) = &peer.ip_block {
            let net: IpNet = b.cidr.parse().unwrap();
            return net.contains(&ip)
                && !b
                    .except
                    .iter()
                    .flatten()
                    .any(|e| e.parse::<IpNet>().unwrap().contains(&ip));
        }
        let Some(p) = self.pod_at(ip) else {
            return false;
        };
        let ns = p.metadata.namespace.as_deref().unwrap();
        let ns_ok = match &peer.namespace_selector {
            None => ns == policy_ns,
            Some(sel) => selector_matches(sel, &self.ns_labels(ns)).unwrap(),
        };
        let pod_ok = match &peer.pod_selector {
            None => true,
            Some(sel) => selector_matches(sel, &labels_of(&p.metadata)).unwrap(),
        };
        ns_ok && pod_ok
    }

    fn port_matches(
        &self,
        ports: &Option<Vec<NetworkPolicyPort>>,
        dst: IpAddr,
        proto: u8,
        port: u16,
    ) -> bool {
        let Some(ports) = ports.as_ref().filter(|p| !p.is_empty()) else {
            return true;
        };
        ports.iter().any(|p| {
            if proto_of(p.protocol.as_deref()) != Some(proto) {
                return false;
            }
            match &p.port {
                None => true,
                Some(IntOrString::Int(n)) => {
                    let hi = p.end_port.unwrap_or(*n);
                    i32::from(port) >= *n && i32::from(port) <= hi
                }
                Some(IntOrString::String(name)) => self.pod_at(dst).is_some_and(|d| {
                    named_ports(d)
                        .iter()
                        .any(|np| np.name == *name && np.proto() == Some(proto) && np.port == port)
                }),
            }
        })
    }

    /// May `subj` take (ingress) / send (egress) this flow with `peer`?
    fn allows(&self, subj: IpAddr, peer: IpAddr, dir: u8, proto: u8, port: u16) -> bool {
        let pod = self.pod_at(subj).unwrap();
        let ns = pod.metadata.namespace.as_deref().unwrap();
        let labels = labels_of(&pod.metadata);
        let dst = if dir == NP_INGRESS { subj } else { peer };
        let mut isolated = false;
        for p in self.policies {
            if p.metadata.namespace.as_deref() != Some(ns) {
                continue;
            }
            let spec = p.spec.as_ref().unwrap();
            if !selector_matches(
                spec.pod_selector.as_ref().unwrap_or(&Default::default()),
                &labels,
            )
            .unwrap()
            {
                continue;
            }
            let (ing, eg) = policy_types(p);
            let rules: Vec<RuleParts> = if dir == NP_INGRESS {
                if !ing {
                    continue;
                }
                spec.ingress
                    .iter()
                    .flatten()
                    .map(|r| (r.from.clone(), r.ports.clone()))
                    .collect()
            } else {
                if !eg {
                    continue;
                }
                spec.egress
                    .iter()
                    .flatten()
                    .map(|r| (r.to.clone(), r.ports.clone()))
                    .collect()
            };
            isolated = true;
            for (peers, ports) in rules {
                let peer_ok = match &peers {
                    Some(v) if !v.is_empty() => v
                        .iter()
                        .any(|x| self.peer_matches(ns, x, peer, dir == NP_INGRESS)),
                    _ => true,
                };
                if peer_ok && self.port_matches(&ports, dst, proto, port) {
                    return true;
                }
            }
        }
        !isolated
    }
}

fn world() -> (Vec<Pod>, Vec<Namespace>) {
    let web_ports = json!([{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}]);
    let alt_ports = json!([{"name": "http", "containerPort": 80}]);
    let pods = vec![
        pod(
            "x",
            "a",
            NODE,
            "10.0.1.1",
            json!({"pod": "a"}),
            web_ports.clone(),
        ),
        pod(
            "x",
            "b",
            NODE,
            "10.0.1.2",
            json!({"pod": "b"}),
            alt_ports.clone(),
        ),
        pod("x", "c", "n2", "10.0.2.3", json!({"pod": "c"}), json!([])),
        pod("y", "a", NODE, "10.0.1.4", json!({"pod": "a"}), web_ports),
        pod("y", "b", "n2", "10.0.2.5", json!({"pod": "b"}), alt_ports),
        pod("z", "a", NODE, "10.0.1.6", json!({"pod": "a"}), json!([])),
        pod("z", "c", "n2", "10.0.2.7", json!({"pod": "c"}), json!([])),
    ];
    let namespaces = vec![
        namespace("x", json!({"ns": "x"})),
        namespace("y", json!({"ns": "y", "team": "blue"})),
        namespace("z", json!({"ns": "z", "team": "blue"})),
    ];
    (pods, namespaces)
}

/// Addresses to probe: the pods and three outsiders.
fn addresses(pods: &[Pod]) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = pods.iter().flat_map(pod_ips).collect();
    v.extend(
        ["192.0.2.1", "192.0.2.200", "10.0.9.9", NODE_IP, NODE2_IP]
            .map(|s| s.parse::<IpAddr>().unwrap()),
    );
    v
}

const PROBES: [(u8, u16); 7] = [
    (TCP, 80),
    (TCP, 81),
    (TCP, 8080),
    (UDP, 53),
    (UDP, 80),
    (SCTP, 80),
    (TCP, 9000),
];

/// Every local pod × every address × direction × probe: the compile's
/// verdict (simulated) against the model's. Returns the mismatches.
fn mismatches(policies: &[NetworkPolicy], pods: &[Pod], namespaces: &[Namespace]) -> Vec<String> {
    let c = compile_network_policies(policies, &members_of_pods(pods, NODE), namespaces, &hosts());
    let model = Model {
        policies,
        pods,
        namespaces,
    };
    let mut bad = Vec::new();
    for subj in pods
        .iter()
        .filter(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some(NODE))
        .flat_map(pod_ips)
    {
        for peer in addresses(pods) {
            if peer == subj {
                continue;
            }
            for dir in [NP_INGRESS, NP_EGRESS] {
                for (proto, port) in PROBES {
                    let got = sim(&c.desired, subj, peer, dir, proto, port);
                    let want = model.allows(subj, peer, dir, proto, port);
                    if got != want {
                        bad.push(format!(
                            "{subj} {} {peer} {proto}/{port}: compiled {got}, model {want}",
                            if dir == NP_INGRESS { "<-" } else { "->" }
                        ));
                    }
                }
            }
        }
    }
    bad
}

fn check(policies: &[NetworkPolicy]) {
    let (pods, namespaces) = world();
    let bad = mismatches(policies, &pods, &namespaces);
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn no_policy_isolates_nothing_and_compiles_identities_only() {
    let (pods, namespaces) = world();
    let c = compile_network_policies(&[], &members_of_pods(&pods, NODE), &namespaces, &hosts());
    assert!(c.desired.rules.is_empty());
    assert_eq!(c.desired.eps.len(), pods.len());
    assert!(c.desired.eps.values().all(|e| e.flags == 0));
    // x/a and y/a share labels and ports but not the namespace
    assert_eq!(c.identities, pods.len());
}

#[test]
fn deny_all_isolates_both_ways_and_admits_nothing() {
    let deny = policy(
        "x",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    check(std::slice::from_ref(&deny));
    let (pods, namespaces) = world();
    let c = compile_network_policies(
        &[deny],
        &members_of_pods(&pods, NODE),
        &namespaces,
        &hosts(),
    );
    let a = c.desired.eps[&np_ep_key("10.0.1.1".parse().unwrap())];
    assert_eq!(a.flags, NP_F_ISOLATED_IN | NP_F_ISOLATED_OUT);
    assert!(c.desired.rules.is_empty());
    // another node's pod is not this node's subject
    let remote = c.desired.eps[&np_ep_key("10.0.2.3".parse().unwrap())];
    assert_eq!(remote.flags, 0);
}

#[test]
fn policy_types_default_to_ingress_plus_egress_when_there_are_egress_rules() {
    check(&[
        policy(
            "x",
            "in",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}}),
        ),
        policy(
            "y",
            "out",
            json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
    ]);
}

#[test]
fn peers_by_pod_namespace_both_and_ip_block_with_except() {
    check(&[
        policy(
            "x",
            "from-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
        policy(
            "y",
            "from-blue",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}),
        ),
        policy(
            "z",
            "from-blue-c",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
        ),
        policy(
            "x",
            "block",
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.2.0/24", "10.0.1.4/32"]}}], "ports": [{"port": 80}]}]}),
        ),
    ]);
}

#[test]
fn ports_by_number_range_name_and_protocol() {
    check(&[
        policy(
            "x",
            "named",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}, {"port": "dns", "protocol": "UDP"}]}]}),
        ),
        policy(
            "y",
            "range",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 79, "endPort": 81}, {"protocol": "SCTP"}]}],
                   "egress": [{"ports": [{"port": "http"}]}], "policyTypes": ["Ingress", "Egress"]}),
        ),
        policy(
            "z",
            "egress-named",
            json!({"podSelector": {}, "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]},
                                              {"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"protocol": "UDP", "port": 53}]}],
                   "policyTypes": ["Egress"]}),
        ),
    ]);
}

#[test]
fn an_egress_named_port_towards_a_block_resolves_per_destination_pod() {
    let p = policy(
        "x",
        "named-block",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"ipBlock": {"cidr": "10.0.1.0/24", "except": ["10.0.1.4/32"]}}], "ports": [{"port": "http"}]}], "policyTypes": ["Egress"]}),
    );
    check(std::slice::from_ref(&p));
    let (pods, namespaces) = world();
    let c = compile_network_policies(
        std::slice::from_ref(&p),
        &members_of_pods(&pods, NODE),
        &namespaces,
        &hosts(),
    );
    assert!(c.diagnostics.is_empty());
    let a: IpAddr = "10.0.1.1".parse().unwrap();
    // x/b names 80 http; y/a names 8080 but is excepted
    assert!(sim(
        &c.desired,
        a,
        "10.0.1.2".parse().unwrap(),
        NP_EGRESS,
        TCP,
        80
    ));
    assert!(!sim(
        &c.desired,
        a,
        "10.0.1.2".parse().unwrap(),
        NP_EGRESS,
        TCP,
        8080
    ));
    assert!(!sim(
        &c.desired,
        a,
        "10.0.1.4".parse().unwrap(),
        NP_EGRESS,
        TCP,
        8080
    ));
}

#[test]
fn a_bad_pod_selector_isolates_its_namespace_and_is_reported() {
    let p = policy(
        "x",
        "bad",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Near", "values": ["a"]}]},
               "ingress": [{}]}),
    );
    let (pods, namespaces) = world();
    let c = compile_network_policies(
        std::slice::from_ref(&p),
        &members_of_pods(&pods, NODE),
        &namespaces,
        &hosts(),
    );
    assert!(matches!(
        c.diagnostics[..],
        [NpDiagnostic::BadSelector { .. }]
    ));
    let a: IpAddr = "10.0.1.1".parse().unwrap();
    let y: IpAddr = "10.0.1.4".parse().unwrap();
    assert!(!sim(&c.desired, a, y, NP_INGRESS, TCP, 80));
    // another namespace is untouched
    assert!(sim(&c.desired, y, a, NP_INGRESS, TCP, 80));
}

#[test]
fn ids_are_stable_across_compiles_and_input_order() {
    let (mut pods, namespaces) = world();
    let one = compile_network_policies(&[], &members_of_pods(&pods, NODE), &namespaces, &hosts());
    pods.reverse();
    let two = compile_network_policies(&[], &members_of_pods(&pods, NODE), &namespaces, &hosts());
    assert_eq!(one.desired.eps, two.desired.eps);
    assert!(one
        .desired
        .eps
        .values()
        .all(|e| e.id >= 1 && e.id < NP_PEER_CIDR));
}

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[(self.next() % v.len() as u64) as usize]
    }
}

fn random_peer(r: &mut Rng) -> Value {
    let sel = [
        json!({}),
        json!({"matchLabels": {"pod": "a"}}),
        json!({"matchLabels": {"pod": "b"}}),
        json!({"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["c"]}]}),
    ];
    let nsel = [
        json!({}),
        json!({"matchLabels": {"team": "blue"}}),
        json!({"matchLabels": {"ns": "x"}}),
    ];
    match r.next() % 5 {
        4 => json!({"namespaceSelector": {"matchLabels": {"policy.cozyplane.io/entity":
            r.pick(&["nodes", "local-node", "local-pods"])}}}),
        0 => json!({"podSelector": r.pick(&sel)}),
        1 => json!({"namespaceSelector": r.pick(&nsel)}),
        2 => json!({"namespaceSelector": r.pick(&nsel), "podSelector": r.pick(&sel)}),
        _ => r
            .pick(&[
                json!({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}}),
                json!({"ipBlock": {"cidr": "10.0.1.0/24", "except": ["10.0.1.4/30"]}}),
                json!({"ipBlock": {"cidr": "192.0.2.0/25"}}),
                json!({"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.2.0/24"]}}),
            ])
            .clone(),
    }
}

fn random_ports(r: &mut Rng) -> Value {
    let all = [
        json!({"port": 80}),
        json!({"port": 79, "endPort": 8080}),
        json!({"port": "http"}),
        json!({"port": "dns", "protocol": "UDP"}),
        json!({"protocol": "UDP"}),
        json!({"protocol": "SCTP", "port": 80}),
        json!({"port": 9000}),
    ];
    let n = r.next() % 3;
    Value::Array((0..n).map(|_| r.pick(&all).clone()).collect())
}

fn random_rule(r: &mut Rng, peer_key: &str) -> Value {
    let mut rule = serde_json::Map::new();
    if !r.next().is_multiple_of(4) {
        let n = 1 + r.next() % 2;
        rule.insert(
            peer_key.to_string(),
            Value::Array((0..n).map(|_| random_peer(r)).collect()),
        );
    }
    if !r.next().is_multiple_of(3) {
        rule.insert("ports".to_string(), random_ports(r));
    }
    Value::Object(rule)
}

fn random_policy(r: &mut Rng, n: usize) -> NetworkPolicy {
    let ns = *r.pick(&["x", "y", "z"]);
    let sel = r
        .pick(&[
            json!({}),
            json!({"matchLabels": {"pod": "a"}}),
            json!({"matchLabels": {"pod": "b"}}),
        ])
        .clone();
    let ingress: Vec<Value> = (0..r.next() % 3).map(|_| random_rule(r, "from")).collect();
    let egress: Vec<Value> = (0..r.next() % 3).map(|_| random_rule(r, "to")).collect();
    let mut spec = json!({"podSelector": sel, "ingress": ingress, "egress": egress});
    match r.next() % 4 {
        0 => spec["policyTypes"] = json!(["Ingress"]),
        1 => spec["policyTypes"] = json!(["Egress"]),
        2 => spec["policyTypes"] = json!(["Ingress", "Egress"]),
        _ => {} // defaulted
    }
    policy(ns, &format!("p{n}"), spec)
}

#[test]
fn random_policies_compile_to_the_model_s_verdicts() {
    let (pods, namespaces) = world();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..150 {
        let n = 1 + (r.next() % 4) as usize;
        let policies: Vec<NetworkPolicy> = (0..n).map(|i| random_policy(&mut r, i)).collect();
        let bad = mismatches(&policies, &pods, &namespaces);
        assert!(
            bad.is_empty(),
            "round {round}: {} mismatches for {}:\n{}",
            bad.len(),
            serde_json::to_string_pretty(&policies).unwrap(),
            bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
        );
    }
}

#[test]
fn entity_peers_name_nodes_this_node_and_its_pods() {
    let p = |name: &str, spec: Value| policy("x", name, spec);
    let entity =
        |e: &str| json!({"namespaceSelector": {"matchLabels": {"policy.cozyplane.io/entity": e}}});
    let policies = [
        p(
            "nodes",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [entity("nodes")]}]}),
        ),
        p(
            "local",
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": [{"from": [entity("local-pods")]}]}),
        ),
        p(
            "egress",
            json!({"podSelector": {"matchLabels": {"pod": "b"}}, "policyTypes": ["Egress"],
                          "egress": [{"to": [entity("local-node")]}, {"to": [entity("local-pods")], "ports": [{"port": 80}]}]}),
        ),
        p(
            "bad",
            json!({"podSelector": {}, "ingress": [{"from": [entity("world")]}]}),
        ),
    ];
    check(&policies);
    let (pods, namespaces) = world();
    let c = compile_network_policies(
        &policies,
        &members_of_pods(&pods, NODE),
        &namespaces,
        &hosts(),
    );
    let kinds: Vec<&str> = c
        .diagnostics
        .iter()
        .map(|d| match d {
            NpDiagnostic::BadEntity { .. } => "bad",
            NpDiagnostic::EntityInEgress { .. } => "egress",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["bad", "egress"]);
    let (a, b, remote_c): (IpAddr, IpAddr, IpAddr) = (
        "10.0.1.1".parse().unwrap(),
        "10.0.1.2".parse().unwrap(),
        "10.0.2.3".parse().unwrap(),
    );
    let node2: IpAddr = NODE2_IP.parse().unwrap();
    // nodes: the other node reaches x/a, a pod does not
    assert!(sim(&c.desired, a, node2, NP_INGRESS, TCP, 80));
    assert!(!sim(&c.desired, a, remote_c, NP_INGRESS, TCP, 80));
    // local-pods: x/b admits a co-scheduled pod, not one across nodes
    assert!(sim(&c.desired, b, a, NP_INGRESS, TCP, 80));
    assert!(!sim(&c.desired, b, remote_c, NP_INGRESS, TCP, 80));
}

/// The Cilium subset (cilium.rs): Cozystack's own tenant policies, then
/// Cilium's rules one by one; verdicts from the compiled maps (`sim`).
mod cilium_subset {
    use super::*;
    use cozyplane_api::cilium::{CiliumClusterwideNetworkPolicy, CiliumNetworkPolicy};

    const TENANTS: &str = include_str!("../../../../../examples/cozystack/tenants.yaml");
    const POLICIES: &str = include_str!("../../../../../examples/cozystack/tenant-policies.yaml");
    const APISERVER: &str = "10.1.0.100";

    fn chosts() -> NpHosts {
        NpHosts {
            // the tenant fixture's pods and world()'s
            cluster_cidrs: vec![
                "10.244.0.0/16".parse().unwrap(),
                "10.0.0.0/16".parse().unwrap(),
            ],
            apiserver: vec![APISERVER.parse().unwrap()],
            node_labels: [("kubernetes.io/hostname".to_string(), NODE.to_string())].into(),
            ..hosts()
        }
    }

    fn docs(text: &str) -> Vec<Value> {
        serde_saphyr::from_multiple::<Value>(text).unwrap()
    }

    type Cilium = (
        Vec<CiliumNetworkPolicy>,
        Vec<CiliumClusterwideNetworkPolicy>,
    );

    fn split(docs: Vec<Value>) -> Cilium {
        let mut out: Cilium = Default::default();
        for d in docs {
            match d["kind"].as_str() {
                Some("CiliumNetworkPolicy") => out.0.push(serde_json::from_value(d).unwrap()),
                Some("CiliumClusterwideNetworkPolicy") => {
                    out.1.push(serde_json::from_value(d).unwrap())
                }
                k => panic!("unexpected {k:?}"),
            }
        }
        out
    }

    fn compile(c: &Cilium, pods: &[Pod], namespaces: &[Namespace]) -> CompiledNetworkPolicies {
        compile_policies(
            PolicyInput {
                cilium: &c.0,
                cilium_clusterwide: &c.1,
                ..PolicyInput::default()
            },
            &members_of_pods(pods, NODE),
            namespaces,
            &chosts(),
        )
    }

    /// A new flow src -> dst passes both ends' checks (every pod is local).
    fn flows(c: &NpDesired, src: &str, dst: &str, proto: u8, port: u16) -> bool {
        let (s, d): (IpAddr, IpAddr) = (src.parse().unwrap(), dst.parse().unwrap());
        sim(c, s, d, NP_EGRESS, proto, port) && sim(c, d, s, NP_INGRESS, proto, port)
    }

    #[test]
    fn cozystack_tenant_policies_isolate_unrelated_tenants() {
        let namespaces: Vec<Namespace> = docs(TENANTS)
            .into_iter()
            .map(|d| serde_json::from_value(d).unwrap())
            .collect();
        let pods = vec![
            pod(
                "tenant-root",
                "a",
                NODE,
                "10.244.0.10",
                json!({"app": "a"}),
                json!([]),
            ),
            pod(
                "tenant-root",
                "etcd",
                NODE,
                "10.244.0.11",
                json!({"app.kubernetes.io/instance": "etcd"}),
                json!([]),
            ),
            pod(
                "tenant-alpha",
                "a",
                NODE,
                "10.244.0.20",
                json!({"app": "a"}),
                json!([]),
            ),
            pod(
                "tenant-alpha",
                "b",
                NODE,
                "10.244.0.21",
                json!({"app": "b"}),
                json!([]),
            ),
            pod(
                "tenant-alpha",
                "api",
                NODE,
                "10.244.0.22",
                json!({"policy.cozystack.io/allow-to-apiserver": "true"}),
                json!([]),
            ),
            pod(
                "tenant-beta",
                "a",
                NODE,
                "10.244.0.30",
                json!({"app": "a"}),
                json!([]),
            ),
            pod(
                "kube-system",
                "dns",
                NODE,
                "10.244.0.40",
                json!({"k8s-app": "kube-dns"}),
                json!([]),
            ),
            pod(
                "cozy-dashboard",
                "ui",
                NODE,
                "10.244.0.50",
                json!({"app": "ui"}),
                json!([]),
            ),
        ];
        let c = compile(&split(docs(POLICIES)), &pods, &namespaces);
        // every object is inside the subset
        assert!(c.diagnostics.is_empty(), "{:#?}", c.diagnostics);
        let (root, etcd, alpha, alpha_b, api, beta, dns, ui) = (
            "10.244.0.10",
            "10.244.0.11",
            "10.244.0.20",
            "10.244.0.21",
            "10.244.0.22",
            "10.244.0.30",
            "10.244.0.40",
            "10.244.0.50",
        );
        let world = "203.0.113.7";
        let d = &c.desired;
        let table: &[(&str, &str, u8, u16, bool)] = &[
            // a child tenant: its own namespace, the platform, the world
            (alpha, alpha_b, TCP, 80, true),
            (alpha, dns, UDP, 53, true),
            (alpha, dns, TCP, 53, true),
            (alpha, dns, TCP, 80, false),
            (alpha, ui, TCP, 9999, true),
            (alpha, world, TCP, 443, true),
            (alpha, etcd, TCP, 2379, true), // the parent's etcd
            // not an unrelated tenant, not its parent's other pods, not nodes
            (alpha, beta, TCP, 80, false),
            (alpha, beta, UDP, 53, false),
            (beta, alpha, TCP, 80, false),
            (alpha, root, TCP, 80, false),
            (alpha, NODE2_IP, TCP, 10250, false),
            (alpha, APISERVER, TCP, 443, false),
            // the apiserver only for the labelled pod; its port-only rule
            (api, APISERVER, TCP, 443, true),
            (api, beta, TCP, 6443, true),
            (alpha, beta, TCP, 6443, false),
            // the parent reaches its subtree; platform and outside reach in
            (root, alpha, TCP, 80, true),
            (root, beta, TCP, 80, true),
            (dns, alpha, TCP, 80, true),
            (world, alpha, TCP, 80, true),
            (NODE2_IP, alpha, TCP, 80, true),
        ];
        let bad: Vec<String> = table
            .iter()
            .filter(|(s, t, p, port, want)| flows(d, s, t, *p, *port) != *want)
            .map(|(s, t, p, port, want)| format!("{s} -> {t} {p}/{port}: want {want}"))
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        // the host-firewall CCNP: the world not on the listed ports, the
        // cluster (a pod) on them; other ports open
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(!sim_host(d, ip(world), NP_INGRESS, TCP, 10250));
        assert!(!sim_host(d, ip(world), NP_INGRESS, TCP, 2379));
        assert!(sim_host(d, ip(world), NP_INGRESS, TCP, 8000));
        assert!(sim_host(d, ip(alpha), NP_INGRESS, TCP, 10250));
        assert!(
            sim_host(d, ip(world), NP_EGRESS, TCP, 443),
            "no egress rules"
        );

        // which policy decided, side by side
        let (cnps, ccnps) = split(docs(POLICIES));
        let input = PolicyInput {
            cilium: &cnps,
            cilium_clusterwide: &ccnps,
            ..PolicyInput::default()
        };
        let all = members_of_pods(&pods, "");
        let side = |subject: &str, peer: &str, dir: u8, proto: u8, port: u16| {
            explain::explain(
                input,
                &all,
                &namespaces,
                &chosts(),
                explain::Subject::Pod(ip(subject)),
                ip(peer),
                dir,
                proto,
                port,
            )
        };
        let out = side(alpha, beta, NP_EGRESS, TCP, 80);
        assert!(!out.admitted && out.admitted_by.is_empty(), "{out:#?}");
        assert!(
            out.isolated_by
                .contains(&"CiliumClusterwideNetworkPolicy tenant-alpha-egress".to_string())
                && out
                    .isolated_by
                    .contains(&"CiliumNetworkPolicy tenant-alpha/allow-to-dns".to_string()),
            "{out:#?}"
        );
        let into = side(beta, alpha, NP_INGRESS, TCP, 80);
        assert!(into.admitted, "{into:#?}");
        assert_eq!(
            into.admitted_by,
            ["CiliumNetworkPolicy tenant-beta/allow-external-communication"],
            "{into:#?}"
        );
        let dns_ok = side(alpha, dns, NP_EGRESS, UDP, 53);
        assert!(dns_ok.admitted, "{dns_ok:#?}");
        assert_eq!(
            dns_ok.admitted_by,
            ["CiliumNetworkPolicy tenant-alpha/allow-to-dns"],
            "{dns_ok:#?}"
        );
        // the host: the deny names its policy
        let host = explain::explain(
            input,
            &all,
            &namespaces,
            &chosts(),
            explain::Subject::Host,
            ip(world),
            NP_INGRESS,
            TCP,
            10250,
        );
        assert!(!host.admitted);
        assert_eq!(
            host.denied_by,
            ["CiliumClusterwideNetworkPolicy restrict-system-components"],
            "{host:#?}"
        );
    }

    fn cnp(ns: &str, name: &str, spec: Value) -> CiliumNetworkPolicy {
        serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn rules_follow_cilium_semantics_and_what_is_outside_fails_closed() {
        let (pods, namespaces) = world();
        let sel = |p: &str| json!({"matchLabels": {"pod": p}});
        let policies = vec![
            // `- {}`: isolates x/a, admits nothing
            cnp(
                "x",
                "empty",
                json!({"endpointSelector": sel("a"), "ingress": [{}]}),
            ),
            // ports alone: any peer on TCP 81; peers are this namespace's
            // unless the selector names namespaces
            cnp(
                "x",
                "ports",
                json!({"endpointSelector": sel("b"),
                "ingress": [{"toPorts": [{"ports": [{"port": "81", "protocol": "TCP"}]}]}],
                "egress": [{"toEndpoints": [{}]},
                           {"toEndpoints": [{"matchLabels": {"k8s:io.cilium.k8s.namespace.labels.team": "blue"}}],
                            "toPorts": [{"ports": [{"port": "http"}]}]}]}),
            ),
            // rules without isolation
            cnp(
                "y",
                "open",
                json!({"endpointSelector": sel("a"),
                "enableDefaultDeny": {"ingress": false},
                "ingress": [{"fromEndpoints": [{"matchLabels": {"pod": "b"}}]}]}),
            ),
            // outside the subset: toFQDNs and an L7 rule admit nothing;
            // a deny rule leaves z/a admitting nothing at all
            cnp(
                "y",
                "fqdn",
                json!({"endpointSelector": sel("a"),
                "egress": [{"toFQDNs": [{"matchName": "example.com"}]},
                           {"toPorts": [{"ports": [{"port": "80"}], "rules": {"http": [{}]}}]},
                           {"toCIDRSet": [{"cidr": "192.0.2.0/24", "except": ["192.0.2.128/25"]}]}]}),
            ),
            cnp(
                "z",
                "deny",
                json!({"endpointSelector": {}, "ingress": [{"fromEntities": ["all"]}],
                "ingressDeny": [{"fromEntities": ["world"]},
                                {"fromEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "x"}}],
                                 "toPorts": [{"ports": [{"port": "80", "protocol": "TCP"}]}]}]}),
            ),
        ];
        let c = compile(&(policies, Vec::new()), &pods, &namespaces);
        let fields: Vec<String> = c
            .diagnostics
            .iter()
            .map(|d| match d {
                NpDiagnostic::CiliumOutside { field, .. } => field.clone(),
                other => format!("{other}"),
            })
            .collect();
        assert_eq!(
            fields,
            ["spec.egress[0].toFQDNs", "spec.egress[1].toPorts[0].rules"],
            "{:#?}",
            c.diagnostics
        );
        let d = &c.desired;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let (xa, xb, ya, za) = (
            ip("10.0.1.1"),
            ip("10.0.1.2"),
            ip("10.0.1.4"),
            ip("10.0.1.6"),
        );
        let (xc, yb) = (ip("10.0.2.3"), ip("10.0.2.5"));
        // `- {}`
        assert!(!sim(d, xa, xb, NP_INGRESS, TCP, 80));
        assert!(!sim(d, xa, ya, NP_INGRESS, UDP, 53));
        // ports alone
        assert!(sim(d, xb, ya, NP_INGRESS, TCP, 81));
        assert!(sim(d, xb, ip("192.0.2.1"), NP_INGRESS, TCP, 81));
        assert!(!sim(d, xb, ya, NP_INGRESS, TCP, 80));
        // `toEndpoints: [{}]` is x only; namespace labels reach y and z,
        // the named port resolved per destination (y/a: 8080, y/b: 80)
        assert!(sim(d, xb, xc, NP_EGRESS, UDP, 9));
        assert!(!sim(d, xb, za, NP_EGRESS, TCP, 9000));
        assert!(sim(d, xb, ya, NP_EGRESS, TCP, 8080));
        assert!(!sim(d, xb, ya, NP_EGRESS, TCP, 80));
        assert!(sim(d, xb, yb, NP_EGRESS, TCP, 80));
        // enableDefaultDeny: false isolates nothing
        assert!(sim(d, ya, xa, NP_INGRESS, TCP, 80));
        // y/a's egress: isolated; the L7 rule's port admits nothing, only
        // the CIDR set admits
        assert!(!sim(d, ya, ip("198.51.100.1"), NP_EGRESS, TCP, 80));
        assert!(sim(d, ya, ip("192.0.2.9"), NP_EGRESS, TCP, 443));
        assert!(!sim(d, ya, ip("192.0.2.200"), NP_EGRESS, TCP, 443));
        // deny rules win over `all`: not the world, not x on TCP 80
        assert!(!sim(d, za, ip("192.0.2.1"), NP_INGRESS, TCP, 80));
        assert!(!sim(d, za, xa, NP_INGRESS, TCP, 80));
        assert!(sim(d, za, xa, NP_INGRESS, TCP, 81));
        assert!(sim(d, za, ya, NP_INGRESS, TCP, 80));
        // a deny with something outside the subset: fail closed
        let odd = cnp(
            "z",
            "odd",
            json!({"endpointSelector": {},
                   "egressDeny": [{"toFQDNs": [{"matchName": "example.com"}]}]}),
        );
        let c = compile(&(vec![odd], Vec::new()), &pods, &namespaces);
        assert_eq!(c.diagnostics.len(), 1, "{:#?}", c.diagnostics);
        assert!(!sim(&c.desired, za, ya, NP_EGRESS, TCP, 80));
        assert!(sim(&c.desired, za, ya, NP_INGRESS, TCP, 80));
    }

    #[test]
    fn host_policies_select_nodes_and_reserved_selectors_are_reported() {
        let (pods, namespaces) = world();
        let ccnp = |sel: Value| -> CiliumClusterwideNetworkPolicy {
            serde_json::from_value(json!({
                "metadata": {"name": "h"},
                "specs": [{"nodeSelector": sel, "ingress": [{"fromEntities": ["kube-apiserver"]}]},
                          {"endpointSelector": {"matchLabels": {"reserved:host": ""}}, "ingress": [{}]}]
            }))
            .unwrap()
        };
        let host_key = cozyplane_datapath::abi::np_host_key();
        // another node's policy: nothing here
        let c = compile(
            &(
                Vec::new(),
                vec![ccnp(json!({"matchLabels": {"role": "db"}}))],
            ),
            &pods,
            &namespaces,
        );
        assert!(c.desired.eps.values().all(|e| e.flags == 0));
        assert!(c.desired.rules.is_empty());
        assert_eq!(c.diagnostics.len(), 1, "{:#?}", c.diagnostics);
        // this node's (`k8s:` keys, as Cilium writes them): isolated, the
        // API server admitted, no pod touched
        let c = compile(
            &(
                Vec::new(),
                vec![ccnp(
                    json!({"matchLabels": {"k8s:kubernetes.io/hostname": NODE}}),
                )],
            ),
            &pods,
            &namespaces,
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(!sim_host(&c.desired, ip("192.0.2.1"), NP_INGRESS, TCP, 22));
        assert!(sim_host(&c.desired, ip(APISERVER), NP_INGRESS, TCP, 22));
        assert!(c
            .desired
            .eps
            .iter()
            .filter(|(k, _)| **k != host_key)
            .all(|(_, e)| e.flags == 0));
    }

    fn firewall(name: &str, spec: Value) -> HostFirewall {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    }

    #[test]
    fn host_firewalls_isolate_the_selected_node_with_ranges_of_any_length() {
        let (pods, namespaces) = world();
        let host_key = cozyplane_datapath::abi::np_host_key();
        let fws = vec![
            firewall(
                "ssh",
                json!({"ingress": [
                    {"from": [{"cidr": "198.51.100.0/24", "except": ["198.51.100.128/25"]}],
                     "ports": [{"port": 22}]},
                    {"ports": [{"protocol": "UDP", "port": 1000, "endPort": 2999}]}]}),
            ),
            firewall(
                "egress",
                json!({"policyTypes": ["Egress"],
                       "egress": [{"to": [{"cidr": "0.0.0.0/0"}],
                                   "ports": [{"protocol": "UDP", "port": 53}]}]}),
            ),
            firewall(
                "elsewhere",
                json!({"nodeSelector": {"matchLabels": {"role": "db"}},
                       "ingress": [{"ports": [{"port": 5432}]}]}),
            ),
        ];
        let c = compile_policies(
            PolicyInput {
                host_firewalls: &fws,
                ..PolicyInput::default()
            },
            &members_of_pods(&pods, NODE),
            &namespaces,
            &chosts(),
        );
        assert!(c.diagnostics.is_empty(), "{:#?}", c.diagnostics);
        let d = &c.desired;
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(sim_host(d, ip("198.51.100.7"), NP_INGRESS, TCP, 22));
        assert!(!sim_host(d, ip("198.51.100.200"), NP_INGRESS, TCP, 22));
        assert!(!sim_host(d, ip("192.0.2.1"), NP_INGRESS, TCP, 22));
        // a 2000-port range (the prior implementation stopped at 64)
        assert!(sim_host(d, ip("192.0.2.1"), NP_INGRESS, UDP, 1000));
        assert!(sim_host(d, ip("192.0.2.1"), NP_INGRESS, UDP, 2999));
        assert!(!sim_host(d, ip("192.0.2.1"), NP_INGRESS, UDP, 3000));
        assert!(
            !sim_host(d, ip("192.0.2.1"), NP_INGRESS, TCP, 5432),
            "not this node's"
        );
        // egress: UDP 53 only; the API server always, both ways
        assert!(sim_host(d, ip("192.0.2.1"), NP_EGRESS, UDP, 53));
        assert!(!sim_host(d, ip("192.0.2.1"), NP_EGRESS, TCP, 443));
        assert!(sim_host(d, ip(APISERVER), NP_EGRESS, TCP, 443));
        assert!(sim_host(d, ip(APISERVER), NP_INGRESS, TCP, 9999));
        // pods are not the node
        assert!(d
            .eps
            .iter()
            .filter(|(k, _)| **k != host_key)
            .all(|(_, e)| e.flags == 0));
        // no firewall: no host entry at all
        let c = compile_policies(
            PolicyInput::default(),
            &members_of_pods(&pods, NODE),
            &namespaces,
            &chosts(),
        );
        assert!(!c.desired.eps.contains_key(&host_key));
    }
}

#[test]
fn the_rule_order_key_orders_as_the_rules_do_and_round_trips() {
    use cozyplane_datapath::abi::NpMatch;
    let mut rules: Vec<Prefixed<NpRule>> = Vec::new();
    for subject in [1, 7, 0x7fff_fffe] {
        for dir in [NP_INGRESS, NP_EGRESS] {
            for peer in [3, NP_PEER_ANY, NP_PEER_CIDR | 2] {
                rules.push(NpRule::key(subject, dir, peer, NpMatch::Any).into());
                rules.push(NpRule::key(subject, dir, peer, NpMatch::Proto(17)).into());
                for (start, bits) in [(80, 16), (8000, 13), (0, 1), (65535, 16)] {
                    let m = NpMatch::Ports {
                        proto: 6,
                        start,
                        bits,
                    };
                    rules.push(NpRule::key(subject, dir, peer, m).into());
                }
            }
        }
    }
    for r in &rules {
        assert_eq!(rule_of_order(rule_order(r)), *r);
    }
    let mut by_struct = rules.clone();
    by_struct.sort();
    let mut by_key = rules.clone();
    by_key.sort_by_key(rule_order);
    assert_eq!(by_struct, by_key);
}

/// A claim as the agents write them: `snapshot` is the pod's labels for
/// another node's pod (`None`: not written yet).
fn claim(
    ip: &str,
    node: &str,
    ns: &str,
    uid: &str,
    rv: Option<u64>,
    snapshot: Option<&Value>,
) -> FabricIP {
    let mut notes = serde_json::Map::new();
    if let Some(l) = snapshot {
        notes.insert(ANNOTATION_POD_LABELS.into(), json!(l.to_string()));
        notes.insert(
            ANNOTATION_POD_PORTS.into(),
            json!(r#"[{"name":"http","port":8080,"protocol":"TCP"}]"#),
        );
    }
    serde_json::from_value(json!({
        "metadata": {"name": ip, "resourceVersion": rv.map(|v| v.to_string()), "annotations": notes},
        "spec": {"address": ip, "node": node, "podNamespace": ns, "podName": uid, "podUID": uid},
    }))
    .unwrap()
}

/// The members of `claims`, read the plain way (the reference for the
/// cache): every live claim with an address and a namespace; this node's
/// from the live pod with the claim's uid, others' from the snapshot.
fn members_reference(claims: &[FabricIP], local: &[Pod]) -> Vec<NpMember> {
    let mut v: Vec<NpMember> = claims
        .iter()
        .filter(|f| f.metadata.deletion_timestamp.is_none())
        .filter_map(|f| {
            let ip: IpAddr = f.spec.address.parse().ok()?;
            let namespace = f.spec.pod_namespace.clone()?;
            if f.spec.node.as_deref() == Some(NODE) {
                let pod = local
                    .iter()
                    .find(|p| p.metadata.uid.as_deref() == f.spec.pod_uid.as_deref())?;
                Some(NpMember {
                    namespace,
                    labels: pod.metadata.labels.clone().unwrap_or_default(),
                    ports: named_ports(pod),
                    ip,
                    local: true,
                })
            } else {
                let notes = f.metadata.annotations.as_ref()?;
                Some(NpMember {
                    namespace,
                    labels: serde_json::from_str(notes.get(ANNOTATION_POD_LABELS)?).ok()?,
                    ports: serde_json::from_str(notes.get(ANNOTATION_POD_PORTS)?).ok()?,
                    ip,
                    local: false,
                })
            }
        })
        .collect();
    v.sort_by_key(|m| (m.ip, m.local));
    v
}

#[test]
fn the_member_cache_follows_every_change_as_a_fresh_read_would() {
    let mut r = Rng(0x5eed_cace);
    let label = |r: &mut Rng| json!({"app": r.pick(&["a", "b", "c"]), "tier": r.pick(&["x", "y"])});
    let local_pod = |uid: &str, ip: &str, rv: u64, labels: &Value| -> Pod {
        let mut p = pod(
            "ns1",
            uid,
            NODE,
            ip,
            labels.clone(),
            json!([{"name": "http", "containerPort": 8080}]),
        );
        p.metadata.uid = Some(uid.to_string());
        p.metadata.resource_version = Some(rv.to_string());
        p
    };
    let namespaces = vec![namespace("ns1", json!({})), namespace("ns2", json!({}))];
    let policies = vec![
        policy(
            "ns1",
            "p",
            json!({"podSelector": {"matchLabels": {"tier": "x"}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": "http"}]}]}),
        ),
        policy(
            "ns2",
            "q",
            json!({"podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "y"}}}]}]}),
        ),
    ];
    let mut claims: Vec<FabricIP> = Vec::new();
    let mut local: Vec<Pod> = Vec::new();
    let mut cache = MemberCache::default();
    let (mut shared, mut shared_pods, mut shared_cache) =
        (Vec::new(), Vec::new(), MemberCache::default());
    let mut rv = 1u64;
    for step in 0..400 {
        rv += 1;
        let i = r.next() % 24;
        let ip = format!("10.0.{}.{}", i / 8, 10 + i % 8);
        let uid = format!("u{i}");
        let here = claims.iter().position(|f| f.spec.address == ip);
        match (r.next() % 7, here) {
            // a claim appears or is rewritten: this node's, or another's
            // with or without a snapshot, sometimes with no version at all
            (0..=2, _) => {
                let ns = *r.pick(&["ns1", "ns2"]);
                let version = (!r.next().is_multiple_of(8)).then_some(rv);
                let f = if r.next().is_multiple_of(3) {
                    let l = label(&mut r);
                    local.retain(|p| p.metadata.uid.as_deref() != Some(uid.as_str()));
                    local.push(local_pod(&uid, &ip, rv, &l));
                    claim(&ip, NODE, ns, &uid, version, None)
                } else {
                    let l = label(&mut r);
                    let snap = (!r.next().is_multiple_of(5)).then_some(&l);
                    claim(&ip, "n2", ns, &uid, version, snap)
                };
                match here {
                    Some(k) => claims[k] = f,
                    None => claims.push(f),
                }
            }
            // a claim goes, or is being deleted
            (3, Some(k)) => {
                claims.remove(k);
            }
            (4, Some(k)) => {
                claims[k].metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
                claims[k].metadata.resource_version = Some(rv.to_string());
            }
            // this node's pod is relabelled, or disappears and comes back
            (5, _) => {
                if let Some(p) = local
                    .iter_mut()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                {
                    p.metadata.labels = serde_json::from_value(label(&mut r)).ok();
                    p.metadata.resource_version = Some(rv.to_string());
                }
            }
            (6, _) => {
                if let Some(k) = local
                    .iter()
                    .position(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                {
                    local.remove(k);
                }
            }
            _ => {}
        }
        let mut order = claims.clone();
        if r.next().is_multiple_of(4) {
            order.reverse();
        }
        cache.update(&order, &local, NODE);
        let want = members_reference(&claims, &local);
        assert_eq!(cache.members(), want, "step {step}");
        // as a store shares them: an unchanged object is the same one
        shared = store_like(&shared, &order);
        shared_pods = store_like(&shared_pods, &local);
        shared_cache.update_shared(&shared, &shared_pods, NODE);
        assert_eq!(shared_cache.members(), want, "step {step}");
        let mut fresh = MemberCache::default();
        fresh.update(&claims, &local, NODE);
        assert_eq!(fresh.members(), want, "step {step}");
        let via_cache = compile_groups(
            PolicyInput {
                network_policies: &policies,
                ..PolicyInput::default()
            },
            cache.groups(),
            &namespaces,
            &hosts(),
        );
        let via_members = compile_network_policies(&policies, &want, &namespaces, &hosts());
        assert_eq!(via_cache.desired, via_members.desired, "step {step}");
        assert_eq!(via_cache.identities, via_members.identities, "step {step}");
    }
}

/// `now` as a reflector's store shares it after `before`: each object
/// equal to the one before it is that very object, changed ones are new.
fn store_like<T: Clone + serde::Serialize>(before: &[Arc<T>], now: &[T]) -> Vec<Arc<T>> {
    now.iter()
        .enumerate()
        .map(|(i, x)| {
            let v = serde_json::to_value(x).unwrap();
            match before.get(i) {
                Some(o) if serde_json::to_value(&**o).unwrap() == v => Arc::clone(o),
                _ => Arc::new(x.clone()),
            }
        })
        .collect()
}

#[test]
fn shared_objects_unchanged_are_not_read_again_and_replaced_ones_are() {
    let l = json!({"app": "a"});
    let remote = Arc::new(claim("10.0.0.2", "n2", "ns1", "u2", Some(1), Some(&l)));
    let mine = Arc::new(claim("10.0.0.3", NODE, "ns1", "u3", Some(1), None));
    let mut p = pod(
        "ns1",
        "u3",
        NODE,
        "10.0.0.3",
        json!({"app": "b"}),
        json!([]),
    );
    p.metadata.uid = Some("u3".into());
    p.metadata.resource_version = Some("5".into());
    let pod1 = Arc::new(p.clone());
    let mut cache = MemberCache::default();
    let fips = vec![Arc::clone(&remote), Arc::clone(&mine)];
    cache.update_shared(&fips, std::slice::from_ref(&pod1), NODE);
    let first = cache.members();
    assert_eq!(first.len(), 2);
    let pass = cache.pass;
    // the same objects: nothing is read (no pass at all)
    cache.update_shared(&fips, std::slice::from_ref(&pod1), NODE);
    assert_eq!(cache.pass, pass);
    assert_eq!(cache.members(), first);
    // equal content in new objects is read (and found unchanged)
    let copies: Vec<Arc<FabricIP>> = fips.iter().map(|f| Arc::new((**f).clone())).collect();
    cache.update_shared(&copies, std::slice::from_ref(&pod1), NODE);
    assert_eq!(cache.pass, pass + 1);
    assert_eq!(cache.members(), first);
    // the pod relabelled (a new object, a new version): its member follows
    p.metadata.labels = serde_json::from_value(json!({"app": "c"})).ok();
    p.metadata.resource_version = Some("6".into());
    cache.update_shared(&copies, &[Arc::new(p)], NODE);
    let m = cache.members();
    assert_eq!(m[1].labels.get("app").map(String::as_str), Some("c"));
    // a plain update forgets the shared input: the next shared one reads
    cache.update(&[], &[], NODE);
    assert!(cache.members().is_empty());
    cache.update_shared(&copies, std::slice::from_ref(&pod1), NODE);
    assert_eq!(cache.members(), first);
}

#[test]
fn the_cache_read_for_another_node_starts_over() {
    let l = json!({"app": "a"});
    let x = claim("10.0.0.2", "n2", "ns1", "u2", Some(7), Some(&l));
    let mut p = pod(
        "ns1",
        "u2",
        "n2",
        "10.0.0.2",
        json!({"app": "live"}),
        json!([]),
    );
    p.metadata.uid = Some("u2".into());
    p.metadata.resource_version = Some("3".into());
    let mut cache = MemberCache::default();
    cache.update(std::slice::from_ref(&x), std::slice::from_ref(&p), NODE);
    assert!(!cache.members()[0].local);
    // the same claim read for n2: its pod is local there, read live
    cache.update(std::slice::from_ref(&x), std::slice::from_ref(&p), "n2");
    let mut fresh = MemberCache::default();
    fresh.update(std::slice::from_ref(&x), std::slice::from_ref(&p), "n2");
    assert_eq!(cache.members(), fresh.members());
    assert!(cache.members()[0].local);
    assert_eq!(
        cache.members()[0].labels.get("app").map(String::as_str),
        Some("live")
    );
}
