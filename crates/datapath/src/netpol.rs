//! NetworkPolicy in the kernel: typed access to its maps (`bpf/netpol.h`),
//! the desired state the agent's compiler produces, and the sync that makes
//! the maps hold it.
//!
//! The sync owns `cp_np_eps`, `cp_np_rules`, `cp_np_deny`, `cp_np_cidrs`
//! and `cp_np_epoch` (nobody else writes them): whatever is not desired is
//! pruned. It reads the maps on the first pass and after any failed one, so
//! it converges after a restart or a half-done earlier pass; in between it
//! diffs against a mirror of what it wrote (`NpMaps::mirror`). It orders
//! its writes make before break: rules, deny rules and CIDR classes are
//! written before the endpoints (and the host's pseudo endpoint) that use
//! them, and removed after.
//!
//! After a pass that changed anything the epoch is bumped, last: every
//! tracked flow's cached verdict is then void and its next packet is judged
//! against the maps as they now stand (`docs/policy.md`, "Connection
//! tracking").

use aya::maps::{Array, MapData};

use crate::abi::{EpKey, NpCidr, NpCidrKey, NpEp, NpRule, NpRuleKey};
use crate::error::DatapathError;
use crate::sg::{SgSyncReport, SgTable};
use crate::sorted::{merge, Merge, SortedMap};
use crate::tables::{HashTable, LpmTable};

/// The NetworkPolicy maps of a loaded datapath.
pub struct NpMaps {
    /// `cp_np_eps`: pod address → identity and isolation.
    pub eps: HashTable<EpKey, NpEp>,
    /// `cp_np_rules`: {subject, dir, peer, proto | port bits} → 1.
    pub rules: LpmTable<u32, NpRule>,
    /// `cp_np_deny`: the same keys, for deny rules.
    pub deny: LpmTable<u32, NpRule>,
    /// `cp_np_cidrs`: {subject, dir | address bits} → CIDR class.
    pub cidrs: LpmTable<u32, NpCidr>,
    /// `cp_np_epoch`: the policy epoch.
    pub epoch: Array<MapData, u32>,
    /// What the maps hold, as of the last sync that converged (`None`:
    /// unknown, read them).
    pub mirror: Option<NpDesired>,
}

/// An LPM key as an ordered value: its prefix length (the bits after the
/// prefix-length field, fixed fields included) and its data. Ordered by
/// the data first, so that the keys of one subject (the data's first
/// field) are contiguous: the compile sorts each subject's rules alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefixed<T> {
    /// Prefix length of the key.
    pub prefix_len: u32,
    /// The key's data; bits beyond the prefix are zero.
    pub data: T,
}

impl<T: Ord> Ord for Prefixed<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.data, self.prefix_len).cmp(&(&other.data, other.prefix_len))
    }
}

impl<T: Ord> PartialOrd for Prefixed<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: Copy + aya::Pod> Prefixed<T> {
    fn key(&self) -> aya::maps::lpm_trie::Key<T> {
        aya::maps::lpm_trie::Key::new(self.prefix_len, self.data)
    }

    fn of(k: &aya::maps::lpm_trie::Key<T>) -> Self {
        Self {
            prefix_len: k.prefix_len(),
            data: k.data(),
        }
    }
}

impl From<NpRuleKey> for Prefixed<NpRule> {
    fn from(k: NpRuleKey) -> Self {
        Self::of(&k)
    }
}

impl From<NpCidrKey> for Prefixed<NpCidr> {
    fn from(k: NpCidrKey) -> Self {
        Self::of(&k)
    }
}

impl<T: Copy + aya::Pod> SgTable<Prefixed<T>, u32> for LpmTable<u32, T> {
    fn entries(&self) -> Result<Vec<(Prefixed<T>, u32)>, DatapathError> {
        Ok(LpmTable::entries(self)?
            .into_iter()
            .map(|(k, v)| (Prefixed::of(&k), v))
            .collect())
    }
    fn insert(&mut self, key: &Prefixed<T>, value: &u32) -> Result<(), DatapathError> {
        LpmTable::insert(self, &key.key(), value)
    }
    fn remove(&mut self, key: &Prefixed<T>) -> Result<bool, DatapathError> {
        LpmTable::remove(self, &key.key())
    }
}

impl SgTable<EpKey, NpEp> for HashTable<EpKey, NpEp> {
    fn entries(&self) -> Result<Vec<(EpKey, NpEp)>, DatapathError> {
        HashTable::entries(self)
    }
    fn insert(&mut self, key: &EpKey, value: &NpEp) -> Result<(), DatapathError> {
        HashTable::insert(self, key, value)
    }
    fn remove(&mut self, key: &EpKey) -> Result<bool, DatapathError> {
        HashTable::remove(self, key)
    }
}

/// What the NetworkPolicy maps should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NpDesired {
    /// `cp_np_eps`.
    pub eps: SortedMap<EpKey, NpEp>,
    /// `cp_np_rules` (the value is always 1).
    pub rules: SortedMap<Prefixed<NpRule>, u32>,
    /// `cp_np_deny` (the value is always 1).
    pub deny: SortedMap<Prefixed<NpRule>, u32>,
    /// `cp_np_cidrs`: → CIDR class.
    pub cidrs: SortedMap<Prefixed<NpCidr>, u32>,
}

/// The epoch cell, so the sync runs against memory in tests.
pub trait EpochCell {
    /// The current epoch.
    fn get(&self) -> Result<u32, DatapathError>;
    /// Sets the epoch.
    fn set(&mut self, epoch: u32) -> Result<(), DatapathError>;
}

impl EpochCell for Array<MapData, u32> {
    fn get(&self) -> Result<u32, DatapathError> {
        Array::get(self, &0, 0).map_err(|e| DatapathError::map("cp_np_epoch", e))
    }
    fn set(&mut self, epoch: u32) -> Result<(), DatapathError> {
        Array::set(self, 0, epoch, 0).map_err(|e| DatapathError::map("cp_np_epoch", e))
    }
}

/// Writes the entries of `desired` that `have` lacks or holds otherwise,
/// keeping `have` in step with what the kernel accepted (one merge walk of
/// the two sorted maps).
fn write_tracked<K: Ord + Clone, V: PartialEq + Clone>(
    map: &mut impl SgTable<K, V>,
    have: &mut SortedMap<K, V>,
    desired: &SortedMap<K, V>,
    report: &mut SgSyncReport,
) {
    let mut next = Vec::with_capacity(desired.len().max(have.len()));
    for step in merge(have, desired) {
        match step {
            Merge::Left(k, v) => next.push((k.clone(), v.clone())),
            Merge::Both(k, old, v) if old == v => {
                report.unchanged += 1;
                next.push((k.clone(), v.clone()));
            }
            Merge::Both(k, old, v) => match map.insert(k, v) {
                Ok(()) => {
                    report.written += 1;
                    next.push((k.clone(), v.clone()));
                }
                Err(e) => {
                    report.failures.push(e);
                    next.push((k.clone(), old.clone()));
                }
            },
            Merge::Right(k, v) => match map.insert(k, v) {
                Ok(()) => {
                    report.written += 1;
                    next.push((k.clone(), v.clone()));
                }
                Err(e) => report.failures.push(e),
            },
        }
    }
    *have = SortedMap::from_sorted(next);
}

/// Removes the entries of `have` that `desired` lacks, from the kernel and
/// from `have`.
fn prune_tracked<K: Ord + Clone, V: Clone>(
    map: &mut impl SgTable<K, V>,
    have: &mut SortedMap<K, V>,
    desired: &SortedMap<K, V>,
    report: &mut SgSyncReport,
) {
    let mut next = Vec::with_capacity(have.len());
    for step in merge(have, desired) {
        match step {
            Merge::Left(k, v) => match map.remove(k) {
                Ok(gone) => report.removed += usize::from(gone),
                Err(e) => {
                    report.failures.push(e);
                    next.push((k.clone(), v.clone()));
                }
            },
            Merge::Both(k, v, _) => next.push((k.clone(), v.clone())),
            Merge::Right(..) => {}
        }
    }
    *have = SortedMap::from_sorted(next);
}

/// Makes the maps, which hold `have`, hold `desired` (see the module docs
/// for the order), updating `have` as it goes, and bumps the epoch if
/// anything changed. Refused writes are in the report; `have` then still
/// describes the kernel for every entry it names.
pub fn apply_network_policies(
    maps: NpTables<
        '_,
        impl SgTable<EpKey, NpEp>,
        impl SgTable<Prefixed<NpRule>, u32>,
        impl SgTable<Prefixed<NpCidr>, u32>,
    >,
    epoch: &mut impl EpochCell,
    have: &mut NpDesired,
    desired: &NpDesired,
) -> SgSyncReport {
    let NpTables {
        eps,
        rules,
        deny,
        cidrs,
    } = maps;
    let mut report = SgSyncReport::default();
    write_tracked(rules, &mut have.rules, &desired.rules, &mut report);
    write_tracked(deny, &mut have.deny, &desired.deny, &mut report);
    write_tracked(cidrs, &mut have.cidrs, &desired.cidrs, &mut report);
    write_tracked(eps, &mut have.eps, &desired.eps, &mut report);
    prune_tracked(eps, &mut have.eps, &desired.eps, &mut report);
    prune_tracked(cidrs, &mut have.cidrs, &desired.cidrs, &mut report);
    prune_tracked(deny, &mut have.deny, &desired.deny, &mut report);
    prune_tracked(rules, &mut have.rules, &desired.rules, &mut report);
    // A pass that wrote nothing changed no verdict. Any write (even a
    // failed pass's part) may have: the flows are judged again.
    if report.written + report.removed > 0 || !report.failures.is_empty() {
        match epoch.get().and_then(|e| epoch.set(e.wrapping_add(1))) {
            Ok(()) => {}
            Err(e) => report.failures.push(e),
        }
    }
    report
}

/// The four tables the sync writes, borrowed together.
pub struct NpTables<'a, E, R, C> {
    /// `cp_np_eps`.
    pub eps: &'a mut E,
    /// `cp_np_rules`.
    pub rules: &'a mut R,
    /// `cp_np_deny`.
    pub deny: &'a mut R,
    /// `cp_np_cidrs`.
    pub cidrs: &'a mut C,
}

/// What the four maps hold, read from the kernel.
pub fn read_network_policies<E, R, C>(
    maps: &NpTables<'_, E, R, C>,
) -> Result<NpDesired, DatapathError>
where
    E: SgTable<EpKey, NpEp>,
    R: SgTable<Prefixed<NpRule>, u32>,
    C: SgTable<Prefixed<NpCidr>, u32>,
{
    Ok(NpDesired {
        eps: maps.eps.entries()?.into_iter().collect(),
        rules: maps.rules.entries()?.into_iter().collect(),
        deny: maps.deny.entries()?.into_iter().collect(),
        cidrs: maps.cidrs.entries()?.into_iter().collect(),
    })
}

/// Makes the maps hold `desired`: reads them, then
/// [`apply_network_policies`]. Fails only if a map cannot be read (then
/// nothing was written); refused writes are in the report and the next
/// sync retries them.
pub fn sync_network_policies<E, R, C>(
    maps: NpTables<'_, E, R, C>,
    epoch: &mut impl EpochCell,
    desired: &NpDesired,
) -> Result<SgSyncReport, DatapathError>
where
    E: SgTable<EpKey, NpEp>,
    R: SgTable<Prefixed<NpRule>, u32>,
    C: SgTable<Prefixed<NpCidr>, u32>,
{
    let mut have = read_network_policies(&maps)?;
    Ok(apply_network_policies(
        NpTables {
            eps: &mut *maps.eps,
            rules: &mut *maps.rules,
            deny: &mut *maps.deny,
            cidrs: &mut *maps.cidrs,
        },
        epoch,
        &mut have,
        desired,
    ))
}

impl NpMaps {
    /// Makes the maps hold `desired`. The first sync (and the one after any
    /// failure) reads the maps; after a sync that converged the maps are
    /// known to hold what it wrote (nobody else writes them), so the next
    /// one diffs against that mirror instead of reading tens of thousands
    /// of entries back through syscalls.
    pub fn sync(&mut self, desired: &NpDesired) -> Result<SgSyncReport, DatapathError> {
        let mut have = match self.mirror.take() {
            Some(m) => m,
            None => read_network_policies(&NpTables {
                eps: &mut self.eps,
                rules: &mut self.rules,
                deny: &mut self.deny,
                cidrs: &mut self.cidrs,
            })?,
        };
        let report = apply_network_policies(
            NpTables {
                eps: &mut self.eps,
                rules: &mut self.rules,
                deny: &mut self.deny,
                cidrs: &mut self.cidrs,
            },
            &mut self.epoch,
            &mut have,
            desired,
        );
        if report.converged() {
            self.mirror = Some(have);
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use std::collections::BTreeMap;

    use super::*;
    use crate::abi::{np_ep_key, NpMatch, NP_F_ISOLATED_IN, NP_INGRESS};

    struct Mem<K, V> {
        entries: BTreeMap<K, V>,
        log: Vec<&'static str>,
        failing: Option<K>,
    }

    impl<K, V> Default for Mem<K, V> {
        fn default() -> Self {
            Self {
                entries: BTreeMap::new(),
                log: Vec::new(),
                failing: None,
            }
        }
    }

    impl<K: Ord + Clone, V: Clone> SgTable<K, V> for Mem<K, V> {
        fn entries(&self) -> Result<Vec<(K, V)>, DatapathError> {
            Ok(self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
        fn insert(&mut self, key: &K, value: &V) -> Result<(), DatapathError> {
            if self.failing.as_ref() == Some(key) {
                return Err(DatapathError::MissingMap {
                    name: "cp_np_rules",
                });
            }
            self.log.push("insert");
            self.entries.insert(key.clone(), value.clone());
            Ok(())
        }
        fn remove(&mut self, key: &K) -> Result<bool, DatapathError> {
            self.log.push("remove");
            Ok(self.entries.remove(key).is_some())
        }
    }

    impl EpochCell for u32 {
        fn get(&self) -> Result<u32, DatapathError> {
            Ok(*self)
        }
        fn set(&mut self, epoch: u32) -> Result<(), DatapathError> {
            *self = epoch;
            Ok(())
        }
    }

    #[test]
    fn a_sync_that_changes_anything_bumps_the_epoch_and_one_that_does_not_keeps_it() {
        let mut eps = Mem::default();
        let mut rules = Mem::default();
        let mut cidrs: Mem<Prefixed<NpCidr>, u32> = Mem::default();
        let mut epoch = 7u32;
        let mut desired = NpDesired::default();
        desired.eps.insert(
            np_ep_key(Ipv4Addr::new(10, 0, 0, 1).into()),
            NpEp {
                id: 5,
                flags: NP_F_ISOLATED_IN,
            },
        );
        desired
            .rules
            .insert(NpRule::key(5, NP_INGRESS, 6, NpMatch::Proto(6)).into(), 1);
        // a stale rule from before
        rules
            .entries
            .insert(NpRule::key(9, NP_INGRESS, 6, NpMatch::Any).into(), 1);
        let mut deny = Mem::default();
        let r = sync_network_policies(
            NpTables {
                eps: &mut eps,
                rules: &mut rules,
                deny: &mut deny,
                cidrs: &mut cidrs,
            },
            &mut epoch,
            &desired,
        )
        .unwrap();
        assert!(r.converged());
        assert_eq!((r.written, r.removed), (2, 1));
        assert_eq!(epoch, 8);
        assert_eq!(eps.entries, desired.eps);
        assert_eq!(rules.entries, desired.rules);
        // the rule was written before anything removed
        assert_eq!(rules.log, ["insert", "remove"]);

        let r = sync_network_policies(
            NpTables {
                eps: &mut eps,
                rules: &mut rules,
                deny: &mut deny,
                cidrs: &mut cidrs,
            },
            &mut epoch,
            &desired,
        )
        .unwrap();
        assert_eq!((r.written, r.removed, r.unchanged), (0, 0, 2));
        assert_eq!(epoch, 8, "nothing changed: the cached verdicts stand");
    }

    #[test]
    fn the_mirror_follows_only_what_the_kernel_accepted() {
        let mut eps: Mem<EpKey, NpEp> = Mem::default();
        let mut rules = Mem::default();
        let mut cidrs: Mem<Prefixed<NpCidr>, u32> = Mem::default();
        let mut epoch = 0u32;
        let good: Prefixed<NpRule> = NpRule::key(5, NP_INGRESS, 6, NpMatch::Proto(6)).into();
        let bad: Prefixed<NpRule> = NpRule::key(5, NP_INGRESS, 7, NpMatch::Proto(6)).into();
        rules.failing = Some(bad);
        let mut desired = NpDesired::default();
        desired.rules.insert(good, 1);
        desired.rules.insert(bad, 1);
        let mut have = NpDesired::default();
        let mut deny = Mem::default();
        let r = apply_network_policies(
            NpTables {
                eps: &mut eps,
                rules: &mut rules,
                deny: &mut deny,
                cidrs: &mut cidrs,
            },
            &mut epoch,
            &mut have,
            &desired,
        );
        assert!(!r.converged());
        assert_eq!(r.written, 1);
        // the mirror names what the kernel holds, not what was wanted
        assert_eq!(have.rules, rules.entries);
        assert!(!have.rules.contains_key(&bad));
        // the retry writes only the missing entry
        rules.failing = None;
        rules.log.clear();
        let r = apply_network_policies(
            NpTables {
                eps: &mut eps,
                rules: &mut rules,
                deny: &mut deny,
                cidrs: &mut cidrs,
            },
            &mut epoch,
            &mut have,
            &desired,
        );
        assert!(r.converged());
        assert_eq!((r.written, r.unchanged), (1, 1));
        assert_eq!(rules.log, ["insert"]);
        assert_eq!(rules.entries, desired.rules);
    }
}
