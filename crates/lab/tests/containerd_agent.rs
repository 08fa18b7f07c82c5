//! The whole node path under containerd 1.6's CRI with the real node agent.
//!
//! The project's API server (`cozyplane apiserver --standalone`) and the real
//! agent (`cozyplane agent`, the shipped subcommand) run in a one-node lab topology; the agent installs the plugin
//! into the CNI bin dir and writes the conflist last; containerd (in the host
//! namespace, sharing the mount namespace) picks the conflist up and runs the plugin,
//! which asks the agent over its socket; the agent claims a FabricIP and plumbs the
//! pod with the host end of its veth in the node. Needs `kubectl` besides the
//! `containerd_support` prerequisites.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod containerd_support;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use containerd_support::*;
use cozyplane_cri_harness::{cni_netns, PodRef};
use cozyplane_datapath::netlink::host_veth_name;
use cozyplane_lab::{destroy_by_prefix, exec_in, wait_for, Topology, TopologySpec};
use cozyplane_testkit::{needs, Tool};

/// The lab topology of the real-agent test (one node, no external host).
const AGENT_LAB: &str = "cpcri";
/// The cluster pod CIDR the agent draws from.
const CLUSTER_CIDR_PREFIX: [u8; 2] = [10, 244];
/// The kubectl this test runs in the node (the one on `PATH`).
const KUBECTL: Tool = Tool::new("kubectl", &["version", "--client"], "kubectl");

/// `kubectl --kubeconfig <kc> <args>` inside the lab node (the API server listens
/// on the node's loopback).
fn kubectl(node: &cozyplane_lab::Node, kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    let kc = kubeconfig.to_string_lossy();
    let mut argv = vec![
        "kubectl",
        "--kubeconfig",
        kc.as_ref(),
        "--request-timeout=10s",
    ];
    argv.extend_from_slice(args);
    exec_in(node, &argv).expect("run kubectl in the node")
}

fn kubectl_ok(node: &cozyplane_lab::Node, kubeconfig: &Path, args: &[&str]) -> String {
    let out = kubectl(node, kubeconfig, args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(name, spec.address, spec.podName)` of every FabricIP.
fn fabric_ips(node: &cozyplane_lab::Node, kubeconfig: &Path) -> Vec<(String, String, String)> {
    let json = kubectl_ok(
        node,
        kubeconfig,
        &["get", "fabricips.local.sdn.cozystack.io", "-o", "json"],
    );
    let v: serde_json::Value = serde_json::from_str(&json).expect("FabricIP list JSON");
    let field = |item: &serde_json::Value, ptr: &str| {
        item.pointer(ptr)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_string()
    };
    v["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    (
                        field(i, "/metadata/name"),
                        field(i, "/spec/address"),
                        field(i, "/spec/podName"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Kills and reaps a child (the lab's destroy also kills tracked processes; this
/// reaps ours so no zombie is left).
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lazily unmounts a path when dropped.
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

fn log_file(path: &Path) -> (std::fs::File, std::fs::File) {
    let f = std::fs::File::create(path).expect("create log");
    let g = f.try_clone().expect("clone log fd");
    (f, g)
}

/// The whole node path: the project's API server (standalone) and the real
/// agent (`cozyplane agent`) run in a lab node; the agent installs the plugin into the
/// CNI bin dir and writes the conflist last; containerd (host) picks it up and
/// runs the plugin, which asks the agent, which claims a FabricIP and plumbs the
/// pod with its host veth in the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_agent_serves_containerd_through_the_plugin() {
    if !requirements_met(needs!().tool(&KUBECTL)) {
        return;
    }
    let _serial = SERIAL.lock().await;
    let plugin = plugin_binary();
    // One binary for both: `cozyplane apiserver` and `cozyplane agent`.
    let cozyplane = cozyplane_testkit::cozyplane_bin();

    let _ = destroy_by_prefix(AGENT_LAB);
    let mut spec = TopologySpec::new(AGENT_LAB, 1);
    spec.external = false;
    let mut topo = Topology::build(spec).await.expect("lab topology");
    let base = scratch();
    let outcome = real_agent_lifecycle(&topo, base.path(), &plugin, &cozyplane).await;
    // The lab kills the agent and the API server (tracked) and removes the node.
    topo.destroy().expect("destroy the lab");
    if let Err(report) = outcome {
        panic!("{report}");
    }
}

/// The body of the real-agent test; `Err` carries the logs to show.
async fn real_agent_lifecycle(
    topo: &Topology,
    base: &Path,
    plugin: &Path,
    cozyplane: &Path,
) -> Result<(), String> {
    let node = &topo.nodes()[0];
    let api_dir = base.join("api");
    std::fs::create_dir_all(&api_dir).expect("api dir");
    let kubeconfig = api_dir.join("kubeconfig");
    let api_log = api_dir.join("apiserver.log");
    let (out, err) = log_file(&api_log);
    let _apiserver = Reap(
        topo.spawn_in_node(
            node,
            Command::new(cozyplane)
                .args(["apiserver", "--standalone", "--bind-address", "127.0.0.1"])
                .args(["--port", "6443", "--data-dir"])
                .arg(api_dir.join("data"))
                .arg("--cert-dir")
                .arg(api_dir.join("certs"))
                .arg("--write-kubeconfig")
                .arg(&kubeconfig)
                .stdout(out)
                .stderr(err),
        )
        .expect("spawn the API server"),
    );
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    wait_for("the API server", Duration::from_secs(30), || {
        kubeconfig.exists()
            && kubectl(node, &kubeconfig, &["get", "namespace", "default"])
                .status
                .success()
    })
    .map_err(|e| format!("{e}\napiserver log:\n{}", read(&api_log)))?;

    // The Node object with its InternalIP (the agent reads its tunnel endpoint there).
    let node_file = api_dir.join("node.json");
    let node_obj = serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": node.name },
    });
    std::fs::write(&node_file, node_obj.to_string()).expect("write node.json");
    kubectl_ok(
        node,
        &kubeconfig,
        &["create", "-f", &node_file.to_string_lossy()],
    );
    let status = serde_json::json!({ "status": { "addresses": [
        { "type": "InternalIP", "address": node.ip().to_string() } ] } });
    kubectl_ok(
        node,
        &kubeconfig,
        &[
            "patch",
            "node",
            &node.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
    );

    // The agent: installs the plugin into bin_dir, writes the conflist last.
    let cni = cni_dirs(base);
    let agent_dir = base.join("agent");
    let bpffs = agent_dir.join("bpffs");
    // The agent mounts a bpffs here (the lab's pin-dir cleanup is for directories
    // inside a bpffs, not for a mount point); detach it however this test ends.
    let _bpffs = Detach(bpffs.clone());
    std::fs::create_dir_all(&agent_dir).expect("agent dir");
    let agent_log = agent_dir.join("agent.log");
    let (out, err) = log_file(&agent_log);
    let mut agent = Reap(
        topo.spawn_in_node(
            node,
            Command::new(cozyplane)
                .args(["agent", "--node-name", &node.name, "--kubeconfig"])
                .arg(&kubeconfig)
                .args(["--cluster-cidr", "10.244.0.0/16", "--bpffs"])
                .arg(&bpffs)
                .arg("--run-dir")
                .arg(agent_dir.join("run"))
                .arg("--cni-conf-dir")
                .arg(&cni.conf_dir)
                .arg("--cni-bin-dir")
                .arg(&cni.bin_dir)
                .arg("--cni-plugin")
                .arg(plugin)
                .args(["--metrics-bind", "127.0.0.1:9411"])
                .env("RUST_LOG", "info,cozyplane_agent=debug")
                .stdout(out)
                .stderr(err),
        )
        .expect("spawn the agent"),
    );
    let conflist = cni.conf_dir.join("10-cozyplane.conflist");
    wait_for("the agent's conflist", Duration::from_secs(60), || {
        conflist.exists() || agent.0.try_wait().is_ok_and(|s| s.is_some())
    })
    .map_err(|e| format!("{e}\nagent log:\n{}", read(&agent_log)))?;
    if !conflist.exists() {
        return Err(format!("the agent exited; log:\n{}", read(&agent_log)));
    }
    assert!(
        cni.bin_dir.join("cozyplane").is_file(),
        "the agent did not install the plugin"
    );

    let (ctd, mut cri) = start(base, &cni).await;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        format!(
            "{what}: {e}\nagent log:\n{}\ncontainerd log tail:\n{}",
            read(&agent_log),
            ctd.log()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        )
    };
    let netns_before = cni_netns().expect("list netns");
    let log_dir = base.join("logs");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    // The Pod object, as the kubelet has it before it asks the runtime: the
    // agent reads it at ADD (the VPC it may ask for), by the runtime's UID.
    for (file, obj) in [
        (
            "namespace.json",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "cri-test"}}),
        ),
        (
            "pod.json",
            serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "api", "namespace": "cri-test"},
                               "spec": {"nodeName": node.name,
                                        "containers": [{"name": "c", "image": "pause"}]}}),
        ),
    ] {
        let path = api_dir.join(file);
        std::fs::write(&path, obj.to_string()).expect("write the object");
        kubectl_ok(
            node,
            &kubeconfig,
            &["create", "-f", &path.to_string_lossy()],
        );
    }
    let uid = kubectl_ok(
        node,
        &kubeconfig,
        &[
            "get",
            "pod",
            "-n",
            "cri-test",
            "api",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    );
    let api_pod = PodRef {
        uid: uid.trim().to_string(),
        ..pod("api")
    };
    let t0 = std::time::Instant::now();
    let id = cri
        .run_pod_sandbox(api_pod.sandbox_config(&log_dir))
        .await
        .map_err(|e| fail("RunPodSandbox", &e))?;
    eprintln!(
        "RunPodSandbox (cozyplane plugin + real agent) took {:?}",
        t0.elapsed()
    );
    let ip: Ipv4Addr = cri
        .pod_ip(&id)
        .await
        .map_err(|e| fail("PodSandboxStatus", &e))?
        .parse()
        .expect("an IPv4 pod address");
    assert_eq!(
        ip.octets()[..2],
        CLUSTER_CIDR_PREFIX,
        "{ip} not from the cluster CIDR"
    );

    // The claim is a FabricIP for this pod, the address is on the pod's eth0, and
    // the host veth sits in the node (the agent's namespace).
    let fips = fabric_ips(node, &kubeconfig);
    assert!(
        fips.iter()
            .any(|(_, addr, pod)| addr == &ip.to_string() && pod == "api"),
        "no FabricIP for {ip}: {fips:?}"
    );
    let ns = new_netns(&netns_before);
    let eth0 = addrs_in(&ns, "eth0");
    assert!(eth0.contains(&format!("inet {ip}/32")), "{eth0}");
    let host_veth = host_veth_name(&id, "eth0");
    let in_node = |name: &str| {
        exec_in(node, &["ip", "link", "show", "dev", name]).is_ok_and(|o| o.status.success())
    };
    assert!(in_node(&host_veth), "host veth {host_veth} not in the node");
    assert!(
        !host_link_exists(&host_veth),
        "host veth must not be in the host namespace"
    );

    cri.stop_pod_sandbox(&id)
        .await
        .map_err(|e| fail("StopPodSandbox", &e))?;
    // DEL dooms the veth and answers; the pod namespace's teardown (which the
    // kernel finishes asynchronously) or the agent's reaper (at most 500 ms
    // later, docs/netlink.md) removes it.
    cozyplane_testkit::eventually(
        &format!("veth {host_veth} to be gone after stop"),
        Duration::from_secs(5),
        || !in_node(&host_veth),
    );
    cri.remove_pod_sandbox(&id)
        .await
        .map_err(|e| fail("RemovePodSandbox (second DEL, no netns)", &e))?;
    assert!(cri.list_pod_sandbox().await.expect("list").is_empty());
    assert_eq!(
        cni_netns().expect("list netns"),
        netns_before,
        "pod netns left behind"
    );
    let fips = fabric_ips(node, &kubeconfig);
    assert!(fips.is_empty(), "FabricIP not released by DEL: {fips:?}");
    ctd.shutdown().await.expect("shutdown");
    drop(agent);
    Ok(())
}
