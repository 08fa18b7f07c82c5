//! An in-memory [`ClaimStore`] with the API server's semantics that matter
//! to IPAM: names are unique, creates are atomic, UIDs are assigned by the
//! store and deletes honour the UID precondition. Every call yields to the
//! scheduler before it touches the table, so concurrent allocations really
//! interleave in tests. Faults can be injected to test rollback.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use cozyplane_api::FabricIP;

use super::store::{ClaimObject, ClaimStore, Created, Deleted, StoreError};

/// Which calls fail, and how.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Creates that succeed before every further create fails.
    pub creates_before_failure: Option<usize>,
    /// The failing create is applied but reported as `Unavailable` (a
    /// timeout after commit), instead of failing before it is applied.
    pub create_applied_then_lost: bool,
    /// Every delete fails with `Unavailable`.
    pub deletes_fail: bool,
}

/// See the module docs.
#[derive(Debug)]
pub struct MemoryClaimStore<O = FabricIP> {
    objects: Mutex<BTreeMap<String, O>>,
    faults: Mutex<Faults>,
    next_uid: AtomicU64,
    creates: AtomicU64,
}

impl<O: ClaimObject> Default for MemoryClaimStore<O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O: ClaimObject> MemoryClaimStore<O> {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            objects: Mutex::default(),
            faults: Mutex::default(),
            next_uid: AtomicU64::default(),
            creates: AtomicU64::default(),
        }
    }

    /// Replaces the fault plan.
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.faults) = faults;
    }

    /// A snapshot of every stored claim, by name.
    pub fn snapshot(&self) -> BTreeMap<String, O> {
        lock(&self.objects).clone()
    }

    /// How many create calls were made (successful or not).
    pub fn create_calls(&self) -> u64 {
        self.creates.load(Ordering::SeqCst)
    }

    /// Inserts an object as if somebody else created it (returns its UID).
    pub fn insert_foreign(&self, mut obj: O) -> String {
        let uid = format!("uid-{}", self.next_uid.fetch_add(1, Ordering::SeqCst));
        obj.meta_mut().uid = Some(uid.clone());
        let name = obj.meta().name.clone().unwrap_or_default();
        lock(&self.objects).insert(name, obj);
        uid
    }

    fn list_by_label(&self, key: &str, value: &str) -> Vec<O> {
        lock(&self.objects)
            .values()
            .filter(|o| {
                o.meta()
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .is_some_and(|v| v == value)
            })
            .cloned()
            .collect()
    }
}

/// Locks a mutex, recovering the data if a panicking test thread poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl<O: ClaimObject> ClaimStore<O> for MemoryClaimStore<O> {
    async fn create(&self, claim: &O) -> Result<Created<O>, StoreError> {
        tokio::task::yield_now().await;
        let n = self.creates.fetch_add(1, Ordering::SeqCst);
        let faults = lock(&self.faults).clone();
        let failing = faults
            .creates_before_failure
            .is_some_and(|ok| n >= ok as u64);
        if failing && !faults.create_applied_then_lost {
            return Err(StoreError::Unavailable("injected create failure".into()));
        }
        let name = claim
            .meta()
            .name
            .clone()
            .ok_or_else(|| StoreError::Rejected("claim without a name".into()))?;
        let stored = {
            let mut objects = lock(&self.objects);
            if objects.contains_key(&name) {
                return Ok(Created::AlreadyExists);
            }
            let mut obj = claim.clone();
            obj.meta_mut().uid = Some(format!(
                "uid-{}",
                self.next_uid.fetch_add(1, Ordering::SeqCst)
            ));
            objects.insert(name, obj.clone());
            obj
        };
        if failing {
            return Err(StoreError::Unavailable(
                "injected timeout after the create was applied".into(),
            ));
        }
        Ok(Created::Created(Box::new(stored)))
    }

    async fn delete(&self, name: &str, uid: &str) -> Result<Deleted, StoreError> {
        tokio::task::yield_now().await;
        if lock(&self.faults).deletes_fail {
            return Err(StoreError::Unavailable("injected delete failure".into()));
        }
        let mut objects = lock(&self.objects);
        match objects.get(name) {
            None => Ok(Deleted::NotFound),
            Some(o) if o.meta().uid.as_deref() != Some(uid) => Ok(Deleted::UidMismatch),
            Some(_) => {
                objects.remove(name);
                Ok(Deleted::Deleted)
            }
        }
    }

    async fn list_by_pod_uid(&self, pod_uid: &str) -> Result<Vec<O>, StoreError> {
        tokio::task::yield_now().await;
        Ok(self.list_by_label(O::POD_UID_LABEL, pod_uid))
    }

    async fn list_by_node(&self, node: &str) -> Result<Vec<O>, StoreError> {
        tokio::task::yield_now().await;
        Ok(self.list_by_label(O::NODE_LABEL, node))
    }

    async fn get(&self, name: &str) -> Result<Option<O>, StoreError> {
        tokio::task::yield_now().await;
        Ok(lock(&self.objects).get(name).cloned())
    }
}
