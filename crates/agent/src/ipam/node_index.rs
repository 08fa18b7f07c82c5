//! [`NodeIndexed`]: a [`ClaimStore`] that finds a pod's claims by reading
//! them by name, from an index of this node's claim names, instead of a label
//! scan over every claim of the cluster.
//!
//! # Why
//! Every ADD and DEL asks for the pod's claims (a retried ADD reuses them, a
//! DEL releases them). As a label-selected list that is a scan of the whole
//! cluster's claims on the API server (and, with etcd, a range read of all of
//! them): its cost grows with the cluster, not with the pod. Here it costs
//! one read by name per claim the pod holds, and none for a new pod.
//!
//! # Why it is not a cache
//! The allocator's rule stands (docs/agent.md "IPAM is name-as-claim"): what
//! decides is a live read. The index holds *names*, never objects: every
//! claim [`ClaimStore::list_by_pod_uid`] returns was read by name from the
//! API server in that call, so a stale name (a claim the controller's GC or a
//! revocation deleted) costs a read and is dropped. The only error that
//! matters is a *missing* name — a claim of this node's pod the index does
//! not know — and that cannot arise:
//! - the claims of this node's pods are made by this node's agent only, so
//!   each is either listed (the seed, a live list by node) or made through
//!   this store (its create records it before returning);
//! - until the seed's first list succeeds, every lookup is a live list;
//! - a create whose outcome is unknown (`Unavailable`: it may have been
//!   applied) puts its pod in doubt: that pod's lookups are live lists until
//!   one that began after the doubt succeeds;
//! - a created claim labelled for another node (never made by the agent) puts
//!   its pod in doubt the same way, and so does a live list that finds one:
//!   such a claim cannot be recorded, so its pod is listed live while it
//!   exists;
//! - removals are ordered: a name is dropped only for a read or delete that
//!   began after the name was recorded (a generation counter), so a create
//!   racing a stale delete or read of the same name keeps its entry.
//!
//! A list by node (the CNI GC's, and the periodic reseed) re-seeds the
//! index: names it lists are recorded, names recorded before it began and
//! absent from it are dropped, so names of claims others deleted do not pile
//! up.

use std::collections::{BTreeSet, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::store::{ClaimObject, ClaimStore, Created, Deleted, StoreError};

/// See the module docs.
pub struct NodeIndexed<S, O> {
    shared: Arc<Shared<S>>,
    _kind: PhantomData<fn() -> O>,
}

impl<S, O> Clone for NodeIndexed<S, O> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            _kind: PhantomData,
        }
    }
}

struct Shared<S> {
    inner: S,
    node: String,
    index: Mutex<Index>,
}

/// The recorded names of this node's claims.
#[derive(Debug, Default)]
struct Index {
    /// A list by node has succeeded at least once.
    seeded: bool,
    /// Bumped by every recording and at the start of every read that may
    /// drop names.
    generation: u64,
    by_name: HashMap<String, Entry>,
    by_pod: HashMap<String, BTreeSet<String>>,
    /// Pods whose lookups must be live lists, with the generation at which
    /// the doubt arose.
    doubt: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
struct Entry {
    pod: String,
    /// The claim's `metadata.uid`, when known.
    uid: Option<String>,
    generation: u64,
}

impl Index {
    fn tick(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    fn record(&mut self, name: &str, pod: &str, uid: Option<String>) {
        let generation = self.tick();
        if let Some(old) = self.by_name.get(name) {
            if old.pod != pod {
                let old_pod = old.pod.clone();
                self.unlink(&old_pod, name);
            }
        }
        self.by_name.insert(
            name.to_string(),
            Entry {
                pod: pod.to_string(),
                uid,
                generation,
            },
        );
        self.by_pod
            .entry(pod.to_string())
            .or_default()
            .insert(name.to_string());
    }

    fn unlink(&mut self, pod: &str, name: &str) {
        if let Some(names) = self.by_pod.get_mut(pod) {
            names.remove(name);
            if names.is_empty() {
                self.by_pod.remove(pod);
            }
        }
    }

    /// Drops `name` if it was recorded before `began` (and, with `uid`, only
    /// if it records that claim).
    fn drop_if_older(&mut self, name: &str, began: u64, uid: Option<&str>) {
        let Some(entry) = self.by_name.get(name) else {
            return;
        };
        if entry.generation >= began || uid.is_some_and(|u| entry.uid.as_deref() != Some(u)) {
            return;
        }
        let pod = entry.pod.clone();
        self.by_name.remove(name);
        self.unlink(&pod, name);
    }

    fn doubt(&mut self, pod: &str) {
        let generation = self.tick();
        self.doubt.insert(pod.to_string(), generation);
    }
}

/// The label value a claim is found by.
fn label<'a, O: ClaimObject>(obj: &'a O, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

impl<S, O> NodeIndexed<S, O>
where
    S: ClaimStore<O>,
    O: ClaimObject,
{
    /// Indexes the claims of `node` made or listed through `inner`.
    pub fn new(inner: S, node: impl Into<String>) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                node: node.into(),
                index: Mutex::default(),
            }),
            _kind: PhantomData,
        }
    }

    /// The store underneath (tests inspect it).
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// Lists this node's claims and re-seeds the index from them (see the
    /// module docs); returns how many names the index holds.
    pub async fn seed(&self) -> Result<usize, StoreError> {
        let node = self.shared.node.clone();
        self.list_by_node(&node).await?;
        Ok(self.len())
    }

    /// Whether a list by node has succeeded (until then every lookup is a
    /// live list).
    pub fn is_seeded(&self) -> bool {
        self.index().seeded
    }

    /// How many claim names the index holds.
    pub fn len(&self) -> usize {
        self.index().by_name.len()
    }

    /// Whether the index holds no name.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        // No code path panics while holding the lock; recover the data if
        // one ever did rather than wedge every ADD.
        self.shared.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `obj` if it is one of this node's claims.
    fn record_listed(&self, ix: &mut Index, obj: &O) {
        let (Some(name), Some(pod)) = (obj.meta().name.as_deref(), label(obj, O::POD_UID_LABEL))
        else {
            return;
        };
        if label(obj, O::NODE_LABEL) != Some(self.shared.node.as_str()) {
            return;
        }
        let uid = obj.meta().uid.clone();
        let same = ix
            .by_name
            .get(name)
            .is_some_and(|e| e.pod == pod && e.uid == uid);
        if !same {
            ix.record(name, pod, uid);
        }
    }
}

#[async_trait]
impl<S, O> ClaimStore<O> for NodeIndexed<S, O>
where
    S: ClaimStore<O>,
    O: ClaimObject,
{
    async fn create(&self, claim: &O) -> Result<Created<O>, StoreError> {
        let result = self.shared.inner.create(claim).await;
        let Some(pod) = label(claim, O::POD_UID_LABEL) else {
            return result;
        };
        let mut ix = self.index();
        match &result {
            Ok(Created::Created(obj)) => {
                let ours = label(claim, O::NODE_LABEL) == Some(self.shared.node.as_str());
                match obj.meta().name.as_deref() {
                    Some(name) if ours => ix.record(name, pod, obj.meta().uid.clone()),
                    _ => ix.doubt(pod),
                }
            }
            Ok(Created::AlreadyExists) | Err(StoreError::Rejected(_)) => {}
            // It may have been applied: this pod's claims are listed live
            // until a list that began after now succeeds.
            Err(StoreError::Unavailable(_)) => ix.doubt(pod),
        }
        drop(ix);
        result
    }

    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
        let began = self.index().tick();
        let result = self.shared.inner.delete(name, uid).await;
        let mut ix = self.index();
        match &result {
            Ok(Deleted::Deleted) | Ok(Deleted::NotFound) => ix.drop_if_older(name, began, None),
            // Another claim holds the name: drop only the record of ours.
            Ok(Deleted::UidMismatch) => ix.drop_if_older(name, began, Some(uid)),
            Err(_) => {}
        }
        drop(ix);
        result
    }

    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<O>, StoreError> {
        let (began, names) = {
            let mut ix = self.index();
            let began = ix.tick();
            let live = !ix.seeded || ix.doubt.contains_key(pod_uid);
            let names = (!live).then(|| ix.by_pod.get(pod_uid).cloned().unwrap_or_default());
            (began, names)
        };
        let Some(names) = names else {
            let listed = self.shared.inner.list_by_pod_uid(pod_uid).await?;
            let mut ix = self.index();
            for obj in &listed {
                self.record_listed(&mut ix, obj);
            }
            // A claim of this pod labelled for another node cannot be
            // recorded: the pod stays in doubt while one exists.
            let foreign = listed
                .iter()
                .any(|o| label(o, O::NODE_LABEL) != Some(self.shared.node.as_str()));
            if foreign {
                ix.doubt(pod_uid);
            } else if ix.doubt.get(pod_uid).is_some_and(|&g| g < began) {
                ix.doubt.remove(pod_uid);
            }
            return Ok(listed);
        };
        let reads = futures::future::join_all(
            names
                .iter()
                .map(|name| async move { (name, self.shared.inner.get(name).await) }),
        )
        .await;
        let mut found = Vec::new();
        let mut ix = self.index();
        for (name, read) in reads {
            match read? {
                Some(obj) if label(&obj, O::POD_UID_LABEL) == Some(pod_uid) => {
                    self.record_listed(&mut ix, &obj);
                    found.push(obj);
                }
                // Gone, or the name now holds another pod's claim: not this
                // pod's any more.
                Some(obj) => {
                    ix.drop_if_older(name, began, None);
                    self.record_listed(&mut ix, &obj);
                }
                None => ix.drop_if_older(name, began, None),
            }
        }
        drop(ix);
        Ok(found)
    }

    async fn list_by_node(&self, node: &str) -> Result<Vec<O>, StoreError> {
        let began = self.index().tick();
        let listed = self.shared.inner.list_by_node(node).await?;
        if node != self.shared.node {
            return Ok(listed);
        }
        let mut ix = self.index();
        let names: BTreeSet<&str> = listed
            .iter()
            .filter_map(|o| o.meta().name.as_deref())
            .collect();
        let gone: Vec<String> = ix
            .by_name
            .iter()
            .filter(|(name, e)| e.generation < began && !names.contains(name.as_str()))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            ix.drop_if_older(&name, began, None);
        }
        for obj in &listed {
            self.record_listed(&mut ix, obj);
        }
        ix.seeded = true;
        drop(ix);
        Ok(listed)
    }

    async fn get(&self, name: &str) -> Result<Option<O>, StoreError> {
        self.shared.inner.get(name).await
    }
}

#[cfg(test)]
mod tests;
