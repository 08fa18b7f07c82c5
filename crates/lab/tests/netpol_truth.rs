//! The NetworkPolicy truth table (issue #12), in the spirit of cyclonus: a
//! 2-node lab, namespaces x, y and z with pods a, b and c each (a and c on
//! node1, b on node2), every pod serving TCP and UDP on ports 80 and 81
//! (named `serve-80-tcp`, `serve-80-udp`, `serve-81-tcp`, `serve-81-udp`).
//! For each scenario - policies applied with kubectl, labels changed,
//! policies updated - every ordered pod pair is probed on TCP and UDP 80
//! and 81 from inside the source pod's network namespace, and the observed
//! matrix is compared with the matrix a model in this file computes from
//! the Kubernetes semantics (its own selector evaluation, not the agent's
//! compiler). Every mismatch fails; a scenario is retried a few times first,
//! since a policy takes effect within the agent's sync, not at once.
//!
//! SCTP is probed too, on ports 80 and 81 (`serve-80-sctp`, `serve-81-sctp`):
//! this machine's kernels have no SCTP sockets (`CONFIG_IP_SCTP` is not set),
//! so the probe speaks SCTP's first exchange itself on raw sockets (an INIT
//! answered by an INIT ACK carrying the server's name, `cozyplane_probe::sctp`):
//! real SCTP packets through the real datapath, both directions judged and
//! tracked as an association's first packets are.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl. Under CI a missing
//! prerequisite fails the test; elsewhere it is skipped with a `SKIP` line
//! (the test kit's gate).
//!
//! Run: `cargo build --bins && cargo test -p cozyplane-lab --test netpol_truth`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cozyplane_datapath::netlink::{named_netns_path, Netns};
use cozyplane_lab::{exec_in, wait_for, LabHost};
use cozyplane_testkit::{needs, tools};
use lab_support::{lab, ok, prerequisites, run_dir, text, Down};
use serde_json::{json, Value};

struct Ns(String, Netns);

impl LabHost for Ns {
    fn name(&self) -> &str {
        &self.0
    }
    fn netns(&self) -> &Netns {
        &self.1
    }
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl");
        ok(&format!("kubectl {}", args.join(" ")), out)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&a)).expect("kubectl json")
    }

    /// Applies `objects` in one call (a multi-document YAML stream; JSON is YAML).
    fn apply(&self, objects: &[Value]) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("m.yaml");
        let docs: Vec<String> = objects.iter().map(Value::to_string).collect();
        std::fs::write(&f, docs.join("\n---\n")).expect("write manifest");
        self.run(&["apply", "-f", &f.display().to_string()]);
    }
}

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
/// (protocol, port) probed for every pair.
const PROBES: [(&str, u16); 6] = [
    ("tcp", 80),
    ("tcp", 81),
    ("udp", 80),
    ("udp", 81),
    ("sctp", 80),
    ("sctp", 81),
];

/// A pod of the table as the model sees it.
#[derive(Clone, Debug)]
struct PodState {
    ns: String,
    name: String,
    ip: IpAddr,
    labels: BTreeMap<String, String>,
    netns: String,
}

impl PodState {
    fn id(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

/// The model's world: pods, namespace labels, policies (as applied).
struct World {
    pods: Vec<PodState>,
    ns_labels: BTreeMap<String, BTreeMap<String, String>>,
    policies: Vec<Value>,
}

/// `matchLabels` and `matchExpressions`, as the API reference defines them
/// (this file's own evaluation).
fn selects(sel: &Value, labels: &BTreeMap<String, String>) -> bool {
    if sel.is_null() {
        return true;
    }
    let by_labels = sel["matchLabels"].as_object().is_none_or(|m| {
        m.iter()
            .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
    });
    let by_exprs = sel["matchExpressions"].as_array().is_none_or(|es| {
        es.iter().all(|e| {
            let key = e["key"].as_str().unwrap();
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let have = labels.get(key).map(String::as_str);
            match e["operator"].as_str().unwrap() {
                "In" => have.is_some_and(|h| values.contains(&h)),
                "NotIn" => !have.is_some_and(|h| values.contains(&h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                op => panic!("operator {op}"),
            }
        })
    });
    by_labels && by_exprs
}

fn cidr_contains(cidr: &str, ip: IpAddr) -> bool {
    let (net, len) = cidr.split_once('/').unwrap();
    let (IpAddr::V4(ip), Ok(IpAddr::V4(net))) = (ip, net.parse::<IpAddr>()) else {
        return false;
    };
    let len: u32 = len.parse().unwrap();
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// The named ports every pod of the table has.
fn named_port(name: &str) -> Option<(&'static str, u16)> {
    match name {
        "serve-80-tcp" => Some(("tcp", 80)),
        "serve-80-udp" => Some(("udp", 80)),
        "serve-81-tcp" => Some(("tcp", 81)),
        "serve-81-udp" => Some(("udp", 81)),
        "serve-80-sctp" => Some(("sctp", 80)),
        "serve-81-sctp" => Some(("sctp", 81)),
        _ => None,
    }
}

impl World {
    fn peer_matches(&self, policy_ns: &str, peer: &Value, other: &PodState) -> bool {
        if let Some(b) = peer.get("ipBlock") {
            return cidr_contains(b["cidr"].as_str().unwrap(), other.ip)
                && !b["except"].as_array().is_some_and(|ex| {
                    ex.iter()
                        .any(|e| cidr_contains(e.as_str().unwrap(), other.ip))
                });
        }
        let ns_ok = match peer.get("namespaceSelector") {
            None => other.ns == policy_ns,
            Some(sel) => selects(sel, &self.ns_labels[&other.ns]),
        };
        let pod_ok = match peer.get("podSelector") {
            None => true,
            Some(sel) => selects(sel, &other.labels),
        };
        ns_ok && pod_ok
    }

    fn port_matches(ports: &Value, proto: &str, port: u16) -> bool {
        let Some(ports) = ports.as_array().filter(|p| !p.is_empty()) else {
            return true;
        };
        ports.iter().any(|p| {
            let pproto = p["protocol"].as_str().unwrap_or("TCP").to_ascii_lowercase();
            if pproto != proto {
                return false;
            }
            match &p["port"] {
                Value::Null => true,
                Value::Number(n) => {
                    let lo = n.as_u64().unwrap();
                    let hi = p["endPort"].as_u64().unwrap_or(lo);
                    (lo..=hi).contains(&u64::from(port))
                }
                // a name resolves to the destination's container port of
                // that name and the rule's protocol
                Value::String(name) => named_port(name) == Some((proto, port)),
                _ => false,
            }
        })
    }

    /// May `subj` take (ingress) or send (egress) this flow with `other`?
    fn allows(
        &self,
        subj: &PodState,
        other: &PodState,
        ingress: bool,
        proto: &str,
        port: u16,
    ) -> bool {
        let mut isolated = false;
        for p in &self.policies {
            if p["metadata"]["namespace"] != subj.ns.as_str() {
                continue;
            }
            let spec = &p["spec"];
            if !selects(&spec["podSelector"], &subj.labels) {
                continue;
            }
            let types: Vec<&str> = spec["policyTypes"]
                .as_array()
                .map(|t| t.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let types = if types.is_empty() {
                let mut t = vec!["Ingress"];
                if spec["egress"].as_array().is_some_and(|e| !e.is_empty()) {
                    t.push("Egress");
                }
                t
            } else {
                types
            };
            let (kind, list, peers_key) = if ingress {
                ("Ingress", &spec["ingress"], "from")
            } else {
                ("Egress", &spec["egress"], "to")
            };
            if !types.contains(&kind) {
                continue;
            }
            isolated = true;
            for rule in list.as_array().into_iter().flatten() {
                let peer_ok = match rule[peers_key].as_array().filter(|v| !v.is_empty()) {
                    None => true,
                    Some(v) => v.iter().any(|x| self.peer_matches(&subj.ns, x, other)),
                };
                if peer_ok && Self::port_matches(&rule["ports"], proto, port) {
                    return true;
                }
            }
        }
        !isolated
    }

    fn expected(&self, src: &PodState, dst: &PodState, proto: &str, port: u16) -> bool {
        self.allows(src, dst, false, proto, port) && self.allows(dst, src, true, proto, port)
    }
}

/// Probes every pair from every pod at once; returns (src, dst, proto,
/// port) → answered.
fn observe(bin: &Path, world: &World) -> BTreeMap<(String, String, String, u16), bool> {
    let handles: Vec<_> = world
        .pods
        .iter()
        .map(|src| {
            let checks: Vec<Value> = world
                .pods
                .iter()
                .filter(|d| d.id() != src.id())
                .flat_map(|d| {
                    PROBES.iter().map(move |(proto, port)| {
                        json!({"id": format!("{}|{proto}|{port}", d.id()), "proto": proto,
                               "target": format!("{}:{port}", d.ip), "expect": d.id().replace('/', "-"),
                               "timeoutMs": 700})
                    })
                })
                .collect();
            let plan = json!({ "checks": checks }).to_string();
            let bin = bin.display().to_string();
            let netns = src.netns.clone();
            let id = src.id();
            std::thread::spawn(move || {
                let ns = Ns(
                    netns.clone(),
                    Netns::open(named_netns_path(&netns)).expect("open pod netns"),
                );
                let out = exec_in(&ns, &[&bin, "probe", "client", "--plan", &plan])
                    .expect("run probe client");
                let stdout = text(&out.stdout);
                let report: Value = stdout
                    .lines()
                    .rev()
                    .find_map(|l| serde_json::from_str(l).ok())
                    .unwrap_or_else(|| panic!("no report from {id}: {stdout}"));
                (id, report)
            })
        })
        .collect();
    let mut out = BTreeMap::new();
    for h in handles {
        let (src, report) = h.join().expect("probe thread");
        for r in report["results"].as_array().expect("results") {
            let id = r["id"].as_str().unwrap();
            let mut parts = id.split('|');
            let (dst, proto, port) = (
                parts.next().unwrap().to_string(),
                parts.next().unwrap().to_string(),
                parts.next().unwrap().parse().unwrap(),
            );
            out.insert((src.clone(), dst, proto, port), r["ok"] == true);
        }
    }
    out
}

fn mismatches(world: &World, seen: &BTreeMap<(String, String, String, u16), bool>) -> Vec<String> {
    let mut bad = Vec::new();
    for s in &world.pods {
        for d in world.pods.iter().filter(|d| d.id() != s.id()) {
            for (proto, port) in PROBES {
                let want = world.expected(s, d, proto, port);
                let got = seen[&(s.id(), d.id(), proto.to_string(), port)];
                if want != got {
                    bad.push(format!(
                        "{} -> {} {proto}/{port}: expected {}, observed {}",
                        s.id(),
                        d.id(),
                        if want { "allowed" } else { "blocked" },
                        if got { "allowed" } else { "blocked" }
                    ));
                }
            }
        }
    }
    bad
}

fn policy(ns: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// One step of a scenario.
enum Step {
    /// Apply these policies (created or updated).
    Apply(Vec<Value>),
    /// Set label `key` of pod `ns/name` (None: remove it).
    PodLabel(
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
    ),
    /// Set label `key` of namespace `ns` (None: remove it).
    NsLabel(&'static str, &'static str, Option<&'static str>),
}

/// The scenarios: a name, and its steps (the table is checked after the
/// last). Built from the upstream e2e cases, each over several namespaces
/// and directions.
fn scenarios(ips: &BTreeMap<String, IpAddr>) -> Vec<(String, Vec<Step>)> {
    use Step::*;
    let mut v: Vec<(String, Vec<Step>)> = Vec::new();
    let both = json!(["Ingress", "Egress"]);
    for ns in NAMESPACES {
        v.push((
            format!("deny-all-ingress/{ns}"),
            vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}}))])],
        ));
        v.push((
            format!("deny-all-egress/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "policyTypes": ["Egress"]}),
            )])],
        ));
        v.push((
            format!("deny-all-both/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "policyTypes": both}),
            )])],
        ));
        v.push((
            format!("allow-all-ingress/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{}]}),
            )])],
        ));
        v.push((
            format!("allow-all-egress/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "egress": [{}], "policyTypes": ["Egress"]}),
            )])],
        ));
        v.push((
            format!("allow-from-own-namespace/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            )])],
        ));
        v.push((format!("egress-to-own-namespace/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {}}]}], "policyTypes": ["Egress"]}))])]));
    }
    for (ns, other) in [("x", "y"), ("y", "z"), ("z", "x")] {
        v.push((format!("allow-from-namespace/{ns}<-{other}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": other}}}]}]}))])]));
        v.push((format!("allow-from-pod-in-namespace/{ns}<-{other}/b"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": other}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}))])]));
        v.push((format!("allow-from-pod-or-namespace/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": other}}}, {"podSelector": {"matchLabels": {"pod": "c"}}}]}]}))])]));
        v.push((format!("egress-to-namespace/{ns}->{other}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": other}}}]}], "policyTypes": ["Egress"]}))])]));
        v.push((format!("egress-to-pod-anywhere/{ns}->b"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}]}], "policyTypes": ["Egress"]}))])]));
    }
    for ns in ["x", "y"] {
        v.push((
            format!("port-80-tcp/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80}]}]}),
            )])],
        ));
        v.push((format!("port-81-udp/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}))])]));
        v.push((
            format!("all-udp-ports/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP"}]}]}),
            )])],
        ));
        v.push((
            format!("named-port-tcp-81/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
            )])],
        ));
        v.push((format!("named-port-udp-80/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}]}))])]));
        v.push((
            format!("named-port-wrong-protocol/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-80-udp"}]}]}),
            )])],
        ));
        v.push((format!("egress-named-port/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "egress": [{"ports": [{"port": "serve-80-tcp"}]}], "policyTypes": ["Egress"]}))])]));
        v.push((format!("end-port-80-81/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 81, "protocol": "UDP"}]}]}))])]));
        v.push((format!("egress-end-port/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "egress": [{"ports": [{"port": 81, "endPort": 90}]}], "policyTypes": ["Egress"]}))])]));
        v.push((format!("ports-and-peers/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {"matchLabels": {"pod": "b"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 80}, {"port": 81, "protocol": "UDP"}]}]}))])]));
    }
    // SCTP, as the upstream e2e's [SCTP] cases: by number, by name, every
    // port, a range, egress, and a peer and a port together
    for ns in ["x", "z"] {
        v.push((format!("port-80-sctp/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "protocol": "SCTP"}]}]}))])]));
        v.push((format!("named-port-sctp-81/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-sctp", "protocol": "SCTP"}]}]}))])]));
        v.push((
            format!("all-sctp-ports/{ns}"),
            vec![Apply(vec![policy(
                ns,
                "p",
                json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP"}]}]}),
            )])],
        ));
        v.push((format!("egress-sctp-end-port/{ns}"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {}, "egress": [{"ports": [{"port": 81, "endPort": 85, "protocol": "SCTP"}]}], "policyTypes": ["Egress"]}))])]));
        v.push((format!("sctp-from-namespace/{ns}<-y"), vec![Apply(vec![policy(ns, "p", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80, "protocol": "SCTP"}, {"port": 81, "protocol": "TCP"}]}]}))])]));
    }
    v.push(("sctp-named-port-tcp-name".into(), vec![Apply(vec![policy("y", "p", json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-80-tcp", "protocol": "SCTP"}]}]}))])]));
    // ipBlock: the addresses are the lab's, known once the pods run
    let ip = |id: &str| ips[id].to_string();
    let yb = ip("y/b");
    let zc = ip("z/c");
    v.push(("ip-block-one-pod".into(), vec![Apply(vec![policy("x", "p", json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": format!("{yb}/32")}}]}]}))])]));
    v.push(("ip-block-with-except".into(), vec![Apply(vec![policy("x", "p", json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [format!("{yb}/32"), format!("{zc}/32")]}}]}]}))])]));
    v.push(("ip-block-except-with-ports".into(), vec![Apply(vec![policy("y", "p", json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": [format!("{zc}/32")]}}], "ports": [{"port": 80}]}, {"from": [{"ipBlock": {"cidr": format!("{zc}/32")}}], "ports": [{"port": 81, "protocol": "UDP"}]}]}))])]));
    v.push(("egress-ip-block".into(), vec![Apply(vec![policy("z", "p", json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [format!("{yb}/32")]}}]}], "policyTypes": ["Egress"]}))])]));
    v.push(("egress-ip-block-named-port".into(), vec![Apply(vec![policy("z", "p", json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": format!("{yb}/32")}}], "ports": [{"port": "serve-81-tcp"}]}], "policyTypes": ["Egress"]}))])]));
    // selectors with expressions
    v.push(("pod-selector-not-in".into(), vec![Apply(vec![policy("x", "p", json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["a"]}]}, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "c"]}]}, "namespaceSelector": {}}]}]}))])]));
    v.push(("namespace-selector-exists".into(), vec![Apply(vec![policy("y", "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["x", "z"]}]}}]}]}))])]));
    v.push(("pod-selector-does-not-exist".into(), vec![Apply(vec![policy("z", "p", json!({"podSelector": {"matchExpressions": [{"key": "extra", "operator": "DoesNotExist"}]}, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Exists"}]}}]}]}))])]));
    // multiple policies: a union
    v.push(("two-policies-union".into(), vec![Apply(vec![
        policy("x", "p1", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80}]}]})),
        policy("x", "p2", json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 81, "protocol": "UDP"}]}]})),
    ])]));
    v.push(("deny-plus-allow".into(), vec![Apply(vec![
        policy("y", "deny", json!({"podSelector": {}, "policyTypes": both})),
        policy("y", "dns-like", json!({"podSelector": {}, "egress": [{"ports": [{"port": 80, "protocol": "UDP"}]}], "policyTypes": ["Egress"]})),
        policy("y", "from-x", json!({"podSelector": {"matchLabels": {"pod": "c"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]})),
    ])]));
    v.push((
        "ingress-and-egress-one-policy".into(),
        vec![Apply(vec![policy(
            "z",
            "p",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": both,
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}],
        "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        )])],
    ));
    v.push((
        "three-namespaces-isolated".into(),
        vec![Apply(vec![
            policy(
                "x",
                "p",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            ),
            policy(
                "y",
                "p",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            ),
            policy(
                "z",
                "p",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            ),
        ])],
    ));
    // updates: a policy changed in place, labels changed under a policy
    v.push(("policy-update-narrows".into(), vec![
        Apply(vec![policy("x", "p", json!({"podSelector": {}, "ingress": [{}]}))]),
        Apply(vec![policy("x", "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}))]),
    ]));
    v.push(("policy-update-widens".into(), vec![
        Apply(vec![policy("y", "p", json!({"podSelector": {}, "policyTypes": both}))]),
        Apply(vec![policy("y", "p", json!({"podSelector": {}, "policyTypes": both, "ingress": [{"ports": [{"port": 81}]}], "egress": [{}]}))]),
    ]));
    v.push((
        "pod-label-joins-selector".into(),
        vec![
            Apply(vec![policy(
                "x",
                "p",
                json!({"podSelector": {"matchLabels": {"role": "locked"}}}),
            )]),
            PodLabel("x", "b", "role", Some("locked")),
        ],
    ));
    v.push((
        "pod-label-leaves-selector".into(),
        vec![
            PodLabel("x", "a", "role", Some("locked")),
            Apply(vec![policy(
                "x",
                "p",
                json!({"podSelector": {"matchLabels": {"role": "locked"}}}),
            )]),
            PodLabel("x", "a", "role", None),
        ],
    ));
    v.push(("peer-label-change".into(), vec![
        Apply(vec![policy("y", "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"trusted": "yes"}}}]}]}))]),
        PodLabel("z", "b", "trusted", Some("yes")),
        PodLabel("x", "c", "trusted", Some("yes")),
    ]));
    v.push(("namespace-label-change".into(), vec![
        Apply(vec![policy("z", "p", json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}))]),
        NsLabel("x", "team", Some("blue")),
    ]));
    v.push(("namespace-label-removed".into(), vec![
        NsLabel("y", "team", Some("blue")),
        Apply(vec![policy("z", "p", json!({"podSelector": {}, "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}], "policyTypes": ["Egress"]}))]),
        NsLabel("y", "team", None),
        NsLabel("x", "team", Some("blue")),
    ]));
    v
}

#[test]
fn network_policy_truth_table() {
    let Some((bin, kubectl)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("npt{}", std::process::id() % 100_000);
    let (n1, n2) = (format!("{name}-node1"), format!("{name}-node2"));
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);
    ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "2"]),
    );
    let k = Kubectl {
        bin: kubectl,
        kubeconfig: run_dir(&name).join("kubeconfig"),
    };

    let mut objects = Vec::new();
    for ns in NAMESPACES {
        objects.push(json!({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": ns, "labels": {"ns": ns}}}));
    }
    k.apply(&objects);
    let mut objects = Vec::new();
    for ns in NAMESPACES {
        for (pod, node) in [("a", &n1), ("b", &n2), ("c", &n1)] {
            objects.push(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": ns, "labels": {"pod": pod}},
                "spec": {"nodeName": node, "containers": [{
                    "name": "s", "image": "ghcr.io/cozystack/cozyplane:test",
                    "command": ["cozyplane", "probe", "server", "--name", format!("{ns}-{pod}"),
                                "--tcp-port", "80", "--udp-port", "80", "--extra-port", "81",
                                "--sctp-port", "80", "--sctp-port", "81", "--http-port", "8080"],
                    "ports": [
                        {"name": "serve-80-tcp", "containerPort": 80},
                        {"name": "serve-80-udp", "containerPort": 80, "protocol": "UDP"},
                        {"name": "serve-81-tcp", "containerPort": 81},
                        {"name": "serve-81-udp", "containerPort": 81, "protocol": "UDP"},
                        {"name": "serve-80-sctp", "containerPort": 80, "protocol": "SCTP"},
                        {"name": "serve-81-sctp", "containerPort": 81, "protocol": "SCTP"}],
                    "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1}}]}
            }));
        }
    }
    k.apply(&objects);
    let mut pods = Vec::new();
    for ns in NAMESPACES {
        for pod in PODS {
            wait_for(
                &format!("{ns}/{pod} Ready"),
                Duration::from_secs(90),
                || {
                    let p = k.json(&["get", "pod", pod, "-n", ns]);
                    p["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
                },
            )
            .expect("pod ready");
            let p = k.json(&["get", "pod", pod, "-n", ns]);
            let uid = p["metadata"]["uid"].as_str().unwrap();
            let node = p["spec"]["nodeName"].as_str().unwrap();
            let hex: String = uid
                .chars()
                .filter(char::is_ascii_hexdigit)
                .take(8)
                .collect();
            pods.push(PodState {
                ns: ns.into(),
                name: pod.into(),
                ip: p["status"]["podIP"].as_str().unwrap().parse().unwrap(),
                labels: BTreeMap::from([("pod".to_string(), pod.to_string())]),
                netns: format!("{node}-p{}", hex.to_ascii_lowercase()),
            });
        }
    }
    assert!(pods
        .iter()
        .all(|p| matches!(p.ip, IpAddr::V4(ip) if ip.octets()[0] == 10)));
    let ips: BTreeMap<String, IpAddr> = pods.iter().map(|p| (p.id(), p.ip)).collect();
    let base_ns: BTreeMap<String, BTreeMap<String, String>> = NAMESPACES
        .iter()
        .map(|n| {
            (
                n.to_string(),
                BTreeMap::from([("ns".to_string(), n.to_string())]),
            )
        })
        .collect();
    let base_pods = pods.clone();

    let scenarios = scenarios(&ips);
    assert!(scenarios.len() >= 60, "{} scenarios", scenarios.len());
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut probed = 0usize;
    for (sname, steps) in &scenarios {
        let mut world = World {
            pods: base_pods.clone(),
            ns_labels: base_ns.clone(),
            policies: Vec::new(),
        };
        for step in steps {
            match step {
                Step::Apply(ps) => {
                    k.apply(ps);
                    for p in ps {
                        world.policies.retain(|q| {
                            q["metadata"]["namespace"] != p["metadata"]["namespace"]
                                || q["metadata"]["name"] != p["metadata"]["name"]
                        });
                        world.policies.push(p.clone());
                    }
                }
                Step::PodLabel(ns, pod, key, value) => {
                    let arg = match value {
                        Some(v) => format!("{key}={v}"),
                        None => format!("{key}-"),
                    };
                    k.run(&["label", "pod", pod, "-n", ns, &arg, "--overwrite"]);
                    let p = world
                        .pods
                        .iter_mut()
                        .find(|p| p.ns == *ns && p.name == *pod)
                        .unwrap();
                    match value {
                        Some(v) => p.labels.insert(key.to_string(), v.to_string()),
                        None => p.labels.remove(*key),
                    };
                }
                Step::NsLabel(ns, key, value) => {
                    let arg = match value {
                        Some(v) => format!("{key}={v}"),
                        None => format!("{key}-"),
                    };
                    k.run(&["label", "namespace", ns, &arg, "--overwrite"]);
                    let l = world.ns_labels.get_mut(*ns).unwrap();
                    match value {
                        Some(v) => l.insert(key.to_string(), v.to_string()),
                        None => l.remove(*key),
                    };
                }
            }
        }
        // the policy takes effect within the agent's sync: retry a little
        let mut bad = Vec::new();
        for attempt in 0..4 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(500));
            }
            let seen = observe(&bin, &world);
            probed += seen.len();
            bad = mismatches(&world, &seen);
            if bad.is_empty() {
                break;
            }
        }
        eprintln!(
            "{sname}: {}",
            if bad.is_empty() {
                "ok".to_string()
            } else {
                format!("{} mismatches", bad.len())
            }
        );
        if !bad.is_empty() {
            failures.push(format!("{sname}:\n  {}", bad.join("\n  ")));
        }
        // reset: policies and labels as at the start
        for ns in NAMESPACES {
            if world
                .policies
                .iter()
                .any(|p| p["metadata"]["namespace"] == ns)
            {
                k.run(&["delete", "networkpolicy", "--all", "-n", ns]);
            }
        }
        for step in steps {
            match step {
                Step::PodLabel(ns, pod, key, _) => {
                    k.run(&["label", "pod", pod, "-n", ns, &format!("{key}-")]);
                }
                Step::NsLabel(ns, key, _) => {
                    k.run(&["label", "namespace", ns, &format!("{key}-")]);
                }
                Step::Apply(_) => {}
            }
        }
    }
    eprintln!(
        "{} scenarios, {probed} probes in {:.0} s",
        scenarios.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
