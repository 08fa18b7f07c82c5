//! The pure half of claim GC (FabricIPs and VPC Ports): which claims look
//! like garbage in a snapshot of claims and pods, and whether a live read
//! confirms it.
//!
//! Kept free of I/O so every rule (grace period, UID mismatch, claims that
//! cannot be judged) is unit-tested without an API server.

use std::collections::HashMap;
use std::time::Duration;

use cozyplane_api::labels::{
    LABEL_FABRIC_POD_NAMESPACE, LABEL_FABRIC_POD_UID, LABEL_POD_NAME, LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
};
use cozyplane_api::{FabricIP, Port};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

/// Why a claim is garbage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// No pod of that namespace/name exists.
    PodMissing,
    /// A pod of that namespace/name exists, but with another UID: the claimant
    /// was deleted and a namesake (StatefulSet replica, re-created pod) took
    /// its place with its own claim.
    UidMismatch {
        /// The UID of the pod that exists now.
        current: String,
    },
}

/// A claim the cache says is garbage, with everything needed to confirm and
/// delete it safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The FabricIP name (the address claim).
    pub name: String,
    /// The FabricIP's `metadata.uid` (delete precondition).
    pub uid: String,
    /// The FabricIP's `metadata.resourceVersion` (delete precondition).
    pub resource_version: String,
    /// The claimant pod's namespace.
    pub pod_namespace: String,
    /// The claimant pod's name.
    pub pod_name: String,
    /// The claimant pod's UID, when the claim records one.
    pub pod_uid: Option<String>,
    /// Why the cache says it is garbage.
    pub reason: Reason,
}

/// Pods by namespace → name → UID: all GC needs to know about a pod.
/// Nested so a lookup by `&str` allocates nothing (one is made per claim
/// per pass).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIndex {
    by_namespace: HashMap<String, HashMap<String, String>>,
    len: usize,
}

impl PodIndex {
    /// Indexes pods; pods without a namespace, name or UID are left out
    /// (the API server always sets them, so such a pod is not a real one).
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut index = Self::default();
        for pod in pods {
            let m = &pod.metadata;
            if let (Some(ns), Some(name), Some(uid)) = (&m.namespace, &m.name, &m.uid) {
                index.insert(ns, name, uid);
            }
        }
        index
    }

    /// Adds one pod (tests and callers that hold plain tuples).
    pub fn insert(&mut self, namespace: &str, name: &str, uid: &str) {
        let names = self.by_namespace.entry(namespace.to_string()).or_default();
        if names.insert(name.to_string(), uid.to_string()).is_none() {
            self.len += 1;
        }
    }

    /// The UID of the pod `namespace/name`, if one exists.
    pub fn uid_of(&self, namespace: &str, name: &str) -> Option<&str> {
        self.by_namespace
            .get(namespace)?
            .get(name)
            .map(String::as_str)
    }

    /// How many pods are indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The claimant a FabricIP names: namespace and UID from the spec, falling
/// back to the reverse-lookup labels; the pod name only lives in the spec.
/// Borrowed from the claim: judging allocates only for garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// The pod's name.
    pub name: &'a str,
    /// The pod's UID, if recorded.
    pub uid: Option<&'a str>,
}

/// The claimant of a claim, or `None` when the claim does not say which pod
/// holds it (such a claim cannot be judged and is never collected).
pub fn claimant(claim: &FabricIP) -> Option<Claimant<'_>> {
    let label = |key: &str| {
        claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    let namespace =
        non_empty(&claim.spec.pod_namespace).or_else(|| label(LABEL_FABRIC_POD_NAMESPACE))?;
    let name = non_empty(&claim.spec.pod_name)?;
    let uid = non_empty(&claim.spec.pod_uid).or_else(|| label(LABEL_FABRIC_POD_UID));
    Some(Claimant {
        namespace,
        name,
        uid,
    })
}

/// The claimant a Port names: namespace and name from the spec, falling
/// back to the labels the agent writes; the UID from the pod-uid label.
pub fn port_claimant(port: &Port) -> Option<Claimant<'_>> {
    let label = |key: &str| {
        port.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    Some(Claimant {
        namespace: non_empty(&port.spec.pod_namespace).or_else(|| label(LABEL_POD_NAMESPACE))?,
        name: non_empty(&port.spec.pod_name).or_else(|| label(LABEL_POD_NAME))?,
        uid: label(LABEL_POD_UID),
    })
}

/// An object that holds an address for one pod and is garbage once that
/// pod is gone: a FabricIP, or a VPC Port (whose node may have died
/// before the CNI DEL could release it).
pub trait PodClaim {
    /// Its metadata.
    fn meta(&self) -> &ObjectMeta;
    /// Its claimant, `None` when it names no pod (never collected).
    fn claimant(&self) -> Option<Claimant<'_>>;
}

impl PodClaim for FabricIP {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn claimant(&self) -> Option<Claimant<'_>> {
        claimant(self)
    }
}

impl PodClaim for Port {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn claimant(&self) -> Option<Claimant<'_>> {
        port_claimant(self)
    }
}

/// A set, non-empty string field.
fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// When the claim becomes old enough to be judged: creation + grace. `None`
/// when the claim has no creation timestamp (never judged: its age is
/// unknown, and an ADD in flight must not be reaped).
fn matures_at<C: PodClaim>(claim: &C, grace: Duration) -> Option<Timestamp> {
    let created = claim.meta().creation_timestamp.as_ref()?.0;
    let grace = k8s_openapi::jiff::SignedDuration::try_from(grace).ok()?;
    created.checked_add(grace).ok()
}

/// Judges one claim against the pod index, ignoring age and lifecycle.
pub fn verdict(claimant: &Claimant<'_>, pods: &PodIndex) -> Option<Reason> {
    match pods.uid_of(claimant.namespace, claimant.name) {
        None => Some(Reason::PodMissing),
        Some(current) => match claimant.uid {
            Some(uid) if uid != current => Some(Reason::UidMismatch {
                current: current.to_string(),
            }),
            // Same UID, or a claim without a UID whose pod exists: keep.
            _ => None,
        },
    }
}

/// The claims that look like garbage at `now`: their pod is missing or has
/// another UID, they are older than `grace`, and they are not already being
/// deleted. Claims that name no pod, or lack a name, UID or
/// resourceVersion, are never candidates.
pub fn garbage<'a, C: PodClaim + 'a>(
    claims: impl IntoIterator<Item = &'a C>,
    pods: &PodIndex,
    now: Timestamp,
    grace: Duration,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for claim in claims {
        let m = claim.meta();
        if m.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(name), Some(uid), Some(rv)) = (&m.name, &m.uid, &m.resource_version) else {
            continue;
        };
        match matures_at(claim, grace) {
            Some(t) if t <= now => {}
            _ => continue,
        }
        let Some(who) = claim.claimant() else {
            continue;
        };
        if let Some(reason) = verdict(&who, pods) {
            out.push(Candidate {
                name: name.clone(),
                uid: uid.clone(),
                resource_version: rv.clone(),
                pod_namespace: who.namespace.to_string(),
                pod_name: who.name.to_string(),
                pod_uid: who.uid.map(str::to_string),
                reason,
            });
        }
    }
    out
}

/// The earliest moment a still-young claim matures, so a pass can be
/// scheduled then instead of waiting for the next full resync.
pub fn next_maturity<'a, C: PodClaim + 'a>(
    claims: impl IntoIterator<Item = &'a C>,
    now: Timestamp,
    grace: Duration,
) -> Option<Timestamp> {
    claims
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .filter_map(|c| matures_at(c, grace))
        .filter(|t| *t > now)
        .min()
}

/// How many claims are still inside their grace period at `now` (exported
/// as a gauge: a persistently high value points at ADDs whose pods never
/// appear).
pub fn young<'a, C: PodClaim + 'a>(
    claims: impl IntoIterator<Item = &'a C>,
    now: Timestamp,
    grace: Duration,
) -> usize {
    claims
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .filter(|c| matches_young(*c, now, grace))
        .count()
}

fn matches_young<C: PodClaim>(claim: &C, now: Timestamp, grace: Duration) -> bool {
    matures_at(claim, grace).is_some_and(|t| t > now)
}

/// Does a live read of the claimant pod confirm the candidate is garbage?
/// `live_uid` is the UID of the pod read live (`None`: it does not exist).
/// A pod that reappeared with the claim's own UID (the cache lagged) saves
/// the claim.
pub fn confirmed(candidate: &Candidate, live_uid: Option<&str>) -> bool {
    match (live_uid, candidate.pod_uid.as_deref()) {
        (None, _) => true,
        (Some(live), Some(claimed)) => live != claimed,
        // The pod exists and the claim names no UID: nothing proves it is
        // not the claimant.
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cozyplane_api::local::FabricIPSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const GRACE: Duration = Duration::from_secs(60);

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("timestamp")
    }

    fn claim(name: &str, ns: &str, pod: &str, pod_uid: &str, created: i64) -> FabricIP {
        FabricIP {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("fuid-{name}")),
                resource_version: Some("7".into()),
                creation_timestamp: Some(Time(ts(created))),
                labels: Some(
                    [
                        (LABEL_FABRIC_POD_UID.to_string(), pod_uid.to_string()),
                        (LABEL_FABRIC_POD_NAMESPACE.to_string(), ns.to_string()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: FabricIPSpec {
                address: "10.0.0.1".into(),
                node: Some("n1".into()),
                pod_namespace: Some(ns.into()),
                pod_name: Some(pod.into()),
                pod_uid: Some(pod_uid.into()),
            },
        }
    }

    #[test]
    fn a_port_names_its_pod_by_spec_or_labels_and_is_judged_like_a_fabric_ip() {
        use cozyplane_api::sdn::{PortSpec, VPCRef};
        let port = |spec_pod: bool, labels: &[(&str, &str)]| {
            let mut p = Port::new(
                "v100.10.0.0.2",
                PortSpec {
                    vpc_ref: VPCRef {
                        namespace: Some("t1".into()),
                        name: "net".into(),
                    },
                    ip: "10.0.0.2".into(),
                    mac: None,
                    node: Some("n1".into()),
                    node_ip: None,
                    pod_namespace: spec_pod.then(|| "app".into()),
                    pod_name: spec_pod.then(|| "web".into()),
                    gateway: None,
                },
            );
            p.metadata.uid = Some("puid".into());
            p.metadata.resource_version = Some("3".into());
            p.metadata.creation_timestamp = Some(Time(ts(0)));
            p.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        };
        let by_spec = port(true, &[(LABEL_POD_UID, "u1")]);
        assert_eq!(
            port_claimant(&by_spec),
            Some(Claimant {
                namespace: "app",
                name: "web",
                uid: Some("u1")
            })
        );
        let by_labels = port(
            false,
            &[
                (LABEL_POD_UID, "u1"),
                (LABEL_POD_NAMESPACE, "app"),
                (LABEL_POD_NAME, "web"),
            ],
        );
        assert_eq!(port_claimant(&by_labels), port_claimant(&by_spec));
        // Naming no pod: never judged.
        assert_eq!(port_claimant(&port(false, &[(LABEL_POD_UID, "u1")])), None);
        // Judged by the pod index like any claim.
        let ports = [by_spec];
        assert!(garbage(&ports, &pods(&[("app", "web", "u1")]), ts(1000), GRACE).is_empty());
        let got = garbage(&ports, &pods(&[("app", "web", "u2")]), ts(1000), GRACE);
        assert_eq!(
            got[0].reason,
            Reason::UidMismatch {
                current: "u2".into()
            }
        );
        assert_eq!(
            garbage(&ports, &PodIndex::default(), ts(1000), GRACE)[0].reason,
            Reason::PodMissing
        );
        assert!(garbage(&ports, &PodIndex::default(), ts(59), GRACE).is_empty());
    }

    fn pods(list: &[(&str, &str, &str)]) -> PodIndex {
        let mut p = PodIndex::default();
        for (ns, name, uid) in list {
            p.insert(ns, name, uid);
        }
        p
    }

    fn names(c: &[Candidate]) -> Vec<&str> {
        c.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn live_pod_keeps_its_claim_missing_pod_loses_it() {
        let claims = vec![
            claim("f-a", "default", "alive", "u1", 0),
            claim("f-b", "default", "gone", "u2", 0),
        ];
        let got = garbage(
            &claims,
            &pods(&[("default", "alive", "u1")]),
            ts(1000),
            GRACE,
        );
        assert_eq!(names(&got), vec!["f-b"]);
        assert_eq!(got[0].reason, Reason::PodMissing);
        assert_eq!(got[0].uid, "fuid-f-b");
        assert_eq!(got[0].resource_version, "7");
        assert_eq!(got[0].pod_uid.as_deref(), Some("u2"));
    }

    #[test]
    fn recreated_pod_with_new_uid_makes_the_old_claim_garbage() {
        let claims = vec![claim("f-a", "default", "web-0", "old", 0)];
        let got = garbage(
            &claims,
            &pods(&[("default", "web-0", "new")]),
            ts(1000),
            GRACE,
        );
        assert_eq!(
            got[0].reason,
            Reason::UidMismatch {
                current: "new".into()
            }
        );
    }

    #[test]
    fn namespace_is_part_of_the_pod_identity() {
        let claims = vec![claim("f-a", "team-a", "web", "u1", 0)];
        let got = garbage(&claims, &pods(&[("team-b", "web", "u1")]), ts(1000), GRACE);
        assert_eq!(names(&got), vec!["f-a"]);
    }

    #[test]
    fn grace_period_protects_young_claims_up_to_the_boundary() {
        let claims = vec![claim("f-a", "default", "gone", "u", 100)];
        let none = PodIndex::default();
        assert!(garbage(&claims, &none, ts(159), GRACE).is_empty());
        assert_eq!(names(&garbage(&claims, &none, ts(160), GRACE)), vec!["f-a"]);
        assert_eq!(next_maturity(&claims, ts(120), GRACE), Some(ts(160)));
        assert_eq!(next_maturity(&claims, ts(160), GRACE), None);
        assert_eq!(young(&claims, ts(159), GRACE), 1);
        assert_eq!(young(&claims, ts(160), GRACE), 0);
    }

    #[test]
    fn claims_that_cannot_be_judged_are_kept() {
        let mut no_ts = claim("f-ts", "default", "gone", "u", 0);
        no_ts.metadata.creation_timestamp = None;
        let mut no_name = claim("f-name", "default", "gone", "u", 0);
        no_name.spec.pod_name = None;
        let mut no_rv = claim("f-rv", "default", "gone", "u", 0);
        no_rv.metadata.resource_version = None;
        let mut deleting = claim("f-del", "default", "gone", "u", 0);
        deleting.metadata.deletion_timestamp = Some(Time(ts(5)));
        let claims = vec![no_ts, no_name, no_rv, deleting];
        assert!(garbage(&claims, &PodIndex::default(), ts(1000), GRACE).is_empty());
        assert_eq!(next_maturity(&claims[3..], ts(0), GRACE), None);
    }

    #[test]
    fn spec_wins_labels_fill_gaps() {
        let mut c = claim("f-a", "default", "p", "u1", 0);
        c.spec.pod_namespace = None;
        c.spec.pod_uid = None;
        assert_eq!(
            claimant(&c),
            Some(Claimant {
                namespace: "default",
                name: "p",
                uid: Some("u1")
            })
        );
        // label says u1, pod now u2: garbage by the label's UID
        let got = garbage(&[c], &pods(&[("default", "p", "u2")]), ts(1000), GRACE);
        assert_eq!(names(&got), vec!["f-a"]);
    }

    #[test]
    fn claim_without_uid_is_kept_while_its_pod_exists() {
        let mut c = claim("f-a", "default", "p", "u1", 0);
        c.spec.pod_uid = None;
        c.metadata.labels = None;
        c.spec.pod_namespace = Some("default".into());
        assert!(garbage(
            &[c.clone()],
            &pods(&[("default", "p", "x")]),
            ts(1000),
            GRACE
        )
        .is_empty());
        assert_eq!(
            garbage(&[c], &PodIndex::default(), ts(1000), GRACE).len(),
            1
        );
    }

    #[test]
    fn live_read_confirms_or_saves() {
        let claims = vec![claim("f-a", "default", "p", "u1", 0)];
        let cand = &garbage(&claims, &PodIndex::default(), ts(1000), GRACE)[0];
        assert!(confirmed(cand, None));
        assert!(confirmed(cand, Some("u9")));
        // the cache lagged: the pod is there with the claim's UID
        assert!(!confirmed(cand, Some("u1")));
        let mut no_uid = cand.clone();
        no_uid.pod_uid = None;
        assert!(!confirmed(&no_uid, Some("u9")));
        assert!(confirmed(&no_uid, None));
    }

    #[test]
    fn pod_index_skips_incomplete_pods() {
        let full = Pod {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("a".into()),
                uid: Some("u".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let mut partial = full.clone();
        partial.metadata.uid = None;
        let idx = PodIndex::from_pods([&full, &partial]);
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.uid_of("ns", "a"), Some("u"));
        assert_eq!(idx.uid_of("other", "a"), None);
        let mut idx = idx;
        idx.insert("ns", "a", "u2"); // a newer sighting replaces, not adds
        idx.insert("other", "a", "u3");
        assert_eq!(idx.len(), 2);
        assert_eq!(idx.uid_of("ns", "a"), Some("u2"));
        assert!(!idx.is_empty() && PodIndex::default().is_empty());
    }
}
