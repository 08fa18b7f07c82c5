//! The node's own firewall as an operator meets it (issue #12): a 2-node
//! lab, a HostFirewall and then Cozystack's kind of host-firewall
//! CiliumClusterwideNetworkPolicy applied with the real kubectl, verdicts
//! observed with real traffic to a hostNetwork server on node1 (TCP/UDP
//! 8000 and 10250, answering `hs`) from the lab's external host, from
//! node2 and from a pod on node2.
//!
//! 1. no policy: everyone reaches both ports;
//! 2. HostFirewall on node1 (selected by a label): TCP 8000 from the
//!    external segment only. The external host reaches 8000, not 10250;
//!    a pod does not reach node1 at all; node2 reaches both (the other
//!    nodes are structurally exempt: the overlay, kubelets, the control
//!    plane); node1's pods stay Ready and reachable across nodes;
//! 3. the HostFirewall deleted, a host-firewall CCNP (`nodeSelector: {}`,
//!    `ingressDeny` from `world` on 10250, `ingress` from `world`, `host`,
//!    `cluster`): the external host reaches 8000 and not 10250, a pod
//!    reaches 10250;
//! 4. the CCNP deleted: everyone reaches both ports again.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl; under CI a missing
//! prerequisite fails the test (the test kit's gate).
//!
//! Run: `cargo build --bins && cargo test -p cozyplane-lab --test hostfw`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::time::Duration;

use cozyplane_lab::wait_for;
use cozyplane_testkit::{needs, tools};
use lab_support::hosts::{probe_in, Ns};
use lab_support::kubectl::{check, expect, ready, Kubectl};
use lab_support::{lab, ok, prerequisites, run_dir, Down};
use serde_json::{json, Value};

const NODE1_IP: &str = "198.18.0.11";

fn to_node1(port: u16, proto: &str, blocked: bool) -> Value {
    let mut c = check("hs", proto, NODE1_IP, blocked);
    c["target"] = json!(format!("{NODE1_IP}:{port}"));
    c["id"] = json!(format!("node1:{port}/{proto}"));
    c
}

/// Runs `checks` from the lab host `ns` (a probe client there) until every
/// one holds; panics with the last results after a minute.
fn expect_from(bin: &std::path::Path, ns: &Ns, phase: &str, checks: &[Value]) {
    let mut last = Value::Null;
    let held = wait_for(phase, Duration::from_secs(60), || {
        last = probe_in(bin, ns, checks).0;
        last["results"]
            .as_array()
            .is_some_and(|r| r.len() == checks.len() && r.iter().all(|r| r["ok"] == true))
    });
    assert!(held.is_ok(), "{phase} (from {}): {last:#}", ns.0);
    eprintln!("{phase} (from {}): held", ns.0);
}

#[test]
fn the_node_firewall_is_enforced_on_real_traffic() {
    let Some((bin, kubectl)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("hfw{}", std::process::id() % 100_000);
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
    let ext = Ns::open(&format!("{name}-ext"));
    let node2 = Ns::open(&n2);

    k.apply(
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "hs", "namespace": "default"},
            "spec": {"nodeName": n1, "hostNetwork": true, "containers": [{
                "name": "s", "image": "ghcr.io/cozystack/cozyplane:test",
                "command": ["cozyplane", "probe", "server", "--name", "hs",
                            "--tcp-port", "8000", "--udp-port", "8000",
                            "--extra-port", "10250", "--http-port", "18080"],
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}
        })
        .to_string(),
    );
    // a pod on node1, reached across nodes
    k.apply(
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": n1, "containers": [{
                "name": "s", "image": "probe",
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}
        })
        .to_string(),
    );
    for pod in ["hs", "web"] {
        wait_for(&format!("{pod} Ready"), Duration::from_secs(60), || {
            ready(&k, "default", pod)
        })
        .expect("server ready");
    }
    let web = k.json(&["get", "pod", "web"])["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_string();

    // 1. no policy
    let all_open = [
        to_node1(8000, "tcp", false),
        to_node1(10250, "tcp", false),
        to_node1(10250, "udp", false),
    ];
    expect_from(&bin, &ext, "1. no policy", &all_open);
    expect(&k, "1. no policy (a pod)", "default", &n2, &all_open);

    // 2. a HostFirewall on node1
    k.run(&["label", "node", &n1, "firewall=on"]);
    k.apply(
        r#"apiVersion: sdn.cozystack.io/v1alpha1
kind: HostFirewall
metadata: {name: node1}
spec:
  nodeSelector: {matchLabels: {firewall: "on"}}
  ingress:
  - from: [{cidr: 198.19.0.0/16}]
    ports: [{protocol: TCP, port: 8000}]
"#,
    );
    expect_from(
        &bin,
        &ext,
        "2. HostFirewall: the external segment on TCP 8000 only",
        &[
            to_node1(8000, "tcp", false),
            to_node1(8000, "udp", true),
            to_node1(10250, "tcp", true),
            to_node1(10250, "udp", true),
        ],
    );
    expect(
        &k,
        "2. HostFirewall: not a pod; node1's pod still reached",
        "default",
        &n2,
        &[
            to_node1(8000, "tcp", true),
            to_node1(10250, "tcp", true),
            check("web", "tcp", &web, false),
        ],
    );
    expect_from(
        &bin,
        &node2,
        "2. HostFirewall: the other node is exempt",
        &[to_node1(10250, "tcp", false), to_node1(10250, "udp", false)],
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(ready(&k, "default", "hs") && ready(&k, "default", "web"));

    // 3. Cozystack's kind of host-firewall CCNP instead
    k.run(&["delete", "hostfirewall", "node1"]);
    k.apply(
        r#"apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: restrict-system-components}
spec:
  nodeSelector: {}
  ingressDeny:
  - fromEntities: [world]
    toPorts:
    - ports:
      - {port: "10250"}
  ingress:
  - fromEntities: [world, host, cluster]
"#,
    );
    expect_from(
        &bin,
        &ext,
        "3. CCNP: the world not on 10250",
        &[
            to_node1(8000, "tcp", false),
            to_node1(8000, "udp", false),
            to_node1(10250, "tcp", true),
            to_node1(10250, "udp", true),
        ],
    );
    expect(
        &k,
        "3. CCNP: the cluster on 10250",
        "default",
        &n2,
        &[to_node1(10250, "tcp", false), to_node1(8000, "tcp", false)],
    );

    // 4. deleted: open again
    k.run(&["delete", "ccnp", "restrict-system-components"]);
    expect_from(&bin, &ext, "4. no policy again", &all_open);
}
