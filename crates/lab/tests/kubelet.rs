//! The lab kubelet and scheduler end to end: `cozyplane lab up` (the real
//! binary), pods applied with the real kubectl, plumbed by the real CNI
//! plugin and agents, answering with their names across nodes.
//!
//! One 2-node lab for every assertion (it takes ~1 s to bring up):
//! pods with and without nodeName and with hostNetwork become Running and
//! Ready with the right IPs; they answer TCP/UDP/HTTP from another node and
//! from another pod; a restartPolicy Never probe client ends Succeeded with
//! its report as the termination message and its network removed; a
//! SIGKILLed and restarted kubelet keeps a pod at the same IP; the
//! scheduler binds through `pods/binding` (a second binding is a 409); the
//! EndpointSlice controller lists a Service's Ready pods;
//! `kubectl delete pod` returns only once the pod's workload, netns and
//! veth are gone (graceful deletion), then its FabricIP goes; a forced
//! delete is torn down too; a pod marked for deletion while its kubelet is
//! down is torn down and deleted by the restarted kubelet; `lab down`
//! leaves nothing.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl. Under CI a missing
//! prerequisite fails the test; elsewhere it is skipped with a `SKIP` line (the
//! test kit's gate).
//!
//! Run: `cargo test -p cozyplane-lab --test kubelet` (the binaries come from
//! `$COZYPLANE_BIN`/`$COZYPLANE_CNI_BIN`, else the test kit builds them).
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cozyplane_datapath::netlink::named_netns_path;
use cozyplane_lab::{exec_in, wait_for};
use cozyplane_testkit::{needs, tools};
use lab_support::components::{component_of, restart_in, sigkill};
use lab_support::hosts::{probe_in, Ns};
use lab_support::{lab, ok, prerequisites, run_dir, running, text, Down};
use serde_json::{json, Value};

/// A lab namespace by name, to run commands in.
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

    /// Runs kubectl that may fail: (success, stdout + stderr).
    fn try_run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=20s")
            .args(args)
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    }

    /// Writes `body` next to the kubeconfig; returns its path.
    fn write(&self, file: &str, body: &str) -> String {
        let p = self.kubeconfig.parent().expect("kubeconfig dir").join(file);
        std::fs::write(&p, body).expect("write file");
        p.display().to_string()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.run(&a)).expect("kubectl json")
    }

    fn pod(&self, name: &str) -> Value {
        self.json(&["get", "pod", name])
    }

    fn apply(&self, manifest: &str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("m.yaml");
        std::fs::write(&f, manifest).expect("write manifest");
        self.run(&["apply", "-f", &f.display().to_string()]);
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn in_cluster_cidr(ip: &str) -> bool {
    ip.parse::<Ipv4Addr>()
        .is_ok_and(|ip| ip.octets()[0] == 10 && ip.octets()[1] == 244)
}

/// Runs `cozyplane probe client --plan` in `ns`; returns the parsed report,
/// every check having passed.
/// Waits until a short UDP check from `ns` to `target` fails with
/// "Connection refused" (an ICMP port unreachable reached the socket),
/// one check at a time: kernels rate-limit ICMP errors per destination.
fn wait_refused(bin: &Path, ns: &Ns, what: &str, target: &str) {
    let check = json!({"id": target, "proto": "udp", "target": target, "expect": null,
        "timeoutMs": 250});
    let mut last = Value::Null;
    wait_for(what, Duration::from_secs(30), || {
        let (report, _) = probe_in(bin, ns, std::slice::from_ref(&check));
        let refused = report["results"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Connection refused"));
        last = report;
        refused
    })
    .unwrap_or_else(|e| panic!("{e}: {last}"));
}

fn probe_from(bin: &Path, ns: &Ns, checks: Value) -> Value {
    let checks = checks.as_array().cloned().unwrap_or_default();
    let (report, out) = probe_in(bin, ns, &checks);
    assert!(
        !report.is_null(),
        "no report from {}:\n{}\n{}",
        ns.0,
        text(&out.stdout),
        text(&out.stderr)
    );
    let failed: Vec<&Value> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["ok"] != true)
        .collect();
    assert!(
        failed.is_empty() && out.status.success(),
        "checks from {} failed: {failed:?}",
        ns.0
    );
    report
}

/// The distinct answers in a probe report.
fn answers(report: &Value) -> std::collections::BTreeSet<&str> {
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["answer"].as_str())
        .collect()
}

fn check(id: &str, proto: &str, target: String, expect: &str) -> Value {
    json!({"id": id, "proto": proto, "target": target, "expect": expect, "timeoutMs": 5000})
}

/// tcp, udp and http checks of a probe server.
fn all_protos(name: &str, ip: &str, port: u16, http: u16) -> Vec<Value> {
    vec![
        check(&format!("{name}/tcp"), "tcp", format!("{ip}:{port}"), name),
        check(&format!("{name}/udp"), "udp", format!("{ip}:{port}"), name),
        check(
            &format!("{name}/http"),
            "http",
            format!("{ip}:{http}"),
            name,
        ),
    ]
}

fn pod_manifest(n1: &str, n2: &str) -> String {
    let env = r#"
      env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}"#;
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: echo-a}}
spec:
  nodeName: {n1}
  containers:
    - name: echo
      image: ghcr.io/cozystack/cozyplane:test
      command: ["cozyplane", "probe", "server"]{env}
      readinessProbe: {{tcpSocket: {{port: 8000}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: free}}
spec:
  containers:
    - name: whatever
      image: nginx
      readinessProbe: {{httpGet: {{port: 8080, path: /}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: host-b}}
spec:
  nodeName: {n2}
  hostNetwork: true
  containers:
    - name: echo
      image: ghcr.io/cozystack/cozyplane:test
      command: ["cozyplane", "probe", "server", "--tcp-port", "4250", "--udp-port", "4250", "--http-port", "4251"]{env}
      readinessProbe: {{tcpSocket: {{port: 4250}}}}
"#
    )
}

fn client_manifest(node: &str, plan: &str) -> String {
    named_client_manifest("client", node, plan)
}

/// A run-once `probe client` pod named `name` on `node`.
fn named_client_manifest(name: &str, node: &str, plan: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
            "name": "client", "image": "ghcr.io/cozystack/cozyplane:test",
            "command": ["cozyplane", "probe", "client", "--plan", plan]}]}
    })
    .to_string()
}

/// The pod's link on a node: the agent's host veth, whose alias names the container id.
fn pod_veths(node: &Ns, container_id: &str) -> Vec<String> {
    let out = exec_in(node, &["ip", "-o", "link", "show"]).expect("ip link");
    text(&out.stdout)
        .lines()
        .filter(|l| l.contains(container_id))
        .map(str::to_string)
        .collect()
}

fn fabric_ips_of(k: &Kubectl, uid: &str) -> usize {
    k.json(&["get", "fabricips"])["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|f| f["spec"]["podUID"] == uid)
        .count()
}

/// The workload `(pid, start time)` a kubelet recorded for pod `uid`.
fn recorded_workload(name: &str, node: &str, uid: &str) -> Option<(i32, u64)> {
    let path = run_dir(name)
        .join("nodes")
        .join(node)
        .join("kubelet/pods")
        .join(uid)
        .join("record.json");
    let rec: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let w = rec["workload"].as_array()?;
    Some((
        i32::try_from(w.first()?.as_i64()?).ok()?,
        w.get(1)?.as_u64()?,
    ))
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"].as_str().expect("uid").to_string()
}

fn netns_of_pod(node: &str, uid: &str) -> String {
    let hex: String = uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect();
    format!("{node}-p{}", hex.to_ascii_lowercase())
}

/// What a running pod is made of on its node.
struct RunningPod {
    uid: String,
    netns: String,
    workload: (i32, u64),
}

/// Applies a bare pod bound to `node`, waits until it is Ready and returns
/// its UID, netns name and recorded workload.
fn run_pod(k: &Kubectl, lab: &str, node: &str, pod: &str) -> RunningPod {
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]}})
        .to_string(),
    );
    wait_for(&format!("{pod} Ready"), Duration::from_secs(30), || {
        ready(&k.pod(pod))
    })
    .unwrap_or_else(|e| panic!("{pod} ready: {e}"));
    let uid = uid_of(&k.pod(pod));
    let netns = netns_of_pod(node, &uid);
    let workload = recorded_workload(lab, node, &uid).unwrap_or_else(|| panic!("{pod}'s workload"));
    RunningPod {
        uid,
        netns,
        workload,
    }
}

#[test]
fn pods_run_answer_restart_safely_and_go_away() {
    let Some((bin, kubectl)) = prerequisites(needs!().tool(&tools::IP)) else {
        return;
    };
    let name = format!("kbt{}", std::process::id() % 100_000);
    let (n1, n2) = (format!("{name}-node1"), format!("{name}-node2"));
    let _ = lab(&bin, &["down", "--name", &name]);
    let down = Down(&bin, &name);

    let t0 = Instant::now();
    let up = ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "2"]),
    );
    for line in [
        "starting the scheduler … ready".to_string(),
        "starting the endpointslice controller … ready".to_string(),
        format!("starting the kubelet of {n1} … ready"),
        format!("starting the kubelet of {n2} … ready"),
        "starting the external probe server on 198.19.0.2 … ready".to_string(),
    ] {
        assert!(up.contains(&line), "no progress line {line:?}:\n{up}");
    }
    let k = Kubectl {
        bin: kubectl,
        kubeconfig: run_dir(&name).join("kubeconfig"),
    };

    // The host kubeconfig names the external target, and kubectl (used below) accepts it.
    let kc: Value =
        serde_saphyr::from_slice(&std::fs::read(&k.kubeconfig).expect("kubeconfig")).expect("yaml");
    let current = kc["current-context"].as_str().expect("current-context");
    let ctx = kc["contexts"]
        .as_array()
        .expect("contexts")
        .iter()
        .find(|c| c["name"] == current)
        .expect("current context");
    let ext = ctx["context"]["extensions"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["name"] == "cozyplane.io/lab"))
        .unwrap_or_else(|| panic!("no cozyplane.io/lab extension: {ctx}"));
    assert_eq!(ext["extension"]["externalTarget"], "198.19.0.2:8000");
    assert_eq!(ext["extension"]["externalName"], "external");

    // Pods: bound by name, bound by the scheduler, host network; and the examples.
    k.apply(&pod_manifest(&n1, &n2));
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/pods.yaml");
    k.run(&["apply", "-f", &examples.display().to_string()]);
    let all = ["echo-a", "free", "host-b", "hello-1", "hello-2"];
    wait_for(
        "every pod Running and Ready",
        Duration::from_secs(60),
        || all.iter().all(|p| ready(&k.pod(p))),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\nkubelet logs:\n{}\n{}",
            k.run(&["get", "pods", "-o", "wide"]),
            std::fs::read_to_string(run_dir(&name).join("nodes").join(&n1).join("kubelet.log"))
                .unwrap_or_default(),
            std::fs::read_to_string(run_dir(&name).join("nodes").join(&n2).join("kubelet.log"))
                .unwrap_or_default(),
        )
    });
    eprintln!(
        "lab up + 5 pods ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    let node_ip = |n: &str| {
        if n == n1 {
            "198.18.0.11"
        } else {
            "198.18.0.12"
        }
    };
    let mut ips = std::collections::HashMap::new();
    for p in all {
        let pod = k.pod(p);
        let node = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            node == n1 || node == n2,
            "{p} not bound to a lab node: {node:?}"
        );
        let ip = pod["status"]["podIP"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(pod["status"]["hostIP"], node_ip(&node), "{p}");
        let cs = &pod["status"]["containerStatuses"][0];
        assert_eq!(cs["ready"], true, "{p}: {cs}");
        assert!(
            cs["containerID"]
                .as_str()
                .is_some_and(|c| c.starts_with("lab://")),
            "{cs}"
        );
        if p == "host-b" {
            assert_eq!(node, n2);
            assert_eq!(ip, node_ip(&n2), "a hostNetwork pod has the node's IP");
        } else {
            assert!(
                in_cluster_cidr(&ip),
                "{p}: podIP {ip:?} not in 10.244.0.0/16"
            );
        }
        ips.insert(p, (ip, node));
    }
    assert_eq!(ips["echo-a"].1, n1);

    // "free" was bound by the scheduler through pods/binding: the server
    // set PodScheduled, and a second binding is refused naming the node.
    let free = k.pod("free");
    assert!(
        free["status"]["conditions"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["type"] == "PodScheduled" && c["status"] == "True")),
        "{free}"
    );
    let sched_log = std::fs::read_to_string(run_dir(&name).join("scheduler").join("scheduler.log"))
        .unwrap_or_default();
    assert!(
        sched_log.contains(&format!("bound default/free to {}", ips["free"].1)),
        "{sched_log}"
    );
    let other = if ips["free"].1 == n1 { &n2 } else { &n1 };
    let second = k.try_run(&[
        "create",
        "--raw",
        "/api/v1/namespaces/default/pods/free/binding",
        "-f",
        &k.write(
            "binding.json",
            &json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "free"},
                "target": {"kind": "Node", "name": other}})
            .to_string(),
        ),
    ]);
    assert!(
        !second.0
            && second.1.contains("already assigned to node")
            && second.1.contains(&ips["free"].1),
        "a second binding must be a conflict: {second:?}"
    );
    assert_eq!(k.pod("free")["spec"]["nodeName"], ips["free"].1.as_str());

    // The lab's EndpointSlice controller: a Service over the example pods lists
    // both, Ready as their kubelets report it (their readinessProbe passed),
    // with the targetPort resolved.
    // (examples/service.yaml, as the README shows it.)
    let service = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/service.yaml");
    k.apply(&std::fs::read_to_string(&service).expect("examples/service.yaml"));
    let hello: std::collections::BTreeSet<String> = ["hello-1", "hello-2"]
        .iter()
        .map(|p| ips[p].0.clone())
        .collect();
    wait_for(
        "the hello Service's endpoints",
        Duration::from_secs(30),
        || {
            let v = k.json(&[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=hello",
            ]);
            // IPv4: the lab's pods have no other address. (A Service the API server
            // gave no cluster IP or families has an empty IPv6 slice too, as kube does.)
            let items: Vec<Value> = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["addressType"] == "IPv4")
                .cloned()
                .collect();
            let ready: std::collections::BTreeSet<String> = items
                .iter()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["ready"] == true)
                .filter_map(|e| e["addresses"][0].as_str().map(str::to_string))
                .collect();
            let ports_of = |s: &Value| -> Vec<i64> {
                let mut p: Vec<i64> = s["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["port"].as_i64())
                    .collect();
                p.sort_unstable();
                p
            };
            ready == hello && !items.is_empty() && items.iter().all(|s| ports_of(s) == [8000, 8080])
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\n{}",
            k.run(&["get", "endpointslices", "-o", "yaml"]),
            std::fs::read_to_string(run_dir(&name).join("endpoints").join("endpoints.log"))
                .unwrap_or_default()
        )
    });

    // Services without kube-proxy: a client pod on each node reaches the hello
    // Service's ClusterIP (allocated by the API server) over TCP and UDP, the
    // node's agent translating it at the socket (docs/services.md); every
    // answer comes from a hello pod, and over both clients both answer.
    let cluster_ip = k.json(&["get", "service", "hello"])["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        cluster_ip.starts_with("10.96."),
        "a ClusterIP from the lab's service range: {cluster_ip:?}"
    );
    let mut svc_checks = Vec::new();
    for i in 0..8 {
        svc_checks.push(json!({"id": format!("svc/http/{i}"), "proto": "http",
            "target": format!("{cluster_ip}:80"), "expect": null, "timeoutMs": 5000}));
    }
    for i in 0..4 {
        svc_checks.push(json!({"id": format!("svc/udp/{i}"), "proto": "udp",
            "target": format!("{cluster_ip}:53"), "expect": null, "timeoutMs": 5000}));
    }
    let svc_plan = json!({ "checks": svc_checks }).to_string();
    let mut answered = std::collections::BTreeSet::new();
    for (pod, node) in [("svc-client-1", &n1), ("svc-client-2", &n2)] {
        k.apply(&named_client_manifest(pod, node, &svc_plan));
        wait_for(&format!("{pod} to finish"), Duration::from_secs(60), || {
            let phase = k.pod(pod)["status"]["phase"].clone();
            phase == "Succeeded" || phase == "Failed"
        })
        .expect("service client finished");
        let p = k.pod(pod);
        let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        let report: Value =
            serde_json::from_str(term["message"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
        let results = report["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), 12, "{pod} on {node}: {term}");
        for r in &results {
            let answer = r["answer"].as_str().unwrap_or_default();
            assert!(
                r["ok"] == true && (answer == "hello-1" || answer == "hello-2"),
                "{pod} on {node}: {r}"
            );
            answered.insert(answer.to_string());
        }
        k.run(&["delete", "pod", pod, "--wait=true"]);
    }
    assert_eq!(answered.len(), 2, "both backends answer: {answered:?}");

    // A client no socket hook sees, as a KubeVirt guest is: the probe runs in
    // echo-a's network namespace from this test process, outside the node's
    // hooked cgroup, so its connects and sends carry the ClusterIP out of the
    // pod. from_pod translates them per packet and the gate reverses the
    // replies (docs/services.md): HTTP is answered by hello pods, and each UDP
    // reply reaches the probe's connected socket only because it comes from
    // the ClusterIP.
    let guest = Ns::open(&netns_of_pod(&n1, &uid_of(&k.pod("echo-a"))));
    let mut guest_checks = Vec::new();
    for i in 0..8 {
        guest_checks.push(json!({"id": format!("guest/http/{i}"), "proto": "http",
            "target": format!("{cluster_ip}:80"), "expect": null, "timeoutMs": 5000}));
    }
    for i in 0..4 {
        guest_checks.push(json!({"id": format!("guest/udp/{i}"), "proto": "udp",
            "target": format!("{cluster_ip}:53"), "expect": null, "timeoutMs": 5000}));
    }
    let report = probe_from(&bin, &guest, json!(guest_checks));
    for r in report["results"].as_array().expect("results") {
        let answer = r["answer"].as_str().unwrap_or_default();
        assert!(answer == "hello-1" || answer == "hello-2", "guest: {r}");
    }

    // Hairpin: the same from hello-1's own network namespace, a guest that is
    // one of the Service's two backends. The flows that pick hello-1 come back
    // into it from its node's address, and its answers leave it to be reversed
    // and sent back in (docs/services.md); without that they would be answered
    // inside the pod, from its own address, and never reach the socket that
    // asked the ClusterIP. Every check is answered, and by both pods.
    let hello1 = k.pod("hello-1");
    let own = Ns::open(&netns_of_pod(
        hello1["spec"]["nodeName"].as_str().expect("hello-1's node"),
        &uid_of(&hello1),
    ));
    let own_checks: Vec<Value> = (0..16)
        .map(|i| {
            json!({"id": format!("hairpin/http/{i}"), "proto": "http",
                "target": format!("{cluster_ip}:80"), "expect": null, "timeoutMs": 5000})
        })
        .collect();
    let report = probe_from(&bin, &own, json!(own_checks));
    assert_eq!(
        answers(&report),
        ["hello-1", "hello-2"].into_iter().collect(),
        "a backend reaching its own Service per packet: {report}"
    );

    // NodePort from outside (examples/nodeport.yaml, per-packet LB in from_uplink):
    // the external host reaches both hello pods through either node's address, and
    // with externalTrafficPolicy Local only the node's own hello pods, which see the
    // external host's own address. `peer` answers "<pod> <source it saw>".
    let nodeport = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/nodeport.yaml");
    k.run(&["apply", "-f", &nodeport.display().to_string()]);
    for svc in ["hello-nodeport", "hello-local", "hello-lb"] {
        let slices = format!("kubernetes.io/service-name={svc}");
        wait_for(
            &format!("{svc}'s endpoints"),
            Duration::from_secs(30),
            || {
                let l = k.json(&["get", "endpointslices", "-l", &slices]);
                l["items"].as_array().is_some_and(|items| {
                    items
                        .iter()
                        .map(|s| s["endpoints"].as_array().map_or(0, Vec::len))
                        .sum::<usize>()
                        == 2
                })
            },
        )
        .expect("NodePort endpoints");
    }
    let ext = Ns::open(&format!("{name}-ext"));
    let external = "198.19.0.2";
    let peer_checks = |port: u16, n: usize| -> Vec<Value> {
        [&n1, &n2]
            .iter()
            .flat_map(|node| {
                (0..n).map(move |i| {
                    json!({"id": format!("{node}:{port}/{i}"), "proto": "peer",
                        "target": format!("{}:{port}", node_ip(node)), "expect": null,
                        "timeoutMs": 5000})
                })
            })
            .collect()
    };
    // Retried until the agents have programmed the new Services.
    let mut last = Value::Null;
    wait_for(
        "NodePort 30080 answers from outside",
        Duration::from_secs(30),
        || {
            let plan = json!({ "checks": peer_checks(30080, 1) }).to_string();
            let out = exec_in(
                &ext,
                &[
                    &bin.display().to_string(),
                    "probe",
                    "client",
                    "--plan",
                    &plan,
                ],
            )
            .expect("probe client");
            last = text(&out.stdout)
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
                .unwrap_or(Value::Null);
            out.status.success()
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {last}"));
    let report = probe_from(&bin, &ext, json!(peer_checks(30080, 8)));
    let mut np_answered = std::collections::BTreeSet::new();
    for r in report["results"].as_array().expect("results") {
        let answer = r["answer"].as_str().unwrap_or_default();
        let (pod, src) = answer.split_once(' ').unwrap_or((answer, ""));
        assert!(
            ips.get(pod).is_some_and(|_| pod.starts_with("hello-")),
            "{r}"
        );
        // etp Cluster: the source is kept for a pod on the node the request
        // reached, and is that node's address (SNAT) for a pod on the other.
        let reached = r["id"]
            .as_str()
            .unwrap_or_default()
            .split(':')
            .next()
            .unwrap_or_default();
        let expect_src = if ips[pod].1 == reached {
            external
        } else {
            node_ip(reached)
        };
        assert_eq!(src, expect_src, "{r}");
        np_answered.insert(pod.to_string());
    }
    assert_eq!(
        np_answered.len(),
        2,
        "both pods answer the NodePort: {np_answered:?}"
    );
    let mut local_checks = Vec::new();
    for node in [&n1, &n2] {
        let here: Vec<&str> = ["hello-1", "hello-2"]
            .into_iter()
            .filter(|p| ips[*p].1 == *node)
            .collect();
        for i in 0..4 {
            let target = format!("{}:30081", node_ip(node));
            local_checks.push(if here.is_empty() {
                // no local endpoint: dropped, as kube-proxy does
                json!({"id": format!("{node}/local/{i}"), "proto": "tcp", "target": target,
                    "expect": null, "expectBlocked": true, "timeoutMs": 2000})
            } else {
                json!({"id": format!("{node}/local/{i}"), "proto": "peer", "target": target,
                    "expect": null, "timeoutMs": 5000})
            });
        }
    }
    let report = probe_from(&bin, &ext, json!(local_checks));
    for r in report["results"].as_array().expect("results") {
        let Some(answer) = r["answer"].as_str() else {
            continue; // an expected block
        };
        let node = r["id"]
            .as_str()
            .unwrap_or_default()
            .split('/')
            .next()
            .unwrap_or_default();
        let (pod, src) = answer.split_once(' ').unwrap_or((answer, ""));
        assert_eq!(
            ips.get(pod).map(|p| p.1.as_str()),
            Some(node),
            "etp Local: {r}"
        );
        assert_eq!(src, external, "etp Local keeps the client's source: {r}");
    }

    // ICMP errors through a NodePort (bpf/lb.h cp_lb_icmp_error): a UDP
    // NodePort whose pods do not listen on the target port. Each pod's
    // kernel answers "port unreachable" about the translated request; the
    // external host's connected socket sees it (ECONNREFUSED) only if the
    // error comes back translated, as about its own request to the
    // NodePort. Untranslated, it would wait out its timeout in silence.
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello-udp-closed"},
            "spec": {"type": "NodePort", "selector": {"app": "hello"},
                "ports": [{"protocol": "UDP", "port": 9, "targetPort": 9, "nodePort": 30097}]}})
        .to_string(),
    );
    // One short check at a time: a pod's kernel rate-limits its ICMP errors
    // per destination (a burst of 6, then 1/s), and a check's outcome names
    // its last attempt's error only.
    for node in [&n1, &n2] {
        wait_refused(
            &bin,
            &ext,
            &format!("a closed UDP NodePort on {node} is refused from outside"),
            &format!("{}:30097", node_ip(node)),
        );
    }

    // The same Service's ClusterIP from the guest-like client above (no socket
    // hook): the pods' "port unreachable" about its per-packet flow reaches
    // its connected socket only translated at the gate, from the ClusterIP.
    let closed_ip = k.json(&["get", "service", "hello-udp-closed"])["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    wait_refused(
        &bin,
        &guest,
        "a closed UDP ClusterIP is refused to a client no socket hook sees",
        &format!("{closed_ip}:9"),
    );

    // sessionAffinity ClientIP from outside: after a first request pins the
    // external host, 16 new connections all reach the same hello pod (the
    // expiry and re-pick are bpf_lb.rs's, deterministic on the kernel).
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hello-sticky"},
            "spec": {"type": "NodePort", "selector": {"app": "hello"},
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30093}]}})
        .to_string(),
    );
    let sticky = |n: usize| -> Vec<Value> {
        (0..n)
            .map(|i| {
                json!({"id": format!("sticky/{i}"), "proto": "http", "expect": null,
                    "timeoutMs": 5000, "target": format!("{}:30093", node_ip(&n1))})
            })
            .collect()
    };
    wait_for("hello-sticky answers", Duration::from_secs(30), || {
        let plan = json!({ "checks": sticky(1) }).to_string();
        exec_in(
            &ext,
            &[
                &bin.display().to_string(),
                "probe",
                "client",
                "--plan",
                &plan,
            ],
        )
        .is_ok_and(|o| o.status.success())
    })
    .expect("hello-sticky answers");
    let report = probe_from(&bin, &ext, json!(sticky(16)));
    let stuck = answers(&report);
    assert_eq!(
        stuck.len(),
        1,
        "one pod for one client under ClientIP affinity: {stuck:?}"
    );

    // healthCheckNodePort of hello-local (etp Local): each node answers 200 with
    // its count of hello pods where it has some, 503 where it has none.
    let hc_checks: Vec<Value> = [&n1, &n2]
        .iter()
        .map(|node| {
            json!({"id": format!("{node}/hc"), "proto": "http", "expect": null,
                "timeoutMs": 5000, "target": format!("{}:30082", node_ip(node))})
        })
        .collect();
    let plan = json!({ "checks": hc_checks }).to_string();
    let out = exec_in(
        &ext,
        &[
            &bin.display().to_string(),
            "probe",
            "client",
            "--plan",
            &plan,
        ],
    )
    .expect("probe client");
    let report: Value = text(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("health-check report");
    for (r, node) in report["results"]
        .as_array()
        .expect("results")
        .iter()
        .zip([&n1, &n2])
    {
        let here = ["hello-1", "hello-2"]
            .into_iter()
            .filter(|p| ips[*p].1 == *node)
            .count();
        if here > 0 {
            // (the probe shortens long answers; the count comes first)
            let answer = r["answer"].as_str().unwrap_or_default();
            assert!(
                r["ok"] == true && answer.contains(&format!("\"localEndpoints\":{here}")),
                "{node}: {r}"
            );
        } else {
            assert!(
                r["ok"] == false && r["error"].as_str().is_some_and(|e| e.contains("503")),
                "{node} has no hello pod: 503 expected: {r}"
            );
        }
    }

    // LoadBalancer: the lab has no load-balancer controller, so the test gives
    // hello-lb two ingress IPs (the status subresource, as such a controller
    // would) and routes each to one node in the fabric, as a router in front of
    // the cluster would; both answer from outside, from both pods.
    let (lb1, lb2) = ("198.18.0.200", "198.18.0.201");
    k.run(&[
        "patch",
        "service",
        "hello-lb",
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({"status": {"loadBalancer": {"ingress": [{"ip": lb1}, {"ip": lb2}]}}}).to_string(),
    ]);
    let fabric = Ns::open(&format!("{name}-fabric"));
    for (ip, node) in [(lb1, &n1), (lb2, &n2)] {
        let out = exec_in(
            &fabric,
            &[
                "ip",
                "route",
                "replace",
                &format!("{ip}/32"),
                "via",
                node_ip(node),
            ],
        )
        .expect("ip route");
        assert!(out.status.success(), "route {ip}: {}", text(&out.stderr));
    }
    let lb_checks = |n: usize| -> Vec<Value> {
        [lb1, lb2]
            .iter()
            .flat_map(|ip| {
                (0..n).map(move |i| {
                    json!({"id": format!("{ip}/{i}"), "proto": "peer",
                        "target": format!("{ip}:80"), "expect": null, "timeoutMs": 5000})
                })
            })
            .collect()
    };
    wait_for(
        "the LoadBalancer IPs answer from outside",
        Duration::from_secs(30),
        || {
            let plan = json!({ "checks": lb_checks(1) }).to_string();
            exec_in(
                &ext,
                &[
                    &bin.display().to_string(),
                    "probe",
                    "client",
                    "--plan",
                    &plan,
                ],
            )
            .is_ok_and(|o| o.status.success())
        },
    )
    .expect("LoadBalancer IPs answer");
    let report = probe_from(&bin, &ext, json!(lb_checks(8)));
    let mut lb_answered = std::collections::BTreeSet::new();
    for r in report["results"].as_array().expect("results") {
        let answer = r["answer"].as_str().unwrap_or_default();
        let (pod, _) = answer.split_once(' ').unwrap_or((answer, ""));
        assert!(pod == "hello-1" || pod == "hello-2", "{r}");
        lb_answered.insert(pod.to_string());
    }
    assert_eq!(
        lb_answered.len(),
        2,
        "both pods answer the LoadBalancer IPs: {lb_answered:?}"
    );

    // loadBalancerSourceRanges that leave the external host out: its new
    // connections to the LoadBalancer IPs go unanswered, while the NodePort of
    // the same Service still answers (kube-proxy filters the LB IPs only); a
    // range that lists it lets it in again.
    let blocked_checks = |n: usize| -> Vec<Value> {
        [lb1, lb2]
            .iter()
            .flat_map(|ip| {
                (0..n).map(move |i| {
                    json!({"id": format!("{ip}/blocked/{i}"), "proto": "tcp",
                        "target": format!("{ip}:80"), "expect": null, "expectBlocked": true,
                        "timeoutMs": 1500})
                })
            })
            .collect()
    };
    let ranges = |r: &[&str]| json!({"spec": {"loadBalancerSourceRanges": r}}).to_string();
    k.run(&[
        "patch",
        "service",
        "hello-lb",
        "--type=merge",
        "-p",
        &ranges(&["203.0.113.0/24"]),
    ]);
    wait_for(
        "the LoadBalancer IPs refuse the external host",
        Duration::from_secs(30),
        || {
            let plan = json!({ "checks": blocked_checks(1) }).to_string();
            exec_in(
                &ext,
                &[
                    &bin.display().to_string(),
                    "probe",
                    "client",
                    "--plan",
                    &plan,
                ],
            )
            .is_ok_and(|o| o.status.success())
        },
    )
    .expect("source ranges enforced");
    probe_from(&bin, &ext, json!(blocked_checks(3)));
    let lb_node_port = k.json(&["get", "service", "hello-lb"])["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .expect("hello-lb's nodePort");
    probe_from(
        &bin,
        &ext,
        json!([{"id": "lb-nodeport", "proto": "http", "expect": null, "timeoutMs": 5000,
            "target": format!("{}:{lb_node_port}", node_ip(&n1))}]),
    );
    k.run(&[
        "patch",
        "service",
        "hello-lb",
        "--type=merge",
        "-p",
        &ranges(&["203.0.113.0/24", "198.19.0.0/24"]),
    ]);
    wait_for(
        "the LoadBalancer IPs admit the listed range",
        Duration::from_secs(30),
        || {
            let plan = json!({ "checks": lb_checks(1) }).to_string();
            exec_in(
                &ext,
                &[
                    &bin.display().to_string(),
                    "probe",
                    "client",
                    "--plan",
                    &plan,
                ],
            )
            .is_ok_and(|o| o.status.success())
        },
    )
    .expect("listed range admitted");

    // kubectl shows them with their IPs and nodes.
    let wide = k.run(&["get", "pods", "-o", "wide"]);
    for p in all {
        let line = wide
            .lines()
            .find(|l| l.starts_with(&format!("{p} ")))
            .unwrap_or_else(|| panic!("{p} missing:\n{wide}"));
        assert!(
            line.contains(&ips[p].0) && line.contains(&ips[p].1),
            "{line}"
        );
    }

    // From the other node's netns: TCP, UDP, HTTP answered with the pod's name.
    let (node1, node2) = (Ns::open(&n1), Ns::open(&n2));
    let echo_ip = ips["echo-a"].0.clone();
    let mut checks = all_protos("echo-a", &echo_ip, 8000, 8080);
    checks.extend(all_protos("free", &ips["free"].0, 8000, 8080));
    checks.extend(all_protos("hello-1", &ips["hello-1"].0, 8000, 8080));
    probe_from(&bin, &node2, json!(checks));
    let mut checks = all_protos("host-b", &ips["host-b"].0, 4250, 4251);
    checks.extend(all_protos("external", "198.19.0.2", 8000, 8080));
    probe_from(&bin, &node1, json!(checks));

    // `lab status` lists the pods and the new components, all healthy.
    let status = ok("lab status", lab(&bin, &["status", "--name", &name]));
    for needle in [
        "scheduler",
        "endpoints",
        "kubelet",
        "external",
        "default/echo-a",
        "healthy: yes",
        "pods: 5",
    ] {
        assert!(status.contains(needle), "{needle:?} missing:\n{status}");
    }
    let row = status
        .lines()
        .find(|l| l.starts_with("default/echo-a"))
        .expect("echo-a row");
    assert!(
        row.contains(&n1) && row.contains("Running") && row.contains(&echo_ip),
        "{row}"
    );

    // From another pod: a run-once client on node 2; its report is the termination message.
    let plan = json!({"checks": all_protos("echo-a", &echo_ip, 8000, 8080)}).to_string();
    k.apply(&client_manifest(&n2, &plan));
    wait_for("the client pod to finish", Duration::from_secs(60), || {
        k.pod("client")["status"]["phase"] == "Succeeded"
            || k.pod("client")["status"]["phase"] == "Failed"
    })
    .expect("client finished");
    let client = k.pod("client");
    let term = &client["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(client["status"]["phase"], "Succeeded", "{term}");
    assert_eq!(
        (term["exitCode"].as_i64(), term["reason"].as_str()),
        (Some(0), Some("Completed"))
    );
    let report: Value =
        serde_json::from_str(term["message"].as_str().expect("message")).expect("report");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    assert!(
        results
            .iter()
            .all(|r| r["ok"] == true && r["answer"] == "echo-a"),
        "{report}"
    );
    let client_ip = client["status"]["podIP"].as_str().unwrap_or_default();
    assert!(
        in_cluster_cidr(client_ip),
        "a finished pod keeps its podIP: {client_ip:?}"
    );
    let client_ns = netns_of_pod(&n2, &uid_of(&client));
    wait_for(
        "the finished pod's netns to go",
        Duration::from_secs(10),
        || !named_netns_path(&client_ns).exists(),
    )
    .expect("finished pod's network removed");

    // An env source the lab cannot provide: Pending, with the reason in the status.
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad-env"},
            "spec": {"nodeName": n1, "containers": [{"name": "c", "env": [
                {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}})
        .to_string(),
    );
    wait_for("bad-env to be refused", Duration::from_secs(20), || {
        k.pod("bad-env")["status"]["reason"] == "CreateContainerConfigError"
    })
    .expect("bad-env status");
    let bad = k.pod("bad-env");
    assert_eq!(bad["status"]["phase"], "Pending");
    assert!(
        bad["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("env S")),
        "{bad}"
    );
    k.run(&["delete", "pod", "bad-env"]);

    // The kubelet runs the probe workload only: no other `cozyplane` subcommand (here the
    // agent, as root on the node) and no loader environment.
    for pod in [
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "not-probe"},
            "spec": {"nodeName": n1, "containers": [{"name": "c",
                "command": ["cozyplane", "agent", "--node-name", n1]}]}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "preload"},
            "spec": {"nodeName": n1, "containers": [{"name": "c",
                "command": ["cozyplane", "probe", "server"],
                "env": [{"name": "LD_PRELOAD", "value": "/tmp/evil.so"}]}]}}),
    ] {
        k.apply(&pod.to_string());
    }
    for (pod, says) in [
        ("not-probe", "only the probe workload"),
        ("preload", "env LD_PRELOAD"),
    ] {
        wait_for(
            &format!("{pod} to be refused"),
            Duration::from_secs(20),
            || k.pod(pod)["status"]["reason"] == "CreateContainerConfigError",
        )
        .expect("refused");
        let p = k.pod(pod);
        assert_eq!(p["status"]["phase"], "Pending", "{p}");
        assert!(
            p["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{p}"
        );
        assert!(
            p["status"]["podIP"].is_null(),
            "nothing was made for {pod}: {p}"
        );
        k.run(&["delete", "pod", pod]);
    }

    // Live Service connections across an agent restart (issue #11): a stream
    // server behind a NodePort/ClusterIP Service on node 2, and three live
    // streams through it: from the external host to node 2's NodePort (the
    // per-packet LB's flow state on node 2), to node 1's NodePort (SNAT on node
    // 1, the backend behind node 2's overlay delivery), and from a pod on node 2
    // to the ClusterIP (socket-LB). Node 2's agent is killed below and
    // restarted; no stream may be cut.
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "streamer", "labels": {"app": "streamer"}},
            "spec": {"nodeName": n2, "containers": [{"name": "s",
                "image": "ghcr.io/cozystack/cozyplane:test",
                "command": ["cozyplane", "probe", "server", "--stream-port", "9000"],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "readinessProbe": {"tcpSocket": {"port": 9000}}}]}})
        .to_string(),
    );
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "streamer"},
            "spec": {"type": "NodePort", "selector": {"app": "streamer"},
                "ports": [{"name": "stream", "port": 90, "targetPort": 9000, "nodePort": 30090}]}})
        .to_string(),
    );
    wait_for("streamer's endpoint", Duration::from_secs(60), || {
        let l = k.json(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=streamer",
        ]);
        l["items"].as_array().is_some_and(|items| {
            items.iter().any(|s| {
                s["endpoints"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["conditions"]["ready"] != false))
            })
        })
    })
    .expect("streamer ready behind its Service");
    let streamer_cip = k.json(&["get", "service", "streamer"])["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let stream_spec = |target: String| {
        json!({"target": target, "expect": "streamer", "intervalMs": 100,
            "echoTimeoutMs": 3000, "connectTimeoutMs": 30000, "maxStreamMs": 40000,
            "holdMs": 1000, "reconnectEveryMs": 500})
        .to_string()
    };
    let spawn_stream = |target: String| -> Child {
        let mut cmd = Command::new(&bin);
        cmd.args(["probe", "stream", "--spec", &stream_spec(target)])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cozyplane_lab::exec::enter_before_exec(&mut cmd, &ext.1).expect("setns hook");
        cmd.spawn().expect("probe stream")
    };
    let ext_streams = [
        (
            "node 2's NodePort",
            spawn_stream(format!("{}:30090", node_ip(&n2))),
        ),
        (
            "node 1's NodePort",
            spawn_stream(format!("{}:30090", node_ip(&n1))),
        ),
    ];
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "svc-stream"},
            "spec": {"nodeName": n2, "restartPolicy": "Never", "containers": [{"name": "c",
                "image": "ghcr.io/cozystack/cozyplane:test",
                "command": ["cozyplane", "probe", "stream", "--spec",
                    stream_spec(format!("{streamer_cip}:90"))]}]}})
        .to_string(),
    );
    wait_for(
        "the ClusterIP stream running",
        Duration::from_secs(30),
        || k.pod("svc-stream")["status"]["phase"] == "Running",
    )
    .expect("svc-stream running");
    // Give every stream time to come up before the agent goes.
    std::thread::sleep(Duration::from_secs(3));

    // The node's agent is down: CNI ADD fails, the pod waits in ContainerCreating with
    // the plugin's error (and no netns left between attempts), then runs once the agent is back.
    let (agent, agent_argv) = component_of(&name, "agent", &n2);
    sigkill("node 2's agent", agent);
    k.apply(
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late"},
            "spec": {"nodeName": n2, "containers": [{"name": "c"}]}})
        .to_string(),
    );
    let waiting = |p: &Value| p["status"]["containerStatuses"][0]["state"]["waiting"].clone();
    wait_for(
        "late to report the CNI failure",
        Duration::from_secs(20),
        || {
            waiting(&k.pod("late"))["message"]
                .as_str()
                .is_some_and(|m| m.contains("CNI ADD"))
        },
    )
    .expect("CNI failure reported");
    let late = k.pod("late");
    assert_eq!(late["status"]["phase"], "Pending");
    assert_eq!(waiting(&late)["reason"], "ContainerCreating");
    let kubelet2_log = run_dir(&name).join("nodes").join(&n2).join("kubelet.log");
    let log2 = std::fs::read_to_string(&kubelet2_log).expect("kubelet log");
    assert!(
        log2.contains("pod default/late: network setup failed: CNI ADD"),
        "{log2}"
    );
    let late_ns = netns_of_pod(&n2, &uid_of(&late));
    // Between attempts (a DEL and the netns removal follow each failed ADD).
    wait_for(
        "no netns left by the failed ADD",
        Duration::from_secs(5),
        || !named_netns_path(&late_ns).exists(),
    )
    .expect("a failed ADD left its netns");
    let mut restarted_agent = restart_in(
        &node2,
        &agent_argv,
        &run_dir(&name).join("nodes").join(&n2).join("agent.log"),
    );
    wait_for(
        "late Ready once the agent is back",
        Duration::from_secs(60),
        || ready(&k.pod("late")),
    )
    .expect("late ready");
    // The streams outlived the agent's death and restart: none was cut, and each
    // echoed after the restarted agent was serving (late got its network from it).
    let restarted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let check_stream = |what: &str, report: &Value| {
        assert!(
            report["cutAt"].is_null() && report["connectedAt"].is_u64(),
            "{what}: the stream was cut or never came up: {report}"
        );
        assert!(
            report["lastEchoAt"].as_u64().is_some_and(|t| t >= restarted_at),
            "{what}: the stream ended before the agent was back (restart at {restarted_at}): {report}"
        );
    };
    for (what, child) in ext_streams {
        let out = child.wait_with_output().expect("stream client");
        let report: Value = text(&out.stdout)
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        check_stream(what, &report);
    }
    wait_for(
        "the ClusterIP stream's report",
        Duration::from_secs(60),
        || {
            k.pod("svc-stream")["status"]["phase"] == "Succeeded"
                || k.pod("svc-stream")["status"]["phase"] == "Failed"
        },
    )
    .expect("svc-stream finished");
    let term = k.pod("svc-stream")["status"]["containerStatuses"][0]["state"]["terminated"].clone();
    let report: Value =
        serde_json::from_str(term["message"].as_str().unwrap_or("{}")).unwrap_or(Value::Null);
    check_stream("the ClusterIP stream from node 2", &report);
    k.run(&["delete", "pod", "svc-stream", "streamer", "--wait=false"]);
    k.run(&["delete", "service", "streamer"]);

    let late_ip = k.pod("late")["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(in_cluster_cidr(&late_ip), "{late_ip}");
    probe_from(
        &bin,
        &node1,
        json!([check("late/tcp", "tcp", format!("{late_ip}:8000"), "late")]),
    );

    // Kubelet SIGKILL + restart: the pod keeps its network and IP, its workload is restarted.
    let echo = k.pod("echo-a");
    let echo_uid = uid_of(&echo);
    let echo_ns = netns_of_pod(&n1, &echo_uid);
    let (kubelet, argv) = component_of(&name, "kubelet", &n1);
    let old_workload = recorded_workload(&name, &n1, &echo_uid).expect("echo-a's workload record");
    assert!(
        running(old_workload.0, old_workload.1),
        "echo-a's workload not running"
    );
    sigkill("the kubelet", kubelet);
    let mut restarted = restart_in(
        &node1,
        &argv,
        &run_dir(&name).join("nodes").join(&n1).join("kubelet.log"),
    );
    wait_for(
        "the new kubelet to restart echo-a's workload",
        Duration::from_secs(30),
        || {
            recorded_workload(&name, &n1, &echo_uid).is_some_and(|w| w != old_workload)
                && !running(old_workload.0, old_workload.1)
        },
    )
    .expect("workload restarted by the new kubelet");
    wait_for("echo-a Ready again", Duration::from_secs(30), || {
        ready(&k.pod("echo-a"))
    })
    .expect("ready");
    let echo = k.pod("echo-a");
    assert_eq!(
        echo["status"]["podIP"],
        echo_ip.as_str(),
        "same IP after a kubelet restart"
    );
    assert!(
        named_netns_path(&echo_ns).exists(),
        "the pod's netns survived"
    );
    let log1 = std::fs::read_to_string(run_dir(&name).join("nodes").join(&n1).join("kubelet.log"))
        .expect("kubelet log");
    assert_eq!(
        log1.matches("pod default/echo-a: network up").count(),
        1,
        "the restarted kubelet must not ADD again:\n{log1}"
    );
    assert!(
        log1.contains("pod default/echo-a: stopped the workload pid"),
        "{log1}"
    );
    probe_from(
        &bin,
        &node2,
        json!(all_protos("echo-a", &echo_ip, 8000, 8080)),
    );

    // Delete: graceful, so kubectl returns only once the kubelet has stopped
    // the workload and removed the netns and veth, and deleted the pod.
    let cid: String = echo_uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    assert_eq!(pod_veths(&node1, &cid).len(), 1, "echo-a's veth");
    assert_eq!(fabric_ips_of(&k, &echo_uid), 1, "echo-a's FabricIP");
    let new_workload = recorded_workload(&name, &n1, &echo_uid).expect("workload");
    let t_del = Instant::now();
    let deleted = k.run(&["delete", "pod", "echo-a"]);
    let returned_in = t_del.elapsed();
    // Checked right after kubectl returned, no waiting.
    assert!(deleted.contains("pod \"echo-a\" deleted"), "{deleted}");
    assert!(
        !named_netns_path(&echo_ns).exists(),
        "kubectl delete returned before the netns went"
    );
    assert!(
        pod_veths(&node1, &cid).is_empty(),
        "kubectl delete returned before the veth went"
    );
    assert!(
        !running(new_workload.0, new_workload.1),
        "kubectl delete returned before the workload stopped"
    );
    assert!(
        recorded_workload(&name, &n1, &echo_uid).is_none(),
        "record left"
    );
    let log1 = std::fs::read_to_string(run_dir(&name).join("nodes").join(&n1).join("kubelet.log"))
        .expect("kubelet log");
    assert!(log1.contains("pod default/echo-a: deleted"), "{log1}");
    wait_for("echo-a's FabricIP to go", Duration::from_secs(30), || {
        fabric_ips_of(&k, &echo_uid) == 0
    })
    .expect("deleted pod's FabricIP removed");
    eprintln!(
        "kubectl delete (graceful) returned in {:.2} s, FabricIP gone in {:.2} s",
        returned_in.as_secs_f64(),
        t_del.elapsed().as_secs_f64()
    );

    // A forced delete (grace 0) removes the pod at once; the kubelet still
    // tears it down.
    let RunningPod {
        uid: forced_uid,
        netns: forced_ns,
        workload: forced_workload,
    } = run_pod(&k, &name, &n1, "forced");
    k.run(&["delete", "pod", "forced", "--grace-period=0", "--force"]);
    assert!(
        !k.try_run(&["get", "pod", "forced"]).0,
        "a grace-0 delete removes the pod at once"
    );
    wait_for(
        "forced's netns and workload to go",
        Duration::from_secs(30),
        || !named_netns_path(&forced_ns).exists() && !running(forced_workload.0, forced_workload.1),
    )
    .expect("force-deleted pod torn down");
    assert!(
        recorded_workload(&name, &n1, &forced_uid).is_none(),
        "forced's record left"
    );

    // Marked for deletion while its kubelet is down: the pod stays (Terminating)
    // with its workload and network; the restarted kubelet tears it down from
    // its record and only then deletes it.
    let RunningPod {
        uid: _,
        netns: doomed_ns,
        workload: doomed_workload,
    } = run_pod(&k, &name, &n1, "doomed");
    restarted.kill().expect("SIGKILL the restarted kubelet");
    let _ = restarted.wait();
    k.run(&["delete", "pod", "doomed", "--wait=false"]);
    let marked = k.pod("doomed");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    assert!(
        named_netns_path(&doomed_ns).exists() && running(doomed_workload.0, doomed_workload.1),
        "nothing is torn down without a kubelet"
    );
    restarted = restart_in(
        &node1,
        &argv,
        &run_dir(&name).join("nodes").join(&n1).join("kubelet.log"),
    );
    wait_for(
        "the restarted kubelet to delete doomed",
        Duration::from_secs(30),
        || !k.try_run(&["get", "pod", "doomed"]).0,
    )
    .expect("doomed deleted by the restarted kubelet");
    assert!(
        !named_netns_path(&doomed_ns).exists(),
        "doomed deleted before its netns went"
    );
    assert!(
        !running(doomed_workload.0, doomed_workload.1),
        "doomed deleted before its workload stopped"
    );

    // A backend deleted mid-run (issue #11): web-a (node 1) and web-b (node 2)
    // behind two Services: web-local (etp Local, a stream port) and web (etp
    // Cluster, HTTP). A stream from the external host through node 1's
    // web-local NodePort is held by web-a; web-b is deleted; web leaves it out of
    // rotation (every later request answered by web-a) while the established
    // stream to web-a goes on uncut.
    for (pod, node) in [("web-a", &n1), ("web-b", &n2)] {
        k.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "labels": {"app": "web"}},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "s",
                    "image": "ghcr.io/cozystack/cozyplane:test",
                    "command": ["cozyplane", "probe", "server", "--stream-port", "9000"],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "readinessProbe": {"tcpSocket": {"port": 9000}}}]}})
            .to_string(),
        );
    }
    for svc in [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-local"},
            "spec": {"type": "NodePort", "externalTrafficPolicy": "Local",
                "selector": {"app": "web"},
                "ports": [{"name": "stream", "port": 90, "targetPort": 9000, "nodePort": 30091}]}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"type": "NodePort", "selector": {"app": "web"},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30092}]}}),
    ] {
        k.apply(&svc.to_string());
    }
    let web_round = |n: usize| -> Vec<String> {
        let checks: Vec<Value> = (0..n)
            .map(|i| {
                json!({"id": format!("web/{i}"), "proto": "http", "expect": null,
                    "timeoutMs": 2000, "target": format!("{}:30092", node_ip(&n1))})
            })
            .collect();
        let plan = json!({ "checks": checks }).to_string();
        let Ok(out) = exec_in(
            &ext,
            &[
                &bin.display().to_string(),
                "probe",
                "client",
                "--plan",
                &plan,
            ],
        ) else {
            return Vec::new();
        };
        let report: Value = text(&out.stdout)
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        report["results"]
            .as_array()
            .map(|r| {
                r.iter()
                    .map(|r| r["answer"].as_str().unwrap_or("(none)").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut seen = std::collections::BTreeSet::new();
    wait_for(
        "web's NodePort answered by both pods",
        Duration::from_secs(60),
        || {
            seen.extend(web_round(8));
            seen.contains("web-a") && seen.contains("web-b")
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {seen:?}"));
    let mut stream = {
        let spec = json!({"target": format!("{}:30091", node_ip(&n1)), "expect": "web-a",
            "intervalMs": 100, "echoTimeoutMs": 3000, "connectTimeoutMs": 30000,
            "maxStreamMs": 12000, "holdMs": 1000, "reconnectEveryMs": 500})
        .to_string();
        let mut cmd = Command::new(&bin);
        cmd.args(["probe", "stream", "--spec", &spec])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cozyplane_lab::exec::enter_before_exec(&mut cmd, &ext.1).expect("setns hook");
        Some(cmd.spawn().expect("probe stream"))
    };
    std::thread::sleep(Duration::from_secs(2));
    let deleted = Instant::now();
    k.run(&["delete", "pod", "web-b", "--wait=false"]);
    wait_for("web-b out of rotation", Duration::from_secs(20), || {
        let answers = web_round(8);
        answers.len() == 8 && answers.iter().all(|a| a == "web-a")
    })
    .expect("web-b left the rotation");
    eprintln!(
        "web-b out of rotation {:.0} ms after its deletion (sampled, not a bound)",
        deleted.elapsed().as_secs_f64() * 1000.0
    );
    // ... and stays out: 16 more requests, all web-a, none failing.
    assert_eq!(web_round(16), vec!["web-a".to_string(); 16]);
    let out = stream
        .take()
        .expect("stream")
        .wait_with_output()
        .expect("stream client");
    let report: Value = text(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    assert!(
        report["cutAt"].is_null() && report["echoes"].as_u64().is_some_and(|n| n > 50),
        "the stream to web-a goes on while web-b goes: {report}"
    );
    k.run(&["delete", "pod", "web-a", "--wait=false"]);
    k.run(&["delete", "service", "web", "web-local"]);

    // Down leaves nothing: namespaces, processes (workloads and the restarted kubelet too), run dir.
    let workloads: Vec<(i32, u64)> = ["free", "hello-1", "hello-2", "late"]
        .iter()
        .filter_map(|p| {
            let pod = k.pod(p);
            let node = pod["spec"]["nodeName"].as_str()?.to_string();
            recorded_workload(&name, &node, &uid_of(&pod))
        })
        .collect();
    assert_eq!(workloads.len(), 4, "workload records");
    ok("lab down", lab(&bin, &["down", "--name", &name]));
    drop(down);
    let _ = restarted.wait();
    let _ = restarted_agent.wait();
    assert!(
        lab_support::netns_with_prefix(&name).is_empty(),
        "namespaces left"
    );
    for (pid, st) in workloads {
        assert!(!running(pid, st), "workload {pid} survived lab down");
    }
    assert!(!run_dir(&name).exists(), "run dir left behind");
}
