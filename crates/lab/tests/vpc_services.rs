//! Services and VPCs on one node, with the real processes (`cozyplane lab up`, kubectl):
//! a VPC may use the service CIDR, so a VPC pod's peer may have the very address of a
//! default-network (net 0) ClusterIP. The node's agent translates Service addresses at the
//! socket for every process of its cgroup, VPC pods included; it must look a VPC pod's
//! sockets up under the pod's own network, never net 0's (docs/services.md, "VPC pods and
//! socket-LB"). Here a VPC inside the lab's service range 10.96.0.0/16 holds a server pod,
//! and a net-0 Service is given that pod's VPC address as its ClusterIP: a VPC client of the
//! same VPC reaches its VPC peer (the answer names the VPC pod), a net-0 client reaches the
//! Service's backend.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl. Under CI a missing prerequisite
//! fails the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate).
//!
//! Run: `nice cargo build --bins && cargo test -p cozyplane-lab --test vpc_services`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cozyplane_lab::wait_for;
use cozyplane_testkit::{needs, tools};
use lab_support::{lab, ok, prerequisites, run_dir, Down};
use serde_json::{json, Value};

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

    fn apply(&self, manifest: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("m.yaml");
        std::fs::write(&f, manifest).expect("write manifest");
        self.run(&["apply", "-f", &f.display().to_string()]);
    }

    /// Runs a run-once `probe client` pod `name` in `namespace` on `node` (in the VPC
    /// `vpc` if given) with `checks`; returns its results once it has ended.
    fn probe(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        vpc: Option<&str>,
        checks: &[Value],
    ) -> Vec<Value> {
        let plan = json!({ "checks": checks }).to_string();
        let mut meta = json!({"name": name, "namespace": namespace});
        if let Some(v) = vpc {
            meta["annotations"] = json!({ "sdn.cozystack.io/vpc": v });
        }
        self.apply(
            &json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                    "name": "client", "image": "ghcr.io/cozystack/cozyplane:test",
                    "command": ["cozyplane", "probe", "client", "--plan", plan]}]}
            })
            .to_string(),
        );
        wait_for(
            &format!("{name} to finish"),
            Duration::from_secs(60),
            || {
                let phase =
                    self.json(&["get", "pod", name, "-n", namespace])["status"]["phase"].clone();
                phase == "Succeeded" || phase == "Failed"
            },
        )
        .expect("probe client finished");
        let p = self.json(&["get", "pod", name, "-n", namespace]);
        let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        let report: Value =
            serde_json::from_str(term["message"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
        let results = report["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), checks.len(), "{name}: {term}");
        self.run(&["delete", "pod", name, "-n", namespace, "--wait=true"]);
        results
    }
}

fn check(id: &str, proto: &str, target: &str) -> Value {
    json!({"id": id, "proto": proto, "target": target, "expect": null, "timeoutMs": 3000})
}

/// Every result answered, by `who`.
fn answered_by(results: &[Value], who: &str) -> bool {
    results
        .iter()
        .all(|r| r["ok"] == true && r["answer"].as_str() == Some(who))
}

#[test]
fn a_vpc_pod_reaches_its_peer_at_a_net_0_cluster_ip_and_net_0_reaches_the_service() {
    let Some((bin, kubectl)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("vsv{}", std::process::id() % 100_000);
    let node = format!("{name}-node1");
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);
    ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "1"]),
    );
    let k = Kubectl {
        bin: kubectl,
        kubeconfig: run_dir(&name).join("kubeconfig"),
    };

    // A tenant VPC inside the service range, a server pod in it; a net-0 server pod. The
    // lab kubelet runs its built-in server in both (TCP/UDP 8000, HTTP 8080, answering
    // with the pod's name).
    k.apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: t1}}
---
apiVersion: sdn.cozystack.io/v1alpha1
kind: VPC
metadata: {{name: net, namespace: t1}}
spec: {{cidrs: ["10.96.200.0/24"]}}
---
apiVersion: sdn.cozystack.io/v1alpha1
kind: VPCBinding
metadata: {{name: net, namespace: t1}}
spec: {{vpcRef: {{name: net}}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: vpc-server
  namespace: t1
  annotations: {{sdn.cozystack.io/vpc: net}}
spec:
  nodeName: {node}
  containers: [{{name: s, image: probe, readinessProbe: {{tcpSocket: {{port: 8000}}}}}}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web0
  labels: {{app: web0}}
spec:
  nodeName: {node}
  containers: [{{name: s, image: probe, readinessProbe: {{tcpSocket: {{port: 8000}}}}}}]
"#
    ));
    let mut vpc_ip = String::new();
    wait_for(
        "vpc-server Running with its VPC address",
        Duration::from_secs(60),
        || {
            let p = k.json(&["get", "pod", "vpc-server", "-n", "t1"]);
            vpc_ip = p["metadata"]["annotations"]["sdn.cozystack.io/vpc-ip"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            p["status"]["phase"] == "Running" && !vpc_ip.is_empty()
        },
    )
    .expect("the VPC server runs");
    assert!(vpc_ip.starts_with("10.96.200."), "{vpc_ip}");
    wait_for("web0 Running", Duration::from_secs(60), || {
        k.json(&["get", "pod", "web0"])["status"]["phase"] == "Running"
    })
    .expect("web0 runs");

    // A net-0 Service whose ClusterIP is the VPC server's address.
    k.apply(&format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: clash}}
spec:
  clusterIP: {vpc_ip}
  selector: {{app: web0}}
  ports:
    - {{name: tcp, port: 8000, targetPort: 8000}}
    - {{name: udp, port: 8000, targetPort: 8000, protocol: UDP}}
"#
    ));
    let svc = k.json(&["get", "service", "clash"]);
    assert_eq!(svc["spec"]["clusterIP"], vpc_ip.as_str(), "{svc}");
    let target = format!("{vpc_ip}:8000");
    let checks = [check("tcp", "tcp", &target), check("udp", "udp", &target)];

    // The Service works for net 0 (the agent has programmed it): answered by web0.
    let mut attempt = 0;
    wait_for(
        "a net-0 client to reach the Service",
        Duration::from_secs(60),
        || {
            attempt += 1;
            let r = k.probe("default", &format!("net0-{attempt}"), &node, None, &checks);
            answered_by(&r, "web0")
        },
    )
    .expect("the net-0 Service answers");

    // A client in the VPC reaches its VPC peer at that address, TCP and UDP: its sockets
    // are not translated against the net-0 Service.
    let r = k.probe("t1", "vpc-client", &node, Some("net"), &checks);
    assert!(answered_by(&r, "vpc-server"), "the VPC peer answers: {r:?}");

    // And net 0 still reaches the Service afterwards.
    let r = k.probe("default", "net0-after", &node, None, &checks);
    assert!(answered_by(&r, "web0"), "the Service answers net 0: {r:?}");
}
