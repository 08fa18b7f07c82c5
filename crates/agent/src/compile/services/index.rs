//! The Services compiler, incrementally: [`ServiceIndex`] keeps the watched
//! Services and EndpointSlices, recompiles only the Services an event touched
//! and hands the sync the frontends whose desired state changed.
//!
//! Why: at 10k Services a full compile is ~60 ms and a full diff of the maps
//! ~200 ms (`docs/benchmarks.md`, "Services"), far over the 100 ms a backend
//! change may take to reach the datapath. Per Service the result depends only
//! on the Service, the slices labelled with its name and this node's
//! [`NodeView`], so:
//!
//! * an event on a Service or a slice marks that Service dirty (a slice whose
//!   `kubernetes.io/service-name` label changes marks both Services); an
//!   event whose `resourceVersion` the index already holds (a relist) marks
//!   nothing;
//! * a new view marks every Service dirty when this node's name, addresses
//!   or options change, and otherwise (pods come and go: the cluster
//!   addresses change) only the Services with an endpoint at an address that
//!   joined or left the set;
//! * [`ServiceIndex::compile`] recompiles the dirty Services with the same
//!   per-Service function as [`super::compile_services`], and resolves a
//!   frontend two Services claim as the full compile does (the first by
//!   namespace/name keeps it; when it goes, the next takes over).
//!
//! The index is pure (no I/O, no clock); the agent feeds it from its watches
//! (`runtime/watch.rs`) and the bench from its generator. An equivalence test
//! checks it against [`super::compile_services`] over a walk of changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use cozyplane_datapath::abi::SvcKey;
use cozyplane_datapath::service::SvcDesired;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    compile_service, desired_frontend, ours, svc_key, Frontend, FrontendKey, NodeView,
    ServiceDiagnostic, ServiceTables, LABEL_SERVICE_NAME,
};

/// `(namespace, name)`.
type Name = (String, String);

/// The kinds the index holds (for a relist's bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SvcObjectKind {
    /// `v1/Service`.
    Service,
    /// `discovery.k8s.io/v1/EndpointSlice`.
    EndpointSlice,
}

/// What one Service compiled to.
#[derive(Debug, Default)]
struct Compiled {
    keys: Vec<FrontendKey>,
    diagnostics: BTreeSet<ServiceDiagnostic>,
}

/// A slice as the index keeps it.
#[derive(Debug)]
struct Slice {
    /// The Service it belongs to (its label), if any.
    service: Option<Name>,
    object: EndpointSlice,
}

/// The incremental Services compiler; see the module docs.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    view: NodeView,
    services: HashMap<Name, Service>,
    slices: HashMap<Name, Slice>,
    /// Slice names by Service.
    slices_of: HashMap<Name, BTreeSet<String>>,
    dirty: BTreeSet<Name>,
    compiled: HashMap<Name, Compiled>,
    /// Every Service claiming each frontend, in namespace/name order.
    claims: BTreeMap<FrontendKey, BTreeMap<Name, Frontend>>,
    desired: SvcDesired,
    /// Whose each desired frontend is.
    owners: HashMap<SvcKey, (Name, FrontendKey)>,
    changed: BTreeSet<SvcKey>,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Name {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn same_version(
    a: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    b: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    a.resource_version.is_some() && a.resource_version == b.resource_version && a.uid == b.uid
}

fn key_string((ns, name): &Name) -> String {
    format!("{ns}/{name}")
}

impl ServiceIndex {
    /// An empty index for `view`.
    pub fn new(view: NodeView) -> Self {
        Self {
            view,
            ..Self::default()
        }
    }

    /// A Service was created or changed.
    pub fn apply_service(&mut self, svc: &Service) {
        let name = name_of(&svc.metadata);
        if let Some(old) = self.services.get(&name) {
            if same_version(&old.metadata, &svc.metadata) {
                return;
            }
        }
        self.services.insert(name.clone(), svc.clone());
        self.dirty.insert(name);
    }

    /// A Service was deleted.
    pub fn delete_service(&mut self, svc: &Service) {
        self.remove(SvcObjectKind::Service, &key_string(&name_of(&svc.metadata)));
    }

    /// An EndpointSlice was created or changed.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let name = name_of(&slice.metadata);
        if let Some(old) = self.slices.get(&name) {
            if same_version(&old.object.metadata, &slice.metadata) {
                return;
            }
        }
        self.drop_slice(&name);
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .map(|s| (name.0.clone(), s.clone()));
        if let Some(svc) = &service {
            self.slices_of
                .entry(svc.clone())
                .or_default()
                .insert(name.1.clone());
            self.dirty.insert(svc.clone());
        }
        self.slices.insert(
            name,
            Slice {
                service,
                object: slice.clone(),
            },
        );
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        self.remove(
            SvcObjectKind::EndpointSlice,
            &key_string(&name_of(&slice.metadata)),
        );
    }

    /// The keys (`namespace/name`) held of `kind`.
    pub fn keys(&self, kind: SvcObjectKind) -> Vec<String> {
        match kind {
            SvcObjectKind::Service => self.services.keys().map(key_string).collect(),
            SvcObjectKind::EndpointSlice => self.slices.keys().map(key_string).collect(),
        }
    }

    /// Forgets the object `key` (`namespace/name`) of `kind`.
    pub fn remove(&mut self, kind: SvcObjectKind, key: &str) {
        let Some((ns, name)) = key.split_once('/') else {
            return;
        };
        let name = (ns.to_string(), name.to_string());
        match kind {
            SvcObjectKind::Service => {
                if self.services.remove(&name).is_some() {
                    self.dirty.insert(name);
                }
            }
            SvcObjectKind::EndpointSlice => self.drop_slice(&name),
        }
    }

    fn drop_slice(&mut self, name: &Name) {
        let Some(old) = self.slices.remove(name) else {
            return;
        };
        if let Some(svc) = old.service {
            if let Some(set) = self.slices_of.get_mut(&svc) {
                set.remove(&name.1);
                if set.is_empty() {
                    self.slices_of.remove(&svc);
                }
            }
            self.dirty.insert(svc);
        }
    }

    /// This node's view; see the module docs for what it marks dirty.
    pub fn set_view(&mut self, view: NodeView) {
        let v = &self.view;
        if v.name != view.name
            || v.addresses != view.addresses
            || v.external_backends != view.external_backends
            || v.proxy_name != view.proxy_name
        {
            self.dirty.extend(self.services.keys().cloned());
        } else if v.cluster_addresses != view.cluster_addresses {
            let moved: BTreeSet<IpAddr> = v
                .cluster_addresses
                .symmetric_difference(&view.cluster_addresses)
                .copied()
                .collect();
            for slice in self.slices.values() {
                let Some(svc) = &slice.service else { continue };
                let hit = slice
                    .object
                    .endpoints
                    .iter()
                    .flatten()
                    .flat_map(|e| &e.addresses)
                    .any(|a| a.parse::<IpAddr>().is_ok_and(|a| moved.contains(&a)));
                if hit {
                    self.dirty.insert(svc.clone());
                }
            }
        }
        self.view = view;
    }

    /// Recompiles the dirty Services; returns how many.
    pub fn compile(&mut self) -> usize {
        let dirty = std::mem::take(&mut self.dirty);
        let mut touched: BTreeSet<FrontendKey> = BTreeSet::new();
        for name in &dirty {
            let mut frontends = BTreeMap::new();
            let mut diagnostics = BTreeSet::new();
            if let Some(svc) = self.services.get(name).filter(|s| ours(s, &self.view)) {
                let slices: Vec<&EndpointSlice> = self
                    .slices_of
                    .get(name)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| self.slices.get(&(name.0.clone(), s.clone())))
                    .map(|s| &s.object)
                    .collect();
                compile_service(
                    svc,
                    &name.0,
                    &name.1,
                    &slices,
                    &self.view,
                    &mut frontends,
                    &mut diagnostics,
                );
            }
            let old = self.compiled.remove(name).unwrap_or_default();
            for key in old.keys {
                if !frontends.contains_key(&key) {
                    if let Some(claims) = self.claims.get_mut(&key) {
                        claims.remove(name);
                        if claims.is_empty() {
                            self.claims.remove(&key);
                        }
                    }
                    touched.insert(key);
                }
            }
            let keys: Vec<FrontendKey> = frontends.keys().copied().collect();
            for (key, fe) in frontends {
                self.claims.entry(key).or_default().insert(name.clone(), fe);
                touched.insert(key);
            }
            if !keys.is_empty() || !diagnostics.is_empty() {
                self.compiled
                    .insert(name.clone(), Compiled { keys, diagnostics });
            }
        }
        for key in touched {
            let winner = self.claims.get(&key).and_then(|c| c.iter().next());
            let want = winner.map(|(owner, fe)| (owner, desired_frontend(&key, fe)));
            match want {
                Some((owner, (k, d))) => {
                    self.owners.insert(k, (owner.clone(), key));
                    if self.desired.get(&k) != Some(&d) {
                        self.desired.insert(k, d);
                        self.changed.insert(k);
                    }
                }
                None => {
                    // the key the frontend had, whether or not the maps held it
                    let k = svc_key(&key);
                    self.owners.remove(&k);
                    if self.desired.remove(&k).is_some() {
                        self.changed.insert(k);
                    }
                }
            }
        }
        dirty.len()
    }

    /// The service maps' desired state, as of the last [`Self::compile`].
    pub fn desired(&self) -> &SvcDesired {
        &self.desired
    }

    /// The frontends whose desired state changed since the last call.
    pub fn take_changes(&mut self) -> BTreeSet<SvcKey> {
        std::mem::take(&mut self.changed)
    }

    /// The Service a desired frontend is of, and the frontend's key.
    pub fn owner(&self, k: &SvcKey) -> Option<(&Service, &FrontendKey)> {
        let (name, key) = self.owners.get(k)?;
        Some((self.services.get(name)?, key))
    }

    /// What the last compile skipped, sorted.
    pub fn diagnostics(&self) -> Vec<ServiceDiagnostic> {
        let all: BTreeSet<&ServiceDiagnostic> = self
            .compiled
            .values()
            .flat_map(|c| &c.diagnostics)
            .collect();
        all.into_iter().cloned().collect()
    }

    /// The compiled tables, as [`super::compile_services`] gives them.
    pub fn tables(&self) -> ServiceTables {
        ServiceTables {
            frontends: self
                .claims
                .iter()
                .filter_map(|(k, c)| Some((*k, c.values().next()?.clone())))
                .collect(),
            diagnostics: self.diagnostics(),
        }
    }

    /// Every Service held.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    /// Every EndpointSlice held.
    pub fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values().map(|s| &s.object)
    }
}

#[cfg(test)]
mod tests;
