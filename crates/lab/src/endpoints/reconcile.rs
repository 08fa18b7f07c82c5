//! Desired endpoints vs the existing slices → the creates, updates and
//! deletes that make them agree, writing as little as kube's reconciler does
//! (pure; `pkg/controller/endpointslice/reconciler.go` in spirit):
//!
//! 1. Slices not owned by the Service (another UID: an older Service of the
//!    same name), of an address type it no longer has, or of a port list no
//!    endpoint resolves to any more are deleted.
//! 2. Per address type and port list, an existing slice keeps the desired
//!    endpoints it already holds (replaced where they changed), loses the
//!    others, and is updated only if something changed (its labels
//!    included); one that is left empty is deleted. An endpoint in two
//!    slices (a duplicate left by a stale cache) stays in the first.
//! 3. Endpoints not yet placed go first into slices being updated anyway
//!    (fullest first), then into the fullest unchanged slice they fit in
//!    whole, then into new slices, at most `max` endpoints each.
//! 4. An address type with no slice left gets one empty placeholder (kept
//!    if it already exists), as kube does for a Service that selects nothing.
//! 5. A create and a delete of the same address type become one update of
//!    the slice to be deleted (its name kept, so a placeholder turning into
//!    a real slice, or a port change, is one write).
//!
//! Slices being deleted (deletionTimestamp) are left alone. Nothing here
//! decides *when*: the caller applies creates, then updates, then deletes
//! (make before break).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::desired::{AddressType, Desired, EndpointKey, PortSpec};

/// What to write for one Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// New slices (`generateName`, no name).
    pub create: Vec<EndpointSlice>,
    /// Slices to replace (name and resourceVersion of the existing one).
    pub update: Vec<EndpointSlice>,
    /// Slices to delete (as they were seen: name and UID).
    pub delete: Vec<EndpointSlice>,
}

impl Plan {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }

    fn extend(&mut self, other: Plan) {
        self.create.extend(other.create);
        self.update.extend(other.update);
        self.delete.extend(other.delete);
    }
}

/// The controller reference a slice of `d`'s Service carries.
pub fn owner_reference(d: &Desired) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: d.service.clone(),
        uid: d.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn owned(s: &EndpointSlice, d: &Desired) -> bool {
    s.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "Service" && r.name == d.service && r.uid == d.uid)
}

fn ports_of(s: &EndpointSlice) -> Vec<PortSpec> {
    s.ports.iter().flatten().map(PortSpec::from_api).collect()
}

/// A slice's endpoints (the API's `null` and `[]` alike).
pub fn endpoints_of(s: &EndpointSlice) -> &[Endpoint] {
    s.endpoints.as_deref().unwrap_or_default()
}

fn endpoints_mut(s: &mut EndpointSlice) -> &mut Vec<Endpoint> {
    s.endpoints.get_or_insert_with(Vec::new)
}

fn labels_of(s: &EndpointSlice) -> BTreeMap<String, String> {
    s.metadata.labels.clone().unwrap_or_default()
}

/// A new slice of `d`'s Service.
fn new_slice(
    d: &Desired,
    af: AddressType,
    ports: &[PortSpec],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", d.service)),
            namespace: Some(d.namespace.clone()),
            labels: Some(d.labels.clone()),
            owner_references: Some(vec![owner_reference(d)]),
            ..ObjectMeta::default()
        },
        address_type: af.as_str().into(),
        endpoints: Some(endpoints),
        ports: Some(ports.iter().map(PortSpec::to_api).collect()),
    }
}

/// `s` with `d`'s labels, `ports` and `endpoints` (everything else kept).
fn with_content(
    s: &EndpointSlice,
    d: &Desired,
    ports: &[PortSpec],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    let mut out = s.clone();
    out.metadata.labels = Some(d.labels.clone());
    out.ports = Some(ports.iter().map(PortSpec::to_api).collect());
    out.endpoints = Some(endpoints);
    out
}

/// The plan for one Service: `desired` is `None` when the Service is gone or
/// gets no slices (every existing one is deleted); `existing` are the slices
/// labelled with its name and this controller; `max` endpoints per slice.
pub fn plan(desired: Option<&Desired>, existing: &[EndpointSlice], max: usize) -> Plan {
    let max = max.max(1);
    let mut live: Vec<&EndpointSlice> = existing
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    live.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Plan::default();
    let Some(d) = desired else {
        out.delete = live.into_iter().cloned().collect();
        return out;
    };
    let mut by_af: BTreeMap<AddressType, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in live {
        match AddressType::parse(&s.address_type) {
            Some(af) if owned(s, d) && d.families.contains(&af) => {
                by_af.entry(af).or_default().push(s)
            }
            _ => out.delete.push(s.clone()),
        }
    }
    for af in &d.families {
        let slices = by_af.remove(af).unwrap_or_default();
        out.extend(plan_family(d, *af, &slices, max));
    }
    out
}

/// Steps 1-5 for one address type (its slices all owned by the Service).
fn plan_family(d: &Desired, af: AddressType, slices: &[&EndpointSlice], max: usize) -> Plan {
    let mut by_ports: BTreeMap<Vec<PortSpec>, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in slices {
        by_ports.entry(ports_of(s)).or_default().push(s);
    }
    let mut p = Plan::default();
    for (ports, ss) in &by_ports {
        if !d.groups.contains_key(&(af, ports.clone())) {
            p.delete.extend(ss.iter().map(|s| (*s).clone()));
        }
    }
    for ((_, ports), want) in d.groups.iter().filter(|((a, _), _)| *a == af) {
        let ss = by_ports.get(ports).map(Vec::as_slice).unwrap_or_default();
        p.extend(plan_group(d, af, ports, want, ss, max));
    }
    if slices.len() == p.delete.len() && p.create.is_empty() {
        let placeholder = new_slice(d, af, &[], Vec::new());
        let kept = p.delete.len() == 1 && {
            let old = &p.delete[0];
            endpoints_of(old).is_empty() && ports_of(old).is_empty() && labels_of(old) == d.labels
        };
        if kept {
            p.delete.clear();
        } else {
            p.create.push(placeholder);
        }
    }
    // A create and a delete → one update of the slice that would go.
    while !p.create.is_empty() && !p.delete.is_empty() {
        let (Some(mut new), Some(old)) = (p.create.pop(), p.delete.pop()) else {
            break;
        };
        new.metadata.name = old.metadata.name.clone();
        new.metadata.resource_version = old.metadata.resource_version.clone();
        new.metadata.uid = old.metadata.uid.clone();
        p.update.push(new);
    }
    p
}

/// Steps 2-3 for one address type and port list.
fn plan_group(
    d: &Desired,
    af: AddressType,
    ports: &[PortSpec],
    want: &BTreeMap<EndpointKey, Endpoint>,
    slices: &[&EndpointSlice],
    max: usize,
) -> Plan {
    let mut remaining = want.clone();
    let mut p = Plan::default();
    let mut updates: Vec<EndpointSlice> = Vec::new();
    let mut unchanged: Vec<&EndpointSlice> = Vec::new();
    for s in slices {
        let mut kept = Vec::with_capacity(endpoints_of(s).len());
        let mut changed = false;
        for e in endpoints_of(s) {
            match remaining.remove(&EndpointKey::of(e)) {
                Some(w) => {
                    changed |= w != *e;
                    kept.push(w);
                }
                None => changed = true,
            }
        }
        if changed && kept.is_empty() {
            p.delete.push((*s).clone());
        } else if changed || labels_of(s) != d.labels {
            updates.push(with_content(s, d, ports, kept));
        } else {
            unchanged.push(s);
        }
    }
    // Slices written anyway take what they can, fullest first.
    updates.sort_by_key(|s| Reverse(endpoints_of(s).len()));
    for s in &mut updates {
        while endpoints_of(s).len() < max {
            let Some((_, e)) = remaining.pop_first() else {
                break;
            };
            endpoints_mut(s).push(e);
        }
    }
    while !remaining.is_empty() {
        // The rest fits whole into an unchanged slice: the fullest that has room.
        let fits = (remaining.len() < max)
            .then(|| {
                unchanged
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| endpoints_of(s).len() + remaining.len() <= max)
                    .max_by_key(|(i, s)| (endpoints_of(s).len(), Reverse(*i)))
                    .map(|(i, _)| i)
            })
            .flatten();
        let (mut slice, is_new) = match fits {
            Some(i) => {
                let s = unchanged.remove(i);
                (with_content(s, d, ports, endpoints_of(s).to_vec()), false)
            }
            None => (new_slice(d, af, ports, Vec::new()), true),
        };
        while endpoints_of(&slice).len() < max {
            let Some((_, e)) = remaining.pop_first() else {
                break;
            };
            endpoints_mut(&mut slice).push(e);
        }
        if is_new {
            p.create.push(slice);
        } else {
            updates.push(slice);
        }
    }
    p.update = updates;
    p
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::discovery::v1::EndpointConditions;

    use super::super::desired::{CONTROLLER_NAME, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
    use super::*;

    fn ep(pod: &str, ip: &str, ready: bool) -> Endpoint {
        Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(ready),
                terminating: Some(false),
            }),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    fn http() -> Vec<PortSpec> {
        vec![PortSpec {
            name: Some("http".into()),
            protocol: Some("TCP".into()),
            port: Some(8080),
            app_protocol: None,
        }]
    }

    /// The Service `web` (uid `u1`) with `eps` behind `ports`, IPv4.
    fn want(groups: &[(Vec<PortSpec>, Vec<Endpoint>)]) -> Desired {
        Desired {
            namespace: "d".into(),
            service: "web".into(),
            uid: "u1".into(),
            labels: BTreeMap::from([
                (SERVICE_NAME_LABEL.to_string(), "web".to_string()),
                (MANAGED_BY_LABEL.to_string(), CONTROLLER_NAME.to_string()),
            ]),
            families: BTreeSet::from([AddressType::IPv4]),
            groups: groups
                .iter()
                .map(|(ports, eps)| {
                    (
                        (AddressType::IPv4, ports.clone()),
                        eps.iter()
                            .map(|e| (EndpointKey::of(e), e.clone()))
                            .collect(),
                    )
                })
                .collect(),
            skipped: Vec::new(),
        }
    }

    fn eps(n: usize) -> Vec<Endpoint> {
        (0..n)
            .map(|i| {
                ep(
                    &format!("p{i:03}"),
                    &format!("10.244.{}.{}", i / 200, i % 200),
                    true,
                )
            })
            .collect()
    }

    /// What the API server would hold after `plan`: creates named `web-<n>`,
    /// every write a new resourceVersion.
    struct Server {
        slices: Vec<EndpointSlice>,
        next: u32,
    }

    impl Server {
        fn new() -> Self {
            Server {
                slices: Vec::new(),
                next: 0,
            }
        }

        fn apply(&mut self, p: &Plan) {
            for c in &p.create {
                assert!(c.metadata.name.is_none(), "a create carries no name");
                assert_eq!(c.metadata.generate_name.as_deref(), Some("web-"));
                let mut s = c.clone();
                self.next += 1;
                s.metadata.name = Some(format!("web-{:02}", self.next));
                s.metadata.uid = Some(format!("slice-{}", self.next));
                s.metadata.resource_version = Some(self.next.to_string());
                self.slices.push(s);
            }
            for u in &p.update {
                let at = self
                    .slices
                    .iter()
                    .position(|s| s.metadata.name == u.metadata.name)
                    .unwrap_or_else(|| panic!("update of a missing slice {:?}", u.metadata.name));
                assert_eq!(
                    u.metadata.resource_version, self.slices[at].metadata.resource_version,
                    "updates are conditional on the version seen"
                );
                self.next += 1;
                let mut s = u.clone();
                s.metadata.resource_version = Some(self.next.to_string());
                self.slices[at] = s;
            }
            for d in &p.delete {
                self.slices.retain(|s| s.metadata.name != d.metadata.name);
            }
        }

        /// Plans against what it holds, applies, and returns the plan.
        fn sync(&mut self, d: Option<&Desired>, max: usize) -> Plan {
            let p = plan(d, &self.slices, max);
            self.apply(&p);
            p
        }

        fn sizes(&self) -> Vec<usize> {
            let mut v: Vec<usize> = self.slices.iter().map(|s| endpoints_of(s).len()).collect();
            v.sort_unstable();
            v
        }
    }

    fn counts(p: &Plan) -> (usize, usize, usize) {
        (p.create.len(), p.update.len(), p.delete.len())
    }

    #[test]
    fn new_endpoints_are_packed_max_per_slice_and_a_second_pass_writes_nothing() {
        let d = want(&[(http(), eps(250))]);
        let mut s = Server::new();
        let p = s.sync(Some(&d), 100);
        assert_eq!(counts(&p), (3, 0, 0));
        assert_eq!(s.sizes(), [50, 100, 100]);
        for slice in &s.slices {
            assert_eq!(slice.address_type, "IPv4");
            assert_eq!(slice.metadata.labels.as_ref(), Some(&d.labels));
            assert_eq!(slice.metadata.namespace.as_deref(), Some("d"));
            assert_eq!(
                slice.metadata.owner_references.as_deref(),
                Some(&[owner_reference(&d)][..])
            );
            let r = owner_reference(&d);
            assert_eq!(
                (r.controller, r.kind.as_str(), r.uid.as_str()),
                (Some(true), "Service", "u1")
            );
            assert_eq!(slice.ports.as_deref(), Some(&[http()[0].to_api()][..]));
        }
        assert!(s.sync(Some(&d), 100).is_empty(), "no change, no write");
    }

    #[test]
    fn a_changed_endpoint_rewrites_only_its_slice() {
        let mut all = eps(5);
        let mut s = Server::new();
        s.sync(Some(&want(&[(http(), all.clone())])), 2);
        assert_eq!(s.sizes(), [1, 2, 2]);
        all[3] = ep("p003", "10.244.0.3", false);
        let p = s.sync(Some(&want(&[(http(), all.clone())])), 2);
        assert_eq!(counts(&p), (0, 1, 0));
        assert!(endpoints_of(&p.update[0]).contains(&all[3]));
        assert_eq!(endpoints_of(&p.update[0]).len(), 2, "its neighbour stays");
    }

    #[test]
    fn removed_endpoints_leave_their_slice_and_an_emptied_slice_goes() {
        let all = eps(5);
        let mut s = Server::new();
        s.sync(Some(&want(&[(http(), all.clone())])), 2);
        // p004 was alone in the third slice: that slice goes, nothing else is written.
        let p = s.sync(Some(&want(&[(http(), all[..4].to_vec())])), 2);
        assert_eq!(counts(&p), (0, 0, 1));
        assert_eq!(s.sizes(), [2, 2]);
        // p000 goes: one update.
        let p = s.sync(Some(&want(&[(http(), all[1..4].to_vec())])), 2);
        assert_eq!(counts(&p), (0, 1, 0));
        assert_eq!(s.sizes(), [1, 2]);
        // A new endpoint fills the slice with room instead of a new one.
        let mut more = all[1..4].to_vec();
        more.push(ep("p100", "10.244.9.1", true));
        let p = s.sync(Some(&want(&[(http(), more)])), 2);
        assert_eq!(counts(&p), (0, 1, 0));
        assert_eq!(s.sizes(), [2, 2]);
    }

    #[test]
    fn a_service_selecting_nothing_has_one_placeholder_that_becomes_its_slice() {
        let mut s = Server::new();
        let p = s.sync(Some(&want(&[])), 100);
        assert_eq!(counts(&p), (1, 0, 0));
        let ph = s.slices[0].clone();
        assert!(endpoints_of(&ph).is_empty());
        assert_eq!(ph.ports.as_deref(), Some(&[][..]));
        assert!(
            s.sync(Some(&want(&[])), 100).is_empty(),
            "the placeholder is kept"
        );

        // Endpoints arrive: the placeholder is rewritten, not deleted and recreated.
        let name = ph.metadata.name.clone();
        let d = want(&[(http(), eps(2))]);
        let p = s.sync(Some(&d), 100);
        assert_eq!(counts(&p), (0, 1, 0));
        assert_eq!(s.slices.len(), 1);
        assert_eq!(s.slices[0].metadata.name, name);
        assert_eq!(endpoints_of(&s.slices[0]).len(), 2);
        assert!(s.sync(Some(&d), 100).is_empty());

        // And back: the last endpoint gone, the slice is the placeholder again (one write).
        let p = s.sync(Some(&want(&[])), 100);
        assert_eq!(counts(&p), (0, 1, 0));
        assert_eq!(s.slices[0].metadata.name, name);
        assert!(
            endpoints_of(&s.slices[0]).is_empty() && s.slices[0].ports.as_deref() == Some(&[][..])
        );
    }

    #[test]
    fn a_port_change_moves_endpoints_in_one_write() {
        let mut s = Server::new();
        s.sync(Some(&want(&[(http(), eps(2))])), 100);
        let name = s.slices[0].metadata.name.clone();
        let mut ports = http();
        ports[0].port = Some(9000);
        let p = s.sync(Some(&want(&[(ports.clone(), eps(2))])), 100);
        assert_eq!(counts(&p), (0, 1, 0));
        assert_eq!(s.slices[0].metadata.name, name);
        assert_eq!(s.slices[0].ports.as_deref(), Some(&[ports[0].to_api()][..]));
    }

    #[test]
    fn gone_foreign_and_stale_slices_are_deleted_and_dying_ones_left_alone() {
        let d = want(&[(http(), eps(1))]);
        let mut s = Server::new();
        s.sync(Some(&d), 100);
        // A slice of an older Service of the same name, and one of a family the Service lacks.
        let mut foreign = s.slices[0].clone();
        foreign.metadata.name = Some("web-old".into());
        foreign
            .metadata
            .owner_references
            .iter_mut()
            .flatten()
            .for_each(|r| r.uid = "u0".into());
        let mut v6 = s.slices[0].clone();
        v6.metadata.name = Some("web-v6".into());
        v6.address_type = "IPv6".into();
        let mut dying = s.slices[0].clone();
        dying.metadata.name = Some("web-dying".into());
        dying.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        s.slices.extend([foreign, v6, dying]);
        let p = s.sync(Some(&d), 100);
        assert_eq!(counts(&p), (0, 0, 2), "{p:#?}");
        let mut gone: Vec<_> = p
            .delete
            .iter()
            .filter_map(|x| x.metadata.name.clone())
            .collect();
        gone.sort();
        assert_eq!(gone, ["web-old", "web-v6"]);

        // The Service gone (or without selector): every live slice goes.
        let p = s.sync(None, 100);
        assert_eq!(counts(&p), (0, 0, 1));
    }

    #[test]
    fn label_changes_update_in_place_and_duplicates_heal() {
        let mut d = want(&[(http(), eps(3))]);
        let mut s = Server::new();
        s.sync(Some(&d), 2);
        d.labels.insert("team".into(), "x".into());
        let p = s.sync(Some(&d), 2);
        assert_eq!(counts(&p), (0, 2, 0));
        assert!(s
            .slices
            .iter()
            .all(|x| x.metadata.labels.as_ref() == Some(&d.labels)));

        // Two slices holding the same endpoint (a create the cache had not seen):
        // the first keeps it, the copy goes.
        let mut copy = s
            .slices
            .iter()
            .find(|x| endpoints_of(x).len() == 2)
            .cloned()
            .expect("full slice");
        copy.metadata.name = Some("web-zz".into());
        s.slices.push(copy);
        let p = s.sync(Some(&d), 2);
        assert_eq!(counts(&p), (0, 0, 1));
        assert_eq!(p.delete[0].metadata.name.as_deref(), Some("web-zz"));
        assert_eq!(s.sizes(), [1, 2]);
    }

    #[test]
    fn groups_by_port_list_and_family_get_their_own_slices() {
        let mut d = want(&[
            (http(), eps(2)),
            (Vec::new(), vec![ep("bare", "10.244.5.5", true)]),
        ]);
        let v6 = ep("p000", "fd00::1", true);
        d.families.insert(AddressType::IPv6);
        d.groups.insert(
            (AddressType::IPv6, http()),
            BTreeMap::from([(EndpointKey::of(&v6), v6)]),
        );
        let mut s = Server::new();
        let p = s.sync(Some(&d), 100);
        assert_eq!(counts(&p), (3, 0, 0));
        let mut shape: Vec<(String, usize, usize)> = s
            .slices
            .iter()
            .map(|x| {
                (
                    x.address_type.clone(),
                    x.ports.as_ref().map_or(0, Vec::len),
                    endpoints_of(x).len(),
                )
            })
            .collect();
        shape.sort();
        assert_eq!(
            shape,
            [
                ("IPv4".to_string(), 0, 1),
                ("IPv4".to_string(), 1, 2),
                ("IPv6".to_string(), 1, 1)
            ]
        );
        assert!(s.sync(Some(&d), 100).is_empty());
    }
}
