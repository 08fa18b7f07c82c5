//! Typed access to the datapath maps, shaped for the agent's diff-sync:
//! `insert` overwrites, `get` returns `None` for a missing key, `remove` is
//! idempotent (reports whether something was removed), `entries` snapshots
//! the whole map so the agent can prune what it no longer wants.

use std::os::fd::AsFd;

use aya::maps::lpm_trie::Key;
use aya::maps::{HashMap, IterableMap, LpmTrie, MapData, MapError};
use aya::Pod;

use crate::abi::EpKey;
use crate::error::{DatapathError, Result};

/// Is this "the key was not there"? aya reports it as `KeyNotFound` on
/// lookups and as an `ENOENT` syscall error on deletes.
pub(crate) fn is_not_found(e: &MapError) -> bool {
    match e {
        MapError::KeyNotFound => true,
        MapError::SyscallError(s) => s.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// A pinned hash (or LRU hash) map with typed keys and values.
pub struct HashTable<K, V> {
    name: &'static str,
    map: HashMap<MapData, K, V>,
}

impl<K: Pod, V: Pod> HashTable<K, V> {
    pub(crate) fn new(name: &'static str, map: HashMap<MapData, K, V>) -> Self {
        Self { name, map }
    }

    /// Map name (as pinned).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Insert or overwrite.
    pub fn insert(&mut self, key: &K, value: &V) -> Result<()> {
        self.map
            .insert(key, value, 0)
            .map_err(|e| DatapathError::map(self.name, e))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        match self.map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(DatapathError::map(self.name, e)),
        }
    }

    /// Inserts or overwrites `entries` in order with `BPF_MAP_UPDATE_BATCH`
    /// (element by element where the kernel has no batches). On an error:
    /// how many were written before the failing one, and the error.
    pub fn insert_batch(&mut self, entries: &[(K, V)]) -> Result<(), (usize, DatapathError)> {
        let (keys, values): (Vec<K>, Vec<V>) = entries.iter().copied().unzip();
        match crate::batch::update(self.map.map().fd().as_fd(), &keys, &values) {
            Ok(()) => return Ok(()),
            Err((0, e)) if crate::batch::unsupported(&e) => {}
            Err((n, e)) => return Err((n, self.syscall_error("bpf_map_update_batch", e))),
        }
        for (n, (k, v)) in entries.iter().enumerate() {
            self.insert(k, v).map_err(|e| (n, e))?;
        }
        Ok(())
    }

    fn syscall_error(&self, call: &'static str, io_error: std::io::Error) -> DatapathError {
        DatapathError::map(
            self.name,
            MapError::SyscallError(aya::sys::SyscallError { call, io_error }),
        )
    }

    /// Remove `key`; `Ok(false)` if it was not there.
    pub fn remove(&mut self, key: &K) -> Result<bool> {
        match self.map.remove(key) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(DatapathError::map(self.name, e)),
        }
    }

    /// Snapshot of every entry. Entries deleted concurrently by the kernel
    /// (LRU eviction) during the walk are skipped, not reported as errors.
    /// One `BPF_MAP_LOOKUP_BATCH` per few thousand entries where the kernel
    /// has it, else two syscalls per entry.
    pub fn entries(&self) -> Result<Vec<(K, V)>> {
        match crate::batch::lookup_all::<K, V>(self.map.map().fd().as_fd()) {
            Ok(v) => return Ok(v),
            Err(e) if crate::batch::unsupported(&e) => {}
            Err(e) => return Err(self.syscall_error("bpf_map_lookup_batch", e)),
        }
        self.entries_one_by_one()
    }

    /// [`Self::entries`] without batching: `BPF_MAP_GET_NEXT_KEY` and a
    /// lookup per entry.
    pub fn entries_one_by_one(&self) -> Result<Vec<(K, V)>> {
        let mut out = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok(kv) => out.push(kv),
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(DatapathError::map(self.name, e)),
            }
        }
        Ok(out)
    }
}

/// A pinned LPM trie with typed values; keys are scoped (`struct
/// cp_lpm_key`, data [`EpKey`]) unless `K` says otherwise.
pub struct LpmTable<V, K = EpKey> {
    name: &'static str,
    map: LpmTrie<MapData, K, V>,
}

impl<V: Pod, K: Pod> LpmTable<V, K> {
    pub(crate) fn new(name: &'static str, map: LpmTrie<MapData, K, V>) -> Self {
        Self { name, map }
    }

    /// Map name (as pinned).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Insert or overwrite the prefix `key`.
    pub fn insert(&mut self, key: &Key<K>, value: &V) -> Result<()> {
        self.map
            .insert(key, value, 0)
            .map_err(|e| DatapathError::map(self.name, e))
    }

    /// Exact-prefix lookup is not what a trie answers: this returns the
    /// value of the longest prefix matching `key`, as the datapath sees it.
    pub fn lookup(&self, key: &Key<K>) -> Result<Option<V>> {
        match self.map.get(key, 0) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(DatapathError::map(self.name, e)),
        }
    }

    /// Remove the exact prefix `key`; `Ok(false)` if it was not there.
    pub fn remove(&mut self, key: &Key<K>) -> Result<bool> {
        match self.map.remove(key) {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(DatapathError::map(self.name, e)),
        }
    }

    /// Snapshot of every prefix and its value.
    pub fn entries(&self) -> Result<Vec<(Key<K>, V)>> {
        let mut out = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok(kv) => out.push(kv),
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(DatapathError::map(self.name, e)),
            }
        }
        Ok(out)
    }
}
