use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::*;
use crate::abi::{SVC_F_AFFINITY, SVC_SCOPE_INTERNAL};

/// In-memory service maps that log every write, in order.
#[derive(Default)]
struct Fake {
    frontends: BTreeMap<SvcKey, Svc>,
    backends: BTreeMap<u32, Backend>,
    revs: BTreeMap<u32, Backend>,
    slots: BTreeMap<u32, u32>,
    log: Vec<String>,
    reads: RefCell<usize>,
    /// Whole-map dumps (frontends).
    dumps: RefCell<usize>,
    /// Fail `set_slot` after this many more successful writes.
    fail_slots_after: Option<usize>,
    /// Slots, if not the kernel's number.
    capacity: Option<u32>,
    /// Source-range prefixes.
    ranges: BTreeSet<RangeKey>,
}

impl SvcTables for Fake {
    fn frontends(&self) -> Result<Vec<(SvcKey, Svc)>, DatapathError> {
        *self.dumps.borrow_mut() += 1;
        Ok(self.frontends.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put_frontend(&mut self, key: &SvcKey, svc: &Svc) -> Result<(), DatapathError> {
        self.log.push(format!("frontend {}", key.port[1]));
        self.frontends.insert(*key, *svc);
        Ok(())
    }
    fn remove_frontend(&mut self, key: &SvcKey) -> Result<(), DatapathError> {
        self.log.push(format!("-frontend {}", key.port[1]));
        self.frontends.remove(key);
        Ok(())
    }
    fn backends(&self) -> Result<Vec<(u32, Backend)>, DatapathError> {
        Ok(self.backends.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put_backend(&mut self, id: u32, b: &Backend) -> Result<(), DatapathError> {
        self.log.push(format!("backend {id}"));
        self.backends.insert(id, *b);
        Ok(())
    }
    fn remove_backend(&mut self, id: u32) -> Result<(), DatapathError> {
        self.log.push(format!("-backend {id}"));
        self.backends.remove(&id);
        Ok(())
    }
    fn revs(&self) -> Result<Vec<(u32, Backend)>, DatapathError> {
        Ok(self.revs.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put_rev(&mut self, id: u32, b: &Backend) -> Result<(), DatapathError> {
        self.log.push(format!("rev {id}"));
        self.revs.insert(id, *b);
        Ok(())
    }
    fn remove_rev(&mut self, id: u32) -> Result<(), DatapathError> {
        self.log.push(format!("-rev {id}"));
        self.revs.remove(&id);
        Ok(())
    }
    fn slot(&self, i: u32) -> Result<u32, DatapathError> {
        *self.reads.borrow_mut() += 1;
        Ok(self.slots.get(&i).copied().unwrap_or(0))
    }
    fn capacity(&self) -> u32 {
        self.capacity.unwrap_or(MAX_SVC_SLOTS)
    }
    fn set_slot(&mut self, i: u32, id: u32) -> Result<(), DatapathError> {
        assert!(i < self.capacity(), "slot {i} out of range");
        if let Some(n) = self.fail_slots_after.as_mut() {
            if *n == 0 {
                return Err(DatapathError::InvalidValue("injected".into()));
            }
            *n -= 1;
        }
        self.log.push(format!("slot {i}"));
        self.slots.insert(i, id);
        Ok(())
    }
    fn source_ranges(&self) -> Result<Vec<LpmKey>, DatapathError> {
        Ok(self.ranges.iter().map(lpm_of).collect())
    }
    fn put_source_range(&mut self, k: &LpmKey) -> Result<(), DatapathError> {
        let r = range_key(k);
        self.log.push(format!("range {} {}", r.1, r.0));
        self.ranges.insert(r);
        Ok(())
    }
    fn remove_source_range(&mut self, k: &LpmKey) -> Result<(), DatapathError> {
        let r = range_key(k);
        self.log.push(format!("-range {} {}", r.1, r.0));
        self.ranges.remove(&r);
        Ok(())
    }
}

fn key(port: u8) -> SvcKey {
    SvcKey::new(
        0,
        "10.96.0.10".parse().unwrap(),
        u16::from(port),
        6,
        SVC_SCOPE_INTERNAL,
    )
}

fn be(last: u16) -> Backend {
    let ip: IpAddr = format!("10.0.{}.{}", last / 250, last % 250 + 1)
        .parse()
        .unwrap();
    Backend::new(0, ip, 8080, 6, 0)
}

fn fe(port: u8, backends: &[u16]) -> (SvcKey, DesiredFrontend) {
    (
        key(port),
        DesiredFrontend {
            addr: Backend::new(0, "10.96.0.10".parse().unwrap(), u16::from(port), 6, 0),
            backends: backends.iter().map(|&b| be(b)).collect(),
            ..DesiredFrontend::default()
        },
    )
}

/// The backends a frontend's range names, resolved through the maps.
fn resolved(f: &Fake, port: u8) -> Vec<Backend> {
    let s = f.frontends[&key(port)];
    (s.base..s.base + s.count)
        .map(|i| f.backends[&f.slots[&i]])
        .collect()
}

#[test]
fn a_first_sync_writes_backends_then_ranges_then_frontends() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    let want: SvcDesired = [fe(80, &[1, 2, 3]), fe(81, &[2, 3])].into_iter().collect();
    let r = sync_services(&mut f, &mut shadow, &want).unwrap();
    assert!(r.converged());
    assert_eq!(f.backends.len(), 3, "shared backends share ids");
    assert_eq!(resolved(&f, 80), vec![be(1), be(2), be(3)]);
    assert_eq!(resolved(&f, 81), vec![be(2), be(3)]);
    let (a, b) = (f.frontends[&key(80)], f.frontends[&key(81)]);
    assert!(
        a.base + a.count <= b.base || b.base + b.count <= a.base,
        "disjoint ranges"
    );
    assert_ne!(a.rev_id, b.rev_id);
    assert_eq!(f.revs[&a.rev_id], want[&key(80)].addr);
    // Every backend before any slot, every slot of a range before its frontend.
    let pos = |s: &str| f.log.iter().position(|l| l == s).unwrap();
    let last_backend = f
        .log
        .iter()
        .rposition(|l| l.starts_with("backend"))
        .unwrap();
    let first_slot = f.log.iter().position(|l| l.starts_with("slot")).unwrap();
    assert!(last_backend < first_slot, "{:?}", f.log);
    assert!(
        pos(&format!("slot {}", a.base + 2)) < pos("frontend 80"),
        "{:?}",
        f.log
    );

    // Nothing changed: nothing written, nothing read back.
    f.log.clear();
    let r = sync_services(&mut f, &mut shadow, &want).unwrap();
    assert!(r.converged());
    assert!(f.log.is_empty(), "{:?}", f.log);
    assert_eq!(*f.reads.borrow(), 0);
}

#[test]
fn a_changed_backend_set_goes_to_a_new_range_and_the_old_one_stays_intact() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[1, 2, 3])].into_iter().collect(),
    )
    .unwrap();
    let old = f.frontends[&key(80)];
    let old_slots: Vec<u32> = (old.base..old.base + 3).map(|i| f.slots[&i]).collect();
    f.log.clear();

    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[1, 3, 4])].into_iter().collect(),
    )
    .unwrap();
    assert!(r.converged());
    let new = f.frontends[&key(80)];
    assert_eq!(new.rev_id, old.rev_id, "a frontend keeps its rev id");
    assert!(
        new.base >= old.base + 3 || new.base + 3 <= old.base,
        "{old:?} {new:?}"
    );
    // A connect that read the old value still finds the old backends' ids.
    let still: Vec<u32> = (old.base..old.base + 3).map(|i| f.slots[&i]).collect();
    assert_eq!(still, old_slots);
    assert_eq!(resolved(&f, 80), vec![be(1), be(3), be(4)]);
    // The new backend first, then the range, then the flip, then the removal.
    let pos = |s: &str| f.log.iter().position(|l| l.starts_with(s)).unwrap();
    assert!(pos("backend") < pos("slot"), "{:?}", f.log);
    assert!(pos("slot") < pos("frontend 80"), "{:?}", f.log);
    assert!(pos("frontend 80") < pos("-backend"), "{:?}", f.log);
    assert_eq!(f.backends.len(), 3, "backend 2 is gone");

    // The next change may reuse the first range, now free.
    sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[5, 6, 7])].into_iter().collect(),
    )
    .unwrap();
    assert_eq!(f.frontends[&key(80)].base, old.base);
}

#[test]
fn attributes_change_in_place_and_maglev_indices_become_backend_ids() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    let (k, mut d) = fe(80, &[1, 2]);
    d.maglev = vec![1, 0, 1, 1, 0];
    sync_services(&mut f, &mut shadow, &[(k, d.clone())].into_iter().collect()).unwrap();
    let s = f.frontends[&k];
    assert_eq!(s.maglev_m, 5);
    let table: Vec<Backend> = (s.maglev_base..s.maglev_base + 5)
        .map(|i| f.backends[&f.slots[&i]])
        .collect();
    assert_eq!(table, vec![be(2), be(1), be(2), be(2), be(1)]);

    f.log.clear();
    d.flags = SVC_F_AFFINITY;
    d.affinity_s = 30;
    sync_services(&mut f, &mut shadow, &[(k, d)].into_iter().collect()).unwrap();
    assert_eq!(f.log, vec!["frontend 80".to_string()]);
    let after = f.frontends[&k];
    assert_eq!(
        (after.base, after.affinity_s, after.flags),
        (s.base, 30, SVC_F_AFFINITY)
    );
}

#[test]
fn removed_frontends_take_only_their_own_backends_with_them() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[1, 2]), fe(81, &[2, 3])].into_iter().collect(),
    )
    .unwrap();
    let rev80 = f.frontends[&key(80)].rev_id;
    f.log.clear();
    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(81, &[2, 3])].into_iter().collect(),
    )
    .unwrap();
    assert!(r.converged());
    assert_eq!(r.frontends_removed, 1);
    assert!(!f.revs.contains_key(&rev80));
    assert_eq!(
        f.backends.values().copied().collect::<Vec<_>>(),
        vec![be(2), be(3)]
    );
    let pos = |s: &str| f.log.iter().position(|l| l.starts_with(s)).unwrap();
    assert!(pos("-frontend 80") < pos("-rev") && pos("-frontend 80") < pos("-backend"));
    assert_eq!(resolved(&f, 81), vec![be(2), be(3)]);
}

#[test]
fn after_a_restart_unchanged_frontends_are_read_once_and_not_rewritten() {
    let mut f = Fake::default();
    let want: SvcDesired = [fe(80, &[1, 2, 3]), fe(81, &[4])].into_iter().collect();
    sync_services(&mut f, &mut SvcShadow::default(), &want).unwrap();
    f.log.clear();
    let mut fresh = SvcShadow::default();
    let r = sync_services(&mut f, &mut fresh, &want).unwrap();
    assert!(r.converged());
    assert!(f.log.is_empty(), "{:?}", f.log);
    assert_eq!(*f.reads.borrow(), 4, "each slot read once");
    sync_services(&mut f, &mut fresh, &want).unwrap();
    assert_eq!(*f.reads.borrow(), 4, "then trusted");
}

#[test]
fn a_failed_range_write_leaves_the_old_frontend_and_the_next_sync_converges() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[1, 2])].into_iter().collect(),
    )
    .unwrap();
    let before = f.frontends[&key(80)];
    f.fail_slots_after = Some(1);
    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[3, 4])].into_iter().collect(),
    )
    .unwrap();
    assert!(!r.converged());
    assert_eq!(f.frontends[&key(80)], before, "the old value stays");
    assert_eq!(
        resolved(&f, 80),
        vec![be(1), be(2)],
        "and so do its backends"
    );
    f.fail_slots_after = None;
    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[3, 4])].into_iter().collect(),
    )
    .unwrap();
    assert!(r.converged());
    assert_eq!(resolved(&f, 80), vec![be(3), be(4)]);
    assert_eq!(f.backends.len(), 2);
}

#[test]
fn a_frontend_that_does_not_fit_is_not_half_programmed() {
    // 10 slots: 6 backends fit; replacing them with 6 others needs a second
    // range of 6 while the first is still in use.
    let mut f = Fake {
        capacity: Some(10),
        ..Fake::default()
    };
    let mut shadow = SvcShadow::default();
    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[1, 2, 3, 4, 5, 6])].into_iter().collect(),
    )
    .unwrap();
    assert!(r.converged());
    let before = f.frontends[&key(80)];
    let r = sync_services(
        &mut f,
        &mut shadow,
        &[fe(80, &[11, 12, 13, 14, 15, 16]), fe(81, &[1])]
            .into_iter()
            .collect(),
    )
    .unwrap();
    assert_eq!(r.unfitted, vec![key(80)]);
    assert!(!r.converged());
    assert_eq!(f.frontends[&key(80)], before, "left as it was");
    assert_eq!(
        resolved(&f, 80),
        (1..=6).map(be).collect::<Vec<_>>(),
        "with its old backends intact"
    );
    assert_eq!(resolved(&f, 81), vec![be(1)], "the others are programmed");
    // With 81 removed there is room again, from the sync after its removal
    // on (a range is reused only once nothing has pointed at it for a sync).
    let want: SvcDesired = [fe(80, &[11, 12, 13, 14])].into_iter().collect();
    let r = sync_services(&mut f, &mut shadow, &want).unwrap();
    assert_eq!(r.unfitted, vec![key(80)]);
    let r = sync_services(&mut f, &mut shadow, &want).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(resolved(&f, 80), (11..=14).map(be).collect::<Vec<_>>());
}

#[test]
fn a_lower_slot_limit_keeps_what_lies_past_it_and_places_nothing_there() {
    // Written with 20 slots: 80 in [0, 6), 81 in [6, 12).
    let mut f = Fake {
        capacity: Some(20),
        ..Fake::default()
    };
    let both = [fe(80, &[1, 2, 3, 4, 5, 6]), fe(81, &[7, 8, 9, 10, 11, 12])];
    let want = |extra: &[(SvcKey, DesiredFrontend)], skip: u8| -> SvcDesired {
        both.iter()
            .chain(extra)
            .filter(|(k, _)| k.port[1] != skip)
            .cloned()
            .collect()
    };
    assert!(
        sync_services(&mut f, &mut SvcShadow::default(), &want(&[], 0))
            .unwrap()
            .converged()
    );
    assert_eq!(f.frontends[&key(81)].base, 6);

    // Read back under a limit of 8 (an agent restarted with --service-slots):
    // 81 lies past it and stays, whole, with every backend it names.
    f.capacity = Some(8);
    let mut shadow = SvcShadow::default();
    let r = sync_services(&mut f, &mut shadow, &want(&[], 0)).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(r.backends_removed, 0);
    assert_eq!(resolved(&f, 81), (7..=12).map(be).collect::<Vec<_>>());

    // Nothing new is placed past the limit: 82 finds no room below it.
    let extra = [fe(82, &[13, 14]), fe(83, &[15])];
    let r = sync_services(&mut f, &mut shadow, &want(&extra[..1], 0)).unwrap();
    assert_eq!(r.unfitted, vec![key(82)]);

    // 81 goes: of its range only [6, 8) comes free (from the sync after), so
    // 82 fits there and 83 does not (set_slot asserts every write is below 8).
    sync_services(&mut f, &mut shadow, &want(&extra, 81)).unwrap();
    let r = sync_services(&mut f, &mut shadow, &want(&extra, 81)).unwrap();
    assert_eq!(r.unfitted, vec![key(83)], "{r:?}");
    assert_eq!(f.frontends[&key(82)].base, 6);
    assert_eq!(resolved(&f, 82), vec![be(13), be(14)]);
    assert_eq!(resolved(&f, 80), (1..=6).map(be).collect::<Vec<_>>());
}

#[test]
fn source_ranges_are_written_before_the_frontend_consults_them_and_removed_after() {
    use crate::abi::SVC_F_SOURCE_RANGES;
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    let with = |ranges: &[(&str, u8)]| -> SvcDesired {
        let (k, mut d) = fe(80, &[1, 2]);
        d.source_ranges = ranges
            .iter()
            .map(|(ip, len)| (ip.parse().unwrap(), *len))
            .collect();
        [(k, d)].into_iter().collect()
    };
    let pos = |f: &Fake, s: &str| f.log.iter().position(|l| l == s);

    // A frontend with two ranges: both prefixes, then the flagged frontend.
    let r = sync_services(
        &mut f,
        &mut shadow,
        &with(&[("203.0.113.0", 24), ("198.51.100.7", 32)]),
    )
    .unwrap();
    assert!(r.converged(), "{r:?}");
    let rev = f.frontends[&key(80)].rev_id;
    assert_ne!(f.frontends[&key(80)].flags & SVC_F_SOURCE_RANGES, 0);
    // v4 prefixes in their 64:ff9b::/96 form, behind the rev_id's 32 bits
    let lens: BTreeSet<u32> = f.ranges.iter().map(|r| r.0).collect();
    assert_eq!(lens, [32 + 96 + 24, 32 + 96 + 32].into_iter().collect());
    assert!(f.ranges.iter().all(|r| r.1 == rev));
    let frontend = pos(&f, "frontend 80").unwrap();
    for len in [152, 160] {
        assert!(
            pos(&f, &format!("range {rev} {len}")).unwrap() < frontend,
            "{:?}",
            f.log
        );
    }
    // A masked key: the host bits of a range are not part of it.
    let (_, d) = fe(80, &[1, 2]);
    let mut d = d;
    d.source_ranges = vec![("203.0.113.99".parse().unwrap(), 24)];
    assert_eq!(
        ranges_of_frontend(rev, &d),
        ranges_of_frontend(rev, &{
            let mut e = d.clone();
            e.source_ranges = vec![("203.0.113.0".parse().unwrap(), 24)];
            e
        })
    );

    // The ranges change: the new prefix first, the old one after.
    f.log.clear();
    let r = sync_services(
        &mut f,
        &mut shadow,
        &with(&[("203.0.113.0", 24), ("192.0.2.0", 28)]),
    )
    .unwrap();
    assert!(r.converged());
    let added = pos(&f, &format!("range {rev} 156")).expect("new prefix written");
    let removed = pos(&f, &format!("-range {rev} 160")).expect("old prefix removed");
    assert!(added < removed, "{:?}", f.log);
    assert_eq!(f.ranges.len(), 2);

    // No ranges: the flag goes first, then the prefixes.
    f.log.clear();
    let r = sync_services(&mut f, &mut shadow, &with(&[])).unwrap();
    assert!(r.converged());
    assert_eq!(f.frontends[&key(80)].flags & SVC_F_SOURCE_RANGES, 0);
    assert!(f.ranges.is_empty());
    let unflagged = pos(&f, "frontend 80").unwrap();
    assert!(
        f.log[unflagged..].iter().any(|l| l.starts_with("-range")),
        "{:?}",
        f.log
    );
    assert!(
        !f.log[..unflagged].iter().any(|l| l.starts_with("-range")),
        "{:?}",
        f.log
    );

    // A removed frontend takes its prefixes with it.
    sync_services(&mut f, &mut shadow, &with(&[("203.0.113.0", 24)])).unwrap();
    assert_eq!(f.ranges.len(), 1);
    sync_services(&mut f, &mut shadow, &SvcDesired::new()).unwrap();
    assert!(f.ranges.is_empty() && f.frontends.is_empty());
}

/// Changes only: the mirror is trusted, nothing is read back, and only the
/// named frontend's entries are written.
#[test]
fn a_sync_of_changes_visits_only_the_named_frontends() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    let mut want: SvcDesired = [fe(80, &[1, 2, 3]), fe(81, &[2, 3])].into_iter().collect();
    // an untrusted mirror: the first sync of changes is a full one
    let r = sync_service_changes(&mut f, &mut shadow, &want, &BTreeSet::new()).unwrap();
    assert!(r.full && r.converged());
    assert!(shadow.trusted());
    let dumps = *f.dumps.borrow();
    f.log.clear();

    let (k, d) = fe(81, &[3, 4]);
    want.insert(k, d);
    let r = sync_service_changes(&mut f, &mut shadow, &want, &[k].into_iter().collect()).unwrap();
    assert!(!r.full && r.converged(), "{r:?}");
    assert_eq!(*f.dumps.borrow(), dumps, "nothing read back");
    assert!(
        f.log.iter().all(|l| !l.starts_with("frontend 80")),
        "{:?}",
        f.log
    );
    assert_eq!(resolved(&f, 81), vec![be(3), be(4)]);
    assert_eq!(resolved(&f, 80), vec![be(1), be(2), be(3)]);
    // backend 2 is still named by 80: it stays
    assert_eq!(f.backends.len(), 4);
    assert_holds(&f, &want);

    // removing 80 takes backends 1 and 2 (named by nobody else) with it
    want.remove(&key(80));
    let r =
        sync_service_changes(&mut f, &mut shadow, &want, &[key(80)].into_iter().collect()).unwrap();
    assert_eq!(r.frontends_removed, 1);
    assert_holds(&f, &want);
}

#[test]
fn after_a_failure_the_mirror_is_not_trusted_and_the_next_sync_is_full() {
    let mut f = Fake::default();
    let mut shadow = SvcShadow::default();
    let mut want: SvcDesired = [fe(80, &[1, 2])].into_iter().collect();
    sync_services(&mut f, &mut shadow, &want).unwrap();
    f.fail_slots_after = Some(0);
    let (k, d) = fe(80, &[3]);
    want.insert(k, d);
    let changed: BTreeSet<SvcKey> = [k].into_iter().collect();
    let r = sync_service_changes(&mut f, &mut shadow, &want, &changed).unwrap();
    assert!(!r.converged() && !shadow.trusted());
    f.fail_slots_after = None;
    // nothing named: the full sync finds the change anyway
    let r = sync_service_changes(&mut f, &mut shadow, &want, &BTreeSet::new()).unwrap();
    assert!(r.full && r.converged(), "{r:?}");
    assert_holds(&f, &want);
}

#[test]
fn a_frontend_that_did_not_fit_is_retried_without_being_named_again() {
    let mut f = Fake {
        capacity: Some(8),
        ..Fake::default()
    };
    let mut shadow = SvcShadow::default();
    let mut want: SvcDesired = [fe(80, &[1, 2, 3, 4, 5, 6])].into_iter().collect();
    sync_services(&mut f, &mut shadow, &want).unwrap();
    let (k, d) = fe(81, &[7, 8, 9]);
    want.insert(k, d);
    let r = sync_service_changes(&mut f, &mut shadow, &want, &[k].into_iter().collect()).unwrap();
    assert_eq!(r.unfitted, vec![k]);
    // its fresh backends and rev went again: nothing half-made stays
    assert_eq!(f.backends.len(), 6, "{:?}", f.backends);
    assert_eq!(f.revs.len(), 1);
    // 80 shrinks (named); 81 fits from the sync after 80's old range is free
    want.insert(key(80), fe(80, &[1]).1);
    let r =
        sync_service_changes(&mut f, &mut shadow, &want, &[key(80)].into_iter().collect()).unwrap();
    assert_eq!(r.unfitted, vec![k], "80's old range is not free yet");
    let r = sync_service_changes(&mut f, &mut shadow, &want, &BTreeSet::new()).unwrap();
    assert!(r.converged() && !r.full, "{r:?}");
    assert_holds(&f, &want);
}

/// A random walk of desired states, synced by changes only, always leaves the
/// maps exactly as desired (no garbage), and a full sync from a fresh mirror
/// then finds nothing to do.
#[test]
fn syncs_of_changes_agree_with_a_full_sync() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut f = Fake {
        capacity: Some(4096),
        ..Fake::default()
    };
    let mut shadow = SvcShadow::default();
    let mut want = SvcDesired::new();
    for step in 0..400 {
        let mut changed = BTreeSet::new();
        for _ in 0..=next(3) {
            let port = 80 + next(12) as u8;
            let k = key(port);
            changed.insert(k);
            if next(5) == 0 {
                want.remove(&k);
                continue;
            }
            let n = next(6) as usize;
            let mut pool: Vec<u16> = (0..n).map(|_| next(20) as u16).collect();
            pool.sort_unstable();
            pool.dedup();
            let (k, mut d) = fe(port, &pool);
            if !pool.is_empty() && next(2) == 0 {
                d.maglev = (0..7).map(|_| next(pool.len() as u64) as u32).collect();
            }
            if next(3) == 0 {
                d.source_ranges = vec![(format!("198.51.{}.0", next(4)).parse().unwrap(), 24)];
            }
            if next(3) == 0 {
                d.flags = SVC_F_AFFINITY;
                d.affinity_s = 10 + next(3) as u32;
            }
            want.insert(k, d);
        }
        let r = sync_service_changes(&mut f, &mut shadow, &want, &changed).unwrap();
        assert!(r.converged(), "step {step}: {r:?}");
        assert_holds(&f, &want);
    }
    f.log.clear();
    let r = sync_services(&mut f, &mut SvcShadow::default(), &want).unwrap();
    assert!(r.converged());
    assert!(f.log.is_empty(), "{:?}", f.log);
}

/// The maps hold exactly `want`: every frontend resolves to its backends,
/// Maglev table, address and prefixes, and nothing else is left.
fn assert_holds(f: &Fake, want: &SvcDesired) {
    assert_eq!(
        f.frontends.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    let mut named = BTreeSet::new();
    let mut ranges = BTreeSet::new();
    for (k, d) in want {
        let s = f.frontends[k];
        let ids: Vec<u32> = (s.base..s.base + s.count).map(|i| f.slots[&i]).collect();
        let got: Vec<Backend> = ids.iter().map(|id| f.backends[id]).collect();
        assert_eq!(got, d.backends, "{k:?}");
        let table: Vec<Backend> = (s.maglev_base..s.maglev_base + s.maglev_m)
            .map(|i| f.backends[&f.slots[&i]])
            .collect();
        let expect: Vec<Backend> = d.maglev.iter().map(|&i| d.backends[i as usize]).collect();
        assert_eq!(table, expect, "{k:?}");
        assert_eq!(f.revs[&s.rev_id], d.addr);
        assert_eq!(
            (s.affinity_s, s.flags & SVC_F_AFFINITY),
            (d.affinity_s, d.flags)
        );
        named.extend(ids);
        ranges.extend(ranges_of_frontend(s.rev_id, d));
    }
    assert_eq!(
        f.backends.keys().copied().collect::<BTreeSet<_>>(),
        named,
        "no garbage"
    );
    assert_eq!(f.revs.len(), want.len());
    assert_eq!(f.ranges, ranges);
}

/// Frontends with the same backend list and Maglev table (a Service port's
/// NodePort on each node address, its LoadBalancer IPs) share one range:
/// written once, kept while any of them names it, freed a sync after the
/// last one lets go.
#[test]
fn identical_ranges_are_shared_and_freed_after_the_last_user() {
    // room for one 251-slot table and its two backends, not for two
    let mut f = Fake {
        capacity: Some(260),
        ..Fake::default()
    };
    let mut shadow = SvcShadow::default();
    let with_table = |port: u8| {
        let (k, mut d) = fe(port, &[1, 2]);
        d.maglev = (0..251).map(|i| i % 2).collect();
        (k, d)
    };
    let mut want: SvcDesired = [with_table(80), with_table(81), with_table(82)]
        .into_iter()
        .collect();
    let r = sync_services(&mut f, &mut shadow, &want).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(r.slots_written, 2 + 251, "written once");
    let g = |f: &Fake, p: u8| {
        let s = f.frontends[&key(p)];
        (s.base, s.count, s.maglev_base, s.maglev_m)
    };
    assert_eq!(g(&f, 80), g(&f, 81));
    assert_eq!(g(&f, 80), g(&f, 82));
    assert_holds(&f, &want);

    // one changes: a new range for it (the 7 slots left), the others keep theirs
    let (k, d) = fe(81, &[3]);
    want.insert(k, d);
    let r = sync_service_changes(&mut f, &mut shadow, &want, &[k].into_iter().collect()).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_holds(&f, &want);
    // the shared table stays while 80 and 82 name it: a fourth user fits
    let (k4, d4) = with_table(83);
    want.insert(k4, d4);
    let r = sync_service_changes(&mut f, &mut shadow, &want, &[k4].into_iter().collect()).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_eq!(r.slots_written, 0, "nothing to write: the range exists");
    assert_holds(&f, &want);

    // all users go: free from the sync after, and a different table fits
    for p in [80, 82, 83] {
        want.remove(&key(p));
    }
    let gone: BTreeSet<SvcKey> = [80, 82, 83].into_iter().map(key).collect();
    sync_service_changes(&mut f, &mut shadow, &want, &gone).unwrap();
    let (k5, mut d5) = fe(85, &[4, 5]);
    d5.maglev = (0..251).map(|i| i % 2).rev().collect();
    want.insert(k5, d5);
    let only5: BTreeSet<SvcKey> = [k5].into_iter().collect();
    let r = sync_service_changes(&mut f, &mut shadow, &want, &only5).unwrap();
    assert!(r.converged(), "{r:?}");
    assert_holds(&f, &want);
    // and after a restart the shared ranges are recognised again
    let r = sync_services(&mut f, &mut SvcShadow::default(), &want).unwrap();
    assert!(r.converged() && r.slots_written == 0, "{r:?}");
}
