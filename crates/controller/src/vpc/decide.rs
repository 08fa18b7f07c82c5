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
