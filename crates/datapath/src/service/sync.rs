//! The service maps' sync: makes `cp_svc`, `cp_svc_slots`, `cp_backends`,
//! `cp_svc_revs` and `cp_lb_src` hold what the agent's compiler wants, make
//! before break, and at 10⁴–10⁵ entries in time proportional to what changed.
//!
//! Ids: a backend keeps its id while any frontend names it (same network,
//! address, port and protocol), a frontend keeps its `rev_id`; new ones get
//! the smallest unused id. Slots: a frontend whose backend list (and Maglev
//! table) did not change keeps its ranges; a changed one gets **new** ranges,
//! written before the frontend value is replaced (one map update, which a
//! reader sees whole), and its old ranges become free only at the next sync,
//! when no frontend points at them any more. Order within a sync:
//!
//! 1. backends and reverse entries are written (a range never names a backend
//!    that is not there yet), and every desired `loadBalancerSourceRanges`
//!    prefix (`cp_lb_src`, keyed by the frontend's `rev_id`);
//! 2. per frontend: its new ranges, then its value (flagged
//!    `SVC_F_SOURCE_RANGES` when it has source ranges: a prefix whose write
//!    failed is then missing, which refuses rather than admits);
//! 3. frontends no longer desired are removed, then reverse entries, backends
//!    no frontend names any more and source ranges no frontend wants. While a
//!    frontend's ranges change, the old and new prefixes admit together for
//!    the moment between steps 1 and 3.
//!
//! A frontend whose ranges do not fit in the free slots is not written at all
//! (its old value, if any, stays, still pointing at intact ranges), is
//! reported in [`SvcSyncReport::unfitted`] (never half-programmed) and is
//! tried again by every later sync until it fits.
//!
//! **The mirror.** This sync is the only writer of those maps, so it keeps a
//! [`SvcShadow`] of what they hold: the frontends, the slots of each, the
//! backends with how many frontends name each, the reverse entries and the
//! source-range prefixes. A full sync ([`sync_services`]) reads the maps into
//! it (one batched dump per map; the slots of a frontend only when its
//! geometry is not the one the mirror recorded, i.e. once after a restart)
//! and compares every desired frontend. A sync of changes
//! ([`sync_service_changes`]) trusts the mirror and visits only the frontends
//! the caller names (plus any that did not fit before): one backend change
//! among 10k Services costs a few map writes, not a dump and a diff of
//! 10⁵ entries (`docs/benchmarks.md`, "Services"). The mirror stops being
//! trusted on any kernel error; the next sync is then a full one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use crate::abi::{
    Addr128, Backend, EpKey, LpmKey, Svc, SvcKey, MAX_SVC_SLOTS, SVC_F_SOURCE_RANGES,
};
use crate::error::DatapathError;

/// One frontend as the agent wants it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredFrontend {
    /// The frontend's own address (`cp_svc_revs`): network, address, port, protocol.
    pub addr: Backend,
    /// Its backends, this node's first.
    pub backends: Vec<Backend>,
    /// How many of `backends` are this node's.
    pub local_count: u32,
    /// The Maglev table: indices into `backends`; empty for none.
    pub maglev: Vec<u32>,
    /// ClientIP affinity timeout, seconds (with `SVC_F_AFFINITY`).
    pub affinity_s: u32,
    /// `SVC_F_*` (the sync adds `SVC_F_SOURCE_RANGES` itself).
    pub flags: u32,
    /// `loadBalancerSourceRanges`: the prefixes new flows may come from
    /// (address, prefix length); empty admits every source.
    pub source_ranges: Vec<(IpAddr, u8)>,
}

/// Every frontend the agent wants, by key.
pub type SvcDesired = BTreeMap<SvcKey, DesiredFrontend>;

/// What one sync did.
#[derive(Debug, Default)]
pub struct SvcSyncReport {
    /// Whether this was a full sync (maps read back, every frontend compared).
    pub full: bool,
    /// Frontend values written (new, changed backends, or changed attributes).
    pub frontends_written: usize,
    /// Frontends removed.
    pub frontends_removed: usize,
    /// Slots written.
    pub slots_written: usize,
    /// Backend and reverse entries written.
    pub backends_written: usize,
    /// Backend and reverse entries removed.
    pub backends_removed: usize,
    /// Frontends left as they were because their ranges did not fit.
    pub unfitted: Vec<SvcKey>,
    /// What the kernel refused; the rest of the sync went on.
    pub failures: Vec<DatapathError>,
}

impl SvcSyncReport {
    /// Did every map end up as desired?
    pub fn converged(&self) -> bool {
        self.failures.is_empty() && self.unfitted.is_empty()
    }
}

/// The service maps as the sync needs them (the kernel's, or a fake in tests).
pub trait SvcTables {
    /// Every frontend.
    fn frontends(&self) -> Result<Vec<(SvcKey, Svc)>, DatapathError>;
    /// Writes a frontend.
    fn put_frontend(&mut self, key: &SvcKey, svc: &Svc) -> Result<(), DatapathError>;
    /// Removes a frontend.
    fn remove_frontend(&mut self, key: &SvcKey) -> Result<(), DatapathError>;
    /// Every backend by id.
    fn backends(&self) -> Result<Vec<(u32, Backend)>, DatapathError>;
    /// Writes a backend.
    fn put_backend(&mut self, id: u32, b: &Backend) -> Result<(), DatapathError>;
    /// Writes backends in order; on an error, how many were written before
    /// the failing one. One by one unless the tables batch them.
    fn put_backends(&mut self, entries: &[(u32, Backend)]) -> Result<(), (usize, DatapathError)> {
        for (n, (id, b)) in entries.iter().enumerate() {
            self.put_backend(*id, b).map_err(|e| (n, e))?;
        }
        Ok(())
    }
    /// Removes a backend.
    fn remove_backend(&mut self, id: u32) -> Result<(), DatapathError>;
    /// Every reverse entry by rev id.
    fn revs(&self) -> Result<Vec<(u32, Backend)>, DatapathError>;
    /// Writes a reverse entry.
    fn put_rev(&mut self, id: u32, b: &Backend) -> Result<(), DatapathError>;
    /// Removes a reverse entry.
    fn remove_rev(&mut self, id: u32) -> Result<(), DatapathError>;
    /// Reads a slot.
    fn slot(&self, i: u32) -> Result<u32, DatapathError>;
    /// Writes a slot.
    fn set_slot(&mut self, i: u32, id: u32) -> Result<(), DatapathError>;
    /// Writes `ids` into the slots from `start` on, in order; on an error,
    /// how many were written before the failing one. One by one unless the
    /// tables batch them.
    fn set_slots(&mut self, start: u32, ids: &[u32]) -> Result<(), (usize, DatapathError)> {
        for (n, (i, id)) in (start..).zip(ids).enumerate() {
            self.set_slot(i, *id).map_err(|e| (n, e))?;
        }
        Ok(())
    }
    /// How many slots there are.
    fn capacity(&self) -> u32 {
        MAX_SVC_SLOTS
    }
    /// Every source-range prefix (`{rev_id, prefix}`).
    fn source_ranges(&self) -> Result<Vec<LpmKey>, DatapathError>;
    /// Writes a source-range prefix.
    fn put_source_range(&mut self, key: &LpmKey) -> Result<(), DatapathError>;
    /// Removes a source-range prefix.
    fn remove_source_range(&mut self, key: &LpmKey) -> Result<(), DatapathError>;
}

/// A source-range prefix as a sortable value: (prefix length incl. the
/// rev_id's bits, rev_id, address).
type RangeKey = (u32, u32, Addr128);

fn range_key(k: &LpmKey) -> RangeKey {
    (k.prefix_len(), k.data().net, k.data().addr)
}

fn lpm_of(r: &RangeKey) -> LpmKey {
    LpmKey::new(
        r.0,
        EpKey {
            net: r.1,
            addr: r.2,
        },
    )
}

/// The desired prefixes of frontend `rev`: each range masked to its length
/// (v4 in its 64:ff9b::/96 form, like every key); ranges of a length the
/// family has not are skipped (the compiler never gives them).
fn ranges_of_frontend(rev: u32, fe: &DesiredFrontend) -> BTreeSet<RangeKey> {
    fe.source_ranges
        .iter()
        .filter_map(|&(ip, len)| crate::abi::lpm_key(rev, masked(ip, len)?, len))
        .map(|k| range_key(&k))
        .collect()
}

/// `ip` with the bits past `len` cleared (None for a length the family has not),
/// so a prefix has one key however it was written.
fn masked(ip: IpAddr, len: u8) -> Option<IpAddr> {
    Some(match ip {
        IpAddr::V4(a) if len <= 32 => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) if len <= 128 => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & m).into())
        }
        _ => return None,
    })
}

/// The identity of a backend: what must match for it to keep its id.
type Ident = (u32, [u8; 16], [u8; 2], u8);

fn ident(b: &Backend) -> Ident {
    (b.net, b.addr.0, b.port, b.proto)
}

/// Where a frontend's ranges are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    base: u32,
    count: u32,
    maglev_base: u32,
    maglev_m: u32,
}

impl Geometry {
    fn of(s: &Svc) -> Self {
        Self {
            base: s.base,
            count: s.count,
            maglev_base: s.maglev_base,
            maglev_m: s.maglev_m,
        }
    }
}

/// What a frontend's ranges hold: backend ids, then the Maglev table's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Ranges {
    ids: Vec<u32>,
    maglev: Vec<u32>,
}

impl Ranges {
    /// The distinct backend ids the ranges name (the Maglev table names a
    /// subset of `ids`, but a corrupt map read back may not).
    fn named(&self) -> BTreeSet<u32> {
        self.ids.iter().chain(&self.maglev).copied().collect()
    }
}

/// Free slots as sorted, disjoint `[start, end)` intervals, first fit.
#[derive(Debug, Default, Clone)]
struct Free(Vec<(u32, u32)>);

impl Free {
    fn all_but(mut used: Vec<(u32, u32)>, capacity: u32) -> Self {
        used.retain(|(s, e)| e > s);
        used.sort_unstable();
        let mut free = Vec::new();
        let mut at = 0u32;
        for (s, e) in used {
            if s > at {
                free.push((at, s.min(capacity)));
            }
            at = at.max(e);
        }
        if at < capacity {
            free.push((at, capacity));
        }
        free.retain(|(s, e)| e > s);
        Self(free)
    }

    /// Takes `len` slots; `Some(0)` for none.
    fn take(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return Some(0);
        }
        let i = self.0.iter().position(|(s, e)| e - s >= len)?;
        let (s, e) = self.0[i];
        if e - s == len {
            self.0.remove(i);
        } else {
            self.0[i] = (s + len, e);
        }
        Some(s)
    }

    /// Gives back `[start, end)`, merged with its neighbours.
    fn give(&mut self, (start, end): (u32, u32)) {
        if end <= start {
            return;
        }
        let i = self.0.partition_point(|(s, _)| *s < start);
        self.0.insert(i, (start, end));
        // merge with the next, then with the previous
        if i + 1 < self.0.len() && self.0[i].1 >= self.0[i + 1].0 {
            self.0[i].1 = self.0[i].1.max(self.0[i + 1].1);
            self.0.remove(i + 1);
        }
        if i > 0 && self.0[i - 1].1 >= self.0[i].0 {
            self.0[i - 1].1 = self.0[i - 1].1.max(self.0[i].1);
            self.0.remove(i);
        }
    }
}

/// The slot ranges in use, shared by content: frontends whose backend list
/// or Maglev table is the same name one range (the NodePort frontends of a
/// Service port on each of the node's addresses and its LoadBalancer IPs
/// hold the same Maglev table; a Service port's inside and wire frontends
/// often the same backends). A range is written once, never rewritten in
/// place, and freed one sync after the last frontend stops naming it.
#[derive(Debug, Default, Clone)]
struct Pool {
    /// start → (length, how many frontend ranges name it)
    used: HashMap<u32, (u32, u32)>,
    /// content → the start of a range holding it
    by_content: HashMap<Vec<u32>, u32>,
    free: Free,
    /// Given up by this sync: free from the next one on.
    released: Vec<(u32, u32)>,
    /// Slots past this are never handed out, even once freed (a range read
    /// back from maps written under a larger limit may lie past it).
    capacity: u32,
}

impl Pool {
    /// The pool of the ranges `named` (start, content) name, in `capacity` slots.
    fn of<'a>(named: impl IntoIterator<Item = (u32, &'a [u32])>, capacity: u32) -> Self {
        let mut pool = Pool::default();
        for (start, content) in named {
            let Ok(len) = u32::try_from(content.len()) else {
                continue;
            };
            if len == 0 {
                continue;
            }
            pool.used.entry(start).or_insert((len, 0)).1 += 1;
            pool.by_content.entry(content.to_vec()).or_insert(start);
        }
        pool.free = Free::all_but(
            pool.used
                .iter()
                .map(|(s, (len, _))| (*s, s.saturating_add(*len)))
                .collect(),
            capacity,
        );
        pool.capacity = capacity;
        pool
    }

    /// A range holding `content` for one more frontend range: a range that
    /// holds it already, or fresh slots (`true`: the caller writes them).
    /// `None`: no room. An empty content takes nothing.
    fn take(&mut self, content: &[u32]) -> Option<(u32, bool)> {
        let len = u32::try_from(content.len()).ok()?;
        if len == 0 {
            return Some((0, false));
        }
        if let Some(&start) = self.by_content.get(content) {
            if let Some(u) = self.used.get_mut(&start) {
                u.1 += 1;
                return Some((start, false));
            }
        }
        let start = self.free.take(len)?;
        self.used.insert(start, (len, 1));
        self.by_content.insert(content.to_vec(), start);
        Some((start, true))
    }

    /// One frontend range stops naming `[start, start + len)`; the last one
    /// frees it (from the next sync on). A range whose write failed is
    /// given up at once, its content forgotten (it may be half written).
    fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let Some(u) = self.used.get_mut(&start) else {
            return;
        };
        u.1 = u.1.saturating_sub(1);
        if u.1 == 0 {
            let len = u.0;
            self.used.remove(&start);
            self.by_content.retain(|_, s| *s != start);
            self.released.push((start, start.saturating_add(len)));
        }
    }

    /// Start of a sync: what the last one released is free now.
    fn next_sync(&mut self) {
        for (start, end) in std::mem::take(&mut self.released) {
            self.free.give((start, end.min(self.capacity)));
        }
    }
}

/// Small integer ids (backend ids, rev ids): the smallest unused one ≥ 1.
#[derive(Debug, Default, Clone)]
struct Ids {
    used: BTreeSet<u32>,
    /// Every id below is used.
    floor: u32,
}

impl Ids {
    fn of(used: impl IntoIterator<Item = u32>) -> Self {
        Self {
            used: used.into_iter().collect(),
            floor: 1,
        }
    }

    fn take(&mut self) -> u32 {
        let mut id = self.floor.max(1);
        for &u in self.used.range(id..) {
            if u != id {
                break;
            }
            id += 1;
        }
        self.used.insert(id);
        self.floor = id + 1;
        id
    }

    fn give(&mut self, id: u32) {
        if self.used.remove(&id) {
            self.floor = self.floor.min(id);
        }
    }
}

/// What the service maps hold, as far as the sync knows (the module docs'
/// "mirror"). `Default` is an untrusted, empty mirror: the first sync loads it.
#[derive(Debug, Default, Clone)]
pub struct SvcShadow {
    /// Whether the rest is what the maps hold.
    trusted: bool,
    frontends: HashMap<SvcKey, Svc>,
    /// What each frontend's ranges hold, at which geometry; survives a
    /// reload (the slots are read back only where the geometry differs).
    slots: HashMap<SvcKey, (Geometry, Ranges)>,
    backends: HashMap<u32, Backend>,
    id_of: HashMap<Ident, u32>,
    /// How many frontends name each backend id.
    refs: HashMap<u32, u32>,
    backend_ids: Ids,
    revs: HashMap<u32, Backend>,
    rev_ids: Ids,
    /// Source-range prefixes by rev_id.
    ranges: HashMap<u32, BTreeSet<RangeKey>>,
    /// The slot ranges in use, shared by content.
    pool: Pool,
    /// Frontends that did not fit: tried again by every sync.
    pending: BTreeSet<SvcKey>,
}

impl SvcShadow {
    /// Whether the next sync of changes may trust this mirror.
    pub fn trusted(&self) -> bool {
        self.trusted
    }

    /// Reads the maps: frontends, backends, reverse entries and prefixes
    /// (one dump each), and the slots of every frontend whose geometry the
    /// mirror has not recorded.
    fn load(&mut self, t: &impl SvcTables) -> Result<(), DatapathError> {
        self.trusted = false;
        self.frontends = t.frontends()?.into_iter().collect();
        let frontends = &self.frontends;
        self.slots
            .retain(|k, (g, _)| frontends.get(k).is_some_and(|s| Geometry::of(s) == *g));
        let capacity = t.capacity();
        for (key, s) in &self.frontends {
            if self.slots.contains_key(key) {
                continue;
            }
            let g = Geometry::of(s);
            // Whole ranges, past a lower placement limit too: what a live
            // frontend names must be known, or its backends would go as garbage.
            let read = |start: u32, len: u32| -> Result<Vec<u32>, DatapathError> {
                let end = start.saturating_add(len).min(MAX_SVC_SLOTS);
                (start..end).map(|i| t.slot(i)).collect()
            };
            let r = Ranges {
                ids: read(g.base, g.count)?,
                maglev: read(g.maglev_base, g.maglev_m)?,
            };
            self.slots.insert(*key, (g, r));
        }
        let mut backends = t.backends()?;
        backends.sort_unstable_by_key(|(id, _)| *id);
        self.id_of = HashMap::with_capacity(backends.len());
        for (id, b) in &backends {
            // a duplicate (never written by this sync) is named by no one's
            // lookup, so it goes as garbage unless a range names it
            self.id_of.entry(ident(b)).or_insert(*id);
        }
        self.backend_ids = Ids::of(backends.iter().map(|(id, _)| *id));
        self.backends = backends.into_iter().collect();
        self.refs = HashMap::with_capacity(self.backends.len());
        for (_, r) in self.slots.values() {
            for id in r.named() {
                *self.refs.entry(id).or_default() += 1;
            }
        }
        self.revs = t.revs()?.into_iter().collect();
        self.rev_ids = Ids::of(
            self.revs
                .keys()
                .copied()
                .chain(self.frontends.values().map(|s| s.rev_id)),
        );
        self.ranges = HashMap::new();
        for k in t.source_ranges()? {
            let r = range_key(&k);
            self.ranges.entry(r.1).or_default().insert(r);
        }
        self.pool = Pool::of(
            self.slots.values().flat_map(|(g, r)| {
                [
                    (g.base, r.ids.as_slice()),
                    (g.maglev_base, r.maglev.as_slice()),
                ]
            }),
            capacity,
        );
        self.pending.clear();
        self.trusted = true;
        Ok(())
    }
}

/// A full sync: reads the maps (see the module docs), then makes them hold
/// `desired`, removing whatever else they hold.
pub fn sync_services(
    t: &mut impl SvcTables,
    shadow: &mut SvcShadow,
    desired: &SvcDesired,
) -> Result<SvcSyncReport, DatapathError> {
    shadow.load(t)?;
    let mut keys: BTreeSet<SvcKey> = desired.keys().copied().collect();
    keys.extend(shadow.frontends.keys().copied());
    let mut report = apply(t, shadow, desired, &keys, true);
    report.full = true;
    Ok(report)
}

/// A sync of changes: `desired` is everything the agent wants, `changed` the
/// keys that may differ from the last sync (added, changed or removed). Only
/// those are visited (and any frontend that did not fit before), while the
/// mirror is trusted; otherwise this is a full sync.
pub fn sync_service_changes(
    t: &mut impl SvcTables,
    shadow: &mut SvcShadow,
    desired: &SvcDesired,
    changed: &BTreeSet<SvcKey>,
) -> Result<SvcSyncReport, DatapathError> {
    if !shadow.trusted {
        return sync_services(t, shadow, desired);
    }
    let mut keys = changed.clone();
    keys.extend(shadow.pending.iter().copied());
    Ok(apply(t, shadow, desired, &keys, false))
}

/// Adds one reference to each id, or drops one.
fn count(refs: &mut HashMap<u32, u32>, ids: &BTreeSet<u32>, up: bool, zeroed: &mut Vec<u32>) {
    for id in ids {
        let n = refs.entry(*id).or_default();
        if up {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                zeroed.push(*id);
            }
        }
    }
}

/// Brings the frontends `keys` to `desired` (absent: removed). With
/// `sweep`, also removes every backend, reverse entry and prefix that no
/// frontend needs (a full sync's garbage: leftovers of a crash or of an
/// older agent).
fn apply(
    t: &mut impl SvcTables,
    sh: &mut SvcShadow,
    desired: &SvcDesired,
    keys: &BTreeSet<SvcKey>,
    sweep: bool,
) -> SvcSyncReport {
    let mut report = SvcSyncReport::default();
    sh.pool.next_sync();
    sh.pending.clear();

    // 1. Backend ids (kept while named), then the values that changed.
    let mut plans: Vec<(SvcKey, &DesiredFrontend, Ranges)> = Vec::new();
    let mut removed: Vec<SvcKey> = Vec::new();
    let mut fresh: Vec<u32> = Vec::new();
    let mut writes: BTreeMap<u32, Backend> = BTreeMap::new();
    for key in keys {
        let Some(fe) = desired.get(key) else {
            if sh.frontends.contains_key(key) {
                removed.push(*key);
            }
            continue;
        };
        let ids: Vec<u32> = fe
            .backends
            .iter()
            .map(|b| {
                let id = match sh.id_of.get(&ident(b)) {
                    Some(id) => *id,
                    None => {
                        let id = sh.backend_ids.take();
                        sh.id_of.insert(ident(b), id);
                        fresh.push(id);
                        id
                    }
                };
                if sh.backends.get(&id) != Some(b) {
                    writes.entry(id).or_insert(*b);
                }
                id
            })
            .collect();
        let maglev = fe
            .maglev
            .iter()
            .filter_map(|&i| ids.get(i as usize).copied())
            .collect();
        plans.push((*key, fe, Ranges { ids, maglev }));
    }
    let mut writes: Vec<(u32, Backend)> = writes.into_iter().collect();
    // A failing element is reported and skipped; the rest are still written.
    while !writes.is_empty() {
        match t.put_backends(&writes) {
            Ok(()) => {
                report.backends_written += writes.len();
                sh.backends.extend(writes.drain(..));
            }
            Err((n, e)) => {
                report.backends_written += n;
                report.failures.push(e);
                let n = n.min(writes.len() - 1);
                sh.backends.extend(writes.drain(..n));
                writes.remove(0);
            }
        }
    }

    // Reverse ids: kept per frontend.
    let mut revs: Vec<u32> = Vec::with_capacity(plans.len());
    for (key, fe, _) in &plans {
        let rev = match sh.frontends.get(key) {
            Some(s) if s.rev_id != 0 => s.rev_id,
            _ => sh.rev_ids.take(),
        };
        if sh.revs.get(&rev) != Some(&fe.addr) {
            match t.put_rev(rev, &fe.addr) {
                Ok(()) => {
                    report.backends_written += 1;
                    sh.revs.insert(rev, fe.addr);
                }
                Err(e) => report.failures.push(e),
            }
        }
        revs.push(rev);
    }

    // Source ranges, before any frontend is flagged to consult them.
    let mut unwanted: Vec<RangeKey> = Vec::new();
    for ((_, fe, _), &rev) in plans.iter().zip(&revs) {
        let want = ranges_of_frontend(rev, fe);
        let have = sh.ranges.entry(rev).or_default();
        for r in want.difference(have).copied().collect::<Vec<_>>() {
            match t.put_source_range(&lpm_of(&r)) {
                Ok(()) => {
                    report.backends_written += 1;
                    have.insert(r);
                }
                Err(e) => report.failures.push(e),
            }
        }
        unwanted.extend(have.difference(&want).copied());
    }

    // 2. Ranges and frontend values.
    let mut zeroed: Vec<u32> = Vec::new();
    for ((key, fe, ranges), &rev) in plans.iter().zip(&revs) {
        let attrs = |g: Geometry| Svc {
            rev_id: rev,
            base: g.base,
            count: g.count,
            local_count: fe.local_count.min(g.count),
            maglev_base: g.maglev_base,
            maglev_m: g.maglev_m,
            affinity_s: fe.affinity_s,
            flags: if fe.source_ranges.is_empty() {
                fe.flags & !SVC_F_SOURCE_RANGES
            } else {
                fe.flags | SVC_F_SOURCE_RANGES
            },
        };
        let old = sh.frontends.get(key).copied();
        let kept = match (old, sh.slots.get(key)) {
            (Some(s), Some((g, r))) if *g == Geometry::of(&s) && r == ranges => Some(*g),
            _ => None,
        };
        let (svc, moved) = match kept {
            Some(g) => (attrs(g), false),
            None => {
                let (Ok(count), Ok(m)) = (
                    u32::try_from(ranges.ids.len()),
                    u32::try_from(ranges.maglev.len()),
                ) else {
                    report.unfitted.push(*key);
                    continue;
                };
                let Some((base, fresh)) = sh.pool.take(&ranges.ids) else {
                    report.unfitted.push(*key);
                    continue;
                };
                let Some((maglev_base, fresh_m)) = sh.pool.take(&ranges.maglev) else {
                    sh.pool.release(base, count);
                    report.unfitted.push(*key);
                    continue;
                };
                let g = Geometry {
                    base,
                    count,
                    maglev_base,
                    maglev_m: m,
                };
                let mut wrote_all = true;
                for (start, range, write) in [
                    (base, &ranges.ids, fresh),
                    (maglev_base, &ranges.maglev, fresh_m),
                ] {
                    if !write {
                        continue;
                    }
                    match t.set_slots(start, range) {
                        Ok(()) => report.slots_written += range.len(),
                        Err((n, e)) => {
                            report.slots_written += n;
                            report.failures.push(e);
                            wrote_all = false;
                            break;
                        }
                    }
                }
                if !wrote_all {
                    // The old value (if any) still points at its intact
                    // ranges; the new ones are given up (the mirror is
                    // reloaded by the next sync anyway).
                    sh.pool.release(base, count);
                    sh.pool.release(maglev_base, m);
                    continue;
                }
                (attrs(g), true)
            }
        };
        if old != Some(svc) {
            if let Err(e) = t.put_frontend(key, &svc) {
                report.failures.push(e);
                if moved {
                    sh.pool.release(svc.base, svc.count);
                    sh.pool.release(svc.maglev_base, svc.maglev_m);
                }
                continue;
            }
            report.frontends_written += 1;
        }
        sh.frontends.insert(*key, svc);
        if moved {
            count(&mut sh.refs, &ranges.named(), true, &mut zeroed);
            let new = (Geometry::of(&svc), ranges.clone());
            if let Some((g, r)) = sh.slots.insert(*key, new) {
                count(&mut sh.refs, &r.named(), false, &mut zeroed);
                sh.pool.release(g.base, g.count);
                sh.pool.release(g.maglev_base, g.maglev_m);
            }
        }
    }
    report.unfitted.sort_unstable();
    sh.pending.extend(report.unfitted.iter().copied());

    // 3. Removals, referencing entries first. A new frontend that was not
    // written gives its fresh rev_id (and prefixes) back.
    let mut dead_revs: Vec<u32> = plans
        .iter()
        .zip(&revs)
        .filter(|((key, _, _), _)| !sh.frontends.contains_key(key))
        .map(|(_, rev)| *rev)
        .collect();
    for key in &removed {
        match t.remove_frontend(key) {
            Ok(()) => {
                report.frontends_removed += 1;
                if let Some(s) = sh.frontends.remove(key) {
                    dead_revs.push(s.rev_id);
                }
                if let Some((g, r)) = sh.slots.remove(key) {
                    count(&mut sh.refs, &r.named(), false, &mut zeroed);
                    sh.pool.release(g.base, g.count);
                    sh.pool.release(g.maglev_base, g.maglev_m);
                }
            }
            Err(e) => report.failures.push(e),
        }
    }
    if sweep {
        let live: BTreeSet<u32> = sh.frontends.values().map(|s| s.rev_id).collect();
        dead_revs.extend(sh.revs.keys().filter(|r| !live.contains(r)));
        dead_revs.extend(sh.ranges.keys().filter(|r| !live.contains(r)));
        zeroed.extend(sh.backends.keys());
    }
    dead_revs.sort_unstable();
    dead_revs.dedup();
    for rev in &dead_revs {
        if sh.revs.contains_key(rev) {
            match t.remove_rev(*rev) {
                Ok(()) => {
                    report.backends_removed += 1;
                    sh.revs.remove(rev);
                }
                Err(e) => {
                    report.failures.push(e);
                    continue;
                }
            }
        }
        unwanted.extend(sh.ranges.get(rev).into_iter().flatten().copied());
        sh.rev_ids.give(*rev);
    }
    // Backends no frontend names (a frontend that could not be rewritten
    // still names its old ones); fresh ones whose frontend did not fit too.
    zeroed.extend(fresh);
    zeroed.sort_unstable();
    zeroed.dedup();
    for id in zeroed {
        if sh.refs.get(&id).copied().unwrap_or(0) > 0 {
            continue;
        }
        sh.refs.remove(&id);
        let Some(b) = sh.backends.get(&id).copied() else {
            // never written (its write failed, so the mirror is reloaded
            // next): only the id to give back
            sh.id_of.retain(|_, v| *v != id);
            sh.backend_ids.give(id);
            continue;
        };
        match t.remove_backend(id) {
            Ok(()) => {
                report.backends_removed += 1;
                sh.backends.remove(&id);
                if sh.id_of.get(&ident(&b)) == Some(&id) {
                    sh.id_of.remove(&ident(&b));
                }
                sh.backend_ids.give(id);
            }
            Err(e) => report.failures.push(e),
        }
    }
    // Source ranges no frontend wants; a frontend left as it was keeps its
    // rev_id, and its prefixes are wanted still (same key, same rev_id).
    unwanted.sort_unstable();
    unwanted.dedup();
    for r in unwanted {
        match t.remove_source_range(&lpm_of(&r)) {
            Ok(()) => {
                report.backends_removed += 1;
                if let Some(set) = sh.ranges.get_mut(&r.1) {
                    set.remove(&r);
                    if set.is_empty() {
                        sh.ranges.remove(&r.1);
                    }
                }
            }
            Err(e) => report.failures.push(e),
        }
    }
    if !report.failures.is_empty() {
        sh.trusted = false;
    }
    report
}

#[cfg(test)]
mod tests;
