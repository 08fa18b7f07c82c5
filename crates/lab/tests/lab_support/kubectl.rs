//! kubectl and probe clients for the lab tests that check verdicts with
//! real traffic (tests/netpol.rs, tests/cilium_tenants.rs).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cozyplane_lab::wait_for;
use serde_json::{json, Value};

use super::ok;

/// kubectl with a lab's kubeconfig.
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl");
        ok(&format!("kubectl {}", args.join(" ")), out)
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&a)).expect("kubectl json")
    }

    /// How many ready endpoints the EndpointSlices of Service `svc` (in
    /// the default namespace) list.
    pub fn ready_endpoints(&self, svc: &str) -> usize {
        let l = self.json(&[
            "get",
            "endpointslices",
            "-l",
            &format!("kubernetes.io/service-name={svc}"),
        ]);
        l["items"].as_array().map_or(0, |items| {
            items
                .iter()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["ready"] == true)
                .count()
        })
    }

    pub fn apply(&self, manifest: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("m.yaml");
        std::fs::write(&f, manifest).expect("write manifest");
        self.run(&["apply", "-f", &f.display().to_string()]);
    }

    /// Runs a run-once `probe client` pod `name` in `namespace` on `node`
    /// with `checks`; returns its results once it has ended.
    pub fn probe(&self, namespace: &str, name: &str, node: &str, checks: &[Value]) -> Vec<Value> {
        let plan = json!({ "checks": checks }).to_string();
        self.apply(
            &json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {"role": "client"}},
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

/// A check that `who` answers, or (`blocked`) that nothing does.
pub fn check(who: &str, proto: &str, ip: &str, blocked: bool) -> Value {
    let id = format!("{who}@{ip}/{proto}");
    let target = format!("{ip}:8000");
    if blocked {
        json!({"id": id, "proto": proto, "target": target, "expect": null,
               "timeoutMs": 1500, "expectBlocked": true})
    } else {
        json!({"id": id, "proto": proto, "target": target, "expect": who, "timeoutMs": 5000})
    }
}

/// Runs `checks` from a fresh client in `ns` on `node` until every one
/// holds (a policy takes effect within the agent's sync); panics with the
/// last results after `within`.
pub fn expect(k: &Kubectl, phase: &str, ns: &str, node: &str, checks: &[Value]) {
    let mut attempt = 0;
    let mut last = Vec::new();
    let held = wait_for(phase, Duration::from_secs(60), || {
        attempt += 1;
        last = k.probe(ns, &format!("client-{attempt}"), node, checks);
        last.iter().all(|r| r["ok"] == true)
    });
    if held.is_err() {
        let failed: Vec<&Value> = last.iter().filter(|r| r["ok"] != true).collect();
        panic!("{phase}: after {attempt} attempts, failing: {failed:#?}");
    }
    eprintln!("{phase}: held (attempt {attempt})");
}

pub fn ready(k: &Kubectl, ns: &str, pod: &str) -> bool {
    let p = k.json(&["get", "pod", pod, "-n", ns]);
    p["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}
