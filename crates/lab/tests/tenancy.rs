//! `cozyplane connectivity test --tenancy` on a real 3-node lab: two tenants' VPCs with
//! the same CIDR, VPC probes, isolation rows and the pod without a binding, a third VPC
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

/// Every row of the tenancy group on a lab of two or more nodes.
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
    "tenancy/twin-vpc/cross-node/tcp",
    "tenancy/twin-vpc/cross-node/udp",
    "tenancy/vpc-to-default/same-node/tcp",
    "tenancy/vpc-to-default/same-node/udp",
    "tenancy/vpc-to-default/cross-node/tcp",
    "tenancy/vpc-to-default/cross-node/udp",
    "tenancy/vpc-to-node/same-node/tcp",
    "tenancy/vpc-to-node/cross-node/tcp",
    "tenancy/vpc-to-node/cross-node/udp",
    "tenancy/default-to-vpc/same-node/tcp",
    "tenancy/default-to-vpc/same-node/udp",
    "tenancy/default-to-vpc/cross-node/tcp",
    "tenancy/default-to-vpc/cross-node/udp",
    "tenancy/no-binding",
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
        .args(["connectivity", "test", "--tenancy", "--kubeconfig"])
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
    for id in TENANCY_ROWS {
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
    for t in ["t1", "t2"] {
        let ip = kubectl(
            &kubectl_bin,
            &admin,
            &[
                "get",
                "pod",
                "echo-b",
                "-n",
                &format!("cozyplane-connectivity-{t}"),
                "-o",
                "jsonpath={.metadata.annotations.sdn\\.cozystack\\.io/vpc-ip}",
            ],
        );
        assert!(ip.starts_with("10.250.0."), "{t}/echo-b vpc-ip {ip:?}");
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
