//! Keeps the SecurityGroup compiler's index ([`SgIndex`]) in step with the
//! watches of VPCs, SecurityGroups, Ports and this node's pods
//! (`index_watch.rs`): the per-object work — interning labels and names,
//! parsing a Port's claim, address and label snapshot, a group's selector
//! and rules — is paid once per changed object, not once per compile; the
//! sync loop compiles from the index (`compile::security_groups`, "Cost").
//! An apply whose `resourceVersion` the index already holds is a no-op, so a
//! relist costs a lookup per unchanged object.

use std::sync::{Arc, Mutex};

use crate::compile::security_groups::{SgIndex, SgIndexed};

pub use super::index_watch::index_events;
use super::index_watch::WatchIndex;

/// The index, shared by the watch streams (writers) and the sync loop.
pub type SharedSgIndex = Arc<Mutex<SgIndex>>;

impl<K: SgIndexed> WatchIndex<K> for SgIndex {
    fn key_of(object: &K) -> String {
        object.index_key()
    }
    fn apply_object(&mut self, object: &K) {
        self.apply(object);
    }
    fn delete_object(&mut self, object: &K) {
        self.delete(object);
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
    use cozyplane_api::Port;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    use super::*;
    use crate::compile::security_groups::SgKind;

    fn port(name: &str, version: &str) -> Port {
        serde_json::from_value(json!({
            "apiVersion": "sdn.cozystack.io/v1alpha1", "kind": "Port",
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"vpcRef": {"namespace": "t1", "name": "net"}, "ip": "10.1.0.2"},
        }))
        .unwrap()
    }

    fn names(index: &SharedSgIndex) -> Vec<String> {
        let mut keys = index.lock().unwrap().keys(SgKind::Port);
        keys.sort();
        keys
    }

    #[test]
    fn events_update_the_index_and_a_relist_drops_what_it_did_not_deliver() {
        let index = SharedSgIndex::default();
        let mut on_event = index_events::<Port, _>(index.clone());
        on_event(&Event::Apply(port("a", "1")));
        on_event(&Event::Apply(port("b", "1")));
        on_event(&Event::Apply(port("c", "1")));
        on_event(&Event::Delete(port("c", "2")));
        assert_eq!(names(&index), ["a", "b"]);
        // the watch restarts; b was deleted meanwhile, d created
        on_event(&Event::Init);
        on_event(&Event::InitApply(port("a", "1")));
        on_event(&Event::InitApply(port("d", "3")));
        // until the relist is done nothing is dropped
        assert_eq!(names(&index), ["a", "b", "d"]);
        on_event(&Event::InitDone);
        assert_eq!(names(&index), ["a", "d"]);
        on_event(&Event::Apply(port("e", "4")));
        assert_eq!(names(&index), ["a", "d", "e"]);
        for key in names(&index) {
            index.lock().unwrap().remove(SgKind::Port, &key);
        }
        assert_eq!(index.lock().unwrap().interned(), 0);
    }
}
