//! SecurityGroups in the kernel: typed access to the connection tracker and
//! the SecurityGroup maps (`bpf/ct.h`, `bpf/policy.h`), the desired state
//! the agent's compiler produces, and the sync that makes the maps hold it.
//!
//! The sync owns `cp_sg_members`, `cp_sg_rules` and `cp_sg_cidrs` entirely
//! (nobody else writes them): whatever is not desired is pruned. It never
//! keeps a shadow copy; every sync reads the maps ([`SgTable::entries`]), so
//! it converges after a restart or a half-done earlier sync. The order keeps
//! traffic in flight judged by a consistent policy as far as one map at a
//! time allows (make before break):
//!
//! 1. rules and CIDR classes are added or replaced (a member never points at
//!    a group whose rules are not there yet);
//! 2. memberships are added, replaced, then removed;
//! 3. CIDR classes, then rules no longer desired are removed.
//!
//! The connection tracker (`cp_ct`) is not synced: a policy change cuts new
//! flows at once, and established flows keep their verdict until they go
//! idle (`docs/datapath.md`, "SecurityGroups").

use std::collections::BTreeMap;

use crate::abi::{CtEntry, CtKey, EpKey, SgCidr, SgCidrKey, SgGroups, SgRule, SgRuleKey};
use crate::error::DatapathError;
use crate::tables::{HashTable, LpmTable};

/// The connection tracker and the SecurityGroup maps of a loaded datapath.
pub struct SgMaps {
    /// `cp_ct`: tracked flows (the datapath writes it).
    pub ct: HashTable<CtKey, CtEntry>,
    /// `cp_sg_members`: endpoint → its groups.
    pub members: HashTable<EpKey, SgGroups>,
    /// `cp_sg_rules`: {subject group, peer, dir, proto | port bits} → 1.
    pub rules: LpmTable<u32, SgRule>,
    /// `cp_sg_cidrs`: {subject group, dir | address bits} → CIDR class.
    pub cidrs: LpmTable<u32, SgCidr>,
}

/// A `cp_sg_rules` entry as an ordered value: the rule data and its prefix
/// length (the bits after the prefix-length field, fixed fields included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleEntry {
    /// Prefix length of the key.
    pub prefix_len: u32,
    /// The key's data; port bits beyond the prefix are zero.
    pub rule: SgRule,
}

impl RuleEntry {
    fn key(&self) -> SgRuleKey {
        SgRuleKey::new(self.prefix_len, self.rule)
    }

    fn of(k: &SgRuleKey) -> Self {
        Self {
            prefix_len: k.prefix_len(),
            rule: k.data(),
        }
    }
}

/// A `cp_sg_cidrs` key as an ordered value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CidrEntry {
    /// Prefix length of the key.
    pub prefix_len: u32,
    /// The key's data; address bits beyond the prefix are zero.
    pub cidr: SgCidr,
}

impl CidrEntry {
    fn key(&self) -> SgCidrKey {
        SgCidrKey::new(self.prefix_len, self.cidr)
    }

    fn of(k: &SgCidrKey) -> Self {
        Self {
            prefix_len: k.prefix_len(),
            cidr: k.data(),
        }
    }
}

impl From<SgRuleKey> for RuleEntry {
    fn from(k: SgRuleKey) -> Self {
        Self::of(&k)
    }
}

impl From<SgCidrKey> for CidrEntry {
    fn from(k: SgCidrKey) -> Self {
        Self::of(&k)
    }
}

/// What the three SecurityGroup maps should hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SgDesired {
    /// `cp_sg_members`.
    pub members: BTreeMap<EpKey, SgGroups>,
    /// `cp_sg_rules` (the value is always 1).
    pub rules: BTreeMap<RuleEntry, u32>,
    /// `cp_sg_cidrs`: → CIDR class.
    pub cidrs: BTreeMap<CidrEntry, u32>,
}

/// One map as the sync sees it, so the sync runs against memory in tests.
pub trait SgTable<K, V> {
    /// Every entry.
    fn entries(&self) -> Result<Vec<(K, V)>, DatapathError>;
    /// Insert or overwrite.
    fn insert(&mut self, key: &K, value: &V) -> Result<(), DatapathError>;
    /// Remove; `false` if it was not there.
    fn remove(&mut self, key: &K) -> Result<bool, DatapathError>;
}

impl SgTable<EpKey, SgGroups> for HashTable<EpKey, SgGroups> {
    fn entries(&self) -> Result<Vec<(EpKey, SgGroups)>, DatapathError> {
        HashTable::entries(self)
    }
    fn insert(&mut self, key: &EpKey, value: &SgGroups) -> Result<(), DatapathError> {
        HashTable::insert(self, key, value)
    }
    fn remove(&mut self, key: &EpKey) -> Result<bool, DatapathError> {
        HashTable::remove(self, key)
    }
}

impl SgTable<RuleEntry, u32> for LpmTable<u32, SgRule> {
    fn entries(&self) -> Result<Vec<(RuleEntry, u32)>, DatapathError> {
        Ok(LpmTable::entries(self)?
            .into_iter()
            .map(|(k, v)| (RuleEntry::of(&k), v))
            .collect())
    }
    fn insert(&mut self, key: &RuleEntry, value: &u32) -> Result<(), DatapathError> {
        LpmTable::insert(self, &key.key(), value)
    }
    fn remove(&mut self, key: &RuleEntry) -> Result<bool, DatapathError> {
        LpmTable::remove(self, &key.key())
    }
}

impl SgTable<CidrEntry, u32> for LpmTable<u32, SgCidr> {
    fn entries(&self) -> Result<Vec<(CidrEntry, u32)>, DatapathError> {
        Ok(LpmTable::entries(self)?
            .into_iter()
            .map(|(k, v)| (CidrEntry::of(&k), v))
            .collect())
    }
    fn insert(&mut self, key: &CidrEntry, value: &u32) -> Result<(), DatapathError> {
        LpmTable::insert(self, &key.key(), value)
    }
    fn remove(&mut self, key: &CidrEntry) -> Result<bool, DatapathError> {
        LpmTable::remove(self, &key.key())
    }
}

/// Counts of one sync, and the entries it could not write.
#[derive(Debug, Default)]
pub struct SgSyncReport {
    /// Entries added or overwritten.
    pub written: usize,
    /// Stale entries removed.
    pub removed: usize,
    /// Entries already right.
    pub unchanged: usize,
    /// What the kernel refused, by map; the rest of the sync went on.
    pub failures: Vec<DatapathError>,
}

impl SgSyncReport {
    /// Did every map end up as desired?
    pub fn converged(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Writes the missing or different entries of `desired` into `map`.
fn write<K: Ord + Clone, V: PartialEq + Clone>(
    map: &mut impl SgTable<K, V>,
    current: &BTreeMap<K, V>,
    desired: &BTreeMap<K, V>,
    report: &mut SgSyncReport,
) {
    for (k, v) in desired {
        if current.get(k) == Some(v) {
            report.unchanged += 1;
            continue;
        }
        match map.insert(k, v) {
            Ok(()) => report.written += 1,
            Err(e) => report.failures.push(e),
        }
    }
}

/// Removes the entries of `current` that `desired` lacks.
fn prune<K: Ord + Clone, V>(
    map: &mut impl SgTable<K, V>,
    current: &BTreeMap<K, V>,
    desired: &BTreeMap<K, V>,
    report: &mut SgSyncReport,
) {
    for k in current.keys().filter(|k| !desired.contains_key(k)) {
        match map.remove(k) {
            Ok(true) => report.removed += 1,
            Ok(false) => {} // gone meanwhile: converged
            Err(e) => report.failures.push(e),
        }
    }
}

/// Every entry of `map`, ordered.
pub(crate) fn read<K: Ord, V>(map: &impl SgTable<K, V>) -> Result<BTreeMap<K, V>, DatapathError> {
    Ok(map.entries()?.into_iter().collect())
}

/// Makes the three maps hold `desired` (see the module docs for the order).
/// Fails only if a map cannot be read (then nothing was written); refused
/// writes are in the report and the next sync retries them.
pub fn sync_security_groups(
    members: &mut impl SgTable<EpKey, SgGroups>,
    rules: &mut impl SgTable<RuleEntry, u32>,
    cidrs: &mut impl SgTable<CidrEntry, u32>,
    desired: &SgDesired,
) -> Result<SgSyncReport, DatapathError> {
    let have_members = read(members)?;
    let have_rules = read(rules)?;
    let have_cidrs = read(cidrs)?;
    let mut report = SgSyncReport::default();
    write(rules, &have_rules, &desired.rules, &mut report);
    write(cidrs, &have_cidrs, &desired.cidrs, &mut report);
    write(members, &have_members, &desired.members, &mut report);
    prune(members, &have_members, &desired.members, &mut report);
    prune(cidrs, &have_cidrs, &desired.cidrs, &mut report);
    prune(rules, &have_rules, &desired.rules, &mut report);
    Ok(report)
}

impl SgMaps {
    /// [`sync_security_groups`] on these maps.
    pub fn sync(&mut self, desired: &SgDesired) -> Result<SgSyncReport, DatapathError> {
        sync_security_groups(&mut self.members, &mut self.rules, &mut self.cidrs, desired)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::abi::{SG_INGRESS, SG_RULE_FIXED_BITS};

    /// An in-memory map that logs its writes into a shared journal.
    struct Mem<K, V> {
        name: &'static str,
        entries: BTreeMap<K, V>,
        journal: Rc<RefCell<Vec<String>>>,
        failing: Option<K>,
    }

    impl<K: Ord + Clone + std::fmt::Debug, V: Clone> Mem<K, V> {
        fn new(name: &'static str, journal: &Rc<RefCell<Vec<String>>>) -> Self {
            Self {
                name,
                entries: BTreeMap::new(),
                journal: Rc::clone(journal),
                failing: None,
            }
        }
    }

    impl<K: Ord + Clone + std::fmt::Debug, V: Clone> SgTable<K, V> for Mem<K, V> {
        fn entries(&self) -> Result<Vec<(K, V)>, DatapathError> {
            Ok(self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect())
        }
        fn insert(&mut self, key: &K, value: &V) -> Result<(), DatapathError> {
            if self.failing.as_ref() == Some(key) {
                return Err(DatapathError::MissingMap { name: self.name });
            }
            self.journal
                .borrow_mut()
                .push(format!("{} insert", self.name));
            self.entries.insert(key.clone(), value.clone());
            Ok(())
        }
        fn remove(&mut self, key: &K) -> Result<bool, DatapathError> {
            self.journal
                .borrow_mut()
                .push(format!("{} remove", self.name));
            Ok(self.entries.remove(key).is_some())
        }
    }

    fn rule(group: u32, peer: u32) -> RuleEntry {
        RuleEntry {
            prefix_len: SG_RULE_FIXED_BITS + 16,
            rule: SgRule {
                net: 100,
                group,
                peer_net: 100,
                peer,
                dir: SG_INGRESS,
                proto: 6,
                port: 8000u16.to_be_bytes(),
            },
        }
    }

    fn member(last: u8, groups: &[u32]) -> (EpKey, SgGroups) {
        (
            EpKey::new(100, std::net::Ipv4Addr::new(10, 0, 0, last)),
            SgGroups::new(groups).unwrap(),
        )
    }

    #[test]
    fn sync_writes_rules_before_members_and_prunes_members_before_rules() {
        let journal = Rc::new(RefCell::new(Vec::new()));
        let mut members = Mem::new("members", &journal);
        let mut rules = Mem::new("rules", &journal);
        let mut cidrs: Mem<CidrEntry, u32> = Mem::new("cidrs", &journal);
        // stale state from before: a member and a rule of group 9
        let (k, v) = member(9, &[9]);
        members.entries.insert(k, v);
        rules.entries.insert(rule(9, 9), 1);

        let mut desired = SgDesired::default();
        desired.rules.insert(rule(1, 2), 1);
        let (k, v) = member(1, &[1]);
        desired.members.insert(k, v);
        let report = sync_security_groups(&mut members, &mut rules, &mut cidrs, &desired).unwrap();
        assert!(report.converged());
        assert_eq!((report.written, report.removed), (2, 2));
        assert_eq!(
            *journal.borrow(),
            [
                "rules insert",
                "members insert",
                "members remove",
                "rules remove"
            ]
        );
        assert_eq!(members.entries, desired.members);
        assert_eq!(rules.entries, desired.rules);

        // again: nothing to do
        journal.borrow_mut().clear();
        let report = sync_security_groups(&mut members, &mut rules, &mut cidrs, &desired).unwrap();
        assert_eq!(
            (report.written, report.removed, report.unchanged),
            (0, 0, 2)
        );
        assert!(journal.borrow().is_empty());
    }

    #[test]
    fn a_refused_write_is_reported_and_the_rest_still_syncs() {
        let journal = Rc::new(RefCell::new(Vec::new()));
        let mut members = Mem::new("members", &journal);
        let mut rules = Mem::new("rules", &journal);
        let mut cidrs: Mem<CidrEntry, u32> = Mem::new("cidrs", &journal);
        rules.failing = Some(rule(1, 2));
        let mut desired = SgDesired::default();
        desired.rules.insert(rule(1, 2), 1);
        desired.rules.insert(rule(1, 3), 1);
        let (k, v) = member(1, &[1]);
        desired.members.insert(k, v);
        let report = sync_security_groups(&mut members, &mut rules, &mut cidrs, &desired).unwrap();
        assert!(!report.converged());
        assert_eq!(report.failures.len(), 1);
        assert_eq!(report.written, 2);
        assert!(rules.entries.contains_key(&rule(1, 3)));
        assert_eq!(members.entries, desired.members);
    }
}
