//! Keeps the Services compiler's index ([`ServiceIndex`]) in step with the
//! Service and EndpointSlice watches (`index_watch.rs`): each event marks the
//! Services it touches dirty, so the sync loop recompiles and re-syncs only
//! those (`compile/services/index.rs`).

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::index_watch::WatchIndex;
use crate::compile::services::{ServiceIndex, SvcObjectKind};

/// The index, shared by the watch streams (writers) and the sync loop.
pub type SharedServiceIndex = Arc<Mutex<ServiceIndex>>;

/// A kind the index holds.
pub trait SvcIndexed: Sized {
    /// Its kind.
    const KIND: SvcObjectKind;
    /// `namespace/name`.
    fn index_key(&self) -> String;
    /// Applies a create or change.
    fn apply_to(&self, index: &mut ServiceIndex);
}

impl SvcIndexed for Service {
    const KIND: SvcObjectKind = SvcObjectKind::Service;
    fn index_key(&self) -> String {
        key(&self.metadata)
    }
    fn apply_to(&self, index: &mut ServiceIndex) {
        index.apply_service(self);
    }
}

impl SvcIndexed for EndpointSlice {
    const KIND: SvcObjectKind = SvcObjectKind::EndpointSlice;
    fn index_key(&self) -> String {
        key(&self.metadata)
    }
    fn apply_to(&self, index: &mut ServiceIndex) {
        index.apply_slice(self);
    }
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

impl<K: SvcIndexed> WatchIndex<K> for ServiceIndex {
    fn key_of(object: &K) -> String {
        object.index_key()
    }
    fn apply_object(&mut self, object: &K) {
        object.apply_to(self);
    }
    fn delete_object(&mut self, object: &K) {
        self.remove(K::KIND, &object.index_key());
    }
    fn held(&self) -> Vec<String> {
        self.keys(K::KIND)
    }
    fn forget(&mut self, key: &str) {
        self.remove(K::KIND, key);
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::runtime::index_watch::index_events;

    fn svc(name: &str, version: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": name, "resourceVersion": version},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]},
        }))
        .unwrap()
    }

    fn names(index: &SharedServiceIndex) -> Vec<String> {
        let mut keys = index.lock().unwrap().keys(SvcObjectKind::Service);
        keys.sort();
        keys
    }

    #[test]
    fn events_update_the_index_and_a_relist_drops_what_it_did_not_deliver() {
        let index = SharedServiceIndex::default();
        let mut on_event = index_events::<Service, _>(index.clone());
        on_event(&Event::Apply(svc("a", "1")));
        on_event(&Event::Apply(svc("b", "1")));
        on_event(&Event::Apply(svc("c", "1")));
        on_event(&Event::Delete(svc("c", "2")));
        assert_eq!(names(&index), ["shop/a", "shop/b"]);
        on_event(&Event::Init);
        on_event(&Event::InitApply(svc("a", "1")));
        on_event(&Event::InitApply(svc("d", "3")));
        assert_eq!(names(&index), ["shop/a", "shop/b", "shop/d"]);
        on_event(&Event::InitDone);
        assert_eq!(names(&index), ["shop/a", "shop/d"]);
        // what the index compiles follows: b's frontend is gone
        let mut index = index.lock().unwrap();
        index.compile();
        assert_eq!(index.desired().len(), 1, "a and d share 10.96.0.10:80");
    }
}
