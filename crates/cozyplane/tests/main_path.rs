//! The README's main command, end to end, as a user runs it: `scripts/lab`
//! (lab up + `cozyplane connectivity test`), then `kubectl get pods -o wide`,
//! then a datapath broken on purpose (one `cp_locals` entry removed) must make
//! the connectivity test fail, then `cozyplane lab down` must leave no
//! namespace, link, mount, pin or process behind.
//!
//! Uses the real binaries (`cozyplane` of this build, the plugin from
//! `$COZYPLANE_CNI_BIN` or built by the test kit) and the real kubectl (the
//! test kit's finder: `$COZYPLANE_KUBECTL`, else the SDK's kubectl 1.33, else
//! `/usr/bin/kubectl`). Needs root, bpffs, cgroup2, iproute2 and ping; under CI
//! a missing prerequisite fails the test (the test kit's gate).
//!
//! Run: `cargo test -p cozyplane --test main_path`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cozyplane_datapath::abi::EpKey;
use cozyplane_datapath::Datapath;
use cozyplane_testkit::{needs, tools};

/// The lab's name: short, and unlike any other test's.
const LAB: &str = "e2e";
/// The namespace the connectivity test deploys into.
const NS: &str = "cozyplane-connectivity";

fn cozyplane() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cozyplane"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(what: &str, out: &Output) -> String {
    format!(
        "{what} ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// `lab down` however the test ends, so a failed assertion leaves no lab.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(cozyplane())
            .args(["lab", "down", "--name", LAB])
            .output();
    }
}

/// The check lines of a connectivity-test run: (verdict, check id, whole line).
fn checks(stdout: &str) -> Vec<(String, String, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let verdict = w.next()?;
            if !matches!(verdict, "PASS" | "FAIL" | "SKIP") {
                return None;
            }
            Some((verdict.to_string(), w.next()?.to_string(), l.to_string()))
        })
        .collect()
}

fn kubectl_out(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "{}", show("kubectl", &out));
    text(&out.stdout)
}

/// Everything on the machine that still carries the lab's prefix.
fn leftovers() -> Vec<String> {
    let prefix = format!("{LAB}-");
    let mut left = Vec::new();
    for (dir, what) in [("/run/netns", "netns"), ("/sys/class/net", "link")] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&prefix) {
                    left.push(format!("{what} {n}"));
                }
            }
        }
    }
    let run_dir = format!("/run/cozyplane-lab/{LAB}");
    if Path::new(&run_dir).exists() {
        left.push(format!(
            "directory {run_dir} (the bpffs pins live under it)"
        ));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in mounts.lines() {
        if l.contains(&format!("{run_dir}/")) || l.contains(&format!("/run/netns/{prefix}")) {
            left.push(format!("mount {l}"));
        }
    }
    // Every process of the lab names the lab's run dir or one of its nodes on
    // its command line (components, kubelets, workloads).
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let pid = e.file_name().to_string_lossy().into_owned();
            if pid.parse::<u32>().is_err() || pid == std::process::id().to_string() {
                continue;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = text(&cmdline).replace('\0', " ");
            if cmdline.contains(&run_dir) || cmdline.contains(&format!("{prefix}node")) {
                left.push(format!("process {pid}: {cmdline}"));
            }
        }
    }
    left
}

fn row<'a>(wide: &'a str, pod: &str) -> &'a str {
    wide.lines()
        .find(|l| l.split_whitespace().next() == Some(pod))
        .unwrap_or_else(|| panic!("no pod {pod} in kubectl get pods -o wide:\n{wide}"))
}

#[test]
fn main_command_brings_up_a_lab_that_passes_the_connectivity_test() {
    let Some(kubectl) = needs!()
        .root()
        .tools(tools::NETNS)
        .ready_with(cozyplane_testkit::kubectl())
    else {
        return;
    };
    let cni = cozyplane_testkit::cni_plugin_bin();
    let _ = Command::new(cozyplane())
        .args(["lab", "down", "--name", LAB])
        .output();
    let _down = Down;

    // 1. The README's main command.
    let out = Command::new(repo_root().join("scripts/lab"))
        .args(["--name", LAB, "--nodes", "3"])
        .env("COZYPLANE_BIN", cozyplane())
        .env("COZYPLANE_CNI_BIN", &cni)
        .output()
        .expect("run scripts/lab");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", show("scripts/lab", &out));
    let first = checks(&stdout);
    assert!(
        first.iter().all(|c| c.0 != "FAIL"),
        "FAIL lines in a healthy lab:\n{stdout}"
    );
    let passed: Vec<&str> = first
        .iter()
        .filter(|c| c.0 == "PASS")
        .map(|c| c.1.as_str())
        .collect();
    for id in [
        "pod-to-pod/same-node/tcp",
        "pod-to-pod/same-node/udp",
        "pod-to-pod/same-node/http",
        "pod-to-pod/cross-node/tcp",
        "pod-to-pod/cross-node/udp",
        "pod-to-pod/cross-node/http",
        "pod-to-node/same-node/tcp",
        "pod-to-node/cross-node/tcp",
        "node-to-pod/same-node/tcp",
        "node-to-pod/cross-node/tcp",
        "pod-to-external/tcp",
        "services/clusterip/same-node/tcp",
        "services/clusterip/same-node/udp",
        "services/clusterip/cross-node/http",
        "services/node-to-clusterip/tcp",
        "services/nodeport/etp-local/tcp",
        "services/nodeport/etp-local/udp",
        "services/nodeport/etp-cluster/tcp",
        "services/nodeport/etp-cluster/http",
    ] {
        assert!(passed.contains(&id), "check {id} did not PASS:\n{stdout}");
    }

    // 2. The probe pods, with their addresses, as kubectl shows them.
    let kubeconfig = PathBuf::from(format!("/run/cozyplane-lab/{LAB}/kubeconfig"));
    let wide = kubectl_out(
        &kubectl,
        &kubeconfig,
        &["get", "pods", "-n", NS, "-o", "wide"],
    );
    for pod in [
        "echo-a",
        "echo-b",
        "host-echo-a",
        "host-echo-b",
        "client",
        "host-client",
    ] {
        let has_ip = row(&wide, pod)
            .split_whitespace()
            .any(|w| w.parse::<Ipv4Addr>().is_ok_and(|ip| !ip.is_unspecified()));
        assert!(has_ip, "pod {pod} has no address:\n{wide}");
    }
    for pod in ["echo-a", "echo-b"] {
        let r = row(&wide, pod);
        assert!(
            r.contains("Running") && r.contains(" 10.244."),
            "{pod} must be Running with a pod-network address:\n{wide}"
        );
    }

    // 3. Break the datapath: echo-a's node forgets echo-a (its cp_locals entry).
    let get = |path: &str| {
        kubectl_out(
            &kubectl,
            &kubeconfig,
            &[
                "get",
                "pod",
                "-n",
                NS,
                "echo-a",
                "-o",
                &format!("jsonpath={path}"),
            ],
        )
    };
    let ip: Ipv4Addr = get("{.status.podIP}")
        .trim()
        .parse()
        .expect("echo-a's IPv4 address");
    let node = get("{.spec.nodeName}");
    let pins = PathBuf::from(format!(
        "/run/cozyplane-lab/{LAB}/nodes/{}/bpffs/cozyplane",
        node.trim()
    ));
    {
        let mut dp = Datapath::load(&pins).expect("open the node's pinned maps");
        assert!(
            dp.locals.remove(&EpKey::new(0, ip)).expect("remove"),
            "echo-a ({ip}) had no cp_locals entry on {node}"
        );
    }
    // As the connectivity test's own identity (`lab up` writes it), as scripts/lab runs it.
    let conn_kubeconfig =
        PathBuf::from(format!("/run/cozyplane-lab/{LAB}/connectivity-kubeconfig"));
    let out = Command::new(cozyplane())
        .args(["connectivity", "test", "--kubeconfig"])
        .arg(&conn_kubeconfig)
        .output()
        .expect("run the connectivity test");
    let stdout = text(&out.stdout);
    assert!(
        !out.status.success(),
        "the connectivity test passed with a broken datapath:\n{}",
        show("connectivity test", &out)
    );
    let second = checks(&stdout);
    let verdict = |id: &str| {
        second
            .iter()
            .find(|c| c.1 == id)
            .map(|c| c.0.clone())
            .unwrap_or_else(|| panic!("no check {id}:\n{stdout}"))
    };
    // What touches echo-a fails; what does not still passes.
    assert_eq!(verdict("pod-to-pod/same-node/tcp"), "FAIL", "{stdout}");
    assert_eq!(verdict("node-to-pod/cross-node/tcp"), "FAIL", "{stdout}");
    assert_eq!(verdict("pod-to-pod/cross-node/tcp"), "PASS", "{stdout}");
    assert_eq!(
        verdict("services/clusterip/same-node/tcp"),
        "FAIL",
        "{stdout}"
    );
    assert_eq!(
        verdict("services/clusterip/cross-node/tcp"),
        "PASS",
        "{stdout}"
    );

    // 4. Down leaves nothing.
    let out = Command::new(cozyplane())
        .args(["lab", "down", "--name", LAB])
        .output()
        .expect("lab down");
    assert!(out.status.success(), "{}", show("lab down", &out));
    let left = leftovers();
    assert!(left.is_empty(), "lab down left:\n{}", left.join("\n"));
}
