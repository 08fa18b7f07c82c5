//! Cozystack's own tenant policies, enforced (issue #12): a 2-node lab
//! (`cozyplane lab up`), the namespaces and the `cilium.io/v2` policies of
//! `examples/cozystack/` applied with the real kubectl — what Cozystack's
//! tenant chart renders for tenant-root and its children tenant-alpha and
//! tenant-beta, and a host-firewall CCNP — and the verdicts observed with
//! real traffic from probe client pods, on the same node and across nodes.
//!
//! Servers answer TCP/UDP 8000 with their name: tenant-root/a,
//! tenant-root/etcd (the parent's etcd, `app.kubernetes.io/instance=etcd`),
//! tenant-alpha/b, tenant-beta/a, kube-system/dns (`k8s-app=kube-dns`; the
//! tenants may reach it on port 53 only), cozy-dashboard/ui; the lab's
//! external host answers as `external` (the `world` entity).
//!
//! 1. a client of tenant-alpha reaches its own namespace, its parent's
//!    etcd, the dashboard and the world; not tenant-beta, not the parent's
//!    other pods, not the DNS pod off port 53;
//! 2. a client of tenant-beta does not reach tenant-alpha (same node and
//!    across), reaches its own namespace and the world;
//! 3. a client of tenant-root reaches its whole subtree;
//! 4. the servers stay Ready (the kubelet's probes are the node's own);
//!    `cozyplane policy explain` names the policies that decide a flow
//!    (tenant-beta's egress CCNP, tenant-alpha's CNPs, the host-firewall
//!    CCNP's deny); a rule outside the subset (`toFQDNs`) is reported on
//!    its policy as a Warning Event;
//! 5. tenant-beta's policies deleted, its client reaches tenant-alpha: the
//!    isolation was theirs.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl; under CI a missing
//! prerequisite fails the test (the test kit's gate).
//!
//! Run: `cargo build --bins && cargo test -p cozyplane-lab --test cilium_tenants`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::collections::HashMap;
use std::time::Duration;

use cozyplane_lab::wait_for;
use cozyplane_testkit::{needs, tools};
use lab_support::kubectl::{check, expect, ready, Kubectl};
use lab_support::{lab, ok, prerequisites, run_dir, Down};
use serde_json::{json, Value};

const TENANTS: &str = include_str!("../../../examples/cozystack/tenants.yaml");
const POLICIES: &str = include_str!("../../../examples/cozystack/tenant-policies.yaml");
/// The lab's external probe server (`world`).
const EXTERNAL: &str = "198.19.0.2";

fn server(ns: &str, name: &str, node: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{
            "name": "s", "image": "probe",
            "ports": [{"name": "serve", "containerPort": 8000}],
            "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}
    })
}

#[test]
fn cozystack_tenant_policies_isolate_tenants_on_real_traffic() {
    let Some((bin, kubectl)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("cct{}", std::process::id() % 100_000);
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
    k.apply(TENANTS);
    let servers = [
        ("tenant-root", "a", &n1, json!({"app": "a"})),
        (
            "tenant-root",
            "etcd",
            &n2,
            json!({"app.kubernetes.io/instance": "etcd"}),
        ),
        ("tenant-alpha", "b", &n2, json!({"app": "b"})),
        ("tenant-beta", "a", &n1, json!({"app": "a"})),
        ("kube-system", "dns", &n1, json!({"k8s-app": "kube-dns"})),
        ("cozy-dashboard", "ui", &n2, json!({"app": "ui"})),
    ];
    for (ns, pod, node, labels) in &servers {
        k.apply(&server(ns, pod, node, labels.clone()).to_string());
    }
    let mut ip = HashMap::new();
    for (ns, pod, _, _) in &servers {
        wait_for(
            &format!("{ns}/{pod} Ready"),
            Duration::from_secs(60),
            || ready(&k, ns, pod),
        )
        .expect("server ready");
        let p = k.json(&["get", "pod", pod, "-n", ns]);
        ip.insert(
            format!("{ns}/{pod}"),
            p["status"]["podIP"].as_str().unwrap().to_string(),
        );
    }
    let root = &ip["tenant-root/a"];
    let etcd = &ip["tenant-root/etcd"];
    let alpha = &ip["tenant-alpha/b"];
    let beta = &ip["tenant-beta/a"];
    let dns = &ip["kube-system/dns"];
    let ui = &ip["cozy-dashboard/ui"];

    // before: a flat network, every tenant reaches every other
    expect(
        &k,
        "0. no policy: tenant-beta reaches tenant-alpha",
        "tenant-beta",
        &n2,
        &[check("b", "tcp", alpha, false)],
    );

    k.apply(POLICIES);
    let n = k.run(&["get", "cnp", "-A", "--no-headers"]).lines().count();
    assert_eq!(n, 18, "6 CiliumNetworkPolicies per tenant");
    let n = k.run(&["get", "ccnp", "--no-headers"]).lines().count();
    assert_eq!(
        n, 7,
        "2 CiliumClusterwideNetworkPolicies per tenant + the host firewall"
    );

    expect(
        &k,
        "1. tenant-alpha: its namespace, its parent's etcd, the platform, the world",
        "tenant-alpha",
        &n1,
        &[
            check("b", "tcp", alpha, false),
            check("b", "udp", alpha, false),
            check("etcd", "tcp", etcd, false),
            check("ui", "tcp", ui, false),
            check("external", "tcp", EXTERNAL, false),
            check("a", "tcp", beta, true),
            check("a", "udp", beta, true),
            check("a", "tcp", root, true),
            check("dns", "tcp", dns, true),
        ],
    );
    expect(
        &k,
        "2. tenant-beta: not tenant-alpha (same node and across), its own namespace, the world",
        "tenant-beta",
        &n2,
        &[
            check("b", "tcp", alpha, true),
            check("b", "udp", alpha, true),
            check("etcd", "tcp", etcd, false),
            check("a", "tcp", beta, false),
            check("external", "tcp", EXTERNAL, false),
        ],
    );
    expect(
        &k,
        "2. tenant-beta across nodes",
        "tenant-beta",
        &n1,
        &[
            check("b", "tcp", alpha, true),
            check("a", "tcp", root, true),
        ],
    );
    expect(
        &k,
        "3. tenant-root: its subtree",
        "tenant-root",
        &n1,
        &[
            check("b", "tcp", alpha, false),
            check("a", "tcp", beta, false),
            check("a", "tcp", root, false),
        ],
    );
    // which policy decided: the CLI names them
    let explain = |from: &str, to: &str, port: &str| -> String {
        let out = std::process::Command::new(&bin)
            .args(["policy", "explain", "--kubeconfig"])
            .arg(run_dir(&name).join("kubeconfig"))
            .args(["--from", from, "--to", to, "--port", port])
            .output()
            .expect("run cozyplane policy explain");
        ok(&format!("policy explain {from} {to}"), out)
    };
    let text = explain("tenant-beta/a", "tenant-alpha/b", "8000");
    eprintln!("{text}");
    assert!(
        text.starts_with("TCP tenant-beta/a") && text.lines().next().unwrap().ends_with("DENIED"),
        "{text}"
    );
    assert!(
        text.contains("egress of pod tenant-beta/a")
            && text.contains("CiliumClusterwideNetworkPolicy tenant-beta-egress")
            && text.contains("admitted by: none"),
        "{text}"
    );
    assert!(
        text.contains("ingress of pod tenant-alpha/b")
            && text.contains(
                "admitted by: CiliumNetworkPolicy tenant-alpha/allow-external-communication"
            ),
        "{text}"
    );
    let text = explain("tenant-alpha/b", "kube-system/dns", "53");
    assert!(
        text.lines().next().unwrap().ends_with("ALLOWED")
            && text.contains("admitted by: CiliumNetworkPolicy tenant-alpha/allow-to-dns"),
        "{text}"
    );
    let text = explain("tenant-alpha/b", "kube-system/dns", "8000");
    assert!(text.lines().next().unwrap().ends_with("DENIED"), "{text}");
    let text = explain("tenant-alpha/b", "198.19.0.2", "443");
    assert!(text.lines().next().unwrap().ends_with("ALLOWED"), "{text}");
    assert!(
        text.contains("admitted by: CiliumNetworkPolicy tenant-alpha/allow-external-communication"),
        "{text}"
    );
    // the host-firewall CCNP, on the node's side
    let node1_ip = "198.18.0.11";
    let text = explain("198.19.0.2", node1_ip, "10250");
    assert!(
        text.lines().next().unwrap().ends_with("DENIED")
            && text
                .contains("denied by:   CiliumClusterwideNetworkPolicy restrict-system-components"),
        "{text}"
    );

    // a rule outside the subset: reported on the policy as a Warning Event
    k.apply(
        r#"apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: to-example, namespace: tenant-alpha}
spec:
  endpointSelector: {}
  egress:
  - toFQDNs: [{matchName: example.com}]
"#,
    );
    let mut last = Value::Null;
    let seen = wait_for("a Warning on to-example", Duration::from_secs(30), || {
        last = k.json(&[
            "get",
            "events",
            "-n",
            "tenant-alpha",
            "--field-selector",
            "involvedObject.name=to-example",
        ]);
        last["items"].as_array().is_some_and(|items| {
            items.iter().any(|e| {
                e["reason"] == "PolicyNotEnforcedAsWritten"
                    && e["type"] == "Warning"
                    && e["involvedObject"]["kind"] == "CiliumNetworkPolicy"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("spec.egress[0].toFQDNs"))
            })
        })
    });
    assert!(seen.is_ok(), "{last:#}");
    k.run(&["delete", "cnp", "to-example", "-n", "tenant-alpha"]);

    // 4. the kubelet's probes still reach the isolated pods
    std::thread::sleep(Duration::from_secs(3));
    for (ns, pod, _, _) in &servers {
        assert!(ready(&k, ns, pod), "{ns}/{pod} stays Ready");
    }

    // 5. tenant-beta's egress policies gone: its clients reach tenant-alpha
    // (whose ingress admits the `cluster` entity)
    k.run(&["delete", "ccnp", "tenant-beta-egress"]);
    k.run(&["delete", "cnp", "--all", "-n", "tenant-beta"]);
    expect(
        &k,
        "5. tenant-beta's policies deleted",
        "tenant-beta",
        &n2,
        &[check("b", "tcp", alpha, false)],
    );
}
