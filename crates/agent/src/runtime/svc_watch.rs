//! Keeps the Services compiler's index ([`ServiceIndex`]) in step with the
//! Service and EndpointSlice watches, as `sg_watch.rs` does for the
//! SecurityGroup index: each event is applied as it arrives and marks the
//! Services it touches dirty, so the sync loop recompiles and re-syncs only
//! those (`compile/services/index.rs`). A relist (`Init` … `InitDone`) also
//! removes what it did not deliver again: objects deleted while the watch
//! was down.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;

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

/// A watch event handler for kind `K` that applies its events to `index`.
pub fn service_events<K: SvcIndexed>(index: SharedServiceIndex) -> impl FnMut(&Event<K>) {
    // during a relist: the keys the index held that it has not seen again
    let mut unseen: Option<HashSet<String>> = None;
    move |event| {
        let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(o) => o.apply_to(&mut index),
            Event::Delete(o) => index.remove(K::KIND, &o.index_key()),
            Event::Init => unseen = Some(index.keys(K::KIND).into_iter().collect()),
            Event::InitApply(o) => {
                if let Some(unseen) = unseen.as_mut() {
                    unseen.remove(&o.index_key());
                }
                o.apply_to(&mut index);
            }
            Event::InitDone => {
                for key in unseen.take().unwrap_or_default() {
                    index.remove(K::KIND, &key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
        let mut on_event = service_events::<Service>(index.clone());
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
