//! SCTP Services on the lab (issue #11: "SCTP where the kernel allows it"). Our machines'
//! kernel has no SCTP (`CONFIG_IP_SCTP` unset), so the clients and servers are the probe's
//! raw-socket SCTP: an INIT answered by an INIT ACK whose State Cookie is the server's
//! name, the CRC32c checked both ways (`crates/probe/src/sctp.rs`). The per-packet load
//! balancer translates SCTP (`bpf/nat.h` cp_sctp_port, cp_sctp_crc): the port changes
//! (30132 → 9132, and the SNAT port to a backend on another node) are carried into the
//! CRC, which a peer checks before anything else.
//!
//! - A NodePort Service (SCTP 132 → 9132) over a pod on each node: the external host's
//!   INITs to node 1's NodePort are answered by both pods (one through the overlay, SNATed
//!   and reversed), each INIT ACK with a good CRC.
//! - A pod's INIT to the Service's ClusterIP is answered by both pods: no socket hook sees
//!   a raw socket, so `from_pod` translates it per packet and the destination gate reverses
//!   the reply.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl. Under CI a missing prerequisite
//! fails the test; elsewhere it is skipped (the test kit's gate).
//!
//! Run: `nice cargo build --bins && cargo test -p cozyplane-lab --test service_sctp`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::collections::BTreeSet;
use std::time::Duration;

use cozyplane_lab::wait_for;
use cozyplane_testkit::{needs, tools};
use lab_support::hosts::{probe_in, Ns};
use lab_support::kubectl::Kubectl;
use lab_support::{lab, ok, prerequisites, run_dir, Down};
use serde_json::{json, Value};

/// `n` SCTP INITs to `target`, each its own association (a fresh source port).
fn inits(target: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"id": format!("sctp/{i}"), "proto": "sctp", "target": target,
                "expect": null, "timeoutMs": 3000})
        })
        .collect()
}

/// The servers that answered `results`, asserting every check was answered.
fn answered(results: &[Value]) -> BTreeSet<String> {
    results
        .iter()
        .map(|r| {
            assert_eq!(r["ok"], true, "an INIT went unanswered: {r}");
            r["answer"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

#[test]
fn sctp_nodeport_and_cluster_ip_are_load_balanced_per_packet() {
    let Some((bin, kubectl_bin)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("sct{}", std::process::id() % 100_000);
    let nodes = [format!("{name}-node1"), format!("{name}-node2")];
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);
    ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "2"]),
    );
    let k = Kubectl {
        bin: kubectl_bin,
        kubeconfig: run_dir(&name).join("kubeconfig"),
    };
    let ext = Ns::open(&format!("{name}-ext"));

    for (pod, node) in [("sctp-1", &nodes[0]), ("sctp-2", &nodes[1])] {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "labels": {"app": "sctp"}},
                "spec": {"nodeName": node, "containers": [{"name": "s",
                    "image": "ghcr.io/cozystack/cozyplane:test",
                    "command": ["cozyplane", "probe", "server", "--sctp-port", "9132",
                        "--http-port", "8080"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "ports": [{"name": "assoc", "containerPort": 9132, "protocol": "SCTP"}],
                    "readinessProbe": {"tcpSocket": {"port": 8080}}}]}})
            .to_string(),
        );
    }
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sctp"},
            "spec": {"type": "NodePort", "selector": {"app": "sctp"},
                "ports": [{"name": "assoc", "protocol": "SCTP", "port": 132,
                    "targetPort": "assoc", "nodePort": 30132}]}})
        .to_string(),
    );
    wait_for("both SCTP endpoints ready", Duration::from_secs(90), || {
        k.ready_endpoints("sctp") == 2
    })
    .expect("endpoints");

    // From the external host to node 1's NodePort: both pods, every INIT ACK whole.
    let mut seen = BTreeSet::new();
    let mut last = Value::Null;
    wait_for(
        "node 1's SCTP NodePort answered by both pods",
        Duration::from_secs(60),
        || {
            let (report, _) = probe_in(&bin, &ext, &inits("198.18.0.11:30132", 8));
            last = report.clone();
            let results = report["results"].as_array().cloned().unwrap_or_default();
            if results.iter().all(|r| r["ok"] == true) {
                seen.extend(answered(&results));
            }
            seen.len() == 2
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {seen:?}, last {last}"));
    assert_eq!(
        seen,
        ["sctp-1", "sctp-2"].map(String::from).into_iter().collect()
    );
    // ... and settled: 16 more, all answered.
    let (report, _) = probe_in(&bin, &ext, &inits("198.18.0.11:30132", 16));
    answered(report["results"].as_array().unwrap());

    // From a pod on node 1 to the ClusterIP.
    let cip = k.json(&["get", "service", "sctp"])["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .to_string();
    let mut from_pod = BTreeSet::new();
    for i in 0..4 {
        let results = k.probe(
            "default",
            &format!("client-{i}"),
            &nodes[0],
            &inits(&format!("{cip}:132"), 8),
        );
        from_pod.extend(answered(&results));
        if from_pod.len() == 2 {
            break;
        }
    }
    assert_eq!(
        from_pod,
        ["sctp-1", "sctp-2"].map(String::from).into_iter().collect(),
        "a pod's INITs to the ClusterIP"
    );

    ok("lab down", lab(&bin, &["down", "--name", &name]));
}
