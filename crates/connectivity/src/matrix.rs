//! The check matrix: which client checks what, as a pure function of the cluster layout.
//!
//! Checks are organised in groups (pod-to-pod, pod-to-node, node-to-pod, pod-to-external;
//! later vpc-isolation, policy, services) so a new feature adds a group function to
//! [`GROUPS`] without touching the others. Check ids are stable strings: users and tests
//! grep them. Every check expects the *name* of the server it targets, so a reply from
//! the wrong pod is a FAIL, not a PASS.
use std::net::{IpAddr, SocketAddr};

use cozyplane_probe::{Check, Plan, Proto};

/// Pod-network servers (`echo-a`, `echo-b`): TCP and UDP port.
pub const POD_ECHO_PORT: u16 = 8000;
/// Pod-network servers: HTTP port.
pub const POD_HTTP_PORT: u16 = 8080;
/// hostNetwork servers (`host-echo-a`, `host-echo-b`): TCP and UDP port. Not 8000, which
/// is often taken on real nodes.
pub const HOST_ECHO_PORT: u16 = 4250;
/// hostNetwork servers: HTTP port.
pub const HOST_HTTP_PORT: u16 = 4251;

/// A node the probes run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Its InternalIP (hostNetwork pods answer there).
    pub internal_ip: IpAddr,
}

/// Something outside the cluster the pods should reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    /// `IP:PORT` (TCP).
    pub target: String,
    /// The answer to expect, if the target is a probe server; `None` accepts any answer.
    pub name: Option<String>,
}

/// What the matrix is built from: nodes, the servers' pod IPs, the external target.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Node A: `client`, `echo-a`, `host-echo-a`.
    pub node_a: NodeInfo,
    /// Node B: `host-client`, `echo-b`, `host-echo-b`; `None` on a one-node cluster.
    pub node_b: Option<NodeInfo>,
    /// `echo-a`'s pod IP.
    pub echo_a_ip: IpAddr,
    /// `echo-b`'s pod IP (present when node B is).
    pub echo_b_ip: Option<IpAddr>,
    /// The external target, if any.
    pub external: Option<External>,
    /// Retry budget of each check, in milliseconds.
    pub check_timeout_ms: u64,
}

/// Which client pod runs a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runner {
    /// `client`: pod network, node A.
    Client,
    /// `host-client`: hostNetwork, node B (node A on a one-node cluster).
    HostClient,
}

impl Runner {
    /// All runners, in the order they are reported.
    pub const ALL: [Runner; 2] = [Runner::Client, Runner::HostClient];

    /// The client pod's name.
    pub fn pod_name(self) -> &'static str {
        match self {
            Runner::Client => "client",
            Runner::HostClient => "host-client",
        }
    }
}

/// One row of the matrix: a check to run, or one skipped with a reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedCheck {
    /// The group (first segment of the id).
    pub group: &'static str,
    /// Stable id, e.g. `pod-to-pod/cross-node/tcp`.
    pub id: String,
    /// Who runs it.
    pub runner: Runner,
    /// The server it talks to (pod name, or `external`).
    pub to: String,
    /// Protocol.
    pub proto: Proto,
    /// `IP:PORT`; `None` when skipped for lack of a target.
    pub target: Option<String>,
    /// The expected answer.
    pub expect: Option<String>,
    /// A negative check: PASS only if `target` never answers (then `expect` is `None`).
    pub expect_blocked: bool,
    /// Why it is not run.
    pub skip: Option<String>,
    /// Retry budget.
    pub timeout_ms: u64,
}

/// The whole matrix, in report order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// The rows.
    pub checks: Vec<PlannedCheck>,
}

/// A group of checks: its name and the function producing its rows.
pub type Group = (&'static str, fn(&Layout) -> Vec<PlannedCheck>);

/// Every group, in report order. New feature groups go here.
pub const GROUPS: &[Group] = &[
    ("pod-to-pod", pod_to_pod),
    ("pod-to-node", pod_to_node),
    ("node-to-pod", node_to_pod),
    ("pod-to-external", pod_to_external),
];

/// Why cross-node checks are skipped on a one-node cluster.
pub const SKIP_ONE_NODE: &str = "only one schedulable node";
/// Why the external check is skipped without a target.
pub const SKIP_NO_EXTERNAL: &str =
    "no external target: pass --external-target IP:PORT (the lab sets one in its kubeconfig)";

/// Builds the matrix (pure: no cluster access).
pub fn build(layout: &Layout) -> Matrix {
    Matrix {
        checks: GROUPS.iter().flat_map(|(_, f)| f(layout)).collect(),
    }
}

impl Matrix {
    /// The plan for one client pod, `None` if it has nothing to run.
    pub fn plan_for(&self, runner: Runner) -> Option<Plan> {
        let checks: Vec<Check> = self
            .checks
            .iter()
            .filter(|c| c.runner == runner && c.skip.is_none())
            .filter_map(|c| {
                Some(Check {
                    id: c.id.clone(),
                    proto: c.proto,
                    target: c.target.clone()?,
                    expect: c.expect.clone(),
                    timeout_ms: c.timeout_ms,
                    expect_blocked: c.expect_blocked,
                })
            })
            .collect();
        (!checks.is_empty()).then_some(Plan { checks })
    }
}

/// Builder for rows of one group, so each group reads as a list.
struct Rows<'a> {
    group: &'static str,
    layout: &'a Layout,
    out: Vec<PlannedCheck>,
}

impl<'a> Rows<'a> {
    fn new(group: &'static str, layout: &'a Layout) -> Self {
        Self {
            group,
            layout,
            out: Vec::new(),
        }
    }

    /// Adds `group/scope/proto` for each proto; skipped with `skip` when `target` is `None`.
    fn add(
        &mut self,
        scope: &str,
        runner: Runner,
        to: &str,
        target: Option<(IpAddr, u16, u16)>,
        protos: &[Proto],
        skip: &str,
    ) {
        for &proto in protos {
            let addr = target.map(|(ip, port, http_port)| {
                let p = if proto == Proto::Http {
                    http_port
                } else {
                    port
                };
                SocketAddr::new(ip, p).to_string()
            });
            let id = if scope.is_empty() {
                format!("{}/{proto}", self.group)
            } else {
                format!("{}/{scope}/{proto}", self.group)
            };
            self.out.push(PlannedCheck {
                group: self.group,
                id,
                runner,
                to: to.to_string(),
                proto,
                skip: addr.is_none().then(|| skip.to_string()),
                target: addr,
                expect: Some(to.to_string()),
                expect_blocked: false,
                timeout_ms: self.layout.check_timeout_ms,
            });
        }
    }
}

/// `client` (A) → `echo-a` (same node) and `echo-b` (cross node).
fn pod_to_pod(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let mut r = Rows::new("pod-to-pod", l);
    let a = Some((l.echo_a_ip, POD_ECHO_PORT, POD_HTTP_PORT));
    let b = l.echo_b_ip.map(|ip| (ip, POD_ECHO_PORT, POD_HTTP_PORT));
    r.add(
        "same-node",
        Runner::Client,
        "echo-a",
        a,
        &[Tcp, Udp, Http],
        "",
    );
    r.add(
        "cross-node",
        Runner::Client,
        "echo-b",
        b,
        &[Tcp, Udp, Http],
        SKIP_ONE_NODE,
    );
    r.out
}

/// `client` (A) → the hostNetwork servers at the nodes' InternalIPs.
fn pod_to_node(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let mut r = Rows::new("pod-to-node", l);
    let a = Some((l.node_a.internal_ip, HOST_ECHO_PORT, HOST_HTTP_PORT));
    let b = l
        .node_b
        .as_ref()
        .map(|n| (n.internal_ip, HOST_ECHO_PORT, HOST_HTTP_PORT));
    r.add("same-node", Runner::Client, "host-echo-a", a, &[Tcp], "");
    r.add(
        "cross-node",
        Runner::Client,
        "host-echo-b",
        b,
        &[Tcp, Udp],
        SKIP_ONE_NODE,
    );
    r.out
}

/// `host-client` (B) → `echo-b` (same node) and `echo-a` (cross node). On a one-node
/// cluster host-client runs on A, so "same node" is `echo-a` and cross node is skipped.
fn node_to_pod(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let mut r = Rows::new("node-to-pod", l);
    let a = (l.echo_a_ip, POD_ECHO_PORT, POD_HTTP_PORT);
    match l.echo_b_ip {
        Some(b_ip) => {
            let b = (b_ip, POD_ECHO_PORT, POD_HTTP_PORT);
            r.add(
                "same-node",
                Runner::HostClient,
                "echo-b",
                Some(b),
                &[Tcp, Http],
                "",
            );
            r.add(
                "cross-node",
                Runner::HostClient,
                "echo-a",
                Some(a),
                &[Tcp, Udp, Http],
                "",
            );
        }
        None => {
            r.add(
                "same-node",
                Runner::HostClient,
                "echo-a",
                Some(a),
                &[Tcp, Http],
                "",
            );
            r.add(
                "cross-node",
                Runner::HostClient,
                "echo-b",
                None,
                &[Tcp, Udp, Http],
                SKIP_ONE_NODE,
            );
        }
    }
    r.out
}

/// `client` (A) → the external target (TCP), expecting its name when known.
fn pod_to_external(l: &Layout) -> Vec<PlannedCheck> {
    let mut r = Rows::new("pod-to-external", l);
    match &l.external {
        Some(ext) => r.out.push(PlannedCheck {
            group: "pod-to-external",
            id: "pod-to-external/tcp".into(),
            runner: Runner::Client,
            to: ext.name.clone().unwrap_or_else(|| "external".into()),
            proto: Proto::Tcp,
            target: Some(ext.target.clone()),
            expect: ext.name.clone(),
            expect_blocked: false,
            skip: None,
            timeout_ms: l.check_timeout_ms,
        }),
        None => r.add(
            "",
            Runner::Client,
            "external",
            None,
            &[Proto::Tcp],
            SKIP_NO_EXTERNAL,
        ),
    }
    r.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn two_nodes() -> Layout {
        Layout {
            node_a: NodeInfo {
                name: "lab-node1".into(),
                internal_ip: ip("198.18.0.11"),
            },
            node_b: Some(NodeInfo {
                name: "lab-node2".into(),
                internal_ip: ip("198.18.0.12"),
            }),
            echo_a_ip: ip("10.244.1.5"),
            echo_b_ip: Some(ip("10.244.2.3")),
            external: Some(External {
                target: "198.19.0.2:8000".into(),
                name: Some("external".into()),
            }),
            check_timeout_ms: 5000,
        }
    }

    fn row<'a>(m: &'a Matrix, id: &str) -> &'a PlannedCheck {
        m.checks
            .iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no check {id}"))
    }

    #[test]
    fn two_nodes_full_matrix_with_stable_ids_and_targets() {
        let m = build(&two_nodes());
        let got: Vec<(&str, Runner, &str, Option<&str>)> = m
            .checks
            .iter()
            .map(|c| (c.id.as_str(), c.runner, c.to.as_str(), c.target.as_deref()))
            .collect();
        use Runner::*;
        let want = vec![
            (
                "pod-to-pod/same-node/tcp",
                Client,
                "echo-a",
                Some("10.244.1.5:8000"),
            ),
            (
                "pod-to-pod/same-node/udp",
                Client,
                "echo-a",
                Some("10.244.1.5:8000"),
            ),
            (
                "pod-to-pod/same-node/http",
                Client,
                "echo-a",
                Some("10.244.1.5:8080"),
            ),
            (
                "pod-to-pod/cross-node/tcp",
                Client,
                "echo-b",
                Some("10.244.2.3:8000"),
            ),
            (
                "pod-to-pod/cross-node/udp",
                Client,
                "echo-b",
                Some("10.244.2.3:8000"),
            ),
            (
                "pod-to-pod/cross-node/http",
                Client,
                "echo-b",
                Some("10.244.2.3:8080"),
            ),
            (
                "pod-to-node/same-node/tcp",
                Client,
                "host-echo-a",
                Some("198.18.0.11:4250"),
            ),
            (
                "pod-to-node/cross-node/tcp",
                Client,
                "host-echo-b",
                Some("198.18.0.12:4250"),
            ),
            (
                "pod-to-node/cross-node/udp",
                Client,
                "host-echo-b",
                Some("198.18.0.12:4250"),
            ),
            (
                "node-to-pod/same-node/tcp",
                HostClient,
                "echo-b",
                Some("10.244.2.3:8000"),
            ),
            (
                "node-to-pod/same-node/http",
                HostClient,
                "echo-b",
                Some("10.244.2.3:8080"),
            ),
            (
                "node-to-pod/cross-node/tcp",
                HostClient,
                "echo-a",
                Some("10.244.1.5:8000"),
            ),
            (
                "node-to-pod/cross-node/udp",
                HostClient,
                "echo-a",
                Some("10.244.1.5:8000"),
            ),
            (
                "node-to-pod/cross-node/http",
                HostClient,
                "echo-a",
                Some("10.244.1.5:8080"),
            ),
            (
                "pod-to-external/tcp",
                Client,
                "external",
                Some("198.19.0.2:8000"),
            ),
        ];
        assert_eq!(got, want);
        assert!(m.checks.iter().all(|c| c.skip.is_none()));
        // Every check expects the name of the server it targets.
        assert!(m
            .checks
            .iter()
            .all(|c| c.expect.as_deref() == Some(c.to.as_str())));
        assert!(m.checks.iter().all(|c| c.id.starts_with(c.group)));
    }

    #[test]
    fn plans_split_by_runner_and_validate() {
        let m = build(&two_nodes());
        let client = m.plan_for(Runner::Client).expect("client plan");
        let host = m.plan_for(Runner::HostClient).expect("host plan");
        assert_eq!(client.checks.len(), 10);
        assert_eq!(host.checks.len(), 5);
        client.validate().expect("valid client plan");
        host.validate().expect("valid host plan");
        assert!(host.checks.iter().all(|c| c.id.starts_with("node-to-pod/")));
        let ext = client
            .checks
            .iter()
            .find(|c| c.id == "pod-to-external/tcp")
            .expect("external check");
        assert_eq!(ext.expect.as_deref(), Some("external"));
        assert_eq!(ext.timeout_ms, 5000);
        // The plan survives the JSON trip into a pod's args.
        let json = client.to_json().expect("json");
        assert_eq!(Plan::parse(&json).expect("parse"), client);
    }

    #[test]
    fn one_node_skips_cross_node_and_uses_node_a_for_host_client() {
        let mut l = two_nodes();
        l.node_b = None;
        l.echo_b_ip = None;
        let m = build(&l);
        for c in &m.checks {
            let cross = c.id.contains("/cross-node/");
            assert_eq!(c.skip.is_some(), cross, "{c:?}");
            if cross {
                assert_eq!(c.skip.as_deref(), Some(SKIP_ONE_NODE));
                assert_eq!(c.target, None);
            }
        }
        let same = row(&m, "node-to-pod/same-node/tcp");
        assert_eq!(same.to, "echo-a");
        assert_eq!(same.target.as_deref(), Some("10.244.1.5:8000"));
        let host = m.plan_for(Runner::HostClient).expect("host plan");
        assert_eq!(host.checks.len(), 2);
        assert_eq!(m.checks.len(), 15, "skipped rows stay in the matrix");
    }

    #[test]
    fn external_is_skipped_without_a_target_and_accepts_any_answer_without_a_name() {
        let mut l = two_nodes();
        l.external = None;
        let m = build(&l);
        let e = row(&m, "pod-to-external/tcp");
        assert_eq!(e.skip.as_deref(), Some(SKIP_NO_EXTERNAL));
        assert!(!m
            .plan_for(Runner::Client)
            .expect("plan")
            .checks
            .iter()
            .any(|c| c.id == "pod-to-external/tcp"));

        l.external = Some(External {
            target: "192.0.2.1:443".into(),
            name: None,
        });
        let m = build(&l);
        let e = row(&m, "pod-to-external/tcp");
        assert_eq!(e.expect, None);
        assert_eq!(e.target.as_deref(), Some("192.0.2.1:443"));
    }

    #[test]
    fn ipv6_targets_are_bracketed() {
        let mut l = two_nodes();
        l.echo_a_ip = ip("fd00::5");
        let m = build(&l);
        assert_eq!(
            row(&m, "pod-to-pod/same-node/http").target.as_deref(),
            Some("[fd00::5]:8080")
        );
    }
}
