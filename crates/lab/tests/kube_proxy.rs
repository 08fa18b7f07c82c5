//! The agents with `--kube-proxy-replacement=false` beside an iptables kube-proxy
//! (issue #11): the lab comes up with `lab up --kube-proxy-replacement=false`, so the
//! agents translate no Service and hand net-0 delivery into local pods to the kernel
//! (`PARAM_F_KERNEL_LOCAL`), and the test installs in each node's namespace the nat rules
//! kube-proxy's iptables mode writes for a ClusterIP Service (the shape of
//! `../shared/reference/peer-baselines.md` (e): KUBE-SERVICES, KUBE-SVC-*, KUBE-SEP-*
//! with `statistic` and DNAT, KUBE-MARK-MASQ / KUBE-POSTROUTING), as kube-proxy would.
//! Client pods on both nodes then reach both backends through the ClusterIP, same node
//! and cross node: every reply must pass the client node's conntrack to get the
//! ClusterIP back as its source, which a redirect straight into the pod would skip (the
//! cross-node reply did, before `from_overlay` honoured the flag).
//!
//! Needs root, bpffs, cgroup2, iproute2, iptables and kubectl. Under CI a missing
//! prerequisite fails the test; elsewhere it is skipped (the test kit's gate).
//!
//! Run: `nice cargo build --bins && cargo test -p cozyplane-lab --test kube_proxy`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cozyplane_datapath::abi::PARAM_F_KERNEL_LOCAL;
use cozyplane_datapath::netlink::{named_netns_path, Netns};
use cozyplane_datapath::Datapath;
use cozyplane_lab::{exec_in, wait_for};
use cozyplane_testkit::{needs, tools};
use lab_support::hosts::Ns;
use lab_support::{lab, ok, prerequisites, run_dir, text, Down};
use serde_json::{json, Value};

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=20s")
        .args(args)
        .output()
        .expect("run kubectl");
    ok(&format!("kubectl {}", args.join(" ")), out)
}

/// kube-proxy's iptables-mode nat rules for one ClusterIP TCP port over `backends`
/// (kube-proxy's chain layout, short chain names).
fn kube_proxy_rules(cluster_ip: &str, port: u16, backends: &[(String, u16)]) -> String {
    let mut r = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
         :KUBE-SVC-HELLO - [0:0]\n",
    );
    for i in 0..backends.len() {
        r += &format!(":KUBE-SEP-{i} - [0:0]\n");
    }
    r += "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
          -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
          -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
          -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
          -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
          -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000\n\
          -A KUBE-POSTROUTING -j MASQUERADE --random-fully\n";
    r += &format!(
        "-A KUBE-SERVICES -d {cluster_ip}/32 -p tcp -m tcp --dport {port} -j KUBE-SVC-HELLO\n\
         -A KUBE-SVC-HELLO -d {cluster_ip}/32 -p tcp -m tcp --dport {port} ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n"
    );
    let n = backends.len();
    for (i, (ip, bport)) in backends.iter().enumerate() {
        if i + 1 < n {
            let p = 1.0 / (n - i) as f64;
            r += &format!(
                "-A KUBE-SVC-HELLO -m statistic --mode random --probability {p:.5} -j KUBE-SEP-{i}\n"
            );
        } else {
            r += &format!("-A KUBE-SVC-HELLO -j KUBE-SEP-{i}\n");
        }
        r += &format!(
            "-A KUBE-SEP-{i} -s {ip}/32 -j KUBE-MARK-MASQ\n\
             -A KUBE-SEP-{i} -p tcp -m tcp -j DNAT --to-destination {ip}:{bport}\n"
        );
    }
    r + "COMMIT\n"
}

#[test]
fn an_iptables_kube_proxy_serves_cluster_ips_beside_agents_that_do_not() {
    let Some((bin, kubectl_bin)) =
        prerequisites(needs!().tool(&tools::IP).tool(&tools::IPTABLES_RESTORE))
    else {
        return;
    };
    let name = format!("kpx{}", std::process::id() % 100_000);
    let nodes = [format!("{name}-node1"), format!("{name}-node2")];
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);
    ok(
        "lab up",
        lab(
            &bin,
            &[
                "up",
                "--name",
                &name,
                "--nodes",
                "2",
                "--kube-proxy-replacement=false",
            ],
        ),
    );
    let kc = run_dir(&name).join("kubeconfig");
    let k = |args: &[&str]| kubectl(&kubectl_bin, &kc, args);

    // The agents translate nothing and deliver through the kernel.
    for n in &nodes {
        let pins = run_dir(&name)
            .join("nodes")
            .join(n)
            .join("bpffs")
            .join("cozyplane");
        let dp = Datapath::load(&pins).expect("the node's pinned maps");
        assert_ne!(
            dp.params().unwrap().flags & PARAM_F_KERNEL_LOCAL,
            0,
            "{n}: PARAM_F_KERNEL_LOCAL"
        );
    }

    // Two backends, one per node, and a Service for its ClusterIP (the agents ignore it).
    for (pod, node) in [("hello-1", &nodes[0]), ("hello-2", &nodes[1])] {
        let manifest = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": {"app": "hello"}},
            "spec": {"nodeName": node, "containers": [{"name": "s", "image": "probe",
                "readinessProbe": {"tcpSocket": {"port": 8000}}}]}})
        .to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("pod.json");
        std::fs::write(&f, manifest).expect("write");
        k(&["apply", "-f", &f.display().to_string()]);
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/service.yaml");
    k(&["apply", "-f", &examples.display().to_string()]);
    let mut ips = Vec::new();
    wait_for("both backends Running", Duration::from_secs(60), || {
        ips = ["hello-1", "hello-2"]
            .iter()
            .filter_map(|p| {
                let v: Value = serde_json::from_str(&k(&["get", "pod", p, "-o", "json"])).ok()?;
                (v["status"]["phase"] == "Running")
                    .then(|| v["status"]["podIP"].as_str().map(str::to_string))
                    .flatten()
            })
            .collect();
        ips.len() == 2
    })
    .expect("backends running");
    let svc: Value = serde_json::from_str(&k(&["get", "service", "hello", "-o", "json"])).unwrap();
    let cip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    for n in &nodes {
        let pins = run_dir(&name)
            .join("nodes")
            .join(n)
            .join("bpffs")
            .join("cozyplane");
        let dp = Datapath::load(&pins).expect("the node's pinned maps");
        assert!(
            dp.svc.frontends.entries().unwrap().is_empty(),
            "{n}: no Service programmed with --kube-proxy-replacement=false"
        );
    }

    // kube-proxy's rules in both nodes' namespaces.
    let rules = kube_proxy_rules(
        &cip,
        80,
        &ips.iter().map(|ip| (ip.clone(), 8080)).collect::<Vec<_>>(),
    );
    let file = run_dir(&name).join("kube-proxy.rules");
    std::fs::write(&file, &rules).expect("write rules");
    for n in &nodes {
        let ns = Ns(
            n.clone(),
            Netns::open(named_netns_path(n)).expect("node netns"),
        );
        let out = exec_in(
            &ns,
            &["iptables-restore", "--noflush", &file.display().to_string()],
        )
        .expect("iptables-restore");
        assert!(
            out.status.success(),
            "{n}: iptables-restore: {}\n{rules}",
            text(&out.stderr)
        );
    }

    // A client pod on each node: 12 HTTP requests to the ClusterIP, every one answered
    // by a hello pod; over both clients, both answer (same node and cross node).
    let checks: Vec<Value> = (0..12)
        .map(|i| {
            json!({"id": format!("kp/{i}"), "proto": "http", "expect": null,
                "timeoutMs": 5000, "target": format!("{cip}:80")})
        })
        .collect();
    let plan = json!({ "checks": checks }).to_string();
    let mut answered = BTreeSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let pod = format!("client-{i}");
        let manifest = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                "name": "c", "image": "probe",
                "command": ["cozyplane", "probe", "client", "--plan", plan]}]}})
        .to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("client.json");
        std::fs::write(&f, manifest).expect("write");
        k(&["apply", "-f", &f.display().to_string()]);
        let mut p = Value::Null;
        wait_for(&format!("{pod} to finish"), Duration::from_secs(90), || {
            p = serde_json::from_str(&k(&["get", "pod", &pod, "-o", "json"])).unwrap_or_default();
            p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
        })
        .expect("client finished");
        let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        let report: Value =
            serde_json::from_str(term["message"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
        let results = report["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), 12, "{pod} on {node}: {term}");
        for r in &results {
            let a = r["answer"].as_str().unwrap_or_default();
            assert!(
                r["ok"] == true && (a == "hello-1" || a == "hello-2"),
                "{pod} on {node}: {r}"
            );
            answered.insert(a.to_string());
        }
    }
    assert_eq!(answered.len(), 2, "both backends answered: {answered:?}");
}
