//! `cozyplane connectivity test --tenancy` on a real 3-node lab: two tenants' VPCs with
//! the same CIDR and pods of each on all three nodes, every pod reaching every server of its
//! own VPC, isolation rows (TCP, UDP and ICMP) and the pod without a binding, a third VPC
//! peered with the first (connected, not transitive, cut by deleting a half, back when it
//! is re-created) and a binding revoked under a live TCP stream, with the real
//! `cozyplane` binary (`$COZYPLANE_BIN`, else built by the test kit) and the real kubectl.
//!
//! Needs root, bpffs, cgroup2, iproute2 and kubectl. Under CI a missing prerequisite
//! fails the test; elsewhere it is skipped with a `SKIP` line (the test kit's gate).
//!
//! Run: `nice cargo build --bins && cargo test -p cozyplane-lab --test tenancy`
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed step is a failed test

mod lab_support;

use std::path::Path;
use std::process::{Command, Output};

use cozyplane_testkit::{needs, tools};
use lab_support::{lab, ok, prerequisites, run_dir, text, Down};

/// The named rows of the tenancy group on a lab of three nodes (the mesh rows are
/// [`mesh_rows`]).
const TENANCY_ROWS: &[&str] = &[
    "tenancy/same-vpc/same-node/tcp",
    "tenancy/same-vpc/same-node/udp",
    "tenancy/same-vpc/same-node/http",
    "tenancy/same-vpc/same-node/icmp",
    "tenancy/same-vpc/cross-node/tcp",
    "tenancy/same-vpc/cross-node/udp",
    "tenancy/same-vpc/cross-node/http",
    "tenancy/same-vpc/cross-node/icmp",
    "tenancy/twin-vpc/same-node/tcp",
    "tenancy/twin-vpc/same-node/udp",
    "tenancy/twin-vpc/same-node/icmp",
    "tenancy/twin-vpc/cross-node/tcp",
    "tenancy/twin-vpc/cross-node/udp",
    "tenancy/twin-vpc/cross-node/icmp",
    "tenancy/vpc-to-default/same-node/tcp",
    "tenancy/vpc-to-default/same-node/udp",
    "tenancy/vpc-to-default/same-node/icmp",
    "tenancy/vpc-to-default/cross-node/tcp",
    "tenancy/vpc-to-default/cross-node/udp",
    "tenancy/vpc-to-default/cross-node/icmp",
    "tenancy/vpc-to-node/same-node/tcp",
    "tenancy/vpc-to-node/same-node/icmp",
    "tenancy/vpc-to-node/cross-node/tcp",
    "tenancy/vpc-to-node/cross-node/udp",
    "tenancy/vpc-to-node/cross-node/icmp",
    "tenancy/default-to-default/same-node/icmp",
    "tenancy/default-to-vpc/same-node/tcp",
    "tenancy/default-to-vpc/same-node/udp",
    "tenancy/default-to-vpc/same-node/icmp",
    "tenancy/default-to-vpc/cross-node/tcp",
    "tenancy/default-to-vpc/cross-node/udp",
    "tenancy/default-to-vpc/cross-node/icmp",
    "tenancy/no-binding",
    "tenancy/no-binding/event",
    "tenancy/peered/same-node/tcp",
    "tenancy/peered/cross-node/tcp",
    "tenancy/peered/cross-node/udp",
    "tenancy/peered/reverse/cross-node/tcp",
    "tenancy/peered/reverse/cross-node/udp",
    "tenancy/peered/not-twin/same-node/tcp",
    "tenancy/peered/not-twin/same-node/udp",
    "tenancy/peered/not-twin/cross-node/tcp",
    "tenancy/peered/not-twin/cross-node/udp",
    "tenancy/peered/half-deleted",
    "tenancy/peered/half-restored",
    "tenancy/revoked/stream-cut",
    "tenancy/revoked/pod-running",
    "tenancy/revoked/no-reconnect",
    "tenancy/security-group/web-to-api/tcp",
    "tenancy/security-group/web-to-api/udp",
    "tenancy/security-group/web-to-api/http",
    "tenancy/security-group/other-to-api/tcp",
    "tenancy/security-group/web-egress/tcp",
];

/// The mesh rows: each twin VPC's client on each of the three nodes to every server of
/// its VPC (tcp, udp, icmp); and, but for t1-client-a (which runs the isolation group's ICMP
/// rows), to the other twin's servers on its node and the next one, and to its own node.
fn mesh_rows() -> Vec<String> {
    let mut out = Vec::new();
    for t in ["t1", "t2"] {
        for (i, x) in ["a", "b", "c"].into_iter().enumerate() {
            for y in ["a", "b", "c"] {
                for p in ["tcp", "udp", "icmp"] {
                    out.push(format!("tenancy/same-vpc/{t}/{x}-to-{y}/{p}"));
                }
            }
            if (t, x) == ("t1", "a") {
                continue;
            }
            let next = ["b", "c", "a"][i];
            for y in [x, next] {
                for p in ["tcp", "udp", "icmp"] {
                    out.push(format!("tenancy/twin-vpc/{t}/{x}-to-{y}/{p}"));
                }
            }
            out.push(format!("tenancy/vpc-to-node/{t}/{x}-to-{x}/icmp"));
        }
    }
    out
}

fn show(what: &str, out: &Output) -> String {
    format!(
        "{what} ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// The check lines of a run: (verdict, check id).
fn verdicts(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let verdict = w.next()?;
            if !matches!(verdict, "PASS" | "FAIL" | "SKIP") {
                return None;
            }
            Some((verdict.to_string(), w.next()?.to_string()))
        })
        .collect()
}

fn connectivity(bin: &Path, kubeconfig: &Path) -> Output {
    Command::new(bin)
        .args([
            "connectivity",
            "test",
            "--tenancy",
            "--policy",
            "--kubeconfig",
        ])
        .arg(kubeconfig)
        .output()
        .expect("run the connectivity test")
}

fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--request-timeout=10s")
        .args(args)
        .output()
        .expect("run kubectl");
    ok(&format!("kubectl {}", args.join(" ")), out)
}

#[test]
fn tenancy_matrix_passes_on_a_three_node_lab() {
    let Some((bin, kubectl_bin)) = prerequisites(needs!().tools(tools::NETNS)) else {
        return;
    };
    let name = format!("tm{}", std::process::id() % 100_000);
    let _ = lab(&bin, &["down", "--name", &name]);
    let _down = Down(&bin, &name);
    ok(
        "lab up",
        lab(&bin, &["up", "--name", &name, "--nodes", "3"]),
    );
    let admin = run_dir(&name).join("kubeconfig");

    // The connectivity identity may not create VPCs: a clear error, not a FAIL matrix.
    let out = connectivity(&bin, &run_dir(&name).join("connectivity-kubeconfig"));
    assert!(!out.status.success(), "{}", show("as connectivity", &out));
    let err = text(&out.stderr);
    assert!(
        err.contains("--tenancy needs rights to create namespaces, VPCs and VPCBindings")
            && err.contains("admin kubeconfig"),
        "{}",
        show("as connectivity", &out)
    );

    // As the admin: every row of the whole matrix passes, the tenancy group included.
    let out = connectivity(&bin, &admin);
    let stdout = text(&out.stdout);
    let got = verdicts(&stdout);
    let report = show("connectivity test --tenancy", &out);
    println!("{report}"); // shown with --nocapture, and on failure
    let mesh = mesh_rows();
    assert_eq!(mesh.len(), 6 * 9 + 5 * 7);
    let want: Vec<&str> = TENANCY_ROWS
        .iter()
        .copied()
        .chain(mesh.iter().map(String::as_str))
        .collect();
    for id in &want {
        let v = got.iter().find(|(_, i)| i == id).map(|(v, _)| v.as_str());
        assert_eq!(v, Some("PASS"), "row {id}:\n{report}");
    }
    // No tenancy row is left out of the list above (none skipped on three nodes).
    let tenancy: Vec<&str> = got
        .iter()
        .map(|(_, i)| i.as_str())
        .filter(|i| i.starts_with("tenancy/"))
        .collect();
    assert_eq!(tenancy.len(), want.len(), "{report}");
    // The policy group (`--policy`): NetworkPolicy verdicts on real traffic.
    for id in [
        "policy/admitted/tcp",
        "policy/admitted/udp",
        "policy/admitted-client-other-port/http",
        "policy/denied/tcp",
        "policy/denied/udp",
        "policy/denied/http",
    ] {
        let v = got.iter().find(|(_, i)| i == id).map(|(v, _)| v.as_str());
        assert_eq!(v, Some("PASS"), "row {id}:\n{report}");
    }
    assert!(got.iter().all(|(v, _)| v != "FAIL"), "FAIL rows:\n{report}");
    assert!(out.status.success(), "{report}");

    // What kubectl shows a user afterwards: twin VPCs with one CIDR, VPC addresses on the
    // servers, and the unbound pod never Running.
    let vpcs = kubectl(
        &kubectl_bin,
        &admin,
        &[
            "get",
            "vpcs",
            "-A",
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace} {.spec.cidrs[0]} {.status.phase}{\"\\n\"}{end}",
        ],
    );
    for t in ["t1", "t2"] {
        let line = format!("cozyplane-connectivity-{t} 10.250.0.0/24 Ready");
        assert!(vpcs.lines().any(|l| l == line), "no {line:?}:\n{vpcs}");
    }
    // Each twin VPC has a server on each of the three nodes.
    for t in ["t1", "t2"] {
        let mut nodes = Vec::new();
        for pod in ["echo-a", "echo-b", "echo-c"] {
            let got = kubectl(
                &kubectl_bin,
                &admin,
                &[
                    "get",
                    "pod",
                    pod,
                    "-n",
                    &format!("cozyplane-connectivity-{t}"),
                    "-o",
                    "jsonpath={.spec.nodeName} {.metadata.annotations.sdn\\.cozystack\\.io/vpc-ip}",
                ],
            );
            let (node, ip) = got.trim().split_once(' ').unwrap_or((got.trim(), ""));
            assert!(ip.starts_with("10.250.0."), "{t}/{pod} vpc-ip {ip:?}");
            nodes.push(node.to_string());
        }
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), 3, "{t}'s servers on {nodes:?}");
    }
    let phase = kubectl(
        &kubectl_bin,
        &admin,
        &[
            "get",
            "pod",
            "unbound",
            "-n",
            "cozyplane-connectivity-unbound",
            "-o",
            "jsonpath={.status.phase}",
        ],
    );
    assert_ne!(phase.trim(), "Running", "the unbound pod started");

    let out = lab(&bin, &["down", "--name", &name]);
    ok("lab down", out);
}
