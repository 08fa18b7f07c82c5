//! The tenancy group's cluster objects and verdicts (pure: building and reading only).
//!
//! `--tenancy` makes two tenants, `<ns>-t1` and `<ns>-t2`, each owning a VPC `net` with the
//! **same** CIDR and a VPCBinding for it in its own namespace; probe servers `echo-a` (node A)
//! and `echo-b` (node B) in each VPC; a VPC client `vpc-client` in t1 on node A; and a pod
//! `unbound` in `<ns>-unbound` asking for t1's VPC without a binding, which must never start.
//! The VPC servers answer `t1/echo-a`, `t2/echo-a`, …, so an answer from the twin VPC (same
//! pod name, possibly the same address) can never pass for one from the client's own VPC.
use std::net::IpAddr;

use cozyplane_api::labels::{ANNOTATION_VPC, ANNOTATION_VPC_IP};
use cozyplane_api::sdn::{VPCBindingSpec, VPCRef, VPCSpec};
use cozyplane_api::{VPCBinding, VPC};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::pods::{self, ServerPod};

/// Default CIDR of both tenants' VPCs (`--tenancy-cidr`).
pub const DEFAULT_CIDR: &str = "10.250.0.0/24";
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
}

impl Tenant {
    /// Both tenants.
    pub const ALL: [Tenant; 2] = [Tenant::T1, Tenant::T2];

    /// `t1` or `t2`: the namespace suffix and the prefix of its servers' answers.
    pub fn short(self) -> &'static str {
        match self {
            Tenant::T1 => "t1",
            Tenant::T2 => "t2",
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

/// The servers of one tenant: `echo-a` on node A, `echo-b` on node B, in its VPC.
pub fn servers(tenant: Tenant, base: &str, node_a: &str, node_b: Option<&str>) -> Vec<ServerPod> {
    let on = |name: &'static str, node: &str| ServerPod {
        name,
        node: node.to_string(),
        host_network: false,
        vpc: Some(tenant.vpc_annotation(base)),
        answer: Some(tenant.answer(name)),
    };
    let mut out = vec![on("echo-a", node_a)];
    if let Some(b) = node_b {
        out.push(on("echo-b", b));
    }
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

#[cfg(test)]
mod tests {
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
        let s = servers(Tenant::T2, BASE, "n1", Some("n2"));
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
        let t1 = pods::server_pod(&servers(Tenant::T1, BASE, "n1", Some("n2"))[1], "img:1");
        assert!(!pods::same_spec(&p, &t1));
        assert_eq!(servers(Tenant::T1, BASE, "n1", None).len(), 1);

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
}
