//! The tenancy group's cluster objects and verdicts (pure: building and reading only).
//!
//! `--tenancy` makes two tenants, `<ns>-t1` and `<ns>-t2`, each owning a VPC `net` with the
//! **same** CIDR and a VPCBinding for it in its own namespace; probe servers `echo-a` (node A)
//! and `echo-b` (node B) in each VPC; a VPC client `vpc-client` in t1 on node A; and a pod
//! `unbound` in `<ns>-unbound` asking for t1's VPC without a binding, which must never start.
//! The VPC servers answer `t1/echo-a`, `t2/echo-a`, …, so an answer from the twin VPC (same
//! pod name, possibly the same address) can never pass for one from the client's own VPC.
//!
//! Two more groups build on that:
//! - **peered**: a third tenant `<ns>-t3` owns a VPC `net` with a *disjoint* CIDR
//!   (`--tenancy-peer-cidr`) peered with t1's: a VPCPeering half `peer` in each owner's
//!   namespace naming the other. `peer-client` (t3, node A) and `vpc-client` check both
//!   directions while the peering is live, and that t3 does not reach t2 (the twin of its
//!   peer: no transit). Then `peer-stream` (t1, node A) holds a TCP stream to t3's server,
//!   the test deletes t3's half, judges the cut, and re-creates the half, expecting new
//!   connections to work again.
//! - **revoked**: `<ns>-revoke` has its own binding `net` to t1's VPC (so the other rows
//!   keep theirs); `stream-client` there holds a TCP stream to t1's server, the test deletes
//!   that binding, judges the cut (≤ 1 s), that the pod stays Running, and, after it
//!   re-creates the binding, that the severed pod stays cut off.
//!
//! - **security-group**: in t1's VPC, SecurityGroup `api` selects the server `sg-api`
//!   (label `cozyplane.io/sg=api`) and admits only TCP 8000 from group `web`; group `web`
//!   selects the client `sg-web` and lets it send only TCP 8000 to group `api`. `sg-web`
//!   reaches `sg-api` on TCP 8000 and nothing else (not UDP 8000, not HTTP 8080, not t1's
//!   unpoliced `echo-a`: egress); `vpc-client` (in no group) does not reach `sg-api`
//!   (ingress). `sg-api` is Ready only if its kubelet's probe passes its groups (the bridge).
//!
//! The cut rows are judged from the stream client's report ([`cozyplane_probe::stream`])
//! against the moments the test deleted and re-created the object ([`Window`]).
use std::net::{IpAddr, SocketAddr};

use cozyplane_api::labels::{ANNOTATION_VPC, ANNOTATION_VPC_IP};
use cozyplane_api::sdn::{
    LocalVPCRef, ObjectRef, SecurityGroupEgressRule, SecurityGroupIngressRule, SecurityGroupPeer,
    SecurityGroupPort, SecurityGroupSpec, VPCBindingSpec, VPCPeeringSpec, VPCRef, VPCSpec,
};
use cozyplane_api::{SecurityGroup, VPCBinding, VPCPeering, VPC};
use cozyplane_probe::stream::StreamReport;
use cozyplane_probe::{Outcome, Proto};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::matrix::PlannedCheck;
use crate::pods::{self, ServerPod};

/// The label the security-group rows' groups select by.
pub const SG_LABEL: &str = "cozyplane.io/sg";
/// The policed server (t1's VPC, node B; label `cozyplane.io/sg=api`).
pub const SG_API: &str = "sg-api";
/// The policed client (t1's VPC, node A; label `cozyplane.io/sg=web`).
pub const SG_WEB: &str = "sg-web";
/// The one port group `web` may use to reach group `api`.
pub const SG_PORT: u16 = 8000;

/// The security-group rows' two groups in t1's namespace (see the module docs):
/// `api` admits only TCP [`SG_PORT`] from `web`; `web` sends only TCP [`SG_PORT`] to `api`.
pub fn security_groups(base: &str) -> [SecurityGroup; 2] {
    let ns = Tenant::T1.namespace(base);
    let selector = |v: &str| LabelSelector {
        match_labels: Some([(SG_LABEL.to_string(), v.to_string())].into()),
        ..LabelSelector::default()
    };
    let peer = |g: &str| SecurityGroupPeer {
        group: Some(g.into()),
        ..SecurityGroupPeer::default()
    };
    let tcp = || {
        vec![SecurityGroupPort {
            protocol: "TCP".into(),
            port: i32::from(SG_PORT),
            end_port: None,
        }]
    };
    let group = |name: &str, spec: SecurityGroupSpec| {
        let mut g = SecurityGroup::new(name, spec);
        g.metadata.namespace = Some(ns.clone());
        g
    };
    let vpc_ref = || LocalVPCRef {
        name: VPC_NAME.into(),
    };
    [
        group(
            "api",
            SecurityGroupSpec {
                vpc_ref: vpc_ref(),
                pod_selector: Some(selector("api")),
                ingress: vec![SecurityGroupIngressRule {
                    from: peer("web"),
                    ports: tcp(),
                }],
                egress: Vec::new(),
            },
        ),
        group(
            "web",
            SecurityGroupSpec {
                vpc_ref: vpc_ref(),
                pod_selector: Some(selector("web")),
                ingress: Vec::new(),
                egress: vec![SecurityGroupEgressRule {
                    to: peer("api"),
                    ports: tcp(),
                }],
            },
        ),
    ]
}

/// The policed server `sg-api`: a t1 VPC server on `node` in group `api`.
pub fn sg_server(base: &str, node: &str) -> ServerPod {
    ServerPod {
        name: SG_API,
        node: node.to_string(),
        host_network: false,
        vpc: Some(Tenant::T1.vpc_annotation(base)),
        answer: Some(Tenant::T1.answer(SG_API)),
        stream: false,
    }
}

/// Puts `pod` in the rows' group `group` (`api` or `web`).
pub fn join_group(pod: &mut Pod, group: &str) {
    pod.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(SG_LABEL.into(), group.into());
}

/// Default CIDR of both tenants' VPCs (`--tenancy-cidr`).
pub const DEFAULT_CIDR: &str = "10.250.0.0/24";
/// Default CIDR of the peer tenant t3's VPC (`--tenancy-peer-cidr`): disjoint from t1's.
pub const DEFAULT_PEER_CIDR: &str = "10.251.0.0/24";
/// Name of each peering half (in t1's and t3's namespaces).
pub const PEERING_NAME: &str = "peer";
/// The peer tenant's client pod (in t3, node A).
pub const PEER_CLIENT: &str = "peer-client";
/// The stream client of the peered group (in t1, node A).
pub const PEER_STREAM: &str = "peer-stream";
/// The stream client of the revoked group (in `<ns>-revoke`, node A, in t1's VPC).
pub const REVOKE_STREAM: &str = "stream-client";
/// A live stream must be cut this soon after its binding is deleted (issue #10: 1 s).
pub const REVOKE_DEADLINE_MS: u64 = 1000;
/// … and after a peering half is deleted.
pub const UNPEER_DEADLINE_MS: u64 = 2000;
/// How long after a re-created binding the severed pod must still find no way out.
pub const STAYS_CUT_MS: u64 = 3000;
/// A stream client sends a line this often …
pub const STREAM_INTERVAL_MS: u64 = 50;
/// … and gives up on its echo (the cut) after this long.
pub const ECHO_TIMEOUT_MS: u64 = 500;
/// Pause between the reconnect attempts after a cut.
pub const RECONNECT_EVERY_MS: u64 = 200;
/// The revoked stream client tries to reconnect this long after the cut: the binding
/// comes back about 1.5 s after the cut, so this watches it for over [`STAYS_CUT_MS`].
pub const REVOKE_HOLD_MS: u64 = 8000;
/// The peered stream client tries this long for the peering to come back (it stops at
/// the first new connection that works).
pub const PEER_HOLD_MS: u64 = 15_000;
/// Name of each tenant's VPC and of its binding.
pub const VPC_NAME: &str = "net";
/// The VPC client's pod name (in t1).
pub const VPC_CLIENT: &str = "vpc-client";
/// The pod asking for t1's VPC without a binding.
pub const UNBOUND: &str = "unbound";

/// A tenant of the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tenant {
    /// Owns the VPC the client is in.
    T1,
    /// Owns the twin VPC (same CIDR).
    T2,
    /// Owns the VPC peered with t1's (a disjoint CIDR).
    T3,
}

impl Tenant {
    /// Every tenant.
    pub const ALL: [Tenant; 3] = [Tenant::T1, Tenant::T2, Tenant::T3];

    /// `t1`, `t2` or `t3`: the namespace suffix and the prefix of its servers' answers.
    pub fn short(self) -> &'static str {
        match self {
            Tenant::T1 => "t1",
            Tenant::T2 => "t2",
            Tenant::T3 => "t3",
        }
    }

    /// Its VPC's CIDR: the twins share `twin_cidr`, t3 has `peer_cidr`.
    pub fn cidr<'a>(self, twin_cidr: &'a str, peer_cidr: &'a str) -> &'a str {
        match self {
            Tenant::T1 | Tenant::T2 => twin_cidr,
            Tenant::T3 => peer_cidr,
        }
    }

    /// The tenant's namespace, `<base>-t1`.
    pub fn namespace(self, base: &str) -> String {
        format!("{base}-{}", self.short())
    }

    /// What a server of this tenant answers: `t1/echo-a`.
    pub fn answer(self, server: &str) -> String {
        format!("{}/{server}", self.short())
    }

    /// The pod annotation attaching to this tenant's VPC: `<ns>-t1/net`.
    pub fn vpc_annotation(self, base: &str) -> String {
        format!("{}/{VPC_NAME}", self.namespace(base))
    }
}

/// The namespace of the unbound pod, `<base>-unbound`.
pub fn unbound_namespace(base: &str) -> String {
    format!("{base}-{UNBOUND}")
}

/// The namespace of the revoked group's stream client, `<base>-revoke`.
pub fn revoke_namespace(base: &str) -> String {
    format!("{base}-revoke")
}

/// The revoked group's binding: `net` in `<base>-revoke`, for t1's VPC.
pub fn revoke_binding(base: &str) -> VPCBinding {
    let mut b = binding(Tenant::T1, base);
    b.metadata.namespace = Some(revoke_namespace(base));
    b
}

/// The peering half `peer` in `local`'s namespace, naming `remote`'s VPC.
pub fn peering(local: Tenant, remote: Tenant, base: &str) -> VPCPeering {
    let mut p = VPCPeering::new(
        PEERING_NAME,
        VPCPeeringSpec {
            vpc_ref: LocalVPCRef {
                name: VPC_NAME.into(),
            },
            peer_ref: ObjectRef {
                namespace: remote.namespace(base),
                name: VPC_NAME.into(),
            },
        },
    );
    p.metadata.namespace = Some(local.namespace(base));
    p
}

/// Why an existing peering half cannot be used, if it cannot.
pub fn peering_mismatch(existing: &VPCPeering, wanted: &VPCPeering) -> Option<String> {
    (existing.spec != wanted.spec).then(|| {
        let ns = wanted.metadata.namespace.as_deref().unwrap_or_default();
        format!(
            "VPCPeering {ns}/{PEERING_NAME} exists but peers VPC {} with {}/{}: delete it \
             (kubectl -n {ns} delete vpcpeering {PEERING_NAME}) and run again",
            existing.spec.vpc_ref.name,
            existing.spec.peer_ref.namespace,
            existing.spec.peer_ref.name
        )
    })
}

/// Whether a peering half is live (phase Ready).
pub fn peering_ready(p: &VPCPeering) -> bool {
    p.status
        .as_ref()
        .is_some_and(|s| s.phase.as_deref() == Some("Ready"))
}

/// The tenant's VPC `net` with `cidr`.
pub fn vpc(tenant: Tenant, base: &str, cidr: &str) -> VPC {
    let mut v = VPC::new(
        VPC_NAME,
        VPCSpec {
            cidrs: vec![cidr.to_string()],
            mtu: None,
        },
    );
    v.metadata.namespace = Some(tenant.namespace(base));
    v
}

/// The binding letting the tenant's own namespace attach to its VPC.
pub fn binding(tenant: Tenant, base: &str) -> VPCBinding {
    let mut b = VPCBinding::new(
        VPC_NAME,
        VPCBindingSpec {
            vpc_ref: VPCRef {
                namespace: Some(tenant.namespace(base)),
                name: VPC_NAME.into(),
            },
        },
    );
    b.metadata.namespace = Some(tenant.namespace(base));
    b
}

/// Why an existing VPC cannot be used, if it cannot (a different CIDR: its Ports would
/// not match the plan, and changing it under live pods is not ours to do).
pub fn vpc_mismatch(existing: &VPC, wanted: &VPC) -> Option<String> {
    (existing.spec.cidrs != wanted.spec.cidrs).then(|| {
        format!(
            "VPC {}/{VPC_NAME} exists with CIDRs {:?}, not {:?}: delete its namespace \
             (kubectl delete namespace {0}) or pass --tenancy-cidr {}",
            wanted.metadata.namespace.as_deref().unwrap_or_default(),
            existing.spec.cidrs,
            wanted.spec.cidrs,
            existing
                .spec
                .cidrs
                .first()
                .map(String::as_str)
                .unwrap_or("…"),
        )
    })
}

/// Why an existing binding cannot be used, if it cannot.
pub fn binding_mismatch(existing: &VPCBinding, wanted: &VPCBinding) -> Option<String> {
    let ns = wanted.metadata.namespace.as_deref().unwrap_or_default();
    let refers = |b: &VPCBinding| {
        (
            b.spec
                .vpc_ref
                .namespace
                .clone()
                .unwrap_or_else(|| ns.into()),
            b.spec.vpc_ref.name.clone(),
        )
    };
    (refers(existing) != refers(wanted)).then(|| {
        let (vns, v) = refers(existing);
        format!(
            "VPCBinding {ns}/{VPC_NAME} exists but references VPC {vns}/{v}: delete it \
             (kubectl -n {ns} delete vpcbinding {VPC_NAME}) and run again"
        )
    })
}

/// Whether the VPC is Ready (has its VNI).
pub fn vpc_ready(v: &VPC) -> bool {
    v.status
        .as_ref()
        .is_some_and(|s| s.phase.as_deref() == Some("Ready") && s.vni.is_some())
}

/// The servers of one tenant: `echo-a` on node A, `echo-b` on node B and `echo-c` on
/// node C (the nodes the cluster has), in its VPC, with a stream port for the cut rows.
pub fn servers(
    tenant: Tenant,
    base: &str,
    node_a: &str,
    node_b: Option<&str>,
    node_c: Option<&str>,
) -> Vec<ServerPod> {
    let on = |name: &'static str, node: &str| ServerPod {
        name,
        node: node.to_string(),
        host_network: false,
        vpc: Some(tenant.vpc_annotation(base)),
        answer: Some(tenant.answer(name)),
        stream: true,
    };
    let mut out = vec![on("echo-a", node_a)];
    out.extend(node_b.map(|b| on("echo-b", b)));
    out.extend(node_c.map(|c| on("echo-c", c)));
    out
}

/// The pod asking for t1's VPC from a namespace without a binding (on node A).
pub fn unbound_pod(base: &str, node_a: &str, image: &str) -> Pod {
    let mut p = pods::server_pod(
        &ServerPod {
            name: UNBOUND,
            node: node_a.to_string(),
            host_network: false,
            vpc: Some(Tenant::T1.vpc_annotation(base)),
            answer: None,
            stream: false,
        },
        image,
    );
    p.metadata.namespace = Some(unbound_namespace(base));
    p
}

/// Adds the VPC annotation to a pod (the VPC client).
pub fn attach(pod: &mut Pod, vpc_annotation: &str) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_VPC.into(), vpc_annotation.into());
}

/// The pod's VPC address from `sdn.cozystack.io/vpc-ip` (a comma list: the first IPv4,
/// else the first address), once the agent has stamped it.
pub fn vpc_ip(pod: &Pod) -> Option<IpAddr> {
    let list = pod.metadata.annotations.as_ref()?.get(ANNOTATION_VPC_IP)?;
    let ips: Vec<IpAddr> = list
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    ips.iter().find(|i| i.is_ipv4()).or(ips.first()).copied()
}

/// A namespace object (labelled as the test's).
pub fn namespace_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some([(pods::APP_LABEL.to_string(), pods::APP_VALUE.to_string())].into()),
        ..Default::default()
    }
}

/// What the unbound pod shows so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoBinding {
    /// Not started, and its status or an event names the missing binding (the text).
    Refused(String),
    /// It started (or got a pod IP): attachment was not denied.
    Started(String),
    /// Nothing conclusive yet.
    Pending,
}

/// The error the agent gives for the unbound pod (its namespace, t1's VPC).
pub fn no_binding_message(base: &str) -> String {
    format!(
        "no VPCBinding in namespace {} references VPC {}/{VPC_NAME}",
        unbound_namespace(base),
        Tenant::T1.namespace(base)
    )
}

/// The event `kubectl describe pod` must show for the unbound pod: a Warning with reason
/// `FailedCreatePodSandBox` about this very pod (its UID) whose message names the missing
/// binding. Returns its reason and message, `None` if there is no such event (yet).
pub fn no_binding_event(base: &str, uid: Option<&str>, events: &[Event]) -> Option<String> {
    let want = no_binding_message(base);
    events
        .iter()
        .filter(|e| uid.is_some() && e.involved_object.uid.as_deref() == uid)
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| e.reason.as_deref() == Some(FAILED_CREATE_POD_SANDBOX))
        .find_map(|e| {
            let m = e.message.as_deref()?;
            m.contains(&want)
                .then(|| format!("Warning {FAILED_CREATE_POD_SANDBOX}: {m}"))
        })
}

/// kube's event reason for a pod whose network cannot be set up.
pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";

/// The pods of a VPC and their VPC addresses (`sdn.cozystack.io/vpc-ip`): which pod
/// holds an address, whatever namespace it is in (`vpc` is its `<ns>/<name>` annotation).
pub fn vpc_holders(pods: &[Pod], vpc: &str) -> Vec<(IpAddr, String)> {
    pods.iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_VPC))
                .is_some_and(|v| v == vpc)
        })
        .filter_map(|p| {
            let ip = vpc_ip(p)?;
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let name = p.metadata.name.as_deref().unwrap_or_default();
            Some((ip, format!("{ns}/{name}")))
        })
        .collect()
}

/// A blocked ICMP row whose target address turned out to be held by a pod of the
/// client's own VPC (a client, say, whose address is only known once it runs): an echo
/// reply there is that pod's, as for TCP/UDP a twin address the own VPC holds must reach
/// the own holder. Returns the row's outcome judged that way (a reply passes, naming the
/// holder), or `None` when the rule does not apply (then the outcome stands).
pub fn own_holder_outcome(
    check: &PlannedCheck,
    outcome: &Outcome,
    own_holders: &[(IpAddr, String)],
) -> Option<Outcome> {
    if !(check.expect_blocked && check.proto == Proto::Icmp) || outcome.ok {
        return None;
    }
    let ip = check.target.as_deref()?.parse::<SocketAddr>().ok()?.ip();
    let (_, holder) = own_holders.iter().find(|(held, _)| *held == ip)?;
    let reply = format!("echo reply from {ip}");
    (outcome.answer.as_deref() == Some(reply.as_str())).then(|| Outcome {
        answer: Some(format!(
            "{reply}: {ip} is also {holder} of the client's own VPC, which answered"
        )),
        error: None,
        ok: true,
        ..outcome.clone()
    })
}

/// Reads the unbound pod's fate from its status and its events' messages: refused when
/// it is not running and some text names the missing binding (the lab kubelet puts the
/// CNI error in the container's waiting message; a real kubelet in a
/// FailedCreatePodSandBox event).
pub fn no_binding_verdict(base: &str, pod: &Pod, events: &[String]) -> NoBinding {
    let st = pod.status.as_ref();
    let running = st.is_some_and(|s| matches!(s.phase.as_deref(), Some("Running" | "Succeeded")))
        || st
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            });
    let has_ip = st.is_some_and(|s| s.pod_ip.as_deref().is_some_and(|i| !i.is_empty()));
    if running || has_ip {
        return NoBinding::Started(format!(
            "pod {UNBOUND} started without a VPCBinding ({})",
            crate::state::describe(pod)
        ));
    }
    let want = no_binding_message(base);
    let mut texts: Vec<&str> = Vec::new();
    if let Some(s) = st {
        texts.extend(s.message.as_deref());
        for c in s.container_statuses.iter().flatten() {
            texts.extend(
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.message.as_deref()),
            );
        }
    }
    texts.extend(events.iter().map(String::as_str));
    match texts.into_iter().find(|t| t.contains(&want)) {
        Some(t) => NoBinding::Refused(t.to_string()),
        None => NoBinding::Pending,
    }
}

/// When the test deleted an object and when (if) it re-created it, in Unix ms of its own
/// clock (the stream client's report is in the pod's; see [`cozyplane_probe::stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Just before the delete call.
    pub issued: u64,
    /// Just after it returned.
    pub returned: u64,
    /// Just after the re-create returned.
    pub recreated: Option<u64>,
}

/// A judged row: pass or fail, a time for the matrix's column, and the text shown.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// Passed.
    pub ok: bool,
    /// Milliseconds to show (the cut time, the time to come back).
    pub ms: f64,
    /// What was measured, or why it failed.
    pub text: String,
}

fn judged(ok: bool, ms: i64, text: String) -> Judged {
    // Clamped at 0: a cut seen before the delete returned took no time after it.
    Judged {
        ok,
        ms: ms.max(0) as f64,
        text,
    }
}

fn secs(ms: i64) -> String {
    format!("{:.2} s", ms as f64 / 1000.0)
}

/// The cut: the stream was up before the delete, and its last echo came back at most
/// `deadline_ms` after the delete returned (then it failed). `what` names the object.
pub fn cut_verdict(r: &StreamReport, w: &Window, deadline_ms: u64, what: &str) -> Judged {
    let signed = |t: u64| i64::try_from(t).unwrap_or(i64::MAX);
    let Some(up) = r.connected_at else {
        let why = r.error.clone().unwrap_or_else(|| "no connection".into());
        return judged(false, 0, format!("the stream never came up: {why}"));
    };
    if up > w.issued {
        return judged(
            false,
            0,
            format!("the stream came up only after {what} was deleted: nothing to cut"),
        );
    }
    let (Some(last), Some(cut)) = (r.last_echo_at, r.cut_at) else {
        let why = r.error.clone().unwrap_or_else(|| "still streaming".into());
        return judged(
            false,
            0,
            format!(
                "the stream was not cut after deleting {what} ({} echoes; {why})",
                r.echoes
            ),
        );
    };
    let cut_err = r.cut_error.clone().unwrap_or_default();
    if cut < w.issued {
        return judged(
            false,
            0,
            format!(
                "the stream broke {} before {what} was deleted ({cut_err}): not the revocation",
                secs(signed(w.issued) - signed(cut))
            ),
        );
    }
    let after = signed(last) - signed(w.returned);
    let text = format!(
        "cut {} after deleting {what} (last echo; failure seen after {}, {} echoes: {cut_err})",
        secs(after),
        secs(signed(cut) - signed(w.returned)),
        r.echoes
    );
    if after > signed(deadline_ms) {
        return judged(
            false,
            after,
            format!("{text}: later than {}", secs(signed(deadline_ms))),
        );
    }
    judged(true, after, text)
}

/// After the cut, no fresh connection worked before the object was re-created (a
/// successful one before that means the path was not closed, only the stream lost).
pub fn no_reconnect_before(r: &StreamReport, w: &Window, what: &str) -> Option<String> {
    let until = w.recreated.unwrap_or(u64::MAX);
    r.reconnects
        .iter()
        .find(|a| a.ok && a.from < until)
        .map(|a| {
            format!(
                "a new connection worked {} after deleting {what}, before it was re-created",
                secs(i64::try_from(a.from).unwrap_or(0) - i64::try_from(w.returned).unwrap_or(0))
            )
        })
}

/// Revoked: every reconnect failed, and they went on at least `watch_ms` after the
/// binding was re-created (else the proof is too short to count).
pub fn stays_cut_verdict(r: &StreamReport, w: &Window, watch_ms: u64) -> Judged {
    let Some(back) = w.recreated else {
        return judged(false, 0, "the binding was not re-created".into());
    };
    if r.cut_at.is_none() {
        return judged(false, 0, "the stream was never cut".into());
    }
    if let Some(a) = r.reconnects.iter().find(|a| a.ok) {
        let d = i64::try_from(a.from).unwrap_or(0) - i64::try_from(back).unwrap_or(0);
        return judged(
            false,
            d,
            format!(
                "the severed pod connected again {} after the binding was re-created",
                secs(d)
            ),
        );
    }
    let tries: u32 = r.reconnects.iter().map(|a| a.count).sum();
    let last = r.reconnects.last().map(|a| a.to).unwrap_or(0);
    let watched = i64::try_from(last).unwrap_or(0) - i64::try_from(back).unwrap_or(0);
    if watched < i64::try_from(watch_ms).unwrap_or(i64::MAX) {
        return judged(
            false,
            watched,
            format!(
                "inconclusive: the client stopped trying {} after the binding was re-created \
                 (wanted {})",
                secs(watched),
                secs(i64::try_from(watch_ms).unwrap_or(0))
            ),
        );
    }
    judged(
        true,
        watched,
        format!(
            "all {tries} new connections failed, the last {} after the binding was re-created",
            secs(watched)
        ),
    )
}

/// Peered, half re-created: a fresh connection works again after the re-create, and none
/// did between the cut and the re-create.
pub fn comes_back_verdict(r: &StreamReport, w: &Window, what: &str) -> Judged {
    let Some(back) = w.recreated else {
        return judged(false, 0, format!("{what} was not re-created"));
    };
    if r.cut_at.is_none() {
        return judged(false, 0, "the stream was never cut".into());
    }
    if let Some(why) = no_reconnect_before(r, w, what) {
        return judged(false, 0, why);
    }
    match r.reconnects.iter().find(|a| a.ok) {
        Some(a) => {
            let d = i64::try_from(a.from).unwrap_or(0) - i64::try_from(back).unwrap_or(0);
            judged(
                true,
                d,
                format!(
                    "a new connection worked {} after {what} was re-created",
                    secs(d)
                ),
            )
        }
        None => {
            let tried = r.reconnects.last().map(|a| a.to).unwrap_or(back);
            judged(
                false,
                0,
                format!(
                    "no new connection worked in the {} after {what} was re-created",
                    secs(i64::try_from(tried).unwrap_or(0) - i64::try_from(back).unwrap_or(0))
                ),
            )
        }
    }
}

/// The severed pod is still the same pod, Running, its container running and never
/// restarted (`uid` as it was when the stream came up).
pub fn still_running_verdict(pod: Option<&Pod>, uid: Option<&str>) -> Judged {
    let Some(p) = pod else {
        return judged(false, 0, "the pod is gone".into());
    };
    if p.metadata.uid.as_deref() != uid || p.metadata.deletion_timestamp.is_some() {
        return judged(false, 0, "the pod was replaced or is being deleted".into());
    }
    let st = p.status.as_ref();
    let phase = st.and_then(|s| s.phase.as_deref()).unwrap_or("unknown");
    let c = st
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first());
    let restarts = c.map(|c| c.restart_count).unwrap_or(0);
    let running = c.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    let ok = phase == "Running" && running && restarts == 0;
    let text = format!(
        "phase {phase}, container {}, {restarts} restarts",
        if running { "running" } else { "not running" }
    );
    judged(ok, 0, text)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_security_groups_admit_only_tcp_8000_from_web_and_select_by_label() {
        let [api, web] = security_groups(BASE);
        let ns = Some(Tenant::T1.namespace(BASE));
        assert_eq!(
            (
                api.metadata.namespace.clone(),
                web.metadata.namespace.clone()
            ),
            (ns.clone(), ns)
        );
        let v = serde_json::to_value(&api.spec).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "vpcRef": {"name": "net"},
                "podSelector": {"matchLabels": {"cozyplane.io/sg": "api"}},
                "ingress": [{"from": {"group": "web"}, "ports": [{"protocol": "TCP", "port": 8000}]}]
            })
        );
        let v = serde_json::to_value(&web.spec).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "vpcRef": {"name": "net"},
                "podSelector": {"matchLabels": {"cozyplane.io/sg": "web"}},
                "egress": [{"to": {"group": "api"}, "ports": [{"protocol": "TCP", "port": 8000}]}]
            })
        );
        let mut pod = pods::server_pod(&sg_server(BASE, "n2"), "img");
        join_group(&mut pod, "api");
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels.get(SG_LABEL).map(String::as_str), Some("api"));
        assert_eq!(
            pod.metadata
                .annotations
                .unwrap()
                .get(ANNOTATION_VPC)
                .map(String::as_str),
            Some(Tenant::T1.vpc_annotation(BASE).as_str())
        );
    }

    use super::*;

    const BASE: &str = "cozyplane-connectivity";

    #[test]
    fn tenants_share_one_cidr_and_bind_their_own_vpc() {
        let v1 = vpc(Tenant::T1, BASE, DEFAULT_CIDR);
        let v2 = vpc(Tenant::T2, BASE, DEFAULT_CIDR);
        assert_eq!(
            v1.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-t1")
        );
        assert_eq!(
            v2.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-t2")
        );
        assert_eq!(v1.spec.cidrs, ["10.250.0.0/24"]);
        assert_eq!(v1.spec.cidrs, v2.spec.cidrs, "twin VPCs overlap on purpose");
        let b = binding(Tenant::T2, BASE);
        assert_eq!(
            b.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-t2")
        );
        assert_eq!(
            b.spec.vpc_ref,
            VPCRef {
                namespace: Some("cozyplane-connectivity-t2".into()),
                name: "net".into()
            }
        );
        assert_eq!(unbound_namespace(BASE), "cozyplane-connectivity-unbound");
    }

    #[test]
    fn existing_objects_are_reused_only_when_they_match() {
        let want = vpc(Tenant::T1, BASE, DEFAULT_CIDR);
        assert_eq!(vpc_mismatch(&want.clone(), &want), None);
        let other = vpc(Tenant::T1, BASE, "10.9.0.0/24");
        let why = vpc_mismatch(&other, &want).expect("mismatch");
        assert!(
            why.contains("10.9.0.0/24") && why.contains("--tenancy-cidr"),
            "{why}"
        );

        let b = binding(Tenant::T1, BASE);
        let mut implicit = b.clone();
        implicit.spec.vpc_ref.namespace = None; // defaults to the binding's namespace
        assert_eq!(binding_mismatch(&implicit, &b), None);
        let mut elsewhere = b.clone();
        elsewhere.spec.vpc_ref.namespace = Some("cozyplane-connectivity-t2".into());
        let why = binding_mismatch(&elsewhere, &b).expect("mismatch");
        assert!(
            why.contains("references VPC cozyplane-connectivity-t2/net"),
            "{why}"
        );
    }

    #[test]
    fn vpc_servers_answer_with_their_tenant_and_attach_by_annotation() {
        let s = servers(Tenant::T2, BASE, "n1", Some("n2"), None);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].name, s[0].node.as_str()), ("echo-a", "n1"));
        assert_eq!((s[1].name, s[1].node.as_str()), ("echo-b", "n2"));
        let p = pods::server_pod(&s[1], "img:1");
        let ann = p.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(
            ann.get(ANNOTATION_VPC).map(String::as_str),
            Some("cozyplane-connectivity-t2/net")
        );
        let cmd = p.spec.as_ref().expect("spec").containers[0]
            .command
            .clone()
            .expect("command");
        assert!(
            cmd.windows(2).any(|w| w == ["--name", "t2/echo-b"]),
            "{cmd:?}"
        );
        // The kubelet could probe only the fabric address (no bridge yet): no readiness probe.
        assert!(p.spec.as_ref().expect("spec").containers[0]
            .readiness_probe
            .is_none());
        // The other tenant's server is a different pod spec (never reused for it).
        let t1 = pods::server_pod(
            &servers(Tenant::T1, BASE, "n1", Some("n2"), None)[1],
            "img:1",
        );
        assert!(!pods::same_spec(&p, &t1));
        assert_eq!(servers(Tenant::T1, BASE, "n1", None, None).len(), 1);
        let three = servers(Tenant::T1, BASE, "n1", Some("n2"), Some("n3"));
        let got: Vec<(&str, &str)> = three.iter().map(|s| (s.name, s.node.as_str())).collect();
        assert_eq!(got, [("echo-a", "n1"), ("echo-b", "n2"), ("echo-c", "n3")]);
        assert_eq!(three[2].answer.as_deref(), Some("t1/echo-c"));

        let u = unbound_pod(BASE, "n1", "img:1");
        assert_eq!(
            u.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-unbound")
        );
        assert_eq!(
            u.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_VPC))
                .map(String::as_str),
            Some("cozyplane-connectivity-t1/net")
        );
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod json")
    }

    #[test]
    fn vpc_ip_prefers_ipv4_from_the_comma_list() {
        let p = |v: &str| {
            pod(
                serde_json::json!({"metadata": {"name": "x", "annotations": {ANNOTATION_VPC_IP: v}}}),
            )
        };
        assert_eq!(vpc_ip(&p("10.250.0.3")), "10.250.0.3".parse().ok());
        assert_eq!(vpc_ip(&p("fd00::3, 10.250.0.3")), "10.250.0.3".parse().ok());
        assert_eq!(vpc_ip(&p("fd00::3")), "fd00::3".parse().ok());
        assert_eq!(vpc_ip(&p("")), None);
        assert_eq!(
            vpc_ip(&pod(serde_json::json!({"metadata": {"name": "x"}}))),
            None
        );
    }

    fn report(up: u64, last: u64, cut: u64, runs: &[(bool, u64, u64)]) -> StreamReport {
        let mut r = StreamReport {
            connected_at: Some(up),
            echoes: 40,
            last_echo_at: Some(last),
            cut_at: Some(cut),
            cut_error: Some("echo: no answer within 500 ms".into()),
            ..Default::default()
        };
        for &(ok, from, to) in runs {
            r.record(
                ok,
                from,
                to,
                (!ok).then(|| "connect: no answer within 500 ms".into()),
            );
        }
        r
    }

    const W: Window = Window {
        issued: 10_000,
        returned: 10_050,
        recreated: Some(12_000),
    };

    #[test]
    fn a_cut_is_measured_from_the_delete_and_held_to_its_deadline() {
        // Last echo 0.3 s after the delete returned, failure seen 0.5 s later.
        let r = report(5_000, 10_350, 10_850, &[(false, 10_900, 18_000)]);
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "VPCBinding x/net");
        assert!(j.ok, "{j:?}");
        assert_eq!(j.ms, 300.0);
        assert!(
            j.text
                .starts_with("cut 0.30 s after deleting VPCBinding x/net"),
            "{}",
            j.text
        );
        // Cut before the delete returned (the agent was quick): 0 ms, a pass.
        let r = report(5_000, 10_020, 10_520, &[]);
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b");
        assert!(j.ok && j.ms == 0.0, "{j:?}");
        // Too late: echoes came back 1.2 s after the delete.
        let r = report(5_000, 11_250, 11_750, &[]);
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b");
        assert!(!j.ok && j.text.contains("later than 1.00 s"), "{j:?}");
        assert!(cut_verdict(&r, &W, UNPEER_DEADLINE_MS, "b").ok);
        // Broken before the delete was issued: not the revocation.
        let r = report(5_000, 9_000, 9_500, &[]);
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b");
        assert!(!j.ok && j.text.contains("before b was deleted"), "{j:?}");
        // Came up after the delete: nothing was cut.
        let r = report(10_010, 10_300, 10_800, &[]);
        assert!(!cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b").ok);
        // Never cut, never up.
        let mut r = report(5_000, 10_300, 10_800, &[]);
        r.cut_at = None;
        r.error = Some("never cut within 180000 ms".into());
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b");
        assert!(!j.ok && j.text.contains("was not cut"), "{j:?}");
        let r = StreamReport {
            error: Some("never connected within 120000 ms: connect: refused".into()),
            ..Default::default()
        };
        let j = cut_verdict(&r, &W, REVOKE_DEADLINE_MS, "b");
        assert!(!j.ok && j.text.contains("never came up"), "{j:?}");
    }

    #[test]
    fn a_severed_pod_must_stay_cut_long_enough_after_the_binding_is_back() {
        let r = report(5_000, 10_300, 10_800, &[(false, 11_000, 17_000)]);
        let j = stays_cut_verdict(&r, &W, STAYS_CUT_MS);
        assert!(j.ok, "{j:?}");
        assert_eq!(j.ms, 5000.0);
        assert!(j.text.contains("the last 5.00 s after"), "{}", j.text);
        // Reconnected after the binding came back: the quarantine leaked.
        let r = report(
            5_000,
            10_300,
            10_800,
            &[(false, 11_000, 12_500), (true, 12_700, 12_750)],
        );
        let j = stays_cut_verdict(&r, &W, STAYS_CUT_MS);
        assert!(
            !j.ok && j.text.contains("connected again 0.70 s after"),
            "{j:?}"
        );
        // Stopped trying too soon after the re-create: inconclusive is a failure.
        let r = report(5_000, 10_300, 10_800, &[(false, 11_000, 13_000)]);
        let j = stays_cut_verdict(&r, &W, STAYS_CUT_MS);
        assert!(!j.ok && j.text.starts_with("inconclusive"), "{j:?}");
        // No re-create, no cut.
        let w = Window {
            recreated: None,
            ..W
        };
        assert!(!stays_cut_verdict(&r, &w, STAYS_CUT_MS).ok);
        let mut uncut = r.clone();
        uncut.cut_at = None;
        assert!(!stays_cut_verdict(&uncut, &W, STAYS_CUT_MS).ok);
    }

    #[test]
    fn a_peering_comes_back_only_after_its_half_is_recreated() {
        let r = report(
            5_000,
            10_300,
            10_800,
            &[(false, 11_000, 12_900), (true, 13_100, 13_150)],
        );
        assert_eq!(no_reconnect_before(&r, &W, "p"), None);
        let j = comes_back_verdict(&r, &W, "p");
        assert!(j.ok && j.ms == 1100.0, "{j:?}");
        // Worked again while the half was still deleted: the path never closed.
        let r = report(
            5_000,
            10_300,
            10_800,
            &[(false, 11_000, 11_400), (true, 11_600, 11_650)],
        );
        let why = no_reconnect_before(&r, &W, "p").expect("leak");
        assert!(
            why.contains("1.55 s after deleting p, before it was re-created"),
            "{why}"
        );
        assert!(!comes_back_verdict(&r, &W, "p").ok);
        // Never came back.
        let r = report(5_000, 10_300, 10_800, &[(false, 11_000, 26_000)]);
        let j = comes_back_verdict(&r, &W, "p");
        assert!(
            !j.ok && j.text.contains("no new connection worked in the 14.00 s"),
            "{j:?}"
        );
    }

    #[test]
    fn the_severed_pod_must_be_the_same_running_pod() {
        let p = |phase: &str, restarts: i32, state: serde_json::Value| {
            pod(
                serde_json::json!({"metadata": {"name": "stream-client", "uid": "u1"},
                "status": {"phase": phase, "containerStatuses": [{"name": "probe", "image": "i",
                "imageID": "", "ready": false, "restartCount": restarts, "state": state}]}}),
            )
        };
        let running = p("Running", 0, serde_json::json!({"running": {}}));
        let j = still_running_verdict(Some(&running), Some("u1"));
        assert!(j.ok, "{j:?}");
        assert_eq!(j.text, "phase Running, container running, 0 restarts");
        assert!(
            !still_running_verdict(Some(&running), Some("u0")).ok,
            "replaced"
        );
        assert!(!still_running_verdict(None, Some("u1")).ok, "gone");
        let restarted = p("Running", 1, serde_json::json!({"running": {}}));
        assert!(!still_running_verdict(Some(&restarted), Some("u1")).ok);
        let ended = p(
            "Failed",
            0,
            serde_json::json!({"terminated": {"exitCode": 137}}),
        );
        let j = still_running_verdict(Some(&ended), Some("u1"));
        assert!(!j.ok && j.text.contains("phase Failed"), "{j:?}");
    }

    #[test]
    fn the_peer_tenant_and_the_revoke_binding() {
        assert_eq!(
            Tenant::T3.cidr(DEFAULT_CIDR, DEFAULT_PEER_CIDR),
            "10.251.0.0/24"
        );
        assert_eq!(
            Tenant::T2.cidr(DEFAULT_CIDR, DEFAULT_PEER_CIDR),
            "10.250.0.0/24"
        );
        let half = peering(Tenant::T3, Tenant::T1, BASE);
        assert_eq!(
            half.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-t3")
        );
        assert_eq!(half.metadata.name.as_deref(), Some(PEERING_NAME));
        assert_eq!(half.spec.vpc_ref.name, "net");
        assert_eq!(
            (
                half.spec.peer_ref.namespace.as_str(),
                half.spec.peer_ref.name.as_str()
            ),
            ("cozyplane-connectivity-t1", "net")
        );
        assert_eq!(peering_mismatch(&half.clone(), &half), None);
        let other = peering(Tenant::T3, Tenant::T2, BASE);
        let why = peering_mismatch(&other, &half).expect("mismatch");
        assert!(why.contains("with cozyplane-connectivity-t2/net"), "{why}");
        assert!(!peering_ready(&half));
        let mut ready = half.clone();
        ready.status = Some(cozyplane_api::sdn::VPCPeeringStatus {
            phase: Some("Ready".into()),
            ..Default::default()
        });
        assert!(peering_ready(&ready));

        let b = revoke_binding(BASE);
        assert_eq!(
            b.metadata.namespace.as_deref(),
            Some("cozyplane-connectivity-revoke")
        );
        assert_eq!(
            b.spec.vpc_ref,
            VPCRef {
                namespace: Some("cozyplane-connectivity-t1".into()),
                name: "net".into()
            }
        );
        // The t3 servers serve the stream port, the unbound pod does not need one.
        let s = servers(Tenant::T3, BASE, "n1", Some("n2"), None);
        assert!(s.iter().all(|s| s.stream));
        let cmd = pods::server_pod(&s[1], "img:1")
            .spec
            .expect("spec")
            .containers[0]
            .command
            .clone()
            .expect("command");
        assert!(
            cmd.windows(2).any(|w| w == ["--stream-port", "8001"]),
            "{cmd:?}"
        );
    }

    #[test]
    fn the_unbound_pod_passes_only_when_refused_for_the_missing_binding() {
        let err = "CNI ADD (cozyplane) failed with code 102: VPC attachment failed: no VPCBinding \
                   in namespace cozyplane-connectivity-unbound references VPC \
                   cozyplane-connectivity-t1/net (attachment is denied by default)";
        // The lab kubelet: the CNI error in the waiting message.
        let waiting = pod(
            serde_json::json!({"metadata": {"name": "unbound"}, "status": {
            "phase": "Pending", "containerStatuses": [{"name": "probe", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating", "message": err}}}]}}),
        );
        assert_eq!(
            no_binding_verdict(BASE, &waiting, &[]),
            NoBinding::Refused(err.into())
        );
        // A real kubelet: the error in an event, nothing in the status.
        let pending = pod(
            serde_json::json!({"metadata": {"name": "unbound"}, "status": {"phase": "Pending"}}),
        );
        assert_eq!(
            no_binding_verdict(
                BASE,
                &pending,
                &[format!("Failed to create pod sandbox: {err}")]
            ),
            NoBinding::Refused(format!("Failed to create pod sandbox: {err}"))
        );
        // Some other failure is not the proof we look for (yet).
        assert_eq!(
            no_binding_verdict(
                BASE,
                &pending,
                &["VPC cozyplane-connectivity-t1/net is not Ready".into()]
            ),
            NoBinding::Pending
        );
        // Started: attachment was not denied.
        let running = pod(
            serde_json::json!({"metadata": {"name": "unbound"}, "status": {
            "phase": "Running", "podIP": "10.244.1.9"}}),
        );
        assert!(matches!(
            no_binding_verdict(BASE, &running, &[err.into()]),
            NoBinding::Started(m) if m.contains("started without a VPCBinding")
        ));
    }

    fn event(uid: &str, type_: &str, reason: &str, message: &str) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "unbound.1", "namespace": "cozyplane-connectivity-unbound"},
            "involvedObject": {"kind": "Pod", "name": "unbound", "uid": uid},
            "type": type_, "reason": reason, "message": message}))
        .expect("event json")
    }

    #[test]
    fn the_unbound_pod_needs_a_warning_event_naming_the_binding() {
        let msg = format!(
            "Failed to create pod sandbox: CNI ADD (cozyplane) failed with code 102: VPC \
             attachment failed: {} (attachment is denied by default)",
            no_binding_message(BASE)
        );
        let good = event("u1", "Warning", FAILED_CREATE_POD_SANDBOX, &msg);
        assert_eq!(
            no_binding_event(BASE, Some("u1"), std::slice::from_ref(&good)),
            Some(format!("Warning FailedCreatePodSandBox: {msg}"))
        );
        // Another pod's event (an earlier unbound pod), another reason, a Normal event,
        // another message, or no UID to match: not the proof.
        for wrong in [
            event("u0", "Warning", FAILED_CREATE_POD_SANDBOX, &msg),
            event("u1", "Warning", "BackOff", &msg),
            event("u1", "Normal", FAILED_CREATE_POD_SANDBOX, &msg),
            event(
                "u1",
                "Warning",
                FAILED_CREATE_POD_SANDBOX,
                "Failed to create pod sandbox: VPC cozyplane-connectivity-t1/net is not Ready",
            ),
        ] {
            assert_eq!(no_binding_event(BASE, Some("u1"), &[wrong]), None);
        }
        assert_eq!(no_binding_event(BASE, None, &[good]), None);
    }

    #[test]
    fn an_echo_reply_from_an_own_vpc_pod_at_a_twin_address_is_that_pods() {
        let holders = vpc_holders(
            &[
                pod(serde_json::json!({"metadata": {"name": "t1-client-b",
                    "namespace": "cozyplane-connectivity-t1", "annotations": {
                    ANNOTATION_VPC: "cozyplane-connectivity-t1/net",
                    ANNOTATION_VPC_IP: "10.250.0.7"}}})),
                pod(serde_json::json!({"metadata": {"name": "t2-client-b",
                    "namespace": "cozyplane-connectivity-t2", "annotations": {
                    ANNOTATION_VPC: "cozyplane-connectivity-t2/net",
                    ANNOTATION_VPC_IP: "10.250.0.8"}}})),
                pod(serde_json::json!({"metadata": {"name": "client",
                    "namespace": "cozyplane-connectivity"}})),
            ],
            &Tenant::T1.vpc_annotation(BASE),
        );
        assert_eq!(
            holders,
            [(
                "10.250.0.7".parse().expect("ip"),
                "cozyplane-connectivity-t1/t1-client-b".to_string()
            )]
        );
        let row = |ip: &str, proto: Proto| PlannedCheck {
            group: "tenancy",
            id: "tenancy/twin-vpc/t1/b-to-b/icmp".into(),
            runner: crate::matrix::Runner::Member(Tenant::T1, crate::matrix::Slot::B),
            to: "t2/echo-b".into(),
            proto,
            target: Some(format!("{ip}:0")),
            expect: None,
            expect_blocked: true,
            skip: None,
            timeout_ms: 3000,
            control: Some("tenancy/same-vpc/t1/b-to-b/icmp".into()),
        };
        let replied = |ip: &str| Outcome {
            id: "tenancy/twin-vpc/t1/b-to-b/icmp".into(),
            ok: false,
            ms: 2.0,
            answer: Some(format!("echo reply from {ip}")),
            error: Some("icmp: expected no answer (blocked), but answered".into()),
        };
        // t2's echo-b got 10.250.0.7, which t1's own client holds: the reply is t1's.
        let o = own_holder_outcome(
            &row("10.250.0.7", Proto::Icmp),
            &replied("10.250.0.7"),
            &holders,
        )
        .expect("rejudged");
        assert!(o.ok && o.error.is_none(), "{o:?}");
        assert_eq!(
            o.answer.as_deref(),
            Some(
                "echo reply from 10.250.0.7: 10.250.0.7 is also \
                 cozyplane-connectivity-t1/t1-client-b of the client's own VPC, which answered"
            )
        );
        // An address no own pod holds: the reply is the breach, it stays a FAIL.
        assert_eq!(
            own_holder_outcome(
                &row("10.250.0.8", Proto::Icmp),
                &replied("10.250.0.8"),
                &holders
            ),
            None
        );
        // Only blocked ICMP rows, and only a failure by an echo reply, are rejudged.
        assert_eq!(
            own_holder_outcome(
                &row("10.250.0.7", Proto::Tcp),
                &replied("10.250.0.7"),
                &holders
            ),
            None
        );
        let mut silent = replied("10.250.0.7");
        silent.ok = true;
        silent.answer = None;
        silent.error = None;
        assert_eq!(
            own_holder_outcome(&row("10.250.0.7", Proto::Icmp), &silent, &holders),
            None
        );
        let mut broken = replied("10.250.0.7");
        broken.answer = None;
        broken.error = Some("icmp socket (needs CAP_NET_RAW)".into());
        assert_eq!(
            own_holder_outcome(&row("10.250.0.7", Proto::Icmp), &broken, &holders),
            None
        );
    }
}
