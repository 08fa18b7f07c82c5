use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{json, Value};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn service(v: Value) -> Service {
    serde_json::from_value(v).unwrap()
}

fn slice(v: Value) -> EndpointSlice {
    serde_json::from_value(v).unwrap()
}

/// A ClusterIP Service `ns/web` on 10.96.0.10:80 → named port `http`.
fn web(extra_spec: Value) -> Service {
    let mut spec = json!({
        "clusterIP": "10.96.0.10",
        "clusterIPs": ["10.96.0.10"],
        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    });
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    service(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": spec
    }))
}

/// An endpoint: (address, node, ready, serving, terminating).
type Ep<'a> = (&'a str, &'a str, Option<bool>, Option<bool>, Option<bool>);

fn web_slice(name: &str, family: &str, port: u16, eps: &[Ep]) -> EndpointSlice {
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|(a, n, r, s, t)| {
            json!({
                "addresses": [a],
                "nodeName": n,
                "conditions": {"ready": r, "serving": s, "terminating": t}
            })
        })
        .collect();
    slice(json!({
        "metadata": {"namespace": "ns", "name": name,
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": family,
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": port, "protocol": "TCP"},
                  {"name": "metrics", "port": 9090, "protocol": "TCP"}]
    }))
}

fn node() -> NodeView {
    NodeView {
        name: "n1".into(),
        addresses: vec![ip("192.168.0.1")],
        cluster_addresses: [
            "10.0.1.5",
            "10.0.1.6",
            "10.0.2.7",
            "10.0.2.8",
            "fd00::5",
            "fd00::7",
            "192.168.0.2",
        ]
        .iter()
        .map(|a| ip(a))
        .collect::<BTreeSet<_>>(),
        external_backends: Vec::new(),
        proxy_name: None,
    }
}

fn key(addr: &str, port: u16, scope: Scope) -> FrontendKey {
    FrontendKey {
        net: 0,
        addr: ip(addr),
        port,
        proto: Proto::Tcp,
        scope,
    }
}

fn addrs(f: &Frontend) -> Vec<String> {
    f.backends
        .iter()
        .map(|b| format!("{}:{}", b.addr, b.port))
        .collect()
}

const READY: (Option<bool>, Option<bool>, Option<bool>) = (Some(true), Some(true), Some(false));

fn ep<'a>(a: &'a str, n: &'a str) -> Ep<'a> {
    (a, n, READY.0, READY.1, READY.2)
}

#[test]
fn a_cluster_ip_picks_the_ready_endpoints_of_its_named_port_local_first() {
    let slices = [web_slice(
        "web-1",
        "IPv4",
        8080,
        &[
            ep("10.0.2.7", "n2"),
            ep("10.0.1.6", "n1"),
            ep("10.0.1.5", "n1"),
            // Not ready, not terminating: out.
            ("10.0.2.8", "n2", Some(false), Some(false), Some(false)),
        ],
    )];
    let t = compile_services(&[web(json!({}))], &slices, &node());
    assert!(t.diagnostics.is_empty(), "{:?}", t.diagnostics);
    assert_eq!(t.frontends.len(), 1, "a ClusterIP has no wire frontend");
    let f = &t.frontends[&key("10.96.0.10", 80, Scope::Internal)];
    assert_eq!(
        addrs(f),
        ["10.0.1.5:8080", "10.0.1.6:8080", "10.0.2.7:8080"]
    );
    assert_eq!(f.local_count, 2);
    assert_eq!(f.kind, FrontendKind::ClusterIp);
    assert_eq!(f.port_name, "http");
    assert_eq!(f.service, ("ns".to_string(), "web".to_string()));
    assert!(!f.terminating_fallback);
    assert!(
        f.maglev.is_empty(),
        "socket-LB frontends need no Maglev table"
    );
    assert_eq!(f.affinity_timeout_s, None);
}

#[test]
fn unset_conditions_mean_ready_and_duplicates_across_slices_count_once() {
    let slices = [
        web_slice(
            "web-1",
            "IPv4",
            8080,
            &[("10.0.1.5", "n1", None, None, None)],
        ),
        web_slice(
            "web-2",
            "IPv4",
            8080,
            &[ep("10.0.1.5", "n1"), ep("10.0.2.7", "n2")],
        ),
    ];
    let t = compile_services(&[web(json!({}))], &slices, &node());
    let f = &t.frontends[&key("10.96.0.10", 80, Scope::Internal)];
    assert_eq!(addrs(f), ["10.0.1.5:8080", "10.0.2.7:8080"]);
}

#[test]
fn serving_terminating_endpoints_are_used_only_when_none_is_ready() {
    let terminating = (Some(false), Some(true), Some(true));
    let gone = (Some(false), Some(false), Some(true));
    let eps = [
        (
            "10.0.1.5",
            "n1",
            terminating.0,
            terminating.1,
            terminating.2,
        ),
        ("10.0.1.6", "n1", gone.0, gone.1, gone.2),
    ];
    let t = compile_services(
        &[web(json!({}))],
        &[web_slice("s", "IPv4", 8080, &eps)],
        &node(),
    );
    let f = &t.frontends[&key("10.96.0.10", 80, Scope::Internal)];
    assert_eq!(addrs(f), ["10.0.1.5:8080"]);
    assert!(f.terminating_fallback);

    // One ready endpoint anywhere, and the terminating one is out.
    let mut with_ready = eps.to_vec();
    with_ready.push(ep("10.0.2.7", "n2"));
    let t = compile_services(
        &[web(json!({}))],
        &[web_slice("s", "IPv4", 8080, &with_ready)],
        &node(),
    );
    let f = &t.frontends[&key("10.96.0.10", 80, Scope::Internal)];
    assert_eq!(addrs(f), ["10.0.2.7:8080"]);
    assert!(!f.terminating_fallback);
}

#[test]
fn internal_traffic_policy_local_keeps_this_nodes_endpoints_only() {
    let svc = web(json!({"internalTrafficPolicy": "Local"}));
    let slices = [web_slice(
        "s",
        "IPv4",
        8080,
        &[ep("10.0.1.5", "n1"), ep("10.0.2.7", "n2")],
    )];
    let t = compile_services(std::slice::from_ref(&svc), &slices, &node());
    assert_eq!(
        addrs(&t.frontends[&key("10.96.0.10", 80, Scope::Internal)]),
        ["10.0.1.5:8080"]
    );
    // No local endpoint: no backend (refused), not another node's.
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.2.7", "n2")])];
    let t = compile_services(&[svc], &slices, &node());
    assert!(t.frontends[&key("10.96.0.10", 80, Scope::Internal)]
        .backends
        .is_empty());
}

#[test]
fn node_ports_exist_on_every_node_address_and_etp_local_limits_the_wire_scope() {
    let svc = web(json!({
        "type": "NodePort",
        "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]
    }));
    let mut n = node();
    n.addresses.push(ip("fd00:1::1"));
    let slices = [web_slice(
        "s",
        "IPv4",
        8080,
        &[ep("10.0.1.5", "n1"), ep("10.0.2.7", "n2")],
    )];
    let t = compile_services(&[svc], &slices, &n);
    // From the wire: only this node's endpoint (the client's address is kept).
    let wire = &t.frontends[&key("192.168.0.1", 30080, Scope::External)];
    assert_eq!(addrs(wire), ["10.0.1.5:8080"]);
    assert_eq!(wire.kind, FrontendKind::NodePort);
    assert_eq!(wire.maglev.len(), maglev_size(1) as usize);
    assert!(wire.maglev.iter().all(|&i| i == 0));
    // From inside: every endpoint (kube-proxy's short-circuit).
    let inside = &t.frontends[&key("192.168.0.1", 30080, Scope::Internal)];
    assert_eq!(addrs(inside), ["10.0.1.5:8080", "10.0.2.7:8080"]);
    // The Service is IPv4 only: no NodePort on the node's IPv6 address (its
    // connections stay the node's own, as with kube-proxy's IPv4 proxier).
    assert!(!t.frontends.keys().any(|k| k.addr == ip("fd00:1::1")));
    // And the ClusterIP stays.
    assert!(t
        .frontends
        .contains_key(&key("10.96.0.10", 80, Scope::Internal)));
    assert_eq!(t.frontends.len(), 3);
}

#[test]
fn a_dual_stack_node_port_is_served_on_both_families_and_programmed_per_packet() {
    let svc = web(json!({
        "type": "NodePort",
        "clusterIPs": ["10.96.0.10", "fd00:96::10"],
        "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]
    }));
    let mut n = node();
    n.addresses.push(ip("fd00:1::1"));
    let slices = [
        web_slice("s4", "IPv4", 8080, &[ep("10.0.1.5", "n1")]),
        web_slice(
            "s6",
            "IPv6",
            8080,
            &[ep("fd00::5", "n1"), ep("fd00::7", "n2")],
        ),
    ];
    let t = compile_services(std::slice::from_ref(&svc), &slices, &n);
    let wire6 = &t.frontends[&key("fd00:1::1", 30080, Scope::External)];
    assert_eq!(wire6.kind, FrontendKind::NodePort);
    assert_eq!(addrs(wire6), ["fd00::5:8080", "fd00::7:8080"]);
    assert_eq!(wire6.local_count, 1);
    assert_eq!(wire6.maglev.len(), maglev_size(2) as usize);
    let wire4 = &t.frontends[&key("192.168.0.1", 30080, Scope::External)];
    assert_eq!(addrs(wire4), ["10.0.1.5:8080"]);
    // The per-packet load balancer takes the IPv6 wire frontend too.
    let d = to_desired(&t);
    let (k, f) = desired_frontend(&key("fd00:1::1", 30080, Scope::External), wire6);
    assert_eq!(d.get(&k), Some(&f));
    assert_eq!(f.backends.len(), 2);
    assert_eq!(f.maglev.len(), wire6.maglev.len());

    // Without ipFamilies, the cluster IPs' families decide.
    let mut implicit = svc.clone();
    if let Some(spec) = implicit.spec.as_mut() {
        spec.ip_families = None;
        spec.cluster_ips = Some(vec!["fd00:96::10".into()]);
        spec.cluster_ip = Some("fd00:96::10".into());
    }
    let t = compile_services(&[implicit], &slices, &n);
    assert!(t
        .frontends
        .contains_key(&key("fd00:1::1", 30080, Scope::External)));
    assert!(!t.frontends.keys().any(|k| k.addr == ip("192.168.0.1")));
}

#[test]
fn load_balancer_ips_carry_source_ranges_on_the_wire_and_proxy_mode_ips_are_skipped() {
    let mut svc = web(json!({
        "type": "LoadBalancer",
        "loadBalancerSourceRanges": ["203.0.113.0/24", " 198.51.100.7/32", "2001:db8::/32"],
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]
    }));
    svc.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [
        {"ip": "172.16.0.10"},
        {"ip": "172.16.0.11", "ipMode": "Proxy"},
        {"hostname": "lb.example"}
    ]}}))
    .unwrap();
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.2.7", "n2")])];
    let t = compile_services(&[svc], &slices, &node());
    let wire = &t.frontends[&key("172.16.0.10", 80, Scope::External)];
    assert_eq!(wire.kind, FrontendKind::LoadBalancer);
    assert_eq!(
        wire.source_ranges,
        vec![
            "198.51.100.7/32".parse::<IpNet>().unwrap(),
            "203.0.113.0/24".parse().unwrap()
        ],
        "v4 ranges only, sorted"
    );
    assert_eq!(
        addrs(wire),
        ["10.0.2.7:8080"],
        "etp Cluster: every endpoint"
    );
    let inside = &t.frontends[&key("172.16.0.10", 80, Scope::Internal)];
    assert!(
        inside.source_ranges.is_empty(),
        "ranges filter the wire only"
    );
    assert!(!t.frontends.keys().any(|k| k.addr == ip("172.16.0.11")));
    // The NodePort's wire frontend has no source ranges (kube-proxy applies them to the LB IP).
    assert!(t.frontends[&key("192.168.0.1", 30080, Scope::External)]
        .source_ranges
        .is_empty());
    // ... and the datapath gets them with the LB IP's wire frontend only.
    let d = to_desired(&t);
    let with_ranges: Vec<_> = d
        .iter()
        .filter(|(_, f)| !f.source_ranges.is_empty())
        .collect();
    assert_eq!(with_ranges.len(), 1, "{d:?}");
    assert_eq!(with_ranges[0].0.addr.to_ip(), ip("172.16.0.10"));
    assert_eq!(
        with_ranges[0].1.source_ranges,
        vec![(ip("198.51.100.7"), 32), (ip("203.0.113.0"), 24)]
    );
}

#[test]
fn external_ips_get_both_scopes() {
    let svc = web(json!({"externalIPs": ["198.51.100.20"], "externalTrafficPolicy": "Local"}));
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.2.7", "n2")])];
    let t = compile_services(&[svc], &slices, &node());
    let wire = &t.frontends[&key("198.51.100.20", 80, Scope::External)];
    assert_eq!(wire.kind, FrontendKind::ExternalIp);
    assert!(wire.backends.is_empty(), "etp Local, no local endpoint");
    let inside = &t.frontends[&key("198.51.100.20", 80, Scope::Internal)];
    assert_eq!(addrs(inside), ["10.0.2.7:8080"]);
}

#[test]
fn endpoints_that_are_not_cluster_addresses_are_ignored_with_a_reason() {
    let slices = [web_slice(
        "s",
        "IPv4",
        8080,
        &[
            ep("10.0.1.5", "n1"),
            ep("10.250.0.9", "n1"),
            ep("not-an-ip", "n1"),
        ],
    )];
    let t = compile_services(&[web(json!({}))], &slices, &node());
    assert_eq!(
        addrs(&t.frontends[&key("10.96.0.10", 80, Scope::Internal)]),
        ["10.0.1.5:8080"]
    );
    assert_eq!(
        t.diagnostics,
        vec![
            ServiceDiagnostic::ForeignEndpoint {
                namespace: "ns".into(),
                slice: "s".into(),
                addr: ip("10.250.0.9")
            },
            ServiceDiagnostic::BadEndpoint {
                namespace: "ns".into(),
                slice: "s".into(),
                value: "not-an-ip".into()
            },
        ]
    );
    // Unless the operator allowed that range (`--service-external-backends`).
    let mut n = node();
    n.external_backends = vec!["10.250.0.0/24".parse().unwrap()];
    let t = compile_services(&[web(json!({}))], &slices, &n);
    assert_eq!(
        addrs(&t.frontends[&key("10.96.0.10", 80, Scope::Internal)]),
        ["10.0.1.5:8080", "10.250.0.9:8080"]
    );
}

#[test]
fn each_family_gets_its_own_backends() {
    let svc = web(json!({
        "clusterIPs": ["10.96.0.10", "fd00:96::10"],
        "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "PreferDualStack"
    }));
    let slices = [
        web_slice("s4", "IPv4", 8080, &[ep("10.0.1.5", "n1")]),
        web_slice("s6", "IPv6", 8080, &[ep("fd00::7", "n2")]),
        // An IPv4 address in an IPv6 slice is malformed.
        web_slice("bad", "IPv6", 8080, &[ep("10.0.1.6", "n1")]),
    ];
    let t = compile_services(&[svc], &slices, &node());
    assert_eq!(
        addrs(&t.frontends[&key("10.96.0.10", 80, Scope::Internal)]),
        ["10.0.1.5:8080"]
    );
    assert_eq!(
        addrs(&t.frontends[&key("fd00:96::10", 80, Scope::Internal)]),
        ["fd00::7:8080"]
    );
    assert_eq!(t.diagnostics.len(), 1, "{:?}", t.diagnostics);
}

#[test]
fn headless_external_name_and_other_proxies_services_get_no_frontend() {
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.1.5", "n1")])];
    let headless = web(json!({"clusterIP": "None", "clusterIPs": ["None"]}));
    let external_name = web(json!({"type": "ExternalName", "externalName": "db.example"}));
    let mut other = web(json!({}));
    other.metadata.labels =
        Some([(LABEL_SERVICE_PROXY_NAME.to_string(), "other".to_string())].into());
    for svc in [headless, external_name, other.clone()] {
        let t = compile_services(&[svc], &slices, &node());
        assert!(t.frontends.is_empty(), "{:?}", t.frontends);
    }
    // An agent named "other" takes the labelled one.
    let mut n = node();
    n.proxy_name = Some("other".into());
    assert_eq!(compile_services(&[other], &slices, &n).frontends.len(), 1);
}

#[test]
fn client_ip_affinity_carries_its_timeout() {
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.1.5", "n1")])];
    let t = compile_services(
        &[web(json!({"sessionAffinity": "ClientIP"}))],
        &slices,
        &node(),
    );
    assert_eq!(
        t.frontends[&key("10.96.0.10", 80, Scope::Internal)].affinity_timeout_s,
        Some(DEFAULT_AFFINITY_TIMEOUT_S)
    );
    let svc = web(json!({
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 5}}
    }));
    let t = compile_services(&[svc], &slices, &node());
    assert_eq!(
        t.frontends[&key("10.96.0.10", 80, Scope::Internal)].affinity_timeout_s,
        Some(5)
    );
}

#[test]
fn bad_service_fields_are_reported_and_the_rest_compiles() {
    let svc = web(json!({
        "clusterIPs": ["10.96.0.10", "bogus"],
        "ports": [
            {"name": "http", "port": 80, "protocol": "TCP"},
            {"name": "x", "port": 81, "protocol": "ICMP"}
        ]
    }));
    let slices = [web_slice("s", "IPv4", 8080, &[ep("10.0.1.5", "n1")])];
    let t = compile_services(&[svc], &slices, &node());
    assert_eq!(t.frontends.len(), 1);
    assert_eq!(t.diagnostics.len(), 2, "{:?}", t.diagnostics);
}

#[test]
fn udp_and_sctp_ports_match_their_own_protocol_only() {
    let svc = service(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {"clusterIPs": ["10.96.0.10"], "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "sig", "port": 3868, "protocol": "SCTP"}
        ]}
    }));
    let s = slice(json!({
        "metadata": {"namespace": "ns", "name": "s",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.1.5"], "nodeName": "n1"}],
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"},
                  {"name": "dns", "port": 5354, "protocol": "TCP"},
                  {"name": "sig", "port": 3869, "protocol": "SCTP"}]
    }));
    let t = compile_services(&[svc], &[s], &node());
    let udp = FrontendKey {
        proto: Proto::Udp,
        ..key("10.96.0.10", 53, Scope::Internal)
    };
    assert_eq!(addrs(&t.frontends[&udp]), ["10.0.1.5:5353"]);
    let sctp = FrontendKey {
        proto: Proto::Sctp,
        ..key("10.96.0.10", 3868, Scope::Internal)
    };
    assert_eq!(addrs(&t.frontends[&sctp]), ["10.0.1.5:3869"]);
    assert_eq!(t.frontends.len(), 2);
}

#[test]
fn there_is_no_cap_on_backends_per_service() {
    // 1000 backends (the prior implementation stopped at 16).
    let mut n = node();
    let eps: Vec<String> = (0..1000)
        .map(|i| format!("10.1.{}.{}", i / 250, i % 250 + 1))
        .collect();
    n.cluster_addresses.extend(eps.iter().map(|a| ip(a)));
    let list: Vec<Ep> = eps.iter().map(|a| ep(a, "n2")).collect();
    let t = compile_services(
        &[web(json!({}))],
        &[web_slice("s", "IPv4", 8080, &list)],
        &n,
    );
    assert_eq!(
        t.frontends[&key("10.96.0.10", 80, Scope::Internal)]
            .backends
            .len(),
        1000
    );
}

fn backends(n: usize) -> Vec<Backend> {
    (0..n)
        .map(|i| Backend {
            addr: ip(&format!("10.0.{}.{}", i / 200, i % 200 + 1)),
            port: 8080,
            proto: Proto::Tcp,
        })
        .collect()
}

#[test]
fn maglev_fills_every_slot_evenly() {
    for n in [1, 2, 3, 10, 100, 1000] {
        let b = backends(n);
        let table = maglev_table(&b);
        assert_eq!(table.len(), maglev_size(n) as usize);
        let mut counts = vec![0usize; n];
        for &i in &table {
            counts[i as usize] += 1;
        }
        let (lo, hi) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
        // Maglev's fill is round-robin: shares differ by at most a few slots
        // per backend, whatever the hash.
        assert!(lo > 0, "n={n}: a backend got no slot");
        assert!(hi - lo <= 1 + hi / 10, "n={n}: {lo}..{hi}");
    }
    assert!(maglev_table(&[]).is_empty());
    assert_eq!(maglev_size(1), 251);
    assert_eq!(maglev_size(10), 1021);
    assert_eq!(maglev_size(1000), 65_521);
}

#[test]
fn maglev_depends_on_the_set_not_the_order() {
    let b = backends(20);
    let mut shuffled = b.clone();
    shuffled.reverse();
    shuffled.swap(3, 11);
    let t1: Vec<Backend> = maglev_table(&b).iter().map(|&i| b[i as usize]).collect();
    let t2: Vec<Backend> = maglev_table(&shuffled)
        .iter()
        .map(|&i| shuffled[i as usize])
        .collect();
    assert_eq!(t1, t2);
}

#[test]
fn maglev_moves_little_when_a_backend_goes() {
    let all = backends(50);
    let fewer: Vec<Backend> = all.iter().copied().filter(|b| *b != all[17]).collect();
    let before: Vec<Backend> = maglev_table(&all)
        .iter()
        .map(|&i| all[i as usize])
        .collect();
    let after: Vec<Backend> = maglev_table(&fewer)
        .iter()
        .map(|&i| fewer[i as usize])
        .collect();
    assert_eq!(
        before.len(),
        after.len(),
        "same size for 50 and 49 backends"
    );
    // Flows of the surviving backends mostly stay: the paper's bound is a few %
    // of the table beyond the removed backend's own share.
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| **b != all[17] && b != a)
        .count();
    assert!(
        moved * 100 < before.len() * 3,
        "{moved} of {} slots of surviving backends moved",
        before.len()
    );
}

#[test]
fn the_desired_maps_hold_the_frontends_with_local_and_affinity_flags() {
    use cozyplane_datapath::abi::{
        BACKEND_F_LOCAL, SVC_F_AFFINITY, SVC_SCOPE_EXTERNAL, SVC_SCOPE_INTERNAL,
    };
    let svc = web(json!({
        "type": "NodePort",
        "sessionAffinity": "ClientIP",
        "ports": [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]
    }));
    let slices = [web_slice(
        "s",
        "IPv4",
        8080,
        &[ep("10.0.1.5", "n1"), ep("10.0.2.7", "n2")],
    )];
    let t = compile_services(&[svc], &slices, &node());
    let d = to_desired(&t);
    // ClusterIP and the NodePort as seen from inside, and the NodePort on the
    // wire (per-packet LB), with its Maglev table; ClusterIPs never on the wire.
    assert_eq!(d.len(), 3, "{d:?}");
    let wire: Vec<_> = d
        .iter()
        .filter(|(k, _)| k.scope == SVC_SCOPE_EXTERNAL)
        .collect();
    assert_eq!(wire.len(), 1, "{d:?}");
    let (wk, wf) = wire[0];
    assert_eq!(
        (wk.addr.to_ip(), wk.port),
        (ip("192.168.0.1"), 30080u16.to_be_bytes())
    );
    assert_eq!(wf.backends.len(), 2);
    assert!(!wf.maglev.is_empty() && wf.maglev.iter().all(|&i| i < 2));
    assert_eq!(wf.local_count, 1);
    let k = cozyplane_datapath::abi::SvcKey::new(0, ip("10.96.0.10"), 80, 6, SVC_SCOPE_INTERNAL);
    let f = &d[&k];
    assert_eq!(f.addr.addr.to_ip(), ip("10.96.0.10"));
    assert_eq!(f.addr.port, 80u16.to_be_bytes());
    assert_eq!(f.backends.len(), 2);
    assert_eq!(f.backends[0].addr.to_ip(), ip("10.0.1.5"));
    assert_eq!(f.backends[0].port, 8080u16.to_be_bytes());
    assert_eq!(f.backends[0].flags, BACKEND_F_LOCAL);
    assert_eq!(f.backends[1].flags, 0);
    assert_eq!(f.local_count, 1);
    assert_eq!(
        (f.flags, f.affinity_s),
        (SVC_F_AFFINITY, DEFAULT_AFFINITY_TIMEOUT_S)
    );
    assert!(d.contains_key(&cozyplane_datapath::abi::SvcKey::new(
        0,
        ip("192.168.0.1"),
        30080,
        6,
        SVC_SCOPE_INTERNAL
    )));
}

#[test]
fn cluster_addresses_are_pods_and_nodes() {
    let fip: cozyplane_api::FabricIP = serde_json::from_value(json!({
        "metadata": {"name": "f-10-0-1-5"},
        "spec": {"address": "10.0.1.5", "node": "n1"}
    }))
    .unwrap();
    let bad: cozyplane_api::FabricIP = serde_json::from_value(json!({
        "metadata": {"name": "f-10-0-1-6"},
        "spec": {"address": "10.0.1.7", "node": "n1"}
    }))
    .unwrap();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "n2", "annotations": {"cozyplane.io/node-addresses": "172.16.0.2, fd00::2"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"},
                                  {"type": "Hostname", "address": "n2"}]}
    }))
    .unwrap();
    let got = cluster_addresses(&[node], &[fip, bad], &[ip("192.168.0.1")]);
    let want: BTreeSet<IpAddr> = [
        "10.0.1.5",
        "192.168.0.1",
        "192.168.0.2",
        "172.16.0.2",
        "fd00::2",
    ]
    .iter()
    .map(|a| ip(a))
    .collect();
    assert_eq!(
        got, want,
        "a claim whose name and address disagree is no pod address"
    );
}
