//! Diff-sync: make a kernel map hold the desired entries, pruning stale ones.
//!
//! The agent never keeps a shadow copy of what it wrote: every sync reads
//! the map itself ([`KernelMap::iter`]), so after a restart, a crash halfway
//! through a previous sync, or somebody else's write, the next sync still
//! converges. Only entries the caller *owns* (an ownership predicate over
//! key and value) are ever replaced or pruned, because several writers
//! share some maps: the remote sync must not prune the entries the CNI
//! handler wrote for local pods, nor a VPC writer's entries.
//!
//! Order matters for traffic in flight: inserts and replacements go first,
//! removals last (make before break), so an address that moves between keys
//! is never briefly unroutable. A failing entry does not stop the others: the
//! [`SyncReport`] lists each failure, with the map's own error (errno
//! included), and the caller retries later.

use std::collections::BTreeMap;

/// A kernel map as the sync sees it. The datapath crate's typed maps
/// implement this through the conversion seam (see [`crate::desired`]).
pub trait KernelMap<K, V> {
    /// The map's error type.
    type Error: std::error::Error + 'static;
    /// Every entry currently in the map.
    fn iter(&self) -> Result<Vec<(K, V)>, Self::Error>;
    /// Inserts or replaces one entry.
    fn insert(&mut self, key: &K, value: &V) -> Result<(), Self::Error>;
    /// Removes one entry; `false` if it was not there.
    fn remove(&mut self, key: &K) -> Result<bool, Self::Error>;
}

/// What the sync did to one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Added a missing entry.
    Insert,
    /// Overwrote an entry with another value.
    Replace,
    /// Removed a stale entry.
    Remove,
}

/// One entry the sync could not fix; `E` is the map's error type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure<K, E> {
    /// The kernel refused the operation.
    Kernel {
        /// The entry.
        key: K,
        /// What was attempted.
        op: Op,
        /// The kernel's error.
        error: E,
    },
    /// A desired key is held by an entry this sync does not own: left alone.
    NotOwned {
        /// The entry.
        key: K,
    },
}

/// The outcome of one sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport<K, E> {
    /// Entries added.
    pub inserted: usize,
    /// Entries overwritten with a new value.
    pub replaced: usize,
    /// Stale entries removed.
    pub removed: usize,
    /// Entries already right.
    pub unchanged: usize,
    /// Entries that could not be fixed.
    pub failures: Vec<Failure<K, E>>,
}

impl<K, E> Default for SyncReport<K, E> {
    fn default() -> Self {
        Self {
            inserted: 0,
            replaced: 0,
            removed: 0,
            unchanged: 0,
            failures: Vec::new(),
        }
    }
}

impl<K, E> SyncReport<K, E> {
    /// Did the map end up exactly as desired?
    pub fn converged(&self) -> bool {
        self.failures.is_empty()
    }

    /// Did the sync write anything?
    pub fn changed(&self) -> bool {
        self.inserted + self.replaced + self.removed > 0
    }
}

/// The map could not even be read: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read the map")]
pub struct ReadError<E>(#[source] pub E);

/// Makes `map` hold `desired` for every owned entry; see the module docs.
///
/// `owns(key, value)` says whether an existing entry belongs to this sync.
/// Desired keys must be owned keys; one held by a foreign entry is reported
/// as [`Failure::NotOwned`] and not overwritten.
pub fn sync<K, V, M>(
    map: &mut M,
    desired: &BTreeMap<K, V>,
    owns: impl Fn(&K, &V) -> bool,
) -> Result<SyncReport<K, M::Error>, ReadError<M::Error>>
where
    K: Ord + Clone,
    V: PartialEq,
    M: KernelMap<K, V>,
{
    let current: BTreeMap<K, V> = map.iter().map_err(ReadError)?.into_iter().collect();
    let mut report = SyncReport::default();
    for (key, want) in desired {
        let op = match current.get(key) {
            Some(have) if !owns(key, have) => {
                report.failures.push(Failure::NotOwned { key: key.clone() });
                continue;
            }
            Some(have) if have == want => {
                report.unchanged += 1;
                continue;
            }
            Some(_) => Op::Replace,
            None => Op::Insert,
        };
        write(map, key, want, op, &mut report);
    }
    for (key, have) in &current {
        if desired.contains_key(key) || !owns(key, have) {
            continue;
        }
        // Ok(false): somebody removed it between our read and now
        remove(map, key, &mut report);
    }
    Ok(report)
}

/// Inserts or replaces (`op`) one entry, counting it in `report`.
fn write<K: Clone, V, M: KernelMap<K, V>>(
    map: &mut M,
    key: &K,
    want: &V,
    op: Op,
    report: &mut SyncReport<K, M::Error>,
) {
    match map.insert(key, want) {
        Ok(()) if op == Op::Insert => report.inserted += 1,
        Ok(()) => report.replaced += 1,
        Err(e) => report.failures.push(Failure::Kernel {
            key: key.clone(),
            op,
            error: e,
        }),
    }
}

/// Removes one entry, counting it in `report` (one already gone is fine).
fn remove<K: Clone, V, M: KernelMap<K, V>>(
    map: &mut M,
    key: &K,
    report: &mut SyncReport<K, M::Error>,
) {
    match map.remove(key) {
        Ok(true) => report.removed += 1,
        Ok(false) => {}
        Err(e) => report.failures.push(Failure::Kernel {
            key: key.clone(),
            op: Op::Remove,
            error: e,
        }),
    }
}

/// What one map held after its last converged sync, so the next sync of a
/// map this writer owns whole writes only what changed.
///
/// At cluster scale a full [`sync`] of the remotes map reads every entry
/// from the kernel (two syscalls each) on every pass: ~19 ms per pass with
/// 5 000 pods, and every pod started anywhere causes a pass on every node.
/// A mirrored sync compares the desired entries with the last converged
/// ones in memory and writes the difference. It trusts the mirror only
/// while it is young: a pass after [`MIRROR_FULL_EVERY`], after any
/// failed or unreadable sync, and the first one are full syncs that read
/// the map, so an entry changed behind the agent's back (another process,
/// a replaced pin) is corrected within that bound. Only for maps whose sync
/// owns every entry: a foreign entry under a newly desired key would be
/// overwritten, not reported.
#[derive(Debug)]
pub struct Mirror<K, V> {
    last: Option<BTreeMap<K, V>>,
    full_at: Option<std::time::Instant>,
    full_every: std::time::Duration,
}

/// How long a [`Mirror`] is trusted after the full sync that made it.
pub const MIRROR_FULL_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl<K, V> Default for Mirror<K, V> {
    fn default() -> Self {
        Self {
            last: None,
            full_at: None,
            full_every: MIRROR_FULL_EVERY,
        }
    }
}

impl<K: Ord + Clone, V: PartialEq + Clone> Mirror<K, V> {
    /// A mirror trusted for `full_every` after each full sync (tests).
    pub fn with_full_every(full_every: std::time::Duration) -> Self {
        Self {
            full_every,
            ..Self::default()
        }
    }

    /// Syncs `map` to `desired` (which it must own whole): a full [`sync`]
    /// or, while the mirror is trusted, only the difference from the last
    /// converged state.
    pub fn sync<M>(
        &mut self,
        map: &mut M,
        desired: &BTreeMap<K, V>,
    ) -> Result<SyncReport<K, M::Error>, ReadError<M::Error>>
    where
        M: KernelMap<K, V>,
    {
        let trusted = self
            .full_at
            .is_some_and(|at| at.elapsed() < self.full_every);
        let (report, full) = match self.last.as_ref().filter(|_| trusted) {
            Some(last) => (delta(map, last, desired), false),
            None => match sync(map, desired, |_, _| true) {
                Ok(r) => (r, true),
                Err(e) => {
                    self.last = None;
                    return Err(e);
                }
            },
        };
        if report.converged() {
            self.last = Some(desired.clone());
            if full {
                self.full_at = Some(std::time::Instant::now());
            }
        } else {
            self.last = None;
        }
        Ok(report)
    }
}

/// Writes what differs between `last` (the map's converged state) and
/// `desired`: inserts and replacements first, removals last.
fn delta<K, V, M>(
    map: &mut M,
    last: &BTreeMap<K, V>,
    desired: &BTreeMap<K, V>,
) -> SyncReport<K, M::Error>
where
    K: Ord + Clone,
    V: PartialEq,
    M: KernelMap<K, V>,
{
    let mut report = SyncReport::default();
    for (key, want) in desired {
        let op = match last.get(key) {
            Some(have) if have == want => {
                report.unchanged += 1;
                continue;
            }
            Some(_) => Op::Replace,
            None => Op::Insert,
        };
        write(map, key, want, op, &mut report);
    }
    for key in last.keys().filter(|k| !desired.contains_key(*k)) {
        remove(map, key, &mut report);
    }
    report
}

#[cfg(any(test, feature = "test-util"))]
pub use memory_map::{MemoryMap, MemoryMapError};

#[cfg(any(test, feature = "test-util"))]
mod memory_map {
    use std::collections::BTreeMap;

    use super::{KernelMap, Op};

    /// The error of a [`MemoryMap`]: what the test injected (or "map full").
    #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
    #[error("{0}")]
    pub struct MemoryMapError(pub &'static str);

    impl From<&'static str> for MemoryMapError {
        fn from(s: &'static str) -> Self {
            MemoryMapError(s)
        }
    }

    /// An in-memory [`KernelMap`] for tests of everything that syncs, with
    /// injectable per-key failures and a capacity (a full hash map refuses
    /// inserts, as the kernel's does with `E2BIG`).
    #[derive(Debug, Clone)]
    pub struct MemoryMap<K, V> {
        /// The entries.
        pub entries: BTreeMap<K, V>,
        /// Keys whose insert or remove fails.
        pub failing: Vec<K>,
        /// Whether `iter` fails.
        pub unreadable: bool,
        /// The most entries the map holds.
        pub capacity: usize,
        /// Every write performed, in order (for ordering assertions).
        pub log: Vec<(Op, K)>,
    }

    impl<K: Ord, V> Default for MemoryMap<K, V> {
        fn default() -> Self {
            Self {
                entries: BTreeMap::new(),
                failing: Vec::new(),
                unreadable: false,
                capacity: usize::MAX,
                log: Vec::new(),
            }
        }
    }

    impl<K: Ord + Clone, V: Clone> KernelMap<K, V> for MemoryMap<K, V> {
        type Error = MemoryMapError;

        fn iter(&self) -> Result<Vec<(K, V)>, MemoryMapError> {
            if self.unreadable {
                return Err("injected read failure".into());
            }
            Ok(self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }

        fn insert(&mut self, key: &K, value: &V) -> Result<(), MemoryMapError> {
            if self.failing.contains(key) {
                return Err("injected insert failure".into());
            }
            if !self.entries.contains_key(key) && self.entries.len() >= self.capacity {
                return Err("map full".into());
            }
            let op = if self.entries.contains_key(key) {
                Op::Replace
            } else {
                Op::Insert
            };
            self.log.push((op, key.clone()));
            self.entries.insert(key.clone(), value.clone());
            Ok(())
        }

        fn remove(&mut self, key: &K) -> Result<bool, MemoryMapError> {
            if self.failing.contains(key) {
                return Err("injected remove failure".into());
            }
            self.log.push((Op::Remove, key.clone()));
            Ok(self.entries.remove(key).is_some())
        }
    }
}

#[cfg(test)]
mod tests;
