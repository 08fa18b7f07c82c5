use std::net::Ipv4Addr;

use cozyplane_api::labels::ANNOTATION_POD_LABELS;
use cozyplane_datapath::abi::{EpKey, SgCidr, SG_CIDR_FIXED_BITS};
use serde_json::json;

use super::*;

fn vpc(ns: &str, name: &str, vni: Option<i32>) -> VPC {
    serde_json::from_value(json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "VPC",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"cidrs": ["10.1.0.0/16"]},
        "status": {"vni": vni},
    }))
    .unwrap()
}

/// A group in `ns` of VPC `vpc` selecting `app=<selects>`.
fn sg(ns: &str, name: &str, vpc: &str, selects: &str, ingress: serde_json::Value) -> SecurityGroup {
    serde_json::from_value(json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "SecurityGroup",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{ns}-{name}")},
        "spec": {
            "vpcRef": {"name": vpc},
            "podSelector": {"matchLabels": {"app": selects}},
            "ingress": ingress,
        },
    }))
    .unwrap()
}

fn port(vni: u32, ip: &str, vpc_ns: &str, vpc: &str, pod: &str) -> Port {
    let ip: IpAddr = ip.parse().unwrap();
    serde_json::from_value(json!({
        "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port",
        "metadata": {"name": cozyplane_api::names::port_name(vni, ip)},
        "spec": {
            "vpcRef": {"namespace": vpc_ns, "name": vpc},
            "ip": ip.to_string(),
            "podNamespace": "apps", "podName": pod,
        },
    }))
    .unwrap()
}

fn pod(name: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "apps", "name": name, "labels": {"app": app}},
    }))
    .unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn member(c: &CompiledSecurityGroups, net: u32, addr: &str) -> Option<Vec<u32>> {
    c.desired
        .members
        .get(&EpKey::new(net, ip(addr)))
        .map(|g| g.ids().to_vec())
}

fn id(c: &CompiledSecurityGroups, ns: &str, name: &str) -> u32 {
    c.ids[&(ns.to_string(), name.to_string())].1
}

/// The rules of subject `group` towards peer `(peer_net, peer)` as
/// (dir, proto, first port, prefix bits).
fn rules_of(c: &CompiledSecurityGroups, group: u32, peer: (u32, u32)) -> Vec<(u8, u8, u16, u32)> {
    c.desired
        .rules
        .keys()
        .filter(|r| r.rule.group == group && (r.rule.peer_net, r.rule.peer) == peer)
        .map(|r| {
            (
                r.rule.dir,
                r.rule.proto,
                u16::from_be_bytes(r.rule.port),
                r.prefix_len - SG_RULE_FIXED_BITS,
            )
        })
        .collect()
}

/// t1 owns VPC net (VNI 100): web (app=web) and app (app=app, TCP 8000 from web).
fn basic() -> (Vec<VPC>, Vec<SecurityGroup>, Vec<Port>, Vec<Pod>) {
    let vpcs = vec![vpc("t1", "net", Some(100))];
    let groups = vec![
        sg("t1", "web", "net", "web", json!([])),
        sg(
            "t1",
            "app",
            "net",
            "app",
            json!([{"from": {"group": "web"}, "ports": [{"protocol": "TCP", "port": 8000}]}]),
        ),
    ];
    let ports = vec![
        port(100, "10.1.0.2", "t1", "net", "w"),
        port(100, "10.1.0.3", "t1", "net", "a"),
        port(100, "10.1.0.4", "t1", "net", "o"),
    ];
    let pods = vec![pod("w", "web"), pod("a", "app"), pod("o", "other")];
    (vpcs, groups, ports, pods)
}

#[test]
fn members_and_a_group_rule_compile_to_the_map_entries() {
    let (vpcs, groups, ports, pods) = basic();
    let c = compile_security_groups(&vpcs, &groups, &ports, &pods);
    assert_eq!(c.diagnostics, []);
    let (web, app) = (id(&c, "t1", "web"), id(&c, "t1", "app"));
    assert_ne!(web, app);
    assert_eq!(c.ids[&("t1".into(), "web".into())].0, 100);
    assert_eq!(member(&c, 100, "10.1.0.2"), Some(vec![web]));
    assert_eq!(member(&c, 100, "10.1.0.3"), Some(vec![app]));
    assert_eq!(member(&c, 100, "10.1.0.4"), None, "no group: unrestricted");
    assert_eq!(rules_of(&c, app, (100, web)), [(SG_INGRESS, TCP, 8000, 16)]);
    assert_eq!(c.desired.rules.len(), 1);
    assert!(c.desired.cidrs.is_empty());
    // the same input compiles to the same output
    assert_eq!(compile_security_groups(&vpcs, &groups, &ports, &pods), c);
}

#[test]
fn ids_are_per_group_and_do_not_move_when_others_come_and_go() {
    let (vpcs, mut groups, ports, pods) = basic();
    let before = compile_security_groups(&vpcs, &groups, &ports, &pods);
    for i in 0..200 {
        groups.push(sg(
            "t1",
            &format!("g{i}"),
            "net",
            &format!("x{i}"),
            json!([]),
        ));
    }
    let after = compile_security_groups(&vpcs, &groups, &ports, &pods);
    assert_eq!(after.ids.len(), 202, "no cap of 62 groups per VPC");
    let distinct: std::collections::BTreeSet<_> = after.ids.values().collect();
    assert_eq!(distinct.len(), 202);
    for g in ["web", "app"] {
        assert_eq!(id(&before, "t1", g), id(&after, "t1", g));
    }
}

#[test]
fn port_ranges_protocols_and_icmp_expand_to_prefixes() {
    let vpcs = vec![vpc("t1", "net", Some(100))];
    let groups = vec![
        sg("t1", "web", "net", "web", json!([])),
        sg(
            "t1",
            "app",
            "net",
            "app",
            json!([
                {"from": {"group": "web"}, "ports": [
                    {"protocol": "udp", "port": 5000, "endPort": 5003},
                    {"protocol": "TCP", "port": 0},
                    {"protocol": "ICMP", "port": 8},
                ]},
            ]),
        ),
        sg(
            "t1",
            "all",
            "net",
            "all",
            json!([{"from": {"group": "web"}}]),
        ),
    ];
    let c = compile_security_groups(&vpcs, &groups, &[], &[]);
    assert_eq!(c.diagnostics, []);
    let (web, app, all) = (
        id(&c, "t1", "web"),
        id(&c, "t1", "app"),
        id(&c, "t1", "all"),
    );
    let mut got = rules_of(&c, app, (100, web));
    got.sort();
    assert_eq!(
        got,
        [
            (SG_INGRESS, ICMP, 8, 16),
            (SG_INGRESS, TCP, 0, 0),
            (SG_INGRESS, UDP, 5000, 14),
            (SG_INGRESS, ICMPV6, 128, 16),
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
    // no ports: every port of TCP and UDP, every ICMP and ICMPv6 type (the
    // type is the port's low byte: 0-255 is the prefix 0/8)
    let mut every = rules_of(&c, all, (100, web));
    every.sort();
    assert_eq!(
        every,
        [
            (SG_INGRESS, ICMP, 0, 8),
            (SG_INGRESS, TCP, 0, 0),
            (SG_INGRESS, UDP, 0, 0),
            (SG_INGRESS, ICMPV6, 0, 8)
        ]
    );
}

fn cidr_of(c: &CompiledSecurityGroups, group: u32, net: &str, len: u8) -> Option<u32> {
    let key = sg_cidr_key(100, group, SG_INGRESS, ip(net), len).unwrap();
    c.desired.cidrs.get(&CidrEntry::from(key)).copied()
}

#[test]
fn cidr_classes_hold_the_ports_of_every_enclosing_prefix() {
    let vpcs = vec![vpc("t1", "net", Some(100))];
    let groups = vec![sg(
        "t1",
        "app",
        "net",
        "app",
        json!([
            {"from": {"cidr": "10.1.0.0/24"}, "ports": [{"protocol": "TCP", "port": 23}]},
            {"from": {"cidr": "10.1.0.4/32"}, "ports": [{"protocol": "TCP", "port": 22}]},
            {"from": {"cidr": "192.0.2.7/24"}, "ports": [{"protocol": "TCP", "port": 443}]},
            {"from": {"cidr": "::/0"}, "ports": [{"protocol": "TCP", "port": 80}]},
        ]),
    )];
    let c = compile_security_groups(&vpcs, &groups, &[], &[]);
    assert_eq!(c.diagnostics, []);
    let app = id(&c, "t1", "app");
    let class_24 = cidr_of(&c, app, "10.1.0.0", 24).unwrap();
    let class_32 = cidr_of(&c, app, "10.1.0.4", 32).unwrap();
    // host bits are cleared
    let class_doc = cidr_of(&c, app, "192.0.2.0", 24).unwrap();
    let class_v6 = cidr_of(&c, app, "::", 0).unwrap();
    // ::/0 must not cover IPv4 sources: a barrier class at 64:ff9b::/96 (the
    // IPv4 /0's key) without rules
    let barrier = cidr_of(&c, app, "0.0.0.0", 0).unwrap();
    let ports = |class| {
        let mut v: Vec<u16> = rules_of(&c, app, (SG_PEER_CIDR, class))
            .into_iter()
            .map(|(_, _, p, _)| p)
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(ports(class_24), [23]);
    assert_eq!(ports(class_32), [22, 23]);
    assert_eq!(ports(class_doc), [443]);
    assert_eq!(ports(class_v6), [80]);
    assert_eq!(ports(barrier), Vec::<u16>::new());
    assert_eq!(c.desired.cidrs.len(), 5);
    let k = c
        .desired
        .cidrs
        .keys()
        .find(|k| k.prefix_len == SG_CIDR_FIXED_BITS + 96 + 32)
        .unwrap();
    assert_eq!(
        k.cidr,
        SgCidr {
            net: 100,
            group: app,
            dir: SG_INGRESS,
            pad: [0; 3],
            addr: Ipv4Addr::new(10, 1, 0, 4).into(),
        }
    );
}

#[test]
fn a_group_of_a_peered_vpc_is_keyed_by_its_own_net() {
    let vpcs = vec![vpc("t1", "net", Some(100)), vpc("t2", "other", Some(101))];
    let groups = vec![
        sg("t2", "client", "other", "client", json!([])),
        sg(
            "t1",
            "app",
            "net",
            "app",
            json!([
                {"from": {"group": "client", "vpc": {"namespace": "t2", "name": "other"}},
                 "ports": [{"protocol": "TCP", "port": 80}]},
                // the wrong VPC for that group: skipped
                {"from": {"group": "client", "vpc": {"namespace": "t2", "name": "nope"}}},
                // without vpc, a group of the own VPC is meant: there is none
                {"from": {"group": "client"}},
            ]),
        ),
    ];
    let c = compile_security_groups(&vpcs, &groups, &[], &[]);
    let (app, client) = (id(&c, "t1", "app"), id(&c, "t2", "client"));
    assert_eq!(
        rules_of(&c, app, (101, client)),
        [(SG_INGRESS, TCP, 80, 16)]
    );
    assert_eq!(c.desired.rules.len(), 1);
    assert_eq!(
        c.diagnostics,
        [
            SgDiagnostic::UnknownPeerGroup {
                group: "t1/app".into(),
                peer: "t1/client".into()
            },
            SgDiagnostic::UnknownPeerGroup {
                group: "t1/app".into(),
                peer: "t2/client".into()
            },
        ]
    );
}

#[test]
fn what_cannot_be_compiled_is_reported_and_allows_nothing() {
    let vpcs = vec![vpc("t1", "net", Some(100)), vpc("t1", "pending", None)];
    let mut bad_sel = sg("t1", "badsel", "net", "x", json!([]));
    bad_sel.spec.pod_selector = serde_json::from_value(
        json!({"matchExpressions": [{"key": "app", "operator": "Near", "values": ["a"]}]}),
    )
    .unwrap();
    let groups = vec![
        sg("t1", "early", "pending", "app", json!([])),
        sg(
            "t1",
            "app",
            "net",
            "app",
            json!([
                {"from": {"cidr": "10.1.0.0/33"}},
                {"from": {"cidr": "10.0.0.0/8", "group": "app"}},
                {"from": {}},
                {"from": {"group": "app"}, "ports": [{"protocol": "SCTP", "port": 1}]},
                {"from": {"group": "app"}, "ports": [{"protocol": "TCP", "port": 90, "endPort": 80}]},
                {"from": {"group": "app"}, "ports": [{"protocol": "TCP", "port": 0, "endPort": 80}]},
            ]),
        ),
        bad_sel,
    ];
    let mut stale = port(100, "10.1.0.9", "t1", "net", "a");
    stale.metadata.name = Some(cozyplane_api::names::port_name(200, ip("10.1.0.9")));
    let ports = vec![port(100, "10.1.0.3", "t1", "net", "a"), stale];
    let c = compile_security_groups(&vpcs, &groups, &ports, &[pod("a", "app")]);
    assert!(c.desired.rules.is_empty() && c.desired.cidrs.is_empty());
    let kinds: Vec<String> = c
        .diagnostics
        .iter()
        .map(|d| {
            format!("{d:?}")
                .split([' ', '{'])
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "VpcNotReady",
            "BadSelector",
            "BadPeer",
            "BadPeer",
            "BadPeer",
            "BadPort",
            "BadPort",
            "BadPort",
            "BadClaim"
        ],
        "{:#?}",
        c.diagnostics
    );
    for d in &c.diagnostics {
        assert!(!d.to_string().is_empty());
    }
    // the port is still a member of app (its rules were skipped: it admits nothing)
    assert_eq!(member(&c, 100, "10.1.0.3"), Some(vec![id(&c, "t1", "app")]));
}

#[test]
fn an_endpoint_keeps_at_most_16_groups_the_lowest_ids() {
    let vpcs = vec![vpc("t1", "net", Some(100))];
    let groups: Vec<SecurityGroup> = (0..20)
        .map(|i| sg("t1", &format!("g{i}"), "net", "app", json!([])))
        .collect();
    let ports = vec![port(100, "10.1.0.3", "t1", "net", "a")];
    let c = compile_security_groups(&vpcs, &groups, &ports, &[pod("a", "app")]);
    let mut all: Vec<u32> = c.ids.values().map(|(_, id)| *id).collect();
    all.sort_unstable();
    assert_eq!(member(&c, 100, "10.1.0.3"), Some(all[..16].to_vec()));
    assert_eq!(
        c.diagnostics,
        [SgDiagnostic::TooManyGroups {
            port: cozyplane_api::names::port_name(100, ip("10.1.0.3")),
            selected: 20
        }]
    );
}

#[test]
fn labels_come_from_the_pod_else_the_ports_snapshot_and_selectors_are_full() {
    let vpcs = vec![vpc("t1", "net", Some(100))];
    let mut expr = sg("t1", "tiered", "net", "unused", json!([]));
    expr.spec.pod_selector = serde_json::from_value(json!({
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]
    }))
    .unwrap();
    let mut empty = sg("t1", "everyone", "net", "unused", json!([]));
    empty.spec.pod_selector = Some(LabelSelectorDefault::default());
    let mut none = sg("t1", "nobody", "net", "unused", json!([]));
    none.spec.pod_selector = None;
    let groups = vec![sg("t1", "web", "net", "web", json!([])), expr, empty, none];
    let mut gone = port(100, "10.1.0.8", "t1", "net", "gone");
    gone.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_POD_LABELS.to_string(),
        r#"{"app":"web","tier":"front"}"#.to_string(),
    )]));
    let ports = vec![port(100, "10.1.0.2", "t1", "net", "w"), gone];
    let c = compile_security_groups(&vpcs, &groups, &ports, &[pod("w", "web")]);
    assert_eq!(c.diagnostics, []);
    let (web, tiered, everyone) = (
        id(&c, "t1", "web"),
        id(&c, "t1", "tiered"),
        id(&c, "t1", "everyone"),
    );
    let sorted = |mut v: Vec<u32>| {
        v.sort_unstable();
        v
    };
    assert_eq!(
        member(&c, 100, "10.1.0.2"),
        Some(sorted(vec![web, everyone]))
    );
    assert_eq!(
        member(&c, 100, "10.1.0.8"),
        Some(sorted(vec![web, tiered, everyone]))
    );
}

type LabelSelectorDefault = cozyplane_api::sdn::LabelSelector;

/// A deterministic xorshift64* generator for the equivalence test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}

fn random_labels(r: &mut Rng) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    for _ in 0..r.below(4) {
        m.insert(
            r.pick(&["app", "tier", "x"]).into(),
            r.pick(&["a", "b", "c"]).into(),
        );
    }
    m
}

fn random_selector(r: &mut Rng) -> serde_json::Value {
    let mut sel = serde_json::Map::new();
    if r.chance(70) {
        sel.insert("matchLabels".into(), random_labels(r).into());
    }
    if r.chance(35) {
        let exprs: Vec<serde_json::Value> = (0..1 + r.below(2))
            .map(|_| {
                let op = r.pick(&["In", "NotIn", "Exists", "DoesNotExist", "Near"]);
                let values: Vec<&str> = (0..r.below(3)).map(|_| r.pick(&["a", "b", "c"])).collect();
                json!({"key": r.pick(&["app", "tier", "x"]), "operator": op, "values": values})
            })
            .collect();
        sel.insert("matchExpressions".into(), exprs.into());
    }
    sel.into()
}

fn random_rules(r: &mut Rng, key: &str) -> serde_json::Value {
    let rules: Vec<serde_json::Value> = (0..r.below(4))
        .map(|_| {
            let mut peer = serde_json::Map::new();
            let kind = r.below(10);
            if kind < 5 || kind == 8 {
                peer.insert("group".into(), r.pick(&["g0", "g1", "g2", "g3"]).into());
            }
            if kind >= 5 {
                let c = r.pick(&[
                    "10.1.0.0/24",
                    "10.1.0.4/32",
                    "10.1.0.7/24",
                    "0.0.0.0/0",
                    "::/0",
                    "64:ff9b::/96",
                    "2001:db8::/32",
                    "10.1.0.0/33",
                    "nope",
                ]);
                peer.insert("cidr".into(), c.into());
            }
            if r.chance(25) {
                peer.insert(
                    "vpc".into(),
                    json!({"namespace": r.pick(&["t1", "t2"]), "name": r.pick(&["net", "other", "gone"])}),
                );
            }
            let ports: Vec<serde_json::Value> = (0..r.below(3))
                .map(|_| {
                    let mut p = serde_json::Map::new();
                    p.insert("protocol".into(), r.pick(&["TCP", "udp", "ICMP", "SCTP"]).into());
                    p.insert("port".into(), r.pick(&[0, 8, 80, 5000, -1, 70000]).into());
                    if let Some(end) = r.pick(&[None, None, Some(0), Some(10), Some(5003), Some(300)]) {
                        p.insert("endPort".into(), end.into());
                    }
                    p.into()
                })
                .collect();
            let mut rule = serde_json::Map::new();
            let dir = if key == "ingress" { "from" } else { "to" };
            rule.insert(dir.into(), peer.into());
            rule.insert("ports".into(), ports.into());
            serde_json::Value::from(rule)
        })
        .collect();
    rules.into()
}

/// A random, often inconsistent, world: duplicate VPCs and group names,
/// uid collisions, VPCs without VNI, bad selectors, peers and ports, stale
/// and malformed claims, Ports with and without pods and label snapshots.
fn random_world(seed: u64) -> (Vec<VPC>, Vec<SecurityGroup>, Vec<Port>, Vec<Pod>) {
    let r = &mut Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut vpcs: Vec<VPC> = (0..r.below(5))
        .map(|_| {
            vpc(
                r.pick(&["t1", "t2"]),
                r.pick(&["net", "other", "gone"]),
                r.pick(&[Some(100), Some(101), Some(102), Some(7), None]),
            )
        })
        .collect();
    if r.chance(70) {
        vpcs.insert(0, vpc("t1", "net", Some(100)));
    }
    // one world in eight has many groups (more than an endpoint holds)
    let many = r.chance(12);
    let groups = (0..if many { 40 } else { r.below(14) })
        .map(|i| {
            let ns = if many { "t1" } else { r.pick(&["t1", "t2"]) };
            let name = if many {
                format!("g{i}")
            } else {
                r.pick(&["g0", "g1", "g2", "g3", "g4"]).to_string()
            };
            let mut meta = json!({"namespace": ns, "name": name});
            if let Some(uid) = r.pick(&[None, Some("u1"), Some("u2"), Some("u3"), Some("u4")]) {
                meta["uid"] = uid.into();
            }
            if let Some(t) = r.pick(&[None, Some("2026-01-01T00:00:00Z"), Some("2026-01-02T00:00:00Z")]) {
                meta["creationTimestamp"] = t.into();
            }
            let mut spec = json!({
                "vpcRef": {"name": if many { "net" } else { r.pick(&["net", "net", "other", "gone"]) }},
                "ingress": random_rules(r, "ingress"),
                "egress": random_rules(r, "egress"),
            });
            if many && r.chance(80) {
                spec["podSelector"] = json!({});
            } else if r.chance(85) {
                spec["podSelector"] = random_selector(r);
            }
            serde_json::from_value(json!({
                "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "SecurityGroup",
                "metadata": meta, "spec": spec,
            }))
            .unwrap()
        })
        .collect();
    let ports = (0..r.below(30))
        .map(|_| {
            let ip: IpAddr = if r.chance(70) {
                IpAddr::V4(Ipv4Addr::new(10, 1, 0, r.pick(&[1, 2, 3, 4, 5, 6, 7, 8])))
            } else {
                IpAddr::V6(format!("fd00::{}", r.below(6)).parse().unwrap())
            };
            let name = if r.chance(90) {
                cozyplane_api::names::port_name(r.pick(&[100, 100, 100, 101, 102, 200]), ip)
            } else {
                r.pick(&["x", "v", "v100", "v1x0.10-1-0-1"]).to_string()
            };
            let mut vpc_ref = json!({"name": r.pick(&["net", "net", "other", "gone"])});
            if r.chance(95) {
                vpc_ref["namespace"] = r.pick(&["t1", "t1", "t2"]).into();
            }
            let spec_ip = if r.chance(95) {
                ip.to_string()
            } else {
                "bad".into()
            };
            let mut meta = json!({"name": name});
            if r.chance(25) {
                let snapshot = if r.chance(80) {
                    serde_json::Value::from(random_labels(r)).to_string()
                } else {
                    "{not json".into()
                };
                let mut annotations = serde_json::Map::new();
                annotations.insert(ANNOTATION_POD_LABELS.into(), snapshot.into());
                meta["annotations"] = annotations.into();
            }
            serde_json::from_value(json!({
                "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port",
                "metadata": meta,
                "spec": {
                    "vpcRef": vpc_ref, "ip": spec_ip,
                    "podNamespace": r.pick(&["apps", "other"]),
                    "podName": format!("p{}", r.below(10)),
                },
            }))
            .unwrap()
        })
        .collect();
    let pods = (0..r.below(12))
        .map(|_| {
            let mut meta = json!({"namespace": r.pick(&["apps", "other"]), "name": format!("p{}", r.below(10))});
            if r.chance(85) {
                meta["labels"] = random_labels(r).into();
            }
            serde_json::from_value(json!({ "metadata": meta })).unwrap()
        })
        .collect();
    (vpcs, groups, ports, pods)
}

#[test]
fn the_compiler_matches_its_reference_on_random_worlds() {
    let (mut members, mut rules, mut cidrs) = (0, 0, 0);
    let mut kinds = std::collections::HashSet::new();
    for seed in 0..1000 {
        let (vpcs, groups, ports, pods) = random_world(seed);
        let got = compile_security_groups(&vpcs, &groups, &ports, &pods);
        let want = super::reference::compile_security_groups(&vpcs, &groups, &ports, &pods);
        assert_eq!(got, want, "seed {seed}");
        members += got.desired.members.len();
        rules += got.desired.rules.len();
        cidrs += got.desired.cidrs.len();
        for d in &got.diagnostics {
            kinds.insert(std::mem::discriminant(d));
        }
    }
    // the worlds exercise every part of the compiler
    assert!(
        members > 300 && rules > 3000 && cidrs > 500,
        "{members} {rules} {cidrs}"
    );
    assert_eq!(kinds.len(), 8, "every diagnostic occurs");
}

/// `o` with a resourceVersion that follows its content, as the API server
/// gives a changed object a new one.
fn versioned<K: kube::Resource + serde::Serialize + Clone>(o: &K) -> K {
    use std::hash::{Hash, Hasher};
    let mut o = o.clone();
    o.meta_mut().resource_version = None;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&o).unwrap().hash(&mut h);
    o.meta_mut().resource_version = Some(h.finish().to_string());
    o
}

/// Applies or deletes a random object of `pool` in `index` and `live`.
fn watch_step<K>(r: &mut Rng, index: &mut SgIndex, live: &mut BTreeMap<String, K>, pool: &[K])
where
    K: SgIndexed + kube::Resource + serde::Serialize + Clone,
{
    if pool.is_empty() {
        return;
    }
    let o = versioned(&r.pick(pool));
    if r.chance(20) {
        index.delete(&o);
        live.remove(&o.index_key());
    } else {
        index.apply(&o);
        live.insert(o.index_key(), o);
    }
}

#[test]
fn an_index_kept_by_watch_events_compiles_like_the_reference() {
    for seed in 0..400_u64 {
        let r = &mut Rng(seed.wrapping_mul(0x2545_f491) | 1);
        // two worlds: an object of the second replaces the first's of its
        // key (an update), and back
        let (mut vpcs, mut groups, mut ports, mut pods) = random_world(seed);
        let more = random_world(seed + 100_000);
        vpcs.extend(more.0);
        groups.extend(more.1);
        ports.extend(more.2);
        pods.extend(more.3);
        let mut index = SgIndex::new();
        let mut live = (
            BTreeMap::new(),
            BTreeMap::new(),
            BTreeMap::new(),
            BTreeMap::new(),
        );
        for _ in 0..150 {
            match r.below(4) {
                0 => watch_step(r, &mut index, &mut live.0, &vpcs),
                1 => watch_step(r, &mut index, &mut live.1, &groups),
                2 => watch_step(r, &mut index, &mut live.2, &ports),
                _ => watch_step(r, &mut index, &mut live.3, &pods),
            }
        }
        let lists: (Vec<VPC>, Vec<SecurityGroup>, Vec<Port>, Vec<Pod>) = (
            live.0.values().cloned().collect(),
            live.1.values().cloned().collect(),
            live.2.values().cloned().collect(),
            live.3.values().cloned().collect(),
        );
        let want =
            super::reference::compile_security_groups(&lists.0, &lists.1, &lists.2, &lists.3);
        assert_eq!(index.compile(), want, "seed {seed}");
        for (kind, n) in [
            (SgKind::Vpc, lists.0.len()),
            (SgKind::SecurityGroup, lists.1.len()),
            (SgKind::Port, lists.2.len()),
            (SgKind::Pod, lists.3.len()),
        ] {
            assert_eq!(index.len(kind), n, "seed {seed}");
        }
        // everything deleted: no string stays interned
        for kind in [
            SgKind::Vpc,
            SgKind::SecurityGroup,
            SgKind::Port,
            SgKind::Pod,
        ] {
            for key in index.keys(kind) {
                index.remove(kind, &key);
            }
        }
        assert_eq!(index.interned(), 0, "seed {seed}");
        assert_eq!(index.compile(), CompiledSecurityGroups::default());
    }
}

#[test]
fn an_object_seen_again_at_its_resource_version_is_reused() {
    let (vpcs, groups, mut ports, pods) = basic();
    for p in &mut ports {
        p.metadata.resource_version = Some("1".into());
    }
    let mut index = SgIndex::new();
    vpcs.iter().for_each(|o| index.apply(o));
    groups.iter().for_each(|o| index.apply(o));
    ports.iter().for_each(|o| index.apply(o));
    pods.iter().for_each(|o| index.apply(o));
    let before = index.compile();
    assert_eq!(
        before,
        compile_security_groups(&vpcs, &groups, &ports, &pods)
    );
    // a relist delivers the object again at its version: the record stays
    // (the API server never changes an object without a new version; here
    // the content differs only to show the record was not rebuilt)
    let mut again = ports[1].clone();
    again.spec.vpc_ref.namespace = None;
    index.apply(&again);
    assert_eq!(index.compile(), before);
    // a new version replaces it
    again.metadata.resource_version = Some("2".into());
    index.apply(&again);
    let after = index.compile();
    assert_eq!(member(&after, 100, "10.1.0.3"), None);
    assert!(matches!(
        &after.diagnostics[..],
        [SgDiagnostic::BadClaim { .. }]
    ));
}

#[test]
fn label_churn_does_not_grow_the_interned_strings() {
    let (vpcs, groups, ports, pods) = basic();
    let mut index = SgIndex::from_objects(&vpcs, &groups, &ports, &pods);
    let interned = index.interned();
    let mut w = pod("w", "web");
    for i in 0..1000 {
        w.metadata.resource_version = Some(i.to_string());
        w.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert("pod-template-hash".into(), format!("h{i}"));
        index.apply(&w);
    }
    // the one label key and value the pod holds now
    assert_eq!(index.interned(), interned + 2);
    let w = pod("w", "web");
    index.apply(&w);
    assert_eq!(index.interned(), interned);
    assert_eq!(
        index.compile(),
        compile_security_groups(&vpcs, &groups, &ports, &pods)
    );
}

#[test]
fn names_that_join_alike_do_not_alias_in_the_index() {
    // `a` + `b/c` and `a/b` + `c` join to one `a/b/c`; a label key or value
    // may spell an object's interned key; empty names are names too
    let vpcs = vec![
        vpc("a", "b/c", Some(100)),
        vpc("a/b", "c", Some(101)),
        vpc("", "", Some(102)),
    ];
    let mut groups = vec![
        sg(
            "a",
            "g",
            "b/c",
            "1:a/b/c",
            json!([{"from": {"group": "g"}}]),
        ),
        sg(
            "a/b",
            "g",
            "c",
            "1:a/b/c",
            json!([{"from": {"group": "g", "vpc": {"namespace": "a", "name": "b/c"}}}]),
        ),
        sg("", "", "", "", json!([{"from": {"group": ""}}])),
    ];
    groups[2].metadata.uid = None;
    let mut p1 = port(100, "10.1.0.2", "a", "b/c", "y/z");
    p1.spec.pod_namespace = Some("x".into());
    let mut p2 = port(101, "10.1.0.2", "a/b", "c", "z");
    p2.spec.pod_namespace = Some("x/y".into());
    let mut p3 = port(102, "10.1.0.3", "", "", "");
    p3.spec.pod_namespace = Some(String::new());
    let mut y_z = pod("y/z", "1:a/b/c");
    y_z.metadata.namespace = Some("x".into());
    let mut z = pod("z", "other");
    z.metadata.namespace = Some("x/y".into());
    z.metadata.labels = Some(BTreeMap::from([(
        "1:x/y/z".to_string(),
        "1:a/b/c".to_string(),
    )]));
    let mut empty = pod("", "");
    empty.metadata.namespace = Some(String::new());
    let (ports, pods) = (vec![p1, p2, p3], vec![y_z, z, empty]);
    let c = compile_security_groups(&vpcs, &groups, &ports, &pods);
    assert_eq!(
        c,
        super::reference::compile_security_groups(&vpcs, &groups, &ports, &pods)
    );
    assert_eq!(c.ids.len(), 3);
    assert_eq!(member(&c, 100, "10.1.0.2"), Some(vec![id(&c, "a", "g")]));
    assert_eq!(
        member(&c, 101, "10.1.0.2"),
        None,
        "pod x/y/z is not pod x/y/z"
    );
    assert_eq!(member(&c, 102, "10.1.0.3"), Some(vec![id(&c, "", "")]));
    // the peered rule names group g of VPC a/b/c: net 100, not 101
    let g2 = id(&c, "a/b", "g");
    assert_eq!(rules_of(&c, g2, (100, id(&c, "a", "g"))).len(), 4);
}
