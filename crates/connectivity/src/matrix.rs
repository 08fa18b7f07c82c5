//! The check matrix: which client checks what, as a pure function of the cluster layout.
//!
//! Checks are organised in groups (pod-to-pod, pod-to-node, node-to-pod, pod-to-external;
//! later vpc-isolation, policy, services) so a new feature adds a group function to
//! [`GROUPS`] without touching the others. Check ids are stable strings: users and tests
//! grep them. Every check expects the *name* of the server it targets, so a reply from
//! the wrong pod is a FAIL, not a PASS.
use std::net::{IpAddr, SocketAddr};

use cozyplane_probe::{Check, Plan, Proto};

use crate::tenancy::Tenant;

/// Pod-network servers (`echo-a`, `echo-b`): TCP and UDP port.
pub const POD_ECHO_PORT: u16 = 8000;
/// Pod-network servers: HTTP port.
pub const POD_HTTP_PORT: u16 = 8080;
/// hostNetwork servers (`host-echo-a`, `host-echo-b`): TCP and UDP port. Not 8000, which
/// is often taken on real nodes.
pub const HOST_ECHO_PORT: u16 = 4250;
/// hostNetwork servers: HTTP port.
pub const HOST_HTTP_PORT: u16 = 4251;
/// The tenancy servers' stream port (`probe server --stream-port`).
pub const STREAM_PORT: u16 = 8001;
/// A stream client listens here once its stream is up (its readiness probe).
pub const STREAM_READY_PORT: u16 = 8002;

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
    /// Node C: only the tenancy group uses it (each tenant's `echo-c` and a client of
    /// each tenant); `None` on a cluster of fewer than three nodes.
    pub node_c: Option<NodeInfo>,
    /// `echo-a`'s pod IP.
    pub echo_a_ip: IpAddr,
    /// `echo-b`'s pod IP (present when node B is).
    pub echo_b_ip: Option<IpAddr>,
    /// The external target, if any.
    pub external: Option<External>,
    /// Retry budget of each check, in milliseconds.
    pub check_timeout_ms: u64,
    /// The tenancy group's servers (`--tenancy`), `None` without it.
    pub tenancy: Option<TenancyLayout>,
    /// The services group's Services, `None` when they could not be made.
    pub services: Option<ServicesLayout>,
    /// `--no-services`: the services group has no rows at all.
    pub no_services: bool,
    /// `echo-policy`'s pod IP (`--policy`), `None` without it.
    pub policy_echo_ip: Option<IpAddr>,
}

/// One Service in front of one echo server: its ClusterIP (ports as the pod's) and the
/// nodePorts of its TCP, UDP and HTTP ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SvcAddrs {
    /// `spec.clusterIP`.
    pub cluster_ip: IpAddr,
    /// The nodePort of the TCP echo port.
    pub tcp_node_port: u16,
    /// The nodePort of the UDP echo port.
    pub udp_node_port: u16,
    /// The nodePort of the HTTP port.
    pub http_node_port: u16,
}

/// The services group's Services: `svc-echo-a` (externalTrafficPolicy Local, so a
/// NodePort request keeps its source) and `svc-echo-b` (Cluster, so a NodePort request
/// on node A is SNATed to A and sent to B).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicesLayout {
    /// `svc-echo-a` over `echo-a`.
    pub a: SvcAddrs,
    /// `svc-echo-b` over `echo-b` (present when node B is).
    pub b: Option<SvcAddrs>,
}

/// The VPC addresses (`sdn.cozystack.io/vpc-ip`) of one tenant's servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpcEchoes {
    /// `echo-a` (node A).
    pub echo_a: IpAddr,
    /// `echo-b` (node B; `None` on a one-node cluster).
    pub echo_b: Option<IpAddr>,
    /// `echo-c` (node C; `None` with fewer than three nodes, and for t3, which has none).
    pub echo_c: Option<IpAddr>,
}

impl VpcEchoes {
    /// The server on `slot`'s node.
    pub fn at(&self, slot: Slot) -> Option<IpAddr> {
        match slot {
            Slot::A => Some(self.echo_a),
            Slot::B => self.echo_b,
            Slot::C => self.echo_c,
        }
    }
}

/// One of the three nodes the tenancy group spreads each twin VPC over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// Node A.
    A,
    /// Node B.
    B,
    /// Node C.
    C,
}

impl Slot {
    /// Every slot, in order.
    pub const ALL: [Slot; 3] = [Slot::A, Slot::B, Slot::C];

    /// `a`, `b` or `c`: in row ids (`t2/b-to-c`) and pod names.
    pub fn letter(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
            Slot::C => "c",
        }
    }

    /// The VPC server on this node: `echo-a`, `echo-b`, `echo-c`.
    pub fn server(self) -> &'static str {
        match self {
            Slot::A => "echo-a",
            Slot::B => "echo-b",
            Slot::C => "echo-c",
        }
    }

    /// The next node around the ring A → B → C → A (the cross-node twin rows).
    pub fn next(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::C,
            Slot::C => Slot::A,
        }
    }
}

impl Layout {
    /// The node of `slot`, if the cluster has it.
    pub fn node(&self, slot: Slot) -> Option<&NodeInfo> {
        match slot {
            Slot::A => Some(&self.node_a),
            Slot::B => self.node_b.as_ref(),
            Slot::C => self.node_c.as_ref(),
        }
    }
}

/// What the tenancy group is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenancyLayout {
    /// The client's own VPC.
    pub t1: VpcEchoes,
    /// The twin VPC (same CIDR).
    pub t2: VpcEchoes,
    /// The VPC peered with t1's (disjoint CIDR).
    pub t3: VpcEchoes,
    /// The VPC address of t1's policed server `sg-api`.
    pub sg_api: IpAddr,
}

impl TenancyLayout {
    /// A tenant's servers.
    pub fn echoes(&self, t: Tenant) -> &VpcEchoes {
        match t {
            Tenant::T1 => &self.t1,
            Tenant::T2 => &self.t2,
            Tenant::T3 => &self.t3,
        }
    }
}

/// Which client pod runs a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runner {
    /// `client`: pod network, node A.
    Client,
    /// `host-client`: hostNetwork, node B (node A on a one-node cluster).
    HostClient,
    /// `vpc-client`: in tenant t1's VPC, node A (`--tenancy`).
    VpcClient,
    /// `unbound`: not a client but the pod asking for t1's VPC without a binding; the
    /// test itself judges it from the pod's status and events.
    Unbound,
    /// `peer-client`: in tenant t3's VPC (peered with t1's), node A.
    PeerClient,
    /// `peer-stream`: a stream client in t1's VPC, node A, to t3's server; judged by the
    /// test around deleting and re-creating t3's peering half.
    PeerStream,
    /// `stream-client`: a stream client in `<ns>-revoke` (t1's VPC), node A, to t1's
    /// server; judged by the test around deleting and re-creating that namespace's binding.
    Revoked,
    /// `sg-web`: in t1's VPC and SecurityGroup `web`, node A.
    SgWeb,
    /// `<tenant>-client-<slot>`: a client in a twin VPC (t1 or t2) on that slot's node,
    /// for the rows every VPC pod must pass ([`vpc_mesh`]).
    Member(Tenant, Slot),
    /// `policy-client`: pod network, node A, the one client the policy group's
    /// NetworkPolicy admits (`--policy`).
    PolicyClient,
}

impl Runner {
    /// All runners, in the order they are reported.
    pub const ALL: [Runner; 15] = [
        Runner::Client,
        Runner::PolicyClient,
        Runner::HostClient,
        Runner::VpcClient,
        Runner::Member(Tenant::T1, Slot::A),
        Runner::Member(Tenant::T1, Slot::B),
        Runner::Member(Tenant::T1, Slot::C),
        Runner::Member(Tenant::T2, Slot::A),
        Runner::Member(Tenant::T2, Slot::B),
        Runner::Member(Tenant::T2, Slot::C),
        Runner::Unbound,
        Runner::PeerClient,
        Runner::PeerStream,
        Runner::Revoked,
        Runner::SgWeb,
    ];

    /// The tenant whose VPC the client is in, for the clients that are in one.
    pub fn vpc_tenant(self) -> Option<Tenant> {
        match self {
            Runner::VpcClient | Runner::SgWeb | Runner::PeerStream | Runner::Revoked => {
                Some(Tenant::T1)
            }
            Runner::PeerClient => Some(Tenant::T3),
            Runner::Member(t, _) => Some(t),
            Runner::Client | Runner::HostClient | Runner::Unbound | Runner::PolicyClient => None,
        }
    }

    /// The pod's name.
    pub fn pod_name(self) -> &'static str {
        match self {
            Runner::Client => "client",
            Runner::HostClient => "host-client",
            Runner::VpcClient => crate::tenancy::VPC_CLIENT,
            Runner::Unbound => crate::tenancy::UNBOUND,
            Runner::PeerClient => crate::tenancy::PEER_CLIENT,
            Runner::PeerStream => crate::tenancy::PEER_STREAM,
            Runner::Revoked => crate::tenancy::REVOKE_STREAM,
            Runner::SgWeb => crate::tenancy::SG_WEB,
            Runner::Member(t, s) => member_pod_name(t, s),
            Runner::PolicyClient => POLICY_CLIENT,
        }
    }

    /// Whether the test judges its rows itself (no plan, no client pod of the main phase).
    pub fn judged(self) -> bool {
        matches!(self, Runner::Unbound | Runner::PeerStream | Runner::Revoked)
    }
}

/// `t1-client-b`, …: the pod name of [`Runner::Member`].
fn member_pod_name(t: Tenant, s: Slot) -> &'static str {
    match (t, s) {
        (Tenant::T1, Slot::A) => "t1-client-a",
        (Tenant::T1, Slot::B) => "t1-client-b",
        (Tenant::T1, Slot::C) => "t1-client-c",
        (Tenant::T2, Slot::A) => "t2-client-a",
        (Tenant::T2, Slot::B) => "t2-client-b",
        (Tenant::T2, Slot::C) => "t2-client-c",
        (Tenant::T3, Slot::A) => "t3-client-a",
        (Tenant::T3, Slot::B) => "t3-client-b",
        (Tenant::T3, Slot::C) => "t3-client-c",
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
    /// A blocked ICMP row's control: the id of a row the same client runs that expects an
    /// echo reply. Silence proves isolation only if that row got its reply in the same
    /// run (else the probe could not ping at all): the report fails the row otherwise.
    pub control: Option<String>,
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
    ("tenancy", tenancy),
    ("tenancy-mesh", vpc_mesh),
    ("tenancy-peered", peered),
    ("tenancy-revoked", revoked),
    ("tenancy-security-group", security_group),
    ("services", services),
    ("policy", policy),
];

/// The policy group's server (`--policy`).
pub const POLICY_ECHO: &str = "echo-policy";
/// The policy group's admitted client.
pub const POLICY_CLIENT: &str = "policy-client";
/// Why the policy rows are not there without `--policy` (none are: the
/// group is opt-in like the tenancy group).
///
/// `client` (A) and `policy-client` (A) → `echo-policy` (node B, else A),
/// which a deny-all NetworkPolicy isolates and a second one opens to
/// `policy-client` on the echo port only (`run.rs`, `policy_objects`):
/// - `policy/admitted`: TCP and UDP from `policy-client` answer;
/// - `policy/admitted-client-other-port`: its HTTP (another port) is refused;
/// - `policy/denied`: `client` is refused on every protocol.
fn policy(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let Some(ip) = l.policy_echo_ip else {
        return Vec::new();
    };
    let t = Some((ip, POD_ECHO_PORT, POD_HTTP_PORT));
    let mut r = Rows::new("policy", l);
    r.add(
        "admitted",
        Runner::PolicyClient,
        POLICY_ECHO,
        t,
        &[Tcp, Udp],
        "",
    );
    r.blocked(
        "admitted-client-other-port",
        Runner::PolicyClient,
        POLICY_ECHO,
        t,
        &[Http],
        "",
    );
    r.blocked(
        "denied",
        Runner::Client,
        POLICY_ECHO,
        t,
        &[Tcp, Udp, Http],
        "",
    );
    r.out
}

/// Why cross-node checks are skipped on a one-node cluster.
pub const SKIP_ONE_NODE: &str = "only one schedulable node";
/// Why the external check is skipped without a target.
pub const SKIP_NO_EXTERNAL: &str =
    "no external target: pass --external-target IP:PORT (the lab sets one in its kubeconfig)";

/// Builds the matrix (pure: no cluster access).
pub fn build(layout: &Layout) -> Matrix {
    let mut checks: Vec<PlannedCheck> = GROUPS.iter().flat_map(|(_, f)| f(layout)).collect();
    attach_controls(&mut checks);
    Matrix { checks }
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
                // ICMP has no port: the target says which address is pinged.
                let p = if proto == Proto::Icmp { 0 } else { p };
                SocketAddr::new(ip, p).to_string()
            });
            // An echo reply carries no name: it must come from the target's address.
            let expect = match (proto, target) {
                (Proto::Icmp, Some((ip, ..))) => format!("echo reply from {ip}"),
                _ => to.to_string(),
            };
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
                expect: Some(expect),
                expect_blocked: false,
                timeout_ms: self.layout.check_timeout_ms,
                control: None,
            });
        }
    }
}

impl Rows<'_> {
    /// Adds `group/scope/proto` rows expecting `target` NOT to answer.
    fn blocked(
        &mut self,
        scope: &str,
        runner: Runner,
        to: &str,
        target: Option<(IpAddr, u16, u16)>,
        protos: &[Proto],
        skip: &str,
    ) {
        let first = self.out.len();
        self.add(scope, runner, to, target, protos, skip);
        for c in &mut self.out[first..] {
            c.expect = None;
            c.expect_blocked = true;
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

/// Why the services rows are skipped when the Services could not be made.
pub const SKIP_NO_SERVICES: &str = "the Services could not be created (see the step above)";

/// Services without kube-proxy (or with it): `client` (A) → the ClusterIPs of
/// `svc-echo-a` (same node) and `svc-echo-b` (cross node); `host-client` (B) → the
/// ClusterIP of `svc-echo-a` from a node; and `host-client` (B) → node A's InternalIP
/// at the NodePorts, which arrive on A's uplink like traffic from outside the cluster:
/// `svc-echo-a` (etp Local, to A's own pod) and `svc-echo-b` (etp Cluster, to B's pod
/// through A).
fn services(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let mut r = Rows::new("services", l);
    if l.no_services {
        return r.out;
    }
    let s = l.services.as_ref();
    let cip = |a: &SvcAddrs| (a.cluster_ip, POD_ECHO_PORT, POD_HTTP_PORT);
    let why = |present: bool| {
        if present {
            SKIP_ONE_NODE
        } else {
            SKIP_NO_SERVICES
        }
    };
    r.add(
        "clusterip/same-node",
        Runner::Client,
        "echo-a",
        s.map(|s| cip(&s.a)),
        &[Tcp, Udp, Http],
        SKIP_NO_SERVICES,
    );
    r.add(
        "clusterip/cross-node",
        Runner::Client,
        "echo-b",
        s.and_then(|s| s.b.as_ref()).map(cip),
        &[Tcp, Udp, Http],
        why(s.is_some()),
    );
    r.add(
        "node-to-clusterip",
        Runner::HostClient,
        "echo-a",
        s.map(|s| cip(&s.a)),
        &[Tcp, Http],
        SKIP_NO_SERVICES,
    );
    // NodePorts on node A's address, from node B's network namespace: on a one-node
    // cluster host-client runs on A itself, where they are not "from the wire".
    let two = l.node_b.is_some();
    let np = |a: &SvcAddrs, udp: bool| {
        let port = if udp {
            a.udp_node_port
        } else {
            a.tcp_node_port
        };
        (l.node_a.internal_ip, port, a.http_node_port)
    };
    for (scope, to, svc) in [
        ("nodeport/etp-local", "echo-a", s.map(|s| &s.a)),
        (
            "nodeport/etp-cluster",
            "echo-b",
            s.and_then(|s| s.b.as_ref()),
        ),
    ] {
        let svc = svc.filter(|_| two);
        let skip = why(s.is_some());
        r.add(
            scope,
            Runner::HostClient,
            to,
            svc.map(|a| np(a, false)),
            &[Tcp, Http],
            skip,
        );
        r.add(
            scope,
            Runner::HostClient,
            to,
            svc.map(|a| np(a, true)),
            &[Udp],
            skip,
        );
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
            control: None,
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

/// `--tenancy`: VPC isolation, run by `vpc-client` (t1's VPC, node A) unless noted.
///
/// - `same-vpc`: t1's `echo-a`/`echo-b` at their VPC addresses answer (tcp, udp, http,
///   icmp); the mesh of every twin-VPC client to every server of its VPC is [`vpc_mesh`];
/// - `twin-vpc`: t2's servers at *their* VPC addresses (same CIDR): blocked, or, when
///   t1's server holds the same address, answered by that t1 server, never by t2's;
/// - `vpc-to-default`: the default network's `echo-a`/`echo-b` (pod IPs): blocked;
/// - `vpc-to-node`: the nodes' InternalIPs (hostNetwork servers; ICMP to the address): blocked;
/// - the ICMP rows of `twin-vpc`, `vpc-to-default` and `vpc-to-node` are run by
///   `t1-client-a` (t1's VPC, node A, like `vpc-client`), so that each client's report
///   fits the 4 KiB termination message with every reason in it;
/// - `default-to-default/same-node/icmp`: `client` pings `echo-a` (the control of its
///   blocked ICMP rows, see [`PlannedCheck::control`]);
/// - `default-to-vpc`: `client` (default network) → t1's VPC addresses: blocked;
/// - `no-binding`: the `unbound` pod never starts and names the missing VPCBinding;
///   `no-binding/event`: a Warning event on it says so (`kubectl describe pod`).
fn tenancy(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let Some(t) = &l.tenancy else {
        return Vec::new();
    };
    use crate::tenancy::Tenant::{T1, T2};
    let vpc = |ip: IpAddr| (ip, POD_ECHO_PORT, POD_HTTP_PORT);
    let mut r = Rows::new("tenancy", l);
    let v = Runner::VpcClient;
    // The ICMP isolation rows run in t1's other client on node A: one pod's report must
    // fit the 4 KiB termination message even when every row fails with its reason.
    let pinger = Runner::Member(T1, Slot::A);
    r.add(
        "same-vpc/same-node",
        v,
        &T1.answer("echo-a"),
        Some(vpc(t.t1.echo_a)),
        &[Tcp, Udp, Http, Icmp],
        "",
    );
    r.add(
        "same-vpc/cross-node",
        v,
        &T1.answer("echo-b"),
        t.t1.echo_b.map(vpc),
        &[Tcp, Udp, Http, Icmp],
        SKIP_ONE_NODE,
    );
    // Twin VPC: an address t1 also holds must reach t1's holder; any other must not answer.
    for (scope, name, ip) in [
        ("twin-vpc/same-node", "echo-a", Some(t.t2.echo_a)),
        ("twin-vpc/cross-node", "echo-b", t.t2.echo_b),
    ] {
        twin_rows(
            &mut r,
            (T1, &t.t1),
            v,
            scope,
            &T2.answer(name),
            ip,
            &[Tcp, Udp],
            SKIP_ONE_NODE,
        );
        twin_rows(
            &mut r,
            (T1, &t.t1),
            pinger,
            scope,
            &T2.answer(name),
            ip,
            &[Icmp],
            SKIP_ONE_NODE,
        );
    }
    let pod = |ip: IpAddr| (ip, POD_ECHO_PORT, POD_HTTP_PORT);
    r.blocked(
        "vpc-to-default/same-node",
        v,
        "echo-a",
        Some(pod(l.echo_a_ip)),
        &[Tcp, Udp],
        "",
    );
    r.blocked(
        "vpc-to-default/same-node",
        pinger,
        "echo-a",
        Some(pod(l.echo_a_ip)),
        &[Icmp],
        "",
    );
    r.blocked(
        "vpc-to-default/cross-node",
        v,
        "echo-b",
        l.echo_b_ip.map(pod),
        &[Tcp, Udp],
        SKIP_ONE_NODE,
    );
    r.blocked(
        "vpc-to-default/cross-node",
        pinger,
        "echo-b",
        l.echo_b_ip.map(pod),
        &[Icmp],
        SKIP_ONE_NODE,
    );
    let host = |n: &NodeInfo| (n.internal_ip, HOST_ECHO_PORT, HOST_HTTP_PORT);
    let (node_a, node_b) = (Some(host(&l.node_a)), l.node_b.as_ref().map(host));
    r.blocked(
        "vpc-to-node/same-node",
        v,
        "host-echo-a",
        node_a,
        &[Tcp],
        "",
    );
    r.blocked(
        "vpc-to-node/same-node",
        pinger,
        "host-echo-a",
        node_a,
        &[Icmp],
        "",
    );
    let b = "host-echo-b";
    r.blocked(
        "vpc-to-node/cross-node",
        v,
        b,
        node_b,
        &[Tcp, Udp],
        SKIP_ONE_NODE,
    );
    r.blocked(
        "vpc-to-node/cross-node",
        pinger,
        b,
        node_b,
        &[Icmp],
        SKIP_ONE_NODE,
    );
    // The default-network client's ICMP control: it can ping a pod of its own network.
    r.add(
        "default-to-default/same-node",
        Runner::Client,
        "echo-a",
        Some(pod(l.echo_a_ip)),
        &[Icmp],
        "",
    );
    r.blocked(
        "default-to-vpc/same-node",
        Runner::Client,
        &T1.answer("echo-a"),
        Some(vpc(t.t1.echo_a)),
        &[Tcp, Udp, Icmp],
        "",
    );
    r.blocked(
        "default-to-vpc/cross-node",
        Runner::Client,
        &T1.answer("echo-b"),
        t.t1.echo_b.map(vpc),
        &[Tcp, Udp, Icmp],
        SKIP_ONE_NODE,
    );
    let unbound = format!("{} (no VPCBinding)", T1.answer(crate::tenancy::VPC_NAME));
    r.out.push(judged_row(
        l,
        Runner::Unbound,
        "no-binding",
        unbound.clone(),
    ));
    r.out.push(judged_row(
        l,
        Runner::Unbound,
        "no-binding/event",
        format!("{unbound}: Warning event"),
    ));
    r.out
}

/// Why a mesh row is skipped: its client's or its server's node is missing.
pub const SKIP_FEW_NODES: &str = "needs three schedulable nodes";

/// `--tenancy`: the clients `<t>-client-<x>` of each twin VPC (t1, t2), one on each of
/// the three nodes, against
/// - `same-vpc/<t>/<x>-to-<y>`: every server of its own VPC (`echo-<y>` on node y), tcp,
///   udp and icmp: every pod is a source and a destination, on every node pair in both
///   directions;
/// - `twin-vpc/<t>/<x>-to-<y>`: the other tenant's servers on its own node and on the
///   next one around the ring A → B → C → A (as in `twin-vpc`: blocked, or answered by the
///   own VPC's holder of the same address);
/// - `vpc-to-node/<t>/<x>-to-<x>/icmp`: its own node's InternalIP: blocked.
///
/// `t1-client-a` has no rows of the last two kinds: it runs the ICMP rows of
/// [`tenancy`]'s `twin-vpc`, `vpc-to-default` and `vpc-to-node` instead.
fn vpc_mesh(l: &Layout) -> Vec<PlannedCheck> {
    use Proto::*;
    let Some(t) = &l.tenancy else {
        return Vec::new();
    };
    let vpc = |ip: IpAddr| (ip, POD_ECHO_PORT, POD_HTTP_PORT);
    let mut r = Rows::new("tenancy", l);
    for (own, other) in [(Tenant::T1, Tenant::T2), (Tenant::T2, Tenant::T1)] {
        for x in Slot::ALL {
            let runner = Runner::Member(own, x);
            let here = l.node(x);
            for y in Slot::ALL {
                let ip = here.and(t.echoes(own).at(y));
                r.add(
                    &format!("same-vpc/{}/{}-to-{}", own.short(), x.letter(), y.letter()),
                    runner,
                    &own.answer(y.server()),
                    ip.map(vpc),
                    &[Tcp, Udp, Icmp],
                    SKIP_FEW_NODES,
                );
            }
            if (own, x) == (Tenant::T1, Slot::A) {
                continue;
            }
            for y in [x, x.next()] {
                twin_rows(
                    &mut r,
                    (own, t.echoes(own)),
                    runner,
                    &format!("twin-vpc/{}/{}-to-{}", own.short(), x.letter(), y.letter()),
                    &other.answer(y.server()),
                    here.and(t.echoes(other).at(y)),
                    &[Tcp, Udp, Icmp],
                    SKIP_FEW_NODES,
                );
            }
            let node = here.map_or_else(|| format!("node {}", x.letter()), |n| n.name.clone());
            r.blocked(
                &format!(
                    "vpc-to-node/{}/{}-to-{}",
                    own.short(),
                    x.letter(),
                    x.letter()
                ),
                runner,
                &node,
                here.map(|n| (n.internal_ip, HOST_ECHO_PORT, HOST_HTTP_PORT)),
                &[Icmp],
                SKIP_FEW_NODES,
            );
        }
    }
    r.out
}

/// A row the test judges itself (no target in a plan; `to` says what it is about).
fn judged_row(l: &Layout, runner: Runner, scope: &str, to: String) -> PlannedCheck {
    PlannedCheck {
        group: "tenancy",
        id: format!("tenancy/{scope}"),
        runner,
        to,
        proto: Proto::Tcp,
        target: None,
        expect: None,
        expect_blocked: false,
        skip: None,
        timeout_ms: l.check_timeout_ms,
        control: None,
    }
}

/// Where a stream row's client streams to: `server` of `tenant` at `ip`.
fn stream_to(tenant: crate::tenancy::Tenant, server: &str, ip: IpAddr) -> String {
    format!(
        "{} {} (tcp stream)",
        tenant.answer(server),
        SocketAddr::new(ip, STREAM_PORT)
    )
}

/// The cross-node server of a tenant (`echo-b`), or `echo-a` on a one-node cluster.
fn far_echo(e: &VpcEchoes) -> (&'static str, IpAddr) {
    match e.echo_b {
        Some(b) => ("echo-b", b),
        None => ("echo-a", e.echo_a),
    }
}

/// `--tenancy`, peered VPCs (t1 ↔ t3, disjoint CIDRs), in the `tenancy/peered/` rows:
/// - `same-node`, `cross-node`: `vpc-client` (t1) → t3's servers answer;
/// - `reverse/cross-node`: `peer-client` (t3) → t1's `echo-b` answers;
/// - `not-twin`: `peer-client` → t2's servers (t1's twin, not peered): blocked, or
///   answered by the t1 server holding the same address, never by t2's (no transit);
/// - `half-deleted`: `peer-stream`'s stream to t3 is cut at most
///   [`crate::tenancy::UNPEER_DEADLINE_MS`] after t3's half is deleted, and no new
///   connection works until it is back;
/// - `half-restored`: after re-creating the half, a new connection works again.
fn peered(l: &Layout) -> Vec<PlannedCheck> {
    use crate::tenancy::Tenant::{T1, T2, T3};
    use Proto::*;
    let Some(t) = &l.tenancy else {
        return Vec::new();
    };
    let vpc = |ip: IpAddr| (ip, POD_ECHO_PORT, POD_HTTP_PORT);
    let mut r = Rows::new("tenancy", l);
    r.add(
        "peered/same-node",
        Runner::VpcClient,
        &T3.answer("echo-a"),
        Some(vpc(t.t3.echo_a)),
        &[Tcp],
        "",
    );
    r.add(
        "peered/cross-node",
        Runner::VpcClient,
        &T3.answer("echo-b"),
        t.t3.echo_b.map(vpc),
        &[Tcp, Udp],
        SKIP_ONE_NODE,
    );
    r.add(
        "peered/reverse/cross-node",
        Runner::PeerClient,
        &T1.answer("echo-b"),
        t.t1.echo_b.map(vpc),
        &[Tcp, Udp],
        SKIP_ONE_NODE,
    );
    for (scope, name, ip) in [
        ("peered/not-twin/same-node", "echo-a", Some(t.t2.echo_a)),
        ("peered/not-twin/cross-node", "echo-b", t.t2.echo_b),
    ] {
        twin_rows(
            &mut r,
            (T1, &t.t1),
            Runner::PeerClient,
            scope,
            &T2.answer(name),
            ip,
            &[Tcp, Udp],
            SKIP_ONE_NODE,
        );
    }
    let (name, ip) = far_echo(&t.t3);
    let to = stream_to(T3, name, ip);
    let mut out = r.out;
    out.push(judged_row(
        l,
        Runner::PeerStream,
        "peered/half-deleted",
        to.clone(),
    ));
    out.push(judged_row(
        l,
        Runner::PeerStream,
        "peered/half-restored",
        to,
    ));
    out
}

/// `--tenancy`, a revoked binding, in the `tenancy/revoked/` rows (`stream-client` in
/// `<ns>-revoke`, bound to t1's VPC, streaming to t1's `echo-b`):
/// - `stream-cut`: the stream is cut at most [`crate::tenancy::REVOKE_DEADLINE_MS`] after
///   the binding is deleted (the time column is the measured cut);
/// - `pod-running`: the severed pod stays Running, not restarted;
/// - `no-reconnect`: after the binding is re-created, the severed pod still reaches
///   nothing for [`crate::tenancy::STAYS_CUT_MS`].
fn revoked(l: &Layout) -> Vec<PlannedCheck> {
    use crate::tenancy::Tenant::T1;
    let Some(t) = &l.tenancy else {
        return Vec::new();
    };
    let (name, ip) = far_echo(&t.t1);
    let to = stream_to(T1, name, ip);
    [
        "revoked/stream-cut",
        "revoked/pod-running",
        "revoked/no-reconnect",
    ]
    .into_iter()
    .map(|scope| judged_row(l, Runner::Revoked, scope, to.clone()))
    .collect()
}

/// `--tenancy`, SecurityGroups in t1's VPC, in the `tenancy/security-group/` rows (see
/// [`crate::tenancy`]): `web-to-api/tcp` is answered by `sg-api`; `web-to-api/udp` and
/// `/http` (other protocol, other port), `other-to-api/tcp` (`vpc-client`, in no group:
/// ingress) and `web-egress/tcp` (`sg-web` → t1's unpoliced `echo-a`: egress) are blocked.
fn security_group(l: &Layout) -> Vec<PlannedCheck> {
    use crate::tenancy::Tenant::T1;
    use crate::tenancy::{SG_API, SG_PORT};
    use Proto::*;
    let Some(t) = &l.tenancy else {
        return Vec::new();
    };
    let api = Some((t.sg_api, SG_PORT, POD_HTTP_PORT));
    let to = T1.answer(SG_API);
    let mut r = Rows::new("tenancy", l);
    r.add(
        "security-group/web-to-api",
        Runner::SgWeb,
        &to,
        api,
        &[Tcp],
        "",
    );
    r.blocked(
        "security-group/web-to-api",
        Runner::SgWeb,
        &to,
        api,
        &[Udp, Http],
        "",
    );
    r.blocked(
        "security-group/other-to-api",
        Runner::VpcClient,
        &to,
        api,
        &[Tcp],
        "",
    );
    r.blocked(
        "security-group/web-egress",
        Runner::SgWeb,
        &T1.answer("echo-a"),
        Some((t.t1.echo_a, POD_ECHO_PORT, POD_HTTP_PORT)),
        &[Tcp],
        "",
    );
    r.out
}

/// Twin rows: an address the client's own VPC (`own`) also holds must reach its own
/// holder (for ICMP: an echo reply); any other must not answer.
#[allow(clippy::too_many_arguments)] // one call shape for three row families
fn twin_rows(
    r: &mut Rows<'_>,
    own: (Tenant, &VpcEchoes),
    runner: Runner,
    scope: &str,
    to: &str,
    ip: Option<IpAddr>,
    protos: &[Proto],
    skip: &str,
) {
    let vpc = |ip: IpAddr| (ip, POD_ECHO_PORT, POD_HTTP_PORT);
    let (tenant, echoes) = own;
    let holder = |ip: IpAddr| {
        Slot::ALL
            .into_iter()
            .find(|s| echoes.at(*s) == Some(ip))
            .map(|s| tenant.answer(s.server()))
    };
    match ip.and_then(|ip| holder(ip).map(|h| (ip, h))) {
        Some((ip, holder)) => {
            let first = r.out.len();
            r.add(scope, runner, to, Some(vpc(ip)), protos, "");
            for c in &mut r.out[first..] {
                if c.proto != Proto::Icmp {
                    c.expect = Some(holder.clone());
                }
            }
        }
        None => r.blocked(scope, runner, to, ip.map(vpc), protos, skip),
    }
}

/// Names each blocked ICMP row's control: the first ICMP row of the same client that
/// expects a reply and runs ([`PlannedCheck::control`]).
fn attach_controls(checks: &mut [PlannedCheck]) {
    let controls: Vec<(Runner, String)> = checks
        .iter()
        .filter(|c| c.proto == Proto::Icmp && !c.expect_blocked && c.skip.is_none())
        .map(|c| (c.runner, c.id.clone()))
        .collect();
    for c in checks
        .iter_mut()
        .filter(|c| c.proto == Proto::Icmp && c.expect_blocked)
    {
        c.control = controls
            .iter()
            .find(|(r, _)| *r == c.runner)
            .map(|(_, id)| id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_policy_group_is_there_only_with_its_server() {
        let mut l = two_nodes();
        assert!(build(&l).checks.iter().all(|c| c.group != "policy"));
        l.policy_echo_ip = Some("10.244.2.9".parse().unwrap());
        let rows: Vec<(String, Runner, bool)> = build(&l)
            .checks
            .into_iter()
            .filter(|c| c.group == "policy")
            .map(|c| (c.id, c.runner, c.expect_blocked))
            .collect();
        let want = [
            ("policy/admitted/tcp", Runner::PolicyClient, false),
            ("policy/admitted/udp", Runner::PolicyClient, false),
            (
                "policy/admitted-client-other-port/http",
                Runner::PolicyClient,
                true,
            ),
            ("policy/denied/tcp", Runner::Client, true),
            ("policy/denied/udp", Runner::Client, true),
            ("policy/denied/http", Runner::Client, true),
        ];
        assert_eq!(rows, want.map(|(i, r, b)| (i.to_string(), r, b)).to_vec());
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
            node_c: None,
            external: Some(External {
                target: "198.19.0.2:8000".into(),
                name: Some("external".into()),
            }),
            check_timeout_ms: 5000,
            tenancy: None,
            services: Some(ServicesLayout {
                a: SvcAddrs {
                    cluster_ip: ip("10.96.0.20"),
                    tcp_node_port: 30001,
                    udp_node_port: 30002,
                    http_node_port: 30003,
                },
                b: Some(SvcAddrs {
                    cluster_ip: ip("10.96.0.21"),
                    tcp_node_port: 30011,
                    udp_node_port: 30012,
                    http_node_port: 30013,
                }),
            }),
            no_services: false,
            policy_echo_ip: None,
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
            (
                "services/clusterip/same-node/tcp",
                Client,
                "echo-a",
                Some("10.96.0.20:8000"),
            ),
            (
                "services/clusterip/same-node/udp",
                Client,
                "echo-a",
                Some("10.96.0.20:8000"),
            ),
            (
                "services/clusterip/same-node/http",
                Client,
                "echo-a",
                Some("10.96.0.20:8080"),
            ),
            (
                "services/clusterip/cross-node/tcp",
                Client,
                "echo-b",
                Some("10.96.0.21:8000"),
            ),
            (
                "services/clusterip/cross-node/udp",
                Client,
                "echo-b",
                Some("10.96.0.21:8000"),
            ),
            (
                "services/clusterip/cross-node/http",
                Client,
                "echo-b",
                Some("10.96.0.21:8080"),
            ),
            (
                "services/node-to-clusterip/tcp",
                HostClient,
                "echo-a",
                Some("10.96.0.20:8000"),
            ),
            (
                "services/node-to-clusterip/http",
                HostClient,
                "echo-a",
                Some("10.96.0.20:8080"),
            ),
            (
                "services/nodeport/etp-local/tcp",
                HostClient,
                "echo-a",
                Some("198.18.0.11:30001"),
            ),
            (
                "services/nodeport/etp-local/http",
                HostClient,
                "echo-a",
                Some("198.18.0.11:30003"),
            ),
            (
                "services/nodeport/etp-local/udp",
                HostClient,
                "echo-a",
                Some("198.18.0.11:30002"),
            ),
            (
                "services/nodeport/etp-cluster/tcp",
                HostClient,
                "echo-b",
                Some("198.18.0.11:30011"),
            ),
            (
                "services/nodeport/etp-cluster/http",
                HostClient,
                "echo-b",
                Some("198.18.0.11:30013"),
            ),
            (
                "services/nodeport/etp-cluster/udp",
                HostClient,
                "echo-b",
                Some("198.18.0.11:30012"),
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
        assert_eq!(client.checks.len(), 16);
        assert_eq!(host.checks.len(), 13);
        client.validate().expect("valid client plan");
        host.validate().expect("valid host plan");
        assert!(host
            .checks
            .iter()
            .all(|c| c.id.starts_with("node-to-pod/") || c.id.starts_with("services/")));
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
        l.services.as_mut().expect("services").b = None;
        let m = build(&l);
        for c in &m.checks {
            // NodePorts on A from host-client, which now runs on A too: not from the wire.
            let cross = c.id.contains("/cross-node/") || c.id.starts_with("services/nodeport/");
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
        assert_eq!(host.checks.len(), 4);
        assert_eq!(m.checks.len(), 29, "skipped rows stay in the matrix");
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

#[cfg(test)]
mod tenancy_tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn layout(t2_a: &str, t2_b: &str) -> Layout {
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
            node_c: Some(NodeInfo {
                name: "lab-node3".into(),
                internal_ip: ip("198.18.0.13"),
            }),
            external: None,
            check_timeout_ms: 5000,
            services: None,
            no_services: false,
            policy_echo_ip: None,
            tenancy: Some(TenancyLayout {
                t1: VpcEchoes {
                    echo_a: ip("10.250.0.2"),
                    echo_b: Some(ip("10.250.0.3")),
                    echo_c: Some(ip("10.250.0.20")),
                },
                t2: VpcEchoes {
                    echo_a: ip(t2_a),
                    echo_b: Some(ip(t2_b)),
                    echo_c: Some(ip("10.250.0.21")),
                },
                t3: VpcEchoes {
                    echo_a: ip("10.251.0.2"),
                    echo_b: Some(ip("10.251.0.3")),
                    echo_c: None,
                },
                sg_api: ip("10.250.0.9"),
            }),
        }
    }

    type Line<'a> = (
        &'a str,
        Runner,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        bool,
    );

    /// The rows of the isolation group (not peered, not revoked, not the mesh's).
    fn lines(m: &Matrix) -> Vec<Line<'_>> {
        all_lines(m)
            .into_iter()
            .filter(|l| {
                !l.0.starts_with("tenancy/peered/")
                    && !l.0.starts_with("tenancy/revoked/")
                    && !l.0.starts_with("tenancy/security-group/")
                    && !is_mesh(l.0)
            })
            .collect()
    }

    /// A row of [`vpc_mesh`]: its id names the client's tenant (`…/t2/b-to-c/…`).
    fn is_mesh(id: &str) -> bool {
        id.contains("/t1/") || id.contains("/t2/")
    }

    fn all_lines(m: &Matrix) -> Vec<Line<'_>> {
        m.checks
            .iter()
            .filter(|c| c.group == "tenancy")
            .map(|c| {
                (
                    c.id.as_str(),
                    c.runner,
                    c.to.as_str(),
                    c.target.as_deref(),
                    c.expect.as_deref(),
                    c.expect_blocked,
                )
            })
            .collect()
    }

    #[test]
    fn without_tenancy_there_is_no_tenancy_row() {
        let mut l = layout("10.250.0.4", "10.250.0.5");
        l.tenancy = None;
        let m = build(&l);
        assert!(m.checks.iter().all(|c| c.group != "tenancy"));
        assert_eq!(m.plan_for(Runner::VpcClient), None);
        assert_eq!(m.plan_for(Runner::Unbound), None);
        assert_eq!(m.checks.len(), 29);
    }

    #[test]
    fn the_tenancy_rows_with_distinct_twin_addresses() {
        let m = build(&layout("10.250.0.4", "10.250.0.5"));
        use Runner::*;
        let want: Vec<Line> = vec![
            (
                "tenancy/same-vpc/same-node/tcp",
                VpcClient,
                "t1/echo-a",
                Some("10.250.0.2:8000"),
                Some("t1/echo-a"),
                false,
            ),
            (
                "tenancy/same-vpc/same-node/udp",
                VpcClient,
                "t1/echo-a",
                Some("10.250.0.2:8000"),
                Some("t1/echo-a"),
                false,
            ),
            (
                "tenancy/same-vpc/same-node/http",
                VpcClient,
                "t1/echo-a",
                Some("10.250.0.2:8080"),
                Some("t1/echo-a"),
                false,
            ),
            (
                "tenancy/same-vpc/same-node/icmp",
                VpcClient,
                "t1/echo-a",
                Some("10.250.0.2:0"),
                Some("echo reply from 10.250.0.2"),
                false,
            ),
            (
                "tenancy/same-vpc/cross-node/tcp",
                VpcClient,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                Some("t1/echo-b"),
                false,
            ),
            (
                "tenancy/same-vpc/cross-node/udp",
                VpcClient,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                Some("t1/echo-b"),
                false,
            ),
            (
                "tenancy/same-vpc/cross-node/http",
                VpcClient,
                "t1/echo-b",
                Some("10.250.0.3:8080"),
                Some("t1/echo-b"),
                false,
            ),
            (
                "tenancy/same-vpc/cross-node/icmp",
                VpcClient,
                "t1/echo-b",
                Some("10.250.0.3:0"),
                Some("echo reply from 10.250.0.3"),
                false,
            ),
            (
                "tenancy/twin-vpc/same-node/tcp",
                VpcClient,
                "t2/echo-a",
                Some("10.250.0.4:8000"),
                None,
                true,
            ),
            (
                "tenancy/twin-vpc/same-node/udp",
                VpcClient,
                "t2/echo-a",
                Some("10.250.0.4:8000"),
                None,
                true,
            ),
            (
                "tenancy/twin-vpc/same-node/icmp",
                Member(Tenant::T1, Slot::A),
                "t2/echo-a",
                Some("10.250.0.4:0"),
                None,
                true,
            ),
            (
                "tenancy/twin-vpc/cross-node/tcp",
                VpcClient,
                "t2/echo-b",
                Some("10.250.0.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/twin-vpc/cross-node/udp",
                VpcClient,
                "t2/echo-b",
                Some("10.250.0.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/twin-vpc/cross-node/icmp",
                Member(Tenant::T1, Slot::A),
                "t2/echo-b",
                Some("10.250.0.5:0"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/same-node/tcp",
                VpcClient,
                "echo-a",
                Some("10.244.1.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/same-node/udp",
                VpcClient,
                "echo-a",
                Some("10.244.1.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/same-node/icmp",
                Member(Tenant::T1, Slot::A),
                "echo-a",
                Some("10.244.1.5:0"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/cross-node/tcp",
                VpcClient,
                "echo-b",
                Some("10.244.2.3:8000"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/cross-node/udp",
                VpcClient,
                "echo-b",
                Some("10.244.2.3:8000"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-default/cross-node/icmp",
                Member(Tenant::T1, Slot::A),
                "echo-b",
                Some("10.244.2.3:0"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-node/same-node/tcp",
                VpcClient,
                "host-echo-a",
                Some("198.18.0.11:4250"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-node/same-node/icmp",
                Member(Tenant::T1, Slot::A),
                "host-echo-a",
                Some("198.18.0.11:0"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-node/cross-node/tcp",
                VpcClient,
                "host-echo-b",
                Some("198.18.0.12:4250"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-node/cross-node/udp",
                VpcClient,
                "host-echo-b",
                Some("198.18.0.12:4250"),
                None,
                true,
            ),
            (
                "tenancy/vpc-to-node/cross-node/icmp",
                Member(Tenant::T1, Slot::A),
                "host-echo-b",
                Some("198.18.0.12:0"),
                None,
                true,
            ),
            (
                "tenancy/default-to-default/same-node/icmp",
                Client,
                "echo-a",
                Some("10.244.1.5:0"),
                Some("echo reply from 10.244.1.5"),
                false,
            ),
            (
                "tenancy/default-to-vpc/same-node/tcp",
                Client,
                "t1/echo-a",
                Some("10.250.0.2:8000"),
                None,
                true,
            ),
            (
                "tenancy/default-to-vpc/same-node/udp",
                Client,
                "t1/echo-a",
                Some("10.250.0.2:8000"),
                None,
                true,
            ),
            (
                "tenancy/default-to-vpc/same-node/icmp",
                Client,
                "t1/echo-a",
                Some("10.250.0.2:0"),
                None,
                true,
            ),
            (
                "tenancy/default-to-vpc/cross-node/tcp",
                Client,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                None,
                true,
            ),
            (
                "tenancy/default-to-vpc/cross-node/udp",
                Client,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                None,
                true,
            ),
            (
                "tenancy/default-to-vpc/cross-node/icmp",
                Client,
                "t1/echo-b",
                Some("10.250.0.3:0"),
                None,
                true,
            ),
            (
                "tenancy/no-binding",
                Unbound,
                "t1/net (no VPCBinding)",
                None,
                None,
                false,
            ),
            (
                "tenancy/no-binding/event",
                Unbound,
                "t1/net (no VPCBinding): Warning event",
                None,
                None,
                false,
            ),
        ];
        assert_eq!(lines(&m), want);
        assert!(m
            .checks
            .iter()
            .filter(|c| c.group == "tenancy")
            .all(|c| c.skip.is_none()));

        let vpc = m.plan_for(VpcClient).expect("vpc-client plan");
        vpc.validate().expect("valid");
        assert_eq!(
            vpc.checks.len(),
            17 + 2 + 3 + 1,
            "with the 2 ICMP rows, the 3 peered rows and security-group/other-to-api"
        );
        assert_eq!(
            Plan::parse(&vpc.to_json().expect("json")).expect("parse"),
            vpc
        );
        let client = m.plan_for(Client).expect("client plan");
        client.validate().expect("valid");
        assert_eq!(
            client
                .checks
                .iter()
                .filter(|c| c.id.starts_with("tenancy/"))
                .count(),
            7,
            "default-to-vpc and its ICMP control"
        );
        assert_eq!(
            m.plan_for(Unbound),
            None,
            "judged by the test, not a client"
        );
    }

    #[test]
    fn a_twin_address_t1_also_holds_must_be_answered_by_t1_never_by_t2() {
        // IPAM per VPC: t2's servers got the very addresses of t1's.
        let m = build(&layout("10.250.0.2", "10.250.0.3"));
        let twin: Vec<Line> = lines(&m)
            .into_iter()
            .filter(|l| l.0.starts_with("tenancy/twin-vpc/"))
            .collect();
        use Runner::*;
        assert_eq!(
            twin,
            vec![
                (
                    "tenancy/twin-vpc/same-node/tcp",
                    VpcClient,
                    "t2/echo-a",
                    Some("10.250.0.2:8000"),
                    Some("t1/echo-a"),
                    false
                ),
                (
                    "tenancy/twin-vpc/same-node/udp",
                    VpcClient,
                    "t2/echo-a",
                    Some("10.250.0.2:8000"),
                    Some("t1/echo-a"),
                    false
                ),
                (
                    "tenancy/twin-vpc/same-node/icmp",
                    Member(Tenant::T1, Slot::A),
                    "t2/echo-a",
                    Some("10.250.0.2:0"),
                    Some("echo reply from 10.250.0.2"),
                    false,
                ),
                (
                    "tenancy/twin-vpc/cross-node/tcp",
                    VpcClient,
                    "t2/echo-b",
                    Some("10.250.0.3:8000"),
                    Some("t1/echo-b"),
                    false
                ),
                (
                    "tenancy/twin-vpc/cross-node/udp",
                    VpcClient,
                    "t2/echo-b",
                    Some("10.250.0.3:8000"),
                    Some("t1/echo-b"),
                    false
                ),
                (
                    "tenancy/twin-vpc/cross-node/icmp",
                    Member(Tenant::T1, Slot::A),
                    "t2/echo-b",
                    Some("10.250.0.3:0"),
                    Some("echo reply from 10.250.0.3"),
                    false,
                ),
            ]
        );
        // Crossed: t2's echo-b sits at t1's echo-a address.
        let m = build(&layout("10.250.0.9", "10.250.0.2"));
        let row = m
            .checks
            .iter()
            .find(|c| c.id == "tenancy/twin-vpc/cross-node/tcp")
            .expect("row");
        assert_eq!(row.expect.as_deref(), Some("t1/echo-a"));
        assert!(!row.expect_blocked);
        // No check of a client outside t2's VPC ever expects a t2 answer.
        assert!(m
            .checks
            .iter()
            .filter(|c| c.runner.vpc_tenant() != Some(Tenant::T2))
            .all(|c| !c.expect.as_deref().is_some_and(|e| e.starts_with("t2/"))));
    }

    #[test]
    fn the_security_group_rows_allow_only_tcp_8000_from_web_both_ways() {
        use Runner::{SgWeb, VpcClient};
        let m = build(&layout("10.250.0.4", "10.250.0.5"));
        let got: Vec<Line<'_>> = all_lines(&m)
            .into_iter()
            .filter(|l| l.0.starts_with("tenancy/security-group/"))
            .collect();
        let api = Some("10.250.0.9:8000");
        assert_eq!(
            got,
            vec![
                (
                    "tenancy/security-group/web-to-api/tcp",
                    SgWeb,
                    "t1/sg-api",
                    api,
                    Some("t1/sg-api"),
                    false
                ),
                (
                    "tenancy/security-group/web-to-api/udp",
                    SgWeb,
                    "t1/sg-api",
                    api,
                    None,
                    true
                ),
                (
                    "tenancy/security-group/web-to-api/http",
                    SgWeb,
                    "t1/sg-api",
                    Some("10.250.0.9:8080"),
                    None,
                    true
                ),
                (
                    "tenancy/security-group/other-to-api/tcp",
                    VpcClient,
                    "t1/sg-api",
                    api,
                    None,
                    true
                ),
                (
                    "tenancy/security-group/web-egress/tcp",
                    SgWeb,
                    "t1/echo-a",
                    Some("10.250.0.2:8000"),
                    None,
                    true
                ),
            ]
        );
        // sg-web runs only these rows; its plan validates.
        let plan = m.plan_for(SgWeb).expect("plan");
        assert_eq!(plan.checks.len(), 4);
        assert_eq!(SgWeb.pod_name(), crate::tenancy::SG_WEB);
    }

    #[test]
    fn every_twin_vpc_pod_reaches_every_server_of_its_vpc_on_three_nodes() {
        let m = build(&layout("10.250.0.4", "10.250.0.5"));
        let t = m.checks.clone();
        let ids: std::collections::HashSet<&str> = t.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), t.len(), "ids are unique");
        let l = layout("10.250.0.4", "10.250.0.5");
        let tl = l.tenancy.as_ref().expect("tenancy");
        // Every client of t1 and t2 (one per node) against every server of its own VPC,
        // over TCP, UDP and ICMP: 2 tenants x 3 x 3 pairs, each a row that runs.
        for own in [Tenant::T1, Tenant::T2] {
            for x in Slot::ALL {
                for y in Slot::ALL {
                    for proto in [Proto::Tcp, Proto::Udp, Proto::Icmp] {
                        let id = format!(
                            "tenancy/same-vpc/{}/{}-to-{}/{proto}",
                            own.short(),
                            x.letter(),
                            y.letter()
                        );
                        let c = t.iter().find(|c| c.id == id).expect(&id);
                        assert_eq!(c.runner, Runner::Member(own, x), "{id}");
                        assert_eq!(c.skip, None, "{id}");
                        assert!(!c.expect_blocked, "{id}");
                        let ip = tl.echoes(own).at(y).expect("server");
                        let port = if proto == Proto::Icmp {
                            0
                        } else {
                            POD_ECHO_PORT
                        };
                        assert_eq!(
                            c.target.as_deref(),
                            Some(SocketAddr::new(ip, port).to_string().as_str()),
                            "{id}"
                        );
                        let want = match proto {
                            Proto::Icmp => format!("echo reply from {ip}"),
                            _ => own.answer(y.server()),
                        };
                        assert_eq!(c.expect.as_deref(), Some(want.as_str()), "{id}");
                    }
                }
            }
        }
        // The other members' twin rows: the other tenant's server on their own node and on
        // the next one, blocked over TCP, UDP and ICMP; and their own node's address.
        use Runner::*;
        let got: Vec<Line> = all_lines(&m)
            .into_iter()
            .filter(|l| l.1 == Member(Tenant::T2, Slot::C) && !l.0.contains("/same-vpc/"))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "tenancy/twin-vpc/t2/c-to-c/tcp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-c",
                    Some("10.250.0.20:8000"),
                    None,
                    true
                ),
                (
                    "tenancy/twin-vpc/t2/c-to-c/udp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-c",
                    Some("10.250.0.20:8000"),
                    None,
                    true
                ),
                (
                    "tenancy/twin-vpc/t2/c-to-c/icmp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-c",
                    Some("10.250.0.20:0"),
                    None,
                    true
                ),
                (
                    "tenancy/twin-vpc/t2/c-to-a/tcp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-a",
                    Some("10.250.0.2:8000"),
                    None,
                    true
                ),
                (
                    "tenancy/twin-vpc/t2/c-to-a/udp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-a",
                    Some("10.250.0.2:8000"),
                    None,
                    true
                ),
                (
                    "tenancy/twin-vpc/t2/c-to-a/icmp",
                    Member(Tenant::T2, Slot::C),
                    "t1/echo-a",
                    Some("10.250.0.2:0"),
                    None,
                    true
                ),
                (
                    "tenancy/vpc-to-node/t2/c-to-c/icmp",
                    Member(Tenant::T2, Slot::C),
                    "lab-node3",
                    Some("198.18.0.13:0"),
                    None,
                    true
                ),
            ]
        );
        // Each member runs 9 own-VPC rows, 6 twin rows and its node's row; t1-client-a
        // the 6 ICMP rows of the isolation group instead. Plans validate.
        for r in Runner::ALL {
            if let Member(own, slot) = r {
                assert_eq!(r.vpc_tenant(), Some(own));
                let plan = m.plan_for(r).expect("member plan");
                plan.validate().expect("valid");
                let rest = if (own, slot) == (Tenant::T1, Slot::A) {
                    assert!(plan
                        .checks
                        .iter()
                        .filter(|c| !c.id.starts_with("tenancy/same-vpc/t1/a-to-"))
                        .all(|c| c.proto == Proto::Icmp && c.expect_blocked));
                    6
                } else {
                    6 + 1
                };
                assert_eq!(plan.checks.len(), 9 + rest, "{r:?}");
            }
        }
        let names: std::collections::HashSet<&str> =
            Runner::ALL.iter().map(|r| r.pod_name()).collect();
        assert_eq!(names.len(), Runner::ALL.len(), "pod names are unique");
        assert_eq!(Member(Tenant::T1, Slot::B).pod_name(), "t1-client-b");
        // Every blocked ICMP row has a control: a row of the same client that expects an
        // echo reply and runs.
        let blocked_icmp: Vec<&PlannedCheck> = t
            .iter()
            .filter(|c| c.proto == Proto::Icmp && c.expect_blocked)
            .collect();
        assert_eq!(blocked_icmp.len(), 2 + 2 + 2 + 2 + 5 * 3);
        for c in blocked_icmp {
            let id = c.control.as_deref().expect("control");
            let ctl = t.iter().find(|k| k.id == id).expect("control row");
            assert_eq!(ctl.runner, c.runner, "{c:?}");
            assert!(
                ctl.proto == Proto::Icmp && !ctl.expect_blocked && ctl.skip.is_none(),
                "{ctl:?}"
            );
        }
        assert!(t
            .iter()
            .filter(|c| !(c.proto == Proto::Icmp && c.expect_blocked))
            .all(|c| c.control.is_none()));

        // Two nodes: what needs node C is skipped, saying so; the rest still runs.
        let mut two = layout("10.250.0.4", "10.250.0.5");
        two.node_c = None;
        if let Some(t) = &mut two.tenancy {
            t.t1.echo_c = None;
            t.t2.echo_c = None;
        }
        let m = build(&two);
        for c in m.checks.iter().filter(|c| is_mesh(&c.id)) {
            let needs_c = c.id.contains("/c-to-") || c.id.contains("-to-c/");
            assert_eq!(
                c.skip.as_deref(),
                needs_c.then_some(SKIP_FEW_NODES),
                "{c:?}"
            );
        }
    }

    #[test]
    fn one_node_skips_the_cross_node_tenancy_rows() {
        let mut l = layout("10.250.0.4", "10.250.0.5");
        l.node_b = None;
        l.echo_b_ip = None;
        if let Some(t) = &mut l.tenancy {
            t.t1.echo_b = None;
            t.t2.echo_b = None;
            t.t3.echo_b = None;
        }
        l.node_c = None;
        if let Some(t) = &mut l.tenancy {
            t.t1.echo_c = None;
            t.t2.echo_c = None;
        }
        let m = build(&l);
        for c in m.checks.iter().filter(|c| c.group == "tenancy") {
            let skipped = if is_mesh(&c.id) {
                // Only node A's own rows run.
                !c.id.contains("/a-to-a/")
            } else {
                c.id.contains("/cross-node/")
            };
            assert_eq!(c.skip.is_some(), skipped, "{c:?}");
        }
        assert_eq!(
            m.plan_for(Runner::VpcClient).expect("plan").checks.len(),
            4 + 2 + 2 + 1 + 1 + 1
        );
        for r in Runner::ALL {
            if let Runner::Member(_, s) = r {
                assert_eq!(m.plan_for(r).is_some(), s == Slot::A, "{r:?}");
            }
        }
        // The stream rows are not skipped: they stream to echo-a on the one node.
        for id in ["tenancy/peered/half-deleted", "tenancy/revoked/stream-cut"] {
            let c = m.checks.iter().find(|c| c.id == id).expect("row");
            assert_eq!(c.skip, None);
            assert!(
                c.to.contains("/echo-a ") && c.to.ends_with(":8001 (tcp stream)"),
                "{c:?}"
            );
        }
    }

    #[test]
    fn the_peered_and_revoked_rows() {
        let m = build(&layout("10.250.0.4", "10.250.0.5"));
        use Runner::*;
        let got: Vec<Line> = all_lines(&m)
            .into_iter()
            .filter(|l| l.0.starts_with("tenancy/peered/") || l.0.starts_with("tenancy/revoked/"))
            .collect();
        let t3b = "t3/echo-b 10.251.0.3:8001 (tcp stream)";
        let t1b = "t1/echo-b 10.250.0.3:8001 (tcp stream)";
        let want: Vec<Line> = vec![
            (
                "tenancy/peered/same-node/tcp",
                VpcClient,
                "t3/echo-a",
                Some("10.251.0.2:8000"),
                Some("t3/echo-a"),
                false,
            ),
            (
                "tenancy/peered/cross-node/tcp",
                VpcClient,
                "t3/echo-b",
                Some("10.251.0.3:8000"),
                Some("t3/echo-b"),
                false,
            ),
            (
                "tenancy/peered/cross-node/udp",
                VpcClient,
                "t3/echo-b",
                Some("10.251.0.3:8000"),
                Some("t3/echo-b"),
                false,
            ),
            (
                "tenancy/peered/reverse/cross-node/tcp",
                PeerClient,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                Some("t1/echo-b"),
                false,
            ),
            (
                "tenancy/peered/reverse/cross-node/udp",
                PeerClient,
                "t1/echo-b",
                Some("10.250.0.3:8000"),
                Some("t1/echo-b"),
                false,
            ),
            (
                "tenancy/peered/not-twin/same-node/tcp",
                PeerClient,
                "t2/echo-a",
                Some("10.250.0.4:8000"),
                None,
                true,
            ),
            (
                "tenancy/peered/not-twin/same-node/udp",
                PeerClient,
                "t2/echo-a",
                Some("10.250.0.4:8000"),
                None,
                true,
            ),
            (
                "tenancy/peered/not-twin/cross-node/tcp",
                PeerClient,
                "t2/echo-b",
                Some("10.250.0.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/peered/not-twin/cross-node/udp",
                PeerClient,
                "t2/echo-b",
                Some("10.250.0.5:8000"),
                None,
                true,
            ),
            (
                "tenancy/peered/half-deleted",
                PeerStream,
                t3b,
                None,
                None,
                false,
            ),
            (
                "tenancy/peered/half-restored",
                PeerStream,
                t3b,
                None,
                None,
                false,
            ),
            (
                "tenancy/revoked/stream-cut",
                Revoked,
                t1b,
                None,
                None,
                false,
            ),
            (
                "tenancy/revoked/pod-running",
                Revoked,
                t1b,
                None,
                None,
                false,
            ),
            (
                "tenancy/revoked/no-reconnect",
                Revoked,
                t1b,
                None,
                None,
                false,
            ),
        ];
        assert_eq!(got, want);
        let peer = m.plan_for(PeerClient).expect("peer-client plan");
        peer.validate().expect("valid");
        assert_eq!(peer.checks.len(), 6);
        for r in [PeerStream, Revoked, Unbound] {
            assert!(r.judged());
            assert_eq!(
                m.plan_for(r),
                None,
                "{r:?} is judged by the test, not a client"
            );
        }
        assert!(!PeerClient.judged() && !VpcClient.judged());
        // The twin addresses t1 also holds: the peer reaches t1's holder (peered), never t2's.
        let m = build(&layout("10.250.0.2", "10.250.0.3"));
        let row = m
            .checks
            .iter()
            .find(|c| c.id == "tenancy/peered/not-twin/cross-node/udp")
            .expect("row");
        assert_eq!(
            (row.expect.as_deref(), row.expect_blocked),
            (Some("t1/echo-b"), false)
        );
        assert!(m
            .checks
            .iter()
            .filter(|c| c.runner.vpc_tenant() != Some(Tenant::T2))
            .all(|c| !c.expect.as_deref().is_some_and(|e| e.starts_with("t2/"))));
    }
}
