//! Keeps an in-memory index in step with a watch ([`index_events`]): the
//! SecurityGroup compiler's [`SgIndex`](crate::compile::security_groups::SgIndex)
//! (`sg_watch.rs`) and the Services compiler's
//! [`ServiceIndex`](crate::compile::services::ServiceIndex) (`svc_watch.rs`).
//!
//! Every watch event is applied to the index as it arrives (in the watch
//! stream, beside the reflector store), so the per-object work is paid once
//! per changed object, not once per compile. A relist (`Init` … `InitDone`)
//! also removes what it did not deliver again: objects deleted while the
//! watch was down.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use kube::runtime::watcher::Event;

/// An index that holds objects of kind `K`.
pub trait WatchIndex<K> {
    /// The key the index knows `object` by.
    fn key_of(object: &K) -> String;
    /// Adds or replaces `object`.
    fn apply_object(&mut self, object: &K);
    /// Removes `object`.
    fn delete_object(&mut self, object: &K);
    /// The keys held of `K`'s kind.
    fn held(&self) -> Vec<String>;
    /// Forgets the object of `K`'s kind with key `key`.
    fn forget(&mut self, key: &str);
}

/// A watch event handler for kind `K` that applies its events to `index`.
pub fn index_events<K, I: WatchIndex<K>>(index: Arc<Mutex<I>>) -> impl FnMut(&Event<K>) {
    // during a relist: the keys the index held that it has not seen again
    let mut unseen: Option<HashSet<String>> = None;
    move |event| {
        let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Event::Apply(o) => index.apply_object(o),
            Event::Delete(o) => index.delete_object(o),
            Event::Init => unseen = Some(index.held().into_iter().collect()),
            Event::InitApply(o) => {
                if let Some(unseen) = unseen.as_mut() {
                    unseen.remove(&I::key_of(o));
                }
                index.apply_object(o);
            }
            Event::InitDone => {
                for key in unseen.take().unwrap_or_default() {
                    index.forget(&key);
                }
            }
        }
    }
}
