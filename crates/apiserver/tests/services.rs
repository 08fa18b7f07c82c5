//! core/v1 Services as kube-apiserver serves them (issue #11, increment
//! 1a), over HTTP on both backends: validation with field causes, cluster
//! IPs allocated as IPAddress objects (requested, random, dual-stack,
//! exhausted), node ports, release on delete and on type change, no claim
//! left by a failed create, exactly one winner among concurrent creates
//! of one IP, allocations that survive a restart, and the repair of
//! claims a crash left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

#[macro_use]
mod support;

use std::collections::BTreeSet;

use cozyplane_apiserver::ServerBuilder;
use futures::future::join_all;
use serde_json::{json, Value};
use support::{Backend, Harness, Resp};

both_backends!(
    cluster_ips_are_allocated_as_ip_addresses,
    bad_services_are_422_with_field_causes,
    node_ports_are_allocated_shared_and_released,
    a_failed_create_leaves_no_claim_behind,
    concurrent_creates_of_one_ip_have_one_winner,
    concurrent_random_allocations_never_collide,
    updates_keep_allocations_and_cluster_ips_are_immutable,
    the_service_cidr_is_published,
    the_kubernetes_service_points_at_the_server,
);

/// Runs each named `async fn(&Harness)` on both backends with a server
/// adjusted by `$builder`.
macro_rules! both_backends_with {
    ($builder:path; $($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                if let Some(h) = support::start_with(Backend::Embedded, concat!(stringify!($name), "_embedded"), $builder).await {
                    super::$name(&h).await;
                    h.server.shutdown().await;
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                if let Some(h) = support::start_with(Backend::Etcd, concat!(stringify!($name), "_etcd"), $builder).await {
                    super::$name(&h).await;
                    h.server.shutdown().await;
                }
            }
        }
    )*};
}

both_backends_with!(super::dual_stack; dual_stack_families_and_policies);
both_backends_with!(super::tiny_ranges; exhausted_ranges_are_a_clear_error);

fn dual_stack(b: ServerBuilder) -> ServerBuilder {
    b.service_cidrs("10.0.0.0/24,fd00:10::/120".parse().unwrap())
}

fn tiny_ranges(b: ServerBuilder) -> ServerBuilder {
    b.service_cidrs("10.0.0.0/29".parse().unwrap())
        .node_port_range("30000-30002".parse().unwrap())
}

fn svcs(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/services")
}

fn svc(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

fn web(name: &str) -> Value {
    svc(
        name,
        json!({"selector": {"app": name}, "ports": [{"port": 80}]}),
    )
}

async fn create(h: &Harness, ns: &str, body: Value) -> Resp {
    h.post(&svcs(ns), &body).await
}

async fn created(h: &Harness, ns: &str, body: Value) -> Value {
    let r = create(h, ns, body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.body
}

fn causes(r: &Resp) -> Vec<(String, String)> {
    r.body["details"]["causes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["field"].as_str().unwrap_or("").to_string(),
                        c["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A 422 with a cause at `field` whose message contains `says`.
fn assert_invalid(r: &Resp, field: &str, says: &str) {
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(r.body["reason"], "Invalid", "{}", r.text);
    let c = causes(r);
    assert!(
        c.iter().any(|(f, m)| f == field && m.contains(says)),
        "want a cause at {field} saying {says:?}, got {c:?}"
    );
}

async fn ip_address(h: &Harness, ip: &str) -> Resp {
    h.get(&format!("/apis/networking.k8s.io/v1/ipaddresses/{ip}"))
        .await
}

async fn ip_addresses(h: &Harness) -> Vec<String> {
    let r = h.get("/apis/networking.k8s.io/v1/ipaddresses").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.item_names()
}

async fn node_port_claimed(h: &Harness, port: i64) -> bool {
    h.store
        .get(&format!("/ranges/servicenodeports/{port}"))
        .await
        .unwrap()
        .is_some()
}

fn cluster_ip(s: &Value) -> String {
    s["spec"]["clusterIP"].as_str().unwrap_or("").to_string()
}

fn node_ports(s: &Value) -> Vec<i64> {
    s["spec"]["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["nodePort"].as_i64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

async fn cluster_ips_are_allocated_as_ip_addresses(h: &Harness) {
    h.namespace("a").await;
    let s = created(h, "a", web("one")).await;
    let ip = cluster_ip(&s);
    assert!(ip.starts_with("10.0.0."), "default range 10.0.0.0/24: {ip}");
    assert_eq!(s["spec"]["clusterIPs"], json!([ip]));
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(s["spec"]["ipFamilyPolicy"], "SingleStack");
    assert_eq!(s["spec"]["type"], "ClusterIP");
    // Stored as returned.
    let got = h.get(&format!("{}/one", svcs("a"))).await;
    assert_eq!(cluster_ip(&got.body), ip);
    let ipa = ip_address(h, &ip).await;
    assert_eq!(ipa.status, 200, "{}", ipa.text);
    assert_eq!(
        ipa.body["spec"]["parentRef"],
        json!({"group": "", "resource": "services", "namespace": "a", "name": "one"})
    );
    assert_eq!(ipa.body["kind"], "IPAddress");

    // A requested IP: taken, out of range, free.
    let s = created(
        h,
        "a",
        svc(
            "two",
            json!({"clusterIP": "10.0.0.10", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(cluster_ip(&s), "10.0.0.10");
    let r = create(
        h,
        "a",
        svc(
            "three",
            json!({"clusterIP": "10.0.0.10", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_invalid(&r, "spec.clusterIPs[0]", "provided IP is already allocated");
    let r = create(
        h,
        "a",
        svc(
            "three",
            json!({"clusterIP": "10.1.0.10", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_invalid(
        &r,
        "spec.clusterIPs[0]",
        "is not in the valid range. The range of valid IPs is 10.0.0.0/24",
    );
    let r = create(
        h,
        "a",
        svc(
            "three",
            json!({"clusterIPs": ["fd00::1"], "ipFamilies": ["IPv6"], "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_invalid(&r, "spec.ipFamilies[0]", "not configured on this cluster");
    let r = create(
        h,
        "a",
        svc(
            "three",
            json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_invalid(&r, "spec.ipFamilyPolicy", "not configured for dual-stack");
    // PreferDualStack on a single-stack cluster is single-stack.
    let s = created(
        h,
        "a",
        svc(
            "pref",
            json!({"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(s["spec"]["clusterIPs"].as_array().map(Vec::len), Some(1));

    // Headless and ExternalName Services allocate nothing.
    let before = ip_addresses(h).await;
    let s = created(
        h,
        "a",
        svc(
            "headless",
            json!({"clusterIP": "None", "selector": {"app": "x"}}),
        ),
    )
    .await;
    assert_eq!(s["spec"]["clusterIPs"], json!(["None"]));
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
    let s = created(
        h,
        "a",
        svc(
            "ext",
            json!({"type": "ExternalName", "externalName": "db.example.com"}),
        ),
    )
    .await;
    assert!(s["spec"].get("clusterIP").is_none(), "{s}");
    assert_eq!(ip_addresses(h).await, before);

    // Delete releases: the IP can be requested again.
    let r = h.delete(&format!("{}/two", svcs("a"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(ip_address(h, "10.0.0.10").await.status, 404);
    let s = created(
        h,
        "a",
        svc(
            "three",
            json!({"clusterIP": "10.0.0.10", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(cluster_ip(&s), "10.0.0.10");
    // dryRun claims nothing.
    let r = h
        .post(
            &format!("{}?dryRun=All", svcs("a")),
            &svc(
                "dry",
                json!({"clusterIP": "10.0.0.11", "ports": [{"port": 80}]}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(cluster_ip(&r.body), "10.0.0.11");
    assert_eq!(ip_address(h, "10.0.0.11").await.status, 404);
}

async fn bad_services_are_422_with_field_causes(h: &Harness) {
    h.namespace("b").await;
    let cases = [
        (json!({"ports": []}), "spec.ports", "Required value"),
        (
            json!({"type": "Magic", "ports": [{"port": 80}]}),
            "spec.type",
            "Unsupported value",
        ),
        (
            json!({"ports": [{"port": 80, "protocol": "ICMP"}]}),
            "spec.ports[0].protocol",
            "Unsupported value",
        ),
        (
            json!({"ports": [{"port": 80, "name": "a"}, {"port": 81}]}),
            "spec.ports[1].name",
            "Required value",
        ),
        (
            json!({"ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]}),
            "spec.ports[1]",
            "Duplicate value",
        ),
        (
            json!({"ports": [{"port": 80, "targetPort": "Not_A_Name"}]}),
            "spec.ports[0].targetPort",
            "IANA_SVC_NAME",
        ),
        (
            json!({"ports": [{"port": 80, "nodePort": 30000}]}),
            "spec.ports[0].nodePort",
            "may not be used when `type` is 'ClusterIP'",
        ),
        (
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}),
            "spec.ports[0].nodePort",
            "provided port is not in the valid range. The range of valid ports is 30000-32767",
        ),
        (
            json!({"type": "LoadBalancer", "clusterIP": "None", "ports": [{"port": 80}]}),
            "spec.clusterIPs[0]",
            "may not be set to 'None' for LoadBalancer services",
        ),
        (
            json!({"ports": [{"port": 80}], "externalTrafficPolicy": "Local"}),
            "spec.externalTrafficPolicy",
            "externally-accessible",
        ),
        (
            json!({"ports": [{"port": 80}], "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}}),
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
            "between 1 and 86400",
        ),
        (
            json!({"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0/40"]}),
            "spec.loadBalancerSourceRanges[0]",
            "IP ranges",
        ),
        (
            json!({"ports": [{"port": 80}], "ipFamilies": ["IPv4", "IPv6"]}),
            "spec.ipFamilyPolicy",
            "multiple IP families",
        ),
    ];
    for (spec, field, says) in cases {
        let r = create(h, "b", svc("bad", spec.clone())).await;
        assert_invalid(&r, field, says);
    }
    let r = create(h, "b", svc("Bad-Name", json!({"ports": [{"port": 80}]}))).await;
    assert_invalid(&r, "metadata.name", "DNS-1035");
    // Nothing was stored or claimed (10.0.0.1 is the kubernetes Service's).
    assert!(h.get(&svcs("b")).await.item_names().is_empty());
    assert_eq!(ip_addresses(h).await, ["10.0.0.1"]);
}

async fn node_ports_are_allocated_shared_and_released(h: &Harness) {
    h.namespace("n").await;
    // TCP and UDP of port 53 share one node port; port 80 gets another.
    let s = created(
        h,
        "n",
        svc(
            "dns",
            json!({"type": "NodePort", "ports": [
                {"name": "dns-tcp", "port": 53},
                {"name": "dns-udp", "port": 53, "protocol": "UDP"},
                {"name": "http", "port": 80},
            ]}),
        ),
    )
    .await;
    let nps = node_ports(&s);
    assert!(nps.iter().all(|p| (30000..=32767).contains(p)), "{nps:?}");
    assert_eq!(nps[0], nps[1], "one node port for one port number");
    assert_ne!(nps[0], nps[2]);
    assert!(node_port_claimed(h, nps[0]).await && node_port_claimed(h, nps[2]).await);
    assert_eq!(s["spec"]["externalTrafficPolicy"], "Cluster");

    // A requested node port: taken, then free.
    let r = create(
        h,
        "n",
        svc(
            "other",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": nps[2]}]}),
        ),
    )
    .await;
    assert_invalid(
        &r,
        "spec.ports[0].nodePort",
        "provided port is already allocated",
    );
    let s = created(
        h,
        "n",
        svc(
            "fixed",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 31080}]}),
        ),
    )
    .await;
    assert_eq!(node_ports(&s), [31080]);

    // LoadBalancer with externalTrafficPolicy Local gets a health check port.
    let s = created(h, "n", svc("lb", json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 443}]}))).await;
    let hc = s["spec"]["healthCheckNodePort"].as_i64().unwrap_or(0);
    assert!((30000..=32767).contains(&hc), "{s}");
    assert!(node_port_claimed(h, hc).await);
    assert_ne!(hc, node_ports(&s)[0]);
    // ... and no node ports when asked not to allocate them.
    let s = created(h, "n", svc("lb2", json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": [{"port": 443}]}))).await;
    assert_eq!(node_ports(&s), [0]);

    // A label change keeps the node ports.
    let r = h
        .patch(
            &format!("{}/fixed", svcs("n")),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(node_ports(&r.body), [31080]);
    // Changing the type to ClusterIP drops and releases them.
    let r = h
        .patch(
            &format!("{}/fixed", svcs("n")),
            "application/merge-patch+json",
            &json!({"spec": {"type": "ClusterIP"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(node_ports(&r.body), [0]);
    assert!(
        r.body["spec"].get("externalTrafficPolicy").is_none(),
        "{}",
        r.text
    );
    assert!(!node_port_claimed(h, 31080).await);
    // ... and back to NodePort allocates again.
    let r = h
        .patch(
            &format!("{}/fixed", svcs("n")),
            "application/merge-patch+json",
            &json!({"spec": {"type": "NodePort"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let again = node_ports(&r.body)[0];
    assert!(again != 0 && node_port_claimed(h, again).await);
    // externalTrafficPolicy Local on the LB without it adds a health check port; back to Cluster releases it.
    let r = h
        .patch(
            &format!("{}/lb", svcs("n")),
            "application/merge-patch+json",
            &json!({"spec": {"externalTrafficPolicy": "Cluster"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.body["spec"].get("healthCheckNodePort").is_none(),
        "{}",
        r.text
    );
    assert!(!node_port_claimed(h, hc).await);

    // Delete releases every node port.
    assert_eq!(h.delete(&format!("{}/dns", svcs("n"))).await.status, 200);
    assert!(!node_port_claimed(h, nps[0]).await && !node_port_claimed(h, nps[2]).await);
}

async fn a_failed_create_leaves_no_claim_behind(h: &Harness) {
    h.namespace("f").await;
    // the holder's cluster IP is given, so that a random one cannot be
    // one this test names below (10.0.0.20 was, once in CI)
    created(
        h,
        "f",
        svc(
            "holder",
            json!({"type": "NodePort", "clusterIP": "10.0.0.19",
                "ports": [{"port": 80, "nodePort": 30101}]}),
        ),
    )
    .await;
    // The cluster IP and the first node port are claimed, then the second
    // node port is taken: nothing of it may stay claimed.
    let r = create(
        h,
        "f",
        svc(
            "half",
            json!({"type": "NodePort", "clusterIP": "10.0.0.20", "ports": [
                {"name": "a", "port": 80, "nodePort": 30100},
                {"name": "b", "port": 81, "nodePort": 30101},
            ]}),
        ),
    )
    .await;
    assert_invalid(
        &r,
        "spec.ports[1].nodePort",
        "provided port is already allocated",
    );
    assert_eq!(
        ip_address(h, "10.0.0.20").await.status,
        404,
        "the cluster IP was given back"
    );
    assert!(
        !node_port_claimed(h, 30100).await,
        "the first node port was given back"
    );
    // A create refused by the store after allocating (the name exists).
    let r = create(
        h,
        "f",
        svc(
            "holder",
            json!({"clusterIP": "10.0.0.21", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(
        ip_address(h, "10.0.0.21").await.status,
        404,
        "the cluster IP was given back"
    );
    // So all three can be had.
    let s = created(h, "f", svc("whole", json!({"type": "NodePort", "clusterIPs": ["10.0.0.20"], "ports": [{"port": 80, "nodePort": 30100}]}))).await;
    assert_eq!(cluster_ip(&s), "10.0.0.20");
    created(
        h,
        "f",
        svc(
            "whole2",
            json!({"clusterIP": "10.0.0.21", "ports": [{"port": 80}]}),
        ),
    )
    .await;
}

async fn concurrent_creates_of_one_ip_have_one_winner(h: &Harness) {
    h.namespace("c").await;
    let creates = (0..10).map(|i| {
        create(
            h,
            "c",
            svc(
                &format!("s{i}"),
                json!({"clusterIP": "10.0.0.77", "ports": [{"port": 80}]}),
            ),
        )
    });
    let results = join_all(creates).await;
    let winners: Vec<usize> = (0..10).filter(|i| results[*i].status == 201).collect();
    assert_eq!(winners.len(), 1, "exactly one create gets the IP");
    for r in results.iter().filter(|r| r.status != 201) {
        assert_invalid(r, "spec.clusterIPs[0]", "provided IP is already allocated");
    }
    let ipa = ip_address(h, "10.0.0.77").await;
    assert_eq!(
        ipa.body["spec"]["parentRef"]["name"],
        format!("s{}", winners[0])
    );
    assert_eq!(h.get(&svcs("c")).await.item_names().len(), 1);
    // The same for a node port.
    let creates = (0..10).map(|i| {
        create(
            h,
            "c",
            svc(
                &format!("n{i}"),
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30777}]}),
            ),
        )
    });
    let results = join_all(creates).await;
    assert_eq!(results.iter().filter(|r| r.status == 201).count(), 1);
    assert_eq!(
        ip_addresses(h).await.len(),
        3,
        "the losers' cluster IPs were given back (left: the kubernetes Service's and the winners')"
    );
}

async fn concurrent_random_allocations_never_collide(h: &Harness) {
    h.namespace("r").await;
    let creates = (0..30).map(|i| {
        create(
            h,
            "r",
            svc(
                &format!("s{i}"),
                json!({"type": "NodePort", "ports": [{"port": 80}]}),
            ),
        )
    });
    let results = join_all(creates).await;
    let mut ips = BTreeSet::new();
    let mut ports = BTreeSet::new();
    for r in &results {
        assert_eq!(r.status, 201, "{}", r.text);
        assert!(ips.insert(cluster_ip(&r.body)), "an IP given out twice");
        assert!(
            ports.insert(node_ports(&r.body)[0]),
            "a node port given out twice"
        );
    }
    let names: BTreeSet<String> = ip_addresses(h).await.into_iter().collect();
    ips.insert("10.0.0.1".into()); // the kubernetes Service
    assert_eq!(names, ips);
}

async fn updates_keep_allocations_and_cluster_ips_are_immutable(h: &Harness) {
    h.namespace("u").await;
    let s = created(
        h,
        "u",
        svc(
            "one",
            json!({"type": "NodePort", "selector": {"a": "b"}, "ports": [{"port": 80}]}),
        ),
    )
    .await;
    let ip = cluster_ip(&s);
    let np = node_ports(&s)[0];
    // A PUT of the manifest without the allocated values keeps them (kubectl replace).
    let mut put = svc(
        "one",
        json!({"type": "NodePort", "selector": {"a": "c"}, "ports": [{"port": 80}]}),
    );
    put["metadata"]["resourceVersion"] = s["metadata"]["resourceVersion"].clone();
    let r = h.put(&format!("{}/one", svcs("u")), &put).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(cluster_ip(&r.body), ip);
    assert_eq!(node_ports(&r.body), [np]);
    // Changing the cluster IP is refused.
    let r = h
        .patch(
            &format!("{}/one", svcs("u")),
            "application/merge-patch+json",
            &json!({"spec": {"clusterIP": "10.0.0.99", "clusterIPs": ["10.0.0.99"]}}),
        )
        .await;
    assert_invalid(&r, "spec.clusterIPs[0]", "may not change once set");
    assert_eq!(ip_address(h, "10.0.0.99").await.status, 404);
    // To ExternalName releases the IP; back allocates one.
    let r = h
        .patch(
            &format!("{}/one", svcs("u")),
            "application/merge-patch+json",
            &json!({"spec": {"type": "ExternalName", "externalName": "x.example"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.body["spec"].get("clusterIP").is_none(), "{}", r.text);
    assert_eq!(ip_address(h, &ip).await.status, 404);
    assert!(!node_port_claimed(h, np).await);
    let r = h
        .patch(
            &format!("{}/one", svcs("u")),
            "application/merge-patch+json",
            &json!({"spec": {"type": "ClusterIP", "externalName": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let back = cluster_ip(&r.body);
    assert_eq!(
        ip_address(h, &back).await.body["spec"]["parentRef"]["name"],
        "one"
    );
}

async fn the_service_cidr_is_published(h: &Harness) {
    let r = h
        .get("/apis/networking.k8s.io/v1/servicecidrs/kubernetes")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["spec"]["cidrs"], json!(["10.0.0.0/24"]));
    let r = h
        .post(
            "/apis/networking.k8s.io/v1/servicecidrs",
            &json!({"metadata": {"name": "more"}, "spec": {"cidrs": ["10.9.0.0/24"]}}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
}

async fn the_kubernetes_service_points_at_the_server(h: &Harness) {
    let port = h.server.addr.port();
    let path = "/api/v1/namespaces/default/services/kubernetes";
    let s = h.get(path).await;
    assert_eq!(s.status, 200, "{}", s.text);
    assert_eq!(
        cluster_ip(&s.body),
        "10.0.0.1",
        "the first address of the range"
    );
    assert_eq!(
        s.body["spec"]["ports"],
        json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}])
    );
    assert!(s.body["spec"].get("selector").is_none());
    assert_eq!(
        ip_address(h, "10.0.0.1").await.body["spec"]["parentRef"]["name"],
        "kubernetes"
    );
    let e = h
        .get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes")
        .await;
    assert_eq!(e.status, 200, "{}", e.text);
    assert_eq!(e.body["addressType"], "IPv4");
    assert_eq!(
        e.body["metadata"]["labels"]["kubernetes.io/service-name"],
        "kubernetes"
    );
    assert_eq!(
        e.body["endpoints"][0]["addresses"],
        json!([h.server.addr.ip().to_string()])
    );
    assert_eq!(e.body["ports"][0]["port"], port);
    // Deleted, it comes back (kube-apiserver's reconciler, every 10 s).
    assert_eq!(h.delete(path).await.status, 200);
    assert_eq!(ip_address(h, "10.0.0.1").await.status, 404);
    cozyplane_testkit::eventually_async(
        "the kubernetes Service to be written again",
        std::time::Duration::from_secs(30),
        || async { h.get(path).await.status == 200 },
    )
    .await;
    assert_eq!(cluster_ip(&h.get(path).await.body), "10.0.0.1");
}

async fn dual_stack_families_and_policies(h: &Harness) {
    h.namespace("d").await;
    let s = created(h, "d", web("single")).await;
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
    let s = created(
        h,
        "d",
        svc(
            "six",
            json!({"ipFamilies": ["IPv6"], "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert!(cluster_ip(&s).starts_with("fd00:10::"), "{s}");
    assert_eq!(ip_address(h, &cluster_ip(&s)).await.status, 200);
    let s = created(
        h,
        "d",
        svc(
            "both",
            json!({"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}),
        ),
    )
    .await;
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
    let ips: Vec<String> = s["spec"]["clusterIPs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ips.len(), 2);
    assert!(
        ips[0].starts_with("10.0.0.") && ips[1].starts_with("fd00:10::"),
        "{ips:?}"
    );
    for ip in &ips {
        assert_eq!(ip_address(h, ip).await.status, 200);
    }
    let s = created(h, "d", svc("v6first", json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"], "ports": [{"port": 80}]}))).await;
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv6", "IPv4"]));
    // Headless without a selector gets both families.
    let s = created(h, "d", svc("hl", json!({"clusterIP": "None"}))).await;
    assert_eq!(s["spec"]["ipFamilyPolicy"], "RequireDualStack");
    assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4", "IPv6"]));
    // Upgrade a single-stack Service, then downgrade it: the secondary is
    // claimed, then released.
    let r = h
        .patch(
            &format!("{}/single", svcs("d")),
            "application/merge-patch+json",
            &json!({"spec": {"ipFamilyPolicy": "PreferDualStack"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let second = r.body["spec"]["clusterIPs"][1]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(second.starts_with("fd00:10::"), "{}", r.text);
    assert_eq!(ip_address(h, &second).await.status, 200);
    let r = h
        .patch(
            &format!("{}/single", svcs("d")),
            "application/merge-patch+json",
            &json!({"spec": {"ipFamilyPolicy": "SingleStack"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["spec"]["clusterIPs"].as_array().map(Vec::len),
        Some(1)
    );
    assert_eq!(ip_address(h, &second).await.status, 404);
}

async fn exhausted_ranges_are_a_clear_error(h: &Harness) {
    h.namespace("x").await;
    // 10.0.0.0/29: 6 addresses (not .0, not .7), .1 the kubernetes Service's.
    let mut ips = Vec::new();
    for i in 0..5 {
        let s = created(h, "x", web(&format!("s{i}"))).await;
        ips.push(cluster_ip(&s));
    }
    let got: BTreeSet<String> = ips.iter().cloned().collect();
    let want: BTreeSet<String> = (2..=6).map(|i| format!("10.0.0.{i}")).collect();
    assert_eq!(got, want);
    let r = create(h, "x", web("s5")).await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert!(
        r.text
            .contains("failed to allocate a serviceIP: range is full"),
        "{}",
        r.text
    );
    // 30000-30002: three node ports.
    assert_eq!(h.delete(&format!("{}/s0", svcs("x"))).await.status, 200);
    let s = created(h, "x", svc("np", json!({"type": "NodePort", "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}, {"name": "c", "port": 3}]}))).await;
    let mut nps = node_ports(&s);
    nps.sort_unstable();
    assert_eq!(nps, [30000, 30001, 30002]);
    assert_eq!(h.delete(&format!("{}/s1", svcs("x"))).await.status, 200);
    let r = create(
        h,
        "x",
        svc("np2", json!({"type": "NodePort", "ports": [{"port": 1}]})),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.text);
    assert!(
        r.text
            .contains("failed to allocate a nodePort: range is full"),
        "{}",
        r.text
    );
    assert_eq!(
        ip_address(h, &ips[1]).await.status,
        404,
        "the cluster IP of the failed create was given back"
    );
}

/// Restart: a new server over the same store knows every allocation (none
/// is handed out twice), and its start-up repair deletes claims whose
/// Service is gone (once past the grace period) and re-claims what a
/// Service holds without a claim.
async fn allocations_survive_a_restart(backend: Backend, test: &str) {
    let Some(h) = support::start_with(backend, test, tiny_ranges).await else {
        return;
    };
    h.namespace("s").await;
    let mut ips = BTreeSet::from(["10.0.0.1".to_string()]); // the kubernetes Service
    for i in 0..2 {
        ips.insert(cluster_ip(&created(&h, "s", web(&format!("a{i}"))).await));
    }
    let np = created(
        &h,
        "s",
        svc("np", json!({"type": "NodePort", "ports": [{"port": 80}]})),
    )
    .await;
    ips.insert(cluster_ip(&np));
    let np = node_ports(&np)[0];
    // What a crash leaves: a claim of a Service that never got stored (old
    // and young), and a Service whose claim is gone.
    let orphan = |ip: &str, when: &str| {
        json!({"metadata": {"name": ip, "creationTimestamp": when, "labels": {"ipaddress.kubernetes.io/managed-by": "ipallocator.k8s.io"}},
               "apiVersion": "networking.k8s.io/v1", "kind": "IPAddress",
               "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "s", "name": "ghost"}}})
    };
    let free: Vec<String> = (1..=6)
        .map(|i| format!("10.0.0.{i}"))
        .filter(|ip| !ips.contains(ip))
        .collect();
    assert_eq!(free.len(), 2);
    let put = |key: String, v: Value| {
        let store = h.store.clone();
        async move {
            store
                .create(&key, serde_json::to_vec(&v).unwrap())
                .await
                .unwrap()
        }
    };
    put(
        format!("/networking.k8s.io/ipaddresses/{}", free[0]),
        orphan(&free[0], "2020-01-01T00:00:00Z"),
    )
    .await;
    put(
        format!("/networking.k8s.io/ipaddresses/{}", free[1]),
        orphan(&free[1], &cozyplane_apiserver::registry::now_rfc3339()),
    )
    .await;
    let lost_port = if np == 30002 { 30001 } else { 30002 };
    put(format!("/ranges/servicenodeports/{lost_port}"), json!({"metadata": {"name": lost_port.to_string(), "creationTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"parentRef": {"group": "", "resource": "services", "namespace": "s", "name": "ghost"}}})).await;
    let a0 = h.get(&format!("{}/a0", svcs("s"))).await;
    let a0_ip = cluster_ip(&a0.body);
    h.store
        .delete(&format!("/networking.k8s.io/ipaddresses/{a0_ip}"), None)
        .await
        .unwrap();

    let Harness {
        server, store, dir, ..
    } = h;
    server.shutdown().await;
    let kubeconfig = dir.path().join("kubeconfig-2");
    let server = tiny_ranges(ServerBuilder::new(store.clone(), support::kinds()))
        .standalone(true)
        .write_kubeconfig(kubeconfig.clone())
        .start()
        .await
        .unwrap();
    let client = support::raw_client(&kubeconfig).await;
    let h = Harness {
        server,
        client,
        kubeconfig,
        store,
        dir,
    };

    // Repaired: the old orphan is gone, the young one kept, the lost claim back.
    assert_eq!(
        ip_address(&h, &free[0]).await.status,
        404,
        "an old orphan is deleted"
    );
    assert_eq!(
        ip_address(&h, &free[1]).await.status,
        200,
        "a young orphan may be a write in flight"
    );
    assert!(
        !node_port_claimed(&h, lost_port).await,
        "an old orphan node port is deleted"
    );
    assert_eq!(
        ip_address(&h, &a0_ip).await.body["spec"]["parentRef"]["name"],
        "a0",
        "a lost claim is made again"
    );
    assert!(node_port_claimed(&h, np).await);
    // Every allocation is known: the taken IP is refused, the one free IP
    // goes to the next Service, then the range is full.
    let taken = ips.iter().next().unwrap().clone();
    let r = create(
        &h,
        "s",
        svc("dup", json!({"clusterIP": taken, "ports": [{"port": 80}]})),
    )
    .await;
    assert_invalid(&r, "spec.clusterIPs[0]", "provided IP is already allocated");
    let r = create(
        &h,
        "s",
        svc(
            "np2",
            json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}),
        ),
    )
    .await;
    assert_invalid(
        &r,
        "spec.ports[0].nodePort",
        "provided port is already allocated",
    );
    let s = created(&h, "s", web("b0")).await;
    assert_eq!(cluster_ip(&s), free[0]);
    let r = create(&h, "s", web("b1")).await;
    assert_eq!(r.status, 500, "{}", r.text);
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_survive_a_restart_embedded() {
    allocations_survive_a_restart(Backend::Embedded, "allocations_survive_a_restart_embedded")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_survive_a_restart_etcd() {
    allocations_survive_a_restart(Backend::Etcd, "allocations_survive_a_restart_etcd").await;
}

/// The real kubectl shows the allocated cluster IP and lists IPAddresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_cluster_ips() {
    let Some(bin) = cozyplane_testkit::needs!().ready_with(cozyplane_testkit::kubectl()) else {
        return;
    };
    let Some(h) = support::start(Backend::Embedded, "kubectl_shows_cluster_ips").await else {
        return;
    };
    let dir = h.dir.path().to_path_buf();
    let manifest = dir.join("svc.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  type: NodePort\n  selector:\n    app: web\n  ports:\n  - port: 80\n",
    )
    .unwrap();
    let out = support::kubectl_as(
        &bin,
        &h,
        &h.kubeconfig,
        &["apply", "-f", manifest.to_str().unwrap()],
    )
    .await;
    assert!(out.ok, "{}{}", out.stdout, out.stderr);
    let svc = h.get("/api/v1/namespaces/default/services/web").await;
    let ip = cluster_ip(&svc.body);
    let out = support::kubectl_as(&bin, &h, &h.kubeconfig, &["get", "svc", "web"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains("CLUSTER-IP") && out.stdout.contains(&ip),
        "{}",
        out.stdout
    );
    // Applying the same manifest again keeps the IP (the manifest has none).
    let out = support::kubectl_as(
        &bin,
        &h,
        &h.kubeconfig,
        &["apply", "-f", manifest.to_str().unwrap()],
    )
    .await;
    assert!(out.ok, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        cluster_ip(&h.get("/api/v1/namespaces/default/services/web").await.body),
        ip
    );
    let out = support::kubectl_as(&bin, &h, &h.kubeconfig, &["get", "ipaddresses"]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stdout.contains(&ip) && out.stdout.contains("web"),
        "{}",
        out.stdout
    );
    h.server.shutdown().await;
}
