//! What the VPC controller does, as a pure function of two live lists: the
//! VNIClaims and the VPCs (read in that order, see [`super`]).
//!
//! A VPC's VNI is the claim it holds: `vni-<n>` with `spec.vpcUID` = the VPC's
//! UID. `status.vni` only ever names a VNI whose claim the VPC holds, and the
//! claim's name is unique, so no two VPCs can show one VNI, whatever the
//! number of controllers or their restarts.

use std::collections::{BTreeMap, BTreeSet};

use cozyplane_api::names::{parse_vni_claim_name, FIRST_VPC_VNI, MAX_VNI};
use cozyplane_api::{VNIClaim, VPC};

/// The finalizer that keeps a VPC (and its VNI) while anything uses it.
pub const FINALIZER: &str = "sdn.cozystack.io/vpc-protection";

/// A VPC, as far as the decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VpcView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// `status.vni`, when it is a VPC VNI.
    pub vni: Option<u32>,
    pub ready: bool,
    pub deleting: bool,
    pub has_finalizer: bool,
    /// For a deterministic order of allocation (oldest first).
    pub created: String,
}

impl VpcView {
    /// The view of a VPC object; `None` without a name, namespace or UID.
    pub fn of(v: &VPC) -> Option<Self> {
        let m = &v.metadata;
        let status = v.status.as_ref();
        Some(VpcView {
            namespace: m.namespace.clone()?,
            name: m.name.clone()?,
            uid: m.uid.clone()?,
            resource_version: m.resource_version.clone().unwrap_or_default(),
            vni: status
                .and_then(|s| s.vni)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| (FIRST_VPC_VNI..=MAX_VNI).contains(n)),
            ready: status.and_then(|s| s.phase.as_deref()) == Some("Ready"),
            deleting: m.deletion_timestamp.is_some(),
            has_finalizer: m
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|x| x == FINALIZER)),
            created: m
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
        })
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A VNIClaim, as far as the decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimView {
    pub name: String,
    pub vni: u32,
    pub vpc_uid: String,
    /// The claim's own UID, for delete preconditions.
    pub uid: String,
}

impl ClaimView {
    /// The view of a claim; `None` when its name is not a VNI claim name.
    pub fn of(c: &VNIClaim) -> Option<Self> {
        let name = c.metadata.name.clone()?;
        let vni = parse_vni_claim_name(&name).ok()?;
        Some(ClaimView {
            name,
            vni,
            vpc_uid: c.spec.vpc_uid.clone(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
        })
    }
}

/// One step for the executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Add [`FINALIZER`] (before anything is claimed for the VPC).
    AddFinalizer(VpcView),
    /// Create claim `vni-<vni>` for the VPC (a 409 means another writer won:
    /// the next pass decides again).
    Claim { vpc: VpcView, vni: u32 },
    /// Write `status.vni` = `vni`, phase Ready.
    SetReady { vpc: VpcView, vni: u32 },
    /// Delete a claim nobody holds (its VPC is gone, or holds another).
    Release(ClaimView),
    /// The VPC is being deleted: once nothing uses it, release its claims and
    /// remove the finalizer.
    Finalize {
        vpc: VpcView,
        claims: Vec<ClaimView>,
    },
}

/// The actions that bring `claims` and `vpcs` to agreement.
pub fn plan(vpcs: &[VpcView], claims: &[ClaimView]) -> Vec<Action> {
    let mut out = Vec::new();
    let by_vni: BTreeMap<u32, &ClaimView> = claims.iter().map(|c| (c.vni, c)).collect();
    let mut held: BTreeMap<&str, Vec<&ClaimView>> = BTreeMap::new();
    for c in claims {
        held.entry(c.vpc_uid.as_str()).or_default().push(c);
    }
    let live: BTreeSet<&str> = vpcs.iter().map(|v| v.uid.as_str()).collect();
    // Claims of no listed VPC: the VPC was gone before the VPC list was read
    // (claims are listed first, so a claim made for a newer VPC is not here).
    for c in claims {
        if !live.contains(c.vpc_uid.as_str()) {
            out.push(Action::Release(c.clone()));
        }
    }
    let mut taken: BTreeSet<u32> = by_vni.keys().copied().collect();
    let mut next_free = FIRST_VPC_VNI;
    let mut fresh = |taken: &mut BTreeSet<u32>| -> Option<u32> {
        while next_free <= MAX_VNI && taken.contains(&next_free) {
            next_free += 1;
        }
        (next_free <= MAX_VNI).then(|| {
            taken.insert(next_free);
            next_free
        })
    };
    let mut order: Vec<&VpcView> = vpcs.iter().collect();
    order.sort_by(|a, b| (&a.created, a.key()).cmp(&(&b.created, b.key())));
    for v in order {
        let mine = held.get(v.uid.as_str()).cloned().unwrap_or_default();
        if v.deleting {
            if v.has_finalizer {
                out.push(Action::Finalize {
                    vpc: v.clone(),
                    claims: mine.into_iter().cloned().collect(),
                });
            }
            continue;
        }
        if !v.has_finalizer {
            out.push(Action::AddFinalizer(v.clone()));
            continue;
        }
        // The claim to keep: the one status names, else the lowest held.
        let keep = mine
            .iter()
            .find(|c| Some(c.vni) == v.vni)
            .or_else(|| mine.iter().min_by_key(|c| c.vni))
            .copied();
        for c in &mine {
            if Some(c.vni) != keep.map(|k| k.vni) {
                out.push(Action::Release((*c).clone()));
            }
        }
        match keep {
            Some(k) => {
                if v.vni != Some(k.vni) || !v.ready {
                    out.push(Action::SetReady {
                        vpc: v.clone(),
                        vni: k.vni,
                    });
                }
            }
            None => {
                // Keep the VNI status shows when it is free (a lost claim);
                // else the lowest free one.
                let vni = match v.vni {
                    Some(n) if !taken.contains(&n) => {
                        taken.insert(n);
                        Some(n)
                    }
                    _ => fresh(&mut taken),
                };
                if let Some(vni) = vni {
                    out.push(Action::Claim {
                        vpc: v.clone(),
                        vni,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vpc(name: &str, uid: &str, vni: Option<u32>) -> VpcView {
        VpcView {
            namespace: "t1".into(),
            name: name.into(),
            uid: uid.into(),
            resource_version: "1".into(),
            vni,
            ready: vni.is_some(),
            deleting: false,
            has_finalizer: true,
            created: format!("2026-01-01T00:00:0{}Z", name.len()),
        }
    }

    fn claim(vni: u32, uid: &str) -> ClaimView {
        ClaimView {
            name: format!("vni-{vni}"),
            vni,
            vpc_uid: uid.into(),
            uid: format!("c-{vni}"),
        }
    }

    fn claims_of(actions: &[Action]) -> Vec<(String, u32)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Claim { vpc, vni } => Some((vpc.name.clone(), *vni)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn new_vpcs_get_the_lowest_free_vnis_oldest_first() {
        let vpcs = [
            vpc("bb", "u2", None),
            vpc("a", "u1", None),
            vpc("ccc", "u3", None),
        ];
        let got = plan(&vpcs, &[claim(100, "u9"), claim(102, "u8")]);
        // u9 and u8 are not listed VPCs: their claims are released, but their
        // VNIs are not handed out in the same pass.
        assert_eq!(
            claims_of(&got),
            [("a".into(), 101), ("bb".into(), 103), ("ccc".into(), 104)]
        );
        assert_eq!(
            got.iter()
                .filter(|a| matches!(a, Action::Release(_)))
                .count(),
            2
        );
    }

    #[test]
    fn a_held_claim_is_kept_and_shown() {
        let v = vpc("a", "u1", None);
        assert_eq!(
            plan(std::slice::from_ref(&v), &[claim(100, "u1")]),
            [Action::SetReady {
                vpc: v.clone(),
                vni: 100
            }]
        );
        let ready = vpc("a", "u1", Some(100));
        assert!(plan(&[ready], &[claim(100, "u1")]).is_empty());
    }

    #[test]
    fn racing_writers_leave_one_claim_per_vpc_the_one_status_names() {
        // Two controllers each claimed a VNI for u1; status shows 105.
        let v = vpc("a", "u1", Some(105));
        let got = plan(
            std::slice::from_ref(&v),
            &[claim(101, "u1"), claim(105, "u1")],
        );
        assert_eq!(got, [Action::Release(claim(101, "u1"))]);
        // Status shows none: keep the lowest, show it.
        let v = vpc("a", "u1", None);
        let got = plan(
            std::slice::from_ref(&v),
            &[claim(101, "u1"), claim(105, "u1")],
        );
        assert_eq!(
            got,
            [
                Action::Release(claim(105, "u1")),
                Action::SetReady { vpc: v, vni: 101 }
            ]
        );
    }

    #[test]
    fn status_never_keeps_a_vni_another_vpc_holds() {
        // u2 shows 100 (say, restored from a backup), but u1 holds vni-100.
        let a = vpc("a", "u1", Some(100));
        let b = vpc("bb", "u2", Some(100));
        let got = plan(&[a, b], &[claim(100, "u1")]);
        assert_eq!(claims_of(&got), [("bb".into(), 101)]);
        // A lost claim is re-made for the VNI status shows, if free.
        let c = vpc("a", "u1", Some(107));
        assert_eq!(claims_of(&plan(&[c], &[])), [("a".into(), 107)]);
    }

    #[test]
    fn the_finalizer_comes_first_and_deletion_finalizes() {
        let mut v = vpc("a", "u1", None);
        v.has_finalizer = false;
        assert_eq!(
            plan(std::slice::from_ref(&v), &[]),
            [Action::AddFinalizer(v.clone())]
        );
        let mut gone = vpc("a", "u1", Some(100));
        gone.deleting = true;
        assert_eq!(
            plan(std::slice::from_ref(&gone), &[claim(100, "u1")]),
            [Action::Finalize {
                vpc: gone.clone(),
                claims: vec![claim(100, "u1")]
            }]
        );
        gone.has_finalizer = false;
        assert!(
            plan(&[gone], &[claim(100, "u1")]).is_empty(),
            "not ours to finalize"
        );
    }
}

/// A VPC as a peering sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerVpc {
    pub vni: Option<u32>,
    pub ready: bool,
    pub cidrs: Vec<String>,
}

/// One half of a peering, as far as its status needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeeringView {
    pub namespace: String,
    pub name: String,
    /// The local VPC's name (in `namespace`).
    pub vpc: String,
    pub peer_namespace: String,
    pub peer: String,
}

/// A condition as the controller writes it: (type, status, reason, message).
pub type CondSpec = (&'static str, bool, &'static str, String);

/// The status a peering half should show: phase, peer VNI, conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeeringStatus {
    pub ready: bool,
    pub peer_vni: Option<u32>,
    pub conditions: Vec<CondSpec>,
}

pub use cozyplane_api::validation::net::cidrs_overlap;

/// A peering half's status, from the VPCs (`by (namespace, name)`) and every
/// peering half. Live only when both halves reference each other, both VPCs
/// are Ready, and their CIDRs are disjoint; the peer VNI is shown only then.
pub fn peering_status(
    p: &PeeringView,
    vpcs: &BTreeMap<(String, String), PeerVpc>,
    halves: &[PeeringView],
) -> PeeringStatus {
    let local = vpcs.get(&(p.namespace.clone(), p.vpc.clone()));
    let peer = vpcs.get(&(p.peer_namespace.clone(), p.peer.clone()));
    let self_peering = p.namespace == p.peer_namespace && p.vpc == p.peer;
    let matched = !self_peering
        && halves.iter().any(|h| {
            h.namespace == p.peer_namespace
                && h.vpc == p.peer
                && h.peer_namespace == p.namespace
                && h.peer == p.vpc
        });
    let cond = |t: &'static str, ok: bool, yes: &'static str, no: &'static str, msg: String| {
        (t, ok, if ok { yes } else { no }, msg)
    };
    let mut conditions = vec![cond(
        "PeerMatched",
        matched,
        "Reciprocated",
        if self_peering {
            "SelfPeering"
        } else {
            "AwaitingPeer"
        },
        if matched {
            format!("{}/{} peers back", p.peer_namespace, p.peer)
        } else if self_peering {
            "a VPC cannot peer with itself".into()
        } else {
            format!(
                "no VPCPeering in {} references {}/{} back",
                p.peer_namespace, p.namespace, p.vpc
            )
        },
    )];
    let ready = |v: Option<&PeerVpc>, what: &str| match v {
        Some(v) if v.ready => (true, format!("the {what} VPC is Ready")),
        Some(_) => (false, format!("the {what} VPC is not Ready")),
        None => (false, format!("the {what} VPC does not exist")),
    };
    let (l_ok, l_msg) = ready(local, "local");
    let (p_ok, p_msg) = ready(peer, "peer");
    conditions.push(cond("VPCReady", l_ok, "Ready", "NotReady", l_msg));
    conditions.push(cond("PeerVPCReady", p_ok, "Ready", "NotReady", p_msg));
    let overlap = match (local, peer) {
        (Some(l), Some(r)) => l
            .cidrs
            .iter()
            .flat_map(|a| r.cidrs.iter().map(move |b| (a, b)))
            .find(|(a, b)| cidrs_overlap(a, b))
            .map(|(a, b)| format!("{a} overlaps {b}")),
        _ => Some("unknown until both VPCs exist".into()),
    };
    let disjoint = overlap.is_none() && !self_peering;
    conditions.push(cond(
        "CIDRsDisjoint",
        disjoint,
        "Disjoint",
        "Overlap",
        overlap.unwrap_or_else(|| "no address is in both VPCs".into()),
    ));
    let live = matched && l_ok && p_ok && disjoint;
    PeeringStatus {
        ready: live,
        peer_vni: if live { peer.and_then(|v| v.vni) } else { None },
        conditions,
    }
}

#[cfg(test)]
mod peering_tests {
    use super::*;

    fn half(ns: &str, vpc: &str, pns: &str, peer: &str) -> PeeringView {
        PeeringView {
            namespace: ns.into(),
            name: format!("to-{peer}"),
            vpc: vpc.into(),
            peer_namespace: pns.into(),
            peer: peer.into(),
        }
    }

    fn vpcs(list: &[(&str, &str, u32, &str)]) -> BTreeMap<(String, String), PeerVpc> {
        list.iter()
            .map(|(ns, n, vni, cidr)| {
                (
                    (ns.to_string(), n.to_string()),
                    PeerVpc {
                        vni: Some(*vni),
                        ready: true,
                        cidrs: vec![cidr.to_string()],
                    },
                )
            })
            .collect()
    }

    fn cond<'a>(s: &'a PeeringStatus, t: &str) -> &'a CondSpec {
        s.conditions.iter().find(|c| c.0 == t).expect("condition")
    }

    #[test]
    fn overlap_is_by_prefix_and_family() {
        assert!(cidrs_overlap("10.0.0.0/16", "10.0.128.0/17"));
        assert!(cidrs_overlap("10.0.0.0/8", "10.1.2.0/24"));
        assert!(!cidrs_overlap("10.0.0.0/16", "10.1.0.0/16"));
        assert!(!cidrs_overlap("10.0.0.0/16", "fd00::/64"));
        assert!(cidrs_overlap("fd00::/48", "fd00:0:0:1::/64"));
        assert!(!cidrs_overlap("fd00::/64", "fd00:0:0:1::/64"));
        assert!(cidrs_overlap("0.0.0.0/0", "192.0.2.0/24"));
        assert!(cidrs_overlap("bad", "10.0.0.0/8"));
    }

    #[test]
    fn live_only_when_reciprocated_ready_and_disjoint() {
        let v = vpcs(&[
            ("a", "blue", 100, "10.1.0.0/16"),
            ("b", "red", 101, "10.2.0.0/16"),
        ]);
        let ab = half("a", "blue", "b", "red");
        let ba = half("b", "red", "a", "blue");
        let one = peering_status(&ab, &v, std::slice::from_ref(&ab));
        assert!(!one.ready && one.peer_vni.is_none());
        assert_eq!(cond(&one, "PeerMatched").2, "AwaitingPeer");
        let both = [ab.clone(), ba.clone()];
        let s = peering_status(&ab, &v, &both);
        assert!(s.ready);
        assert_eq!(s.peer_vni, Some(101));
        assert_eq!(peering_status(&ba, &v, &both).peer_vni, Some(100));
        // Non-transitive: c peers with b, but a does not with c.
        let v3 = vpcs(&[
            ("a", "blue", 100, "10.1.0.0/16"),
            ("b", "red", 101, "10.2.0.0/16"),
            ("c", "green", 102, "10.3.0.0/16"),
        ]);
        let bc = half("b", "red", "c", "green");
        let cb = half("c", "green", "b", "red");
        let ac = half("a", "blue", "c", "green");
        let all = [ab.clone(), ba, bc, cb, ac.clone()];
        assert!(!peering_status(&ac, &v3, &all).ready);
        // A half pointing elsewhere does not reciprocate.
        let wrong = half("b", "red", "a", "other");
        assert!(!peering_status(&ab, &v, &[ab.clone(), wrong]).ready);
    }

    #[test]
    fn overlapping_missing_or_self_peerings_are_refused() {
        let v = vpcs(&[
            ("a", "blue", 100, "10.1.0.0/16"),
            ("b", "twin", 101, "10.1.0.0/16"),
        ]);
        let ab = half("a", "blue", "b", "twin");
        let ba = half("b", "twin", "a", "blue");
        let s = peering_status(&ab, &v, &[ab.clone(), ba]);
        assert!(!s.ready && s.peer_vni.is_none());
        let c = cond(&s, "CIDRsDisjoint");
        assert!(
            !c.1 && c.2 == "Overlap" && c.3.contains("10.1.0.0/16 overlaps 10.1.0.0/16"),
            "{c:?}"
        );
        let gone = half("a", "blue", "b", "nothing");
        let s = peering_status(&gone, &v, std::slice::from_ref(&gone));
        assert_eq!(cond(&s, "PeerVPCReady").3, "the peer VPC does not exist");
        let me = half("a", "blue", "a", "blue");
        let s = peering_status(&me, &v, std::slice::from_ref(&me));
        assert!(!s.ready);
        assert_eq!(cond(&s, "PeerMatched").2, "SelfPeering");
    }
}

/// The finalizer that severs a binding's pods when the binding goes.
pub const BINDING_FINALIZER: &str = "sdn.cozystack.io/sever";

/// A VPCBinding, as far as revocation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// The bound VPC: (namespace, name), the namespace defaulted.
    pub vpc: (String, String),
    pub deleting: bool,
    pub has_finalizer: bool,
}

/// What to do with a binding's finalizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingAction {
    /// Add [`BINDING_FINALIZER`].
    AddFinalizer(BindingView),
    /// The binding is being deleted and the pass has severed what it alone
    /// granted ([`ungranted_ports`]): remove the finalizer.
    RemoveFinalizer(BindingView),
}

/// Every live binding carries the finalizer; a deleting one loses it (once
/// the same pass has deleted the Ports it alone granted).
pub fn plan_bindings(bindings: &[BindingView]) -> Vec<BindingAction> {
    bindings
        .iter()
        .filter_map(|b| match (b.deleting, b.has_finalizer) {
            (false, false) => Some(BindingAction::AddFinalizer(b.clone())),
            (true, true) => Some(BindingAction::RemoveFinalizer(b.clone())),
            _ => None,
        })
        .collect()
}

/// A pod's Port, as far as revocation needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortView {
    pub name: String,
    pub uid: String,
    pub pod_namespace: String,
    /// (namespace, name) of its VPC.
    pub vpc: (String, String),
}

/// The Ports no live (not deleting) binding grants: a pod's Port needs a
/// binding in the pod's namespace to the Port's VPC. Ports must be listed
/// before the bindings: a Port was made after the binding that granted it,
/// so a grant missing from the later binding list is really gone. This
/// catches what the finalizer alone cannot: a binding deleted before the
/// controller put its finalizer on, or a Port made by an attach racing with
/// the deletion.
pub fn ungranted_ports<'a>(ports: &'a [PortView], bindings: &[BindingView]) -> Vec<&'a PortView> {
    let granted: BTreeSet<(&str, &(String, String))> = bindings
        .iter()
        .filter(|b| !b.deleting)
        .map(|b| (b.namespace.as_str(), &b.vpc))
        .collect();
    ports
        .iter()
        .filter(|p| !granted.contains(&(p.pod_namespace.as_str(), &p.vpc)))
        .collect()
}

#[cfg(test)]
mod binding_tests {
    use super::*;

    fn b(ns: &str, name: &str, vpc: (&str, &str), deleting: bool, fin: bool) -> BindingView {
        BindingView {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("u-{name}"),
            resource_version: "1".into(),
            vpc: (vpc.0.into(), vpc.1.into()),
            deleting,
            has_finalizer: fin,
        }
    }

    fn p(name: &str, pod_ns: &str, vpc: (&str, &str)) -> PortView {
        PortView {
            name: name.into(),
            uid: format!("u-{name}"),
            pod_namespace: pod_ns.into(),
            vpc: (vpc.0.into(), vpc.1.into()),
        }
    }

    #[test]
    fn bindings_get_the_finalizer_and_lose_it_when_deleted() {
        let new = b("c", "x", ("o", "blue"), false, false);
        assert_eq!(
            plan_bindings(std::slice::from_ref(&new)),
            [BindingAction::AddFinalizer(new.clone())]
        );
        let gone = b("c", "x", ("o", "blue"), true, true);
        assert_eq!(
            plan_bindings(std::slice::from_ref(&gone)),
            [BindingAction::RemoveFinalizer(gone)]
        );
        assert!(plan_bindings(&[b("c", "x", ("o", "blue"), true, false)]).is_empty());
        assert!(plan_bindings(&[b("c", "x", ("o", "blue"), false, true)]).is_empty());
    }

    #[test]
    fn a_port_needs_a_live_binding_of_its_pods_namespace_to_its_vpc() {
        let ports = [
            p("a", "c", ("o", "blue")),
            p("b", "d", ("o", "blue")),
            p("c", "c", ("o", "red")),
        ];
        let names = |v: Vec<&PortView>| v.into_iter().map(|p| p.name.clone()).collect::<Vec<_>>();
        let grants = [
            b("c", "x", ("o", "blue"), false, true),
            b("d", "y", ("o", "blue"), false, true),
            b("c", "z", ("o", "red"), false, true),
        ];
        assert!(ungranted_ports(&ports, &grants).is_empty());
        // c's blue binding is being deleted: only c's blue Port goes.
        let mut revoked = grants.clone();
        revoked[0].deleting = true;
        assert_eq!(names(ungranted_ports(&ports, &revoked)), ["a"]);
        // A second live binding of c to blue still grants it.
        let mut twin = revoked.to_vec();
        twin.push(b("c", "x2", ("o", "blue"), false, false));
        assert!(ungranted_ports(&ports, &twin).is_empty());
        // No binding at all (deleted before it got the finalizer): all go.
        assert_eq!(names(ungranted_ports(&ports, &[])), ["a", "b", "c"]);
    }
}
