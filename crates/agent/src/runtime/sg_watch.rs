//! Keeps the SecurityGroup compiler's index ([`SgIndex`]) in step with the
//! watches of VPCs, SecurityGroups, Ports and this node's pods.
//!
//! Every watch event is applied to the index as it arrives (in the watch
//! stream, beside the reflector store), so the per-object work — interning
//! labels and names, parsing a Port's claim, address and label snapshot, a
//! group's selector and rules — is paid once per changed object, not once
//! per compile; the sync loop compiles from the index
//! (`compile::security_groups`, "Cost"). An apply whose `resourceVersion`
//! the index already holds is a no-op, so a relist costs a lookup per
//! unchanged object. A relist (`Init` … `InitDone`) also removes what it did
//! not deliver again: objects deleted while the watch was down.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kube::runtime::watcher::Event;

use crate::compile::security_groups::{SgIndex, SgIndexed};

/// The index, shared by the watch streams (writers) and the sync loop.
pub type SharedSgIndex = Arc<Mutex<SgIndex>>;

/// A watch event handler for kind `K` that applies its events to `index`.
pub fn index_events<K: SgIndexed>(index: SharedSgIndex) -> impl FnMut(&Event<K>) {
    // during a relist: the keys the index held that it has not seen again
    let mut unseen: Option<HashSet<String>> = None;
    move |event| {
        let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(o) => index.apply(o),
            Event::Delete(o) => index.delete(o),
            Event::Init => unseen = Some(index.keys(K::KIND).into_iter().collect()),
            Event::InitApply(o) => {
                if let Some(unseen) = unseen.as_mut() {
                    unseen.remove(&o.index_key());
                }
                index.apply(o);
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
    use cozyplane_api::Port;
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
        let mut on_event = index_events::<Port>(index.clone());
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
