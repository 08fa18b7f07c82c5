//! The service maps' sync: makes `cp_svc`, `cp_svc_slots`, `cp_backends` and
//! `cp_svc_revs` hold what the agent's compiler wants, make before break.
//!
//! Ids: a backend keeps its id while it exists (same network, address, port
//! and protocol), a frontend keeps its `rev_id`; new ones get the smallest
//! unused id. Slots: a frontend whose backend list (and Maglev table) did not
//! change keeps its ranges; a changed one gets **new** ranges, written before
//! the frontend value is replaced (one map update, which a reader sees whole),
//! and its old ranges become free only at the next sync, when no frontend
//! points at them any more. Order:
//!
//! 1. backends and reverse entries are written (a range never names a backend
//!    that is not there yet), and every desired `loadBalancerSourceRanges`
//!    prefix (`cp_lb_src`, keyed by the frontend's `rev_id`);
//! 2. per frontend: its new ranges, then its value (flagged
//!    `SVC_F_SOURCE_RANGES` when it has source ranges: a prefix whose write
//!    failed is then missing, which refuses rather than admits);
//! 3. frontends no longer desired are removed, then reverse entries, backends
//!    nothing references and source ranges no frontend wants. While a
//!    frontend's ranges change, the old and new prefixes admit together for
//!    the moment between steps 1 and 3.
//!
//! Ranges of frontends removed in a sync are reused from the next sync on,
//! like replaced ones. A frontend whose ranges do not fit in the free slots
//! is not written at all (its old value, if any, stays, still pointing at intact ranges) and is
//! reported in [`SvcSyncReport::unfitted`]: never half-programmed.
//!
//! Reading every frontend's slots back on every sync would cost one syscall
//! per slot; the sync keeps a [`SlotShadow`] of what it wrote instead, trusted
//! only while the frontend's geometry (base, count, Maglev base and size) in
//! the map is what the shadow recorded (this sync is the only writer of the
//! slots), and reads the slots of any other frontend once (after a restart).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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
fn ranges_of_frontend(rev: u32, fe: &DesiredFrontend) -> Vec<RangeKey> {
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

/// What the sync last wrote into each frontend's ranges.
#[derive(Debug, Default, Clone)]
pub struct SlotShadow {
    entries: BTreeMap<SvcKey, (Geometry, Vec<u32>, Vec<u32>)>,
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

/// The identity of a backend: what must match for it to keep its id.
fn ident(b: &Backend) -> (u32, [u8; 16], [u8; 2], u8) {
    (b.net, b.addr.0, b.port, b.proto)
}

/// Free slots as sorted, disjoint `[start, end)` intervals, first fit.
struct Free(Vec<(u32, u32)>);

impl Free {
    fn all_but(mut used: Vec<(u32, u32)>, capacity: u32) -> Self {
        used.retain(|(s, e)| e > s);
        used.sort_unstable();
        let mut free = Vec::new();
        let mut at = 0u32;
        for (s, e) in used {
            if s > at {
                free.push((at, s));
            }
            at = at.max(e);
        }
        if at < capacity {
            free.push((at, capacity));
        }
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

    /// Gives back what `take` handed out (a frontend that did not fit).
    fn give(&mut self, start: u32, len: u32) {
        if len > 0 {
            self.0.push((start, start + len));
            self.0.sort_unstable();
        }
    }
}

/// The smallest id ≥ 1 not in `used`, which it then joins.
fn fresh_id(used: &mut HashSet<u32>, next: &mut u32) -> u32 {
    while used.contains(next) {
        *next += 1;
    }
    used.insert(*next);
    *next
}

/// Syncs `t` to `desired`; see the module docs.
pub fn sync_services(
    t: &mut impl SvcTables,
    shadow: &mut SlotShadow,
    desired: &SvcDesired,
) -> Result<SvcSyncReport, DatapathError> {
    let current: BTreeMap<SvcKey, Svc> = t.frontends()?.into_iter().collect();
    // Sorted by id (deterministic order of ids and removals), hashed for
    // lookups: at 10k Services × 10 backends, ordered maps of 10⁵ backends
    // were most of a sync's time.
    let mut have_backend_list = t.backends()?;
    have_backend_list.sort_unstable_by_key(|(id, _)| *id);
    let have_backends: HashMap<u32, Backend> = have_backend_list.iter().copied().collect();
    let mut have_rev_list = t.revs()?;
    have_rev_list.sort_unstable_by_key(|(id, _)| *id);
    let have_revs: HashMap<u32, Backend> = have_rev_list.iter().copied().collect();
    let mut report = SvcSyncReport::default();

    // 1. Backend ids (kept while the backend exists), then the values.
    let mut id_of = HashMap::with_capacity(have_backend_list.len());
    for (id, b) in &have_backend_list {
        id_of.entry(ident(b)).or_insert(*id);
    }
    let mut used_ids: HashSet<u32> = have_backends.keys().copied().collect();
    let mut next_id = 1;
    let mut want_backends: HashMap<u32, Backend> = HashMap::with_capacity(have_backends.len());
    let mut ids_of: HashMap<SvcKey, Vec<u32>> = HashMap::with_capacity(desired.len());
    for (key, fe) in desired {
        let mut ids = Vec::with_capacity(fe.backends.len());
        for b in &fe.backends {
            let id = *id_of
                .entry(ident(b))
                .or_insert_with(|| fresh_id(&mut used_ids, &mut next_id));
            want_backends.entry(id).or_insert(*b);
            ids.push(id);
        }
        ids_of.insert(*key, ids);
    }
    let mut to_write: Vec<(u32, Backend)> = want_backends
        .iter()
        .filter(|(id, b)| have_backends.get(id) != Some(b))
        .map(|(id, b)| (*id, *b))
        .collect();
    to_write.sort_unstable_by_key(|(id, _)| *id);
    // A failing element is reported and skipped; the rest are still written.
    while !to_write.is_empty() {
        match t.put_backends(&to_write) {
            Ok(()) => {
                report.backends_written += to_write.len();
                break;
            }
            Err((n, e)) => {
                report.backends_written += n;
                report.failures.push(e);
                to_write.drain(..=n.min(to_write.len() - 1));
            }
        }
    }

    // Reverse ids: kept per frontend.
    let mut used_revs: HashSet<u32> = have_revs.keys().copied().collect();
    let mut next_rev = 1;
    let mut rev_of: HashMap<SvcKey, u32> = HashMap::with_capacity(desired.len());
    for key in desired.keys() {
        let rev = match current.get(key) {
            Some(s) if s.rev_id != 0 => s.rev_id,
            _ => fresh_id(&mut used_revs, &mut next_rev),
        };
        used_revs.insert(rev);
        rev_of.insert(*key, rev);
    }
    for (key, fe) in desired {
        let rev = rev_of[key];
        if have_revs.get(&rev) != Some(&fe.addr) {
            match t.put_rev(rev, &fe.addr) {
                Ok(()) => report.backends_written += 1,
                Err(e) => report.failures.push(e),
            }
        }
    }

    // Source ranges, before any frontend is flagged to consult them.
    let have_ranges: BTreeSet<RangeKey> = t.source_ranges()?.iter().map(range_key).collect();
    let mut want_ranges: BTreeSet<RangeKey> = BTreeSet::new();
    for (key, fe) in desired {
        want_ranges.extend(ranges_of_frontend(rev_of[key], fe));
    }
    for r in want_ranges.difference(&have_ranges) {
        match t.put_source_range(&lpm_of(r)) {
            Ok(()) => report.backends_written += 1,
            Err(e) => report.failures.push(e),
        }
    }

    // 2. Ranges and frontend values.
    let occupied: Vec<(u32, u32)> = current
        .values()
        .flat_map(|s| {
            [
                (s.base, s.base.saturating_add(s.count)),
                (s.maglev_base, s.maglev_base.saturating_add(s.maglev_m)),
            ]
        })
        .collect();
    let mut free = Free::all_but(occupied, t.capacity());
    shadow.entries.retain(|k, _| current.contains_key(k));
    // Frontends whose old value stands although it is not what is desired
    // (did not fit, or a write failed): their old backends must stay.
    let mut kept_old: Vec<SvcKey> = Vec::new();
    for (key, fe) in desired {
        let ids = &ids_of[key];
        let maglev: Vec<u32> = fe
            .maglev
            .iter()
            .filter_map(|&i| ids.get(i as usize).copied())
            .collect();
        let attrs = |g: Geometry| Svc {
            rev_id: rev_of[key],
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
        let old = current.get(key);
        let same = match old {
            Some(s) => ranges_of(t, shadow, key, s)? == (ids.clone(), maglev.clone()),
            None => false,
        };
        let (svc, geometry) = if let (true, Some(s)) = (same, old) {
            (attrs(Geometry::of(s)), Geometry::of(s))
        } else {
            let (Ok(count), Ok(m)) = (u32::try_from(ids.len()), u32::try_from(maglev.len())) else {
                report.unfitted.push(*key);
                kept_old.push(*key);
                continue;
            };
            let Some(base) = free.take(count) else {
                report.unfitted.push(*key);
                kept_old.push(*key);
                continue;
            };
            let Some(maglev_base) = free.take(m) else {
                free.give(base, count);
                report.unfitted.push(*key);
                kept_old.push(*key);
                continue;
            };
            let g = Geometry {
                base,
                count,
                maglev_base,
                maglev_m: m,
            };
            let mut wrote_all = true;
            for (start, range) in [(base, ids.as_slice()), (maglev_base, maglev.as_slice())] {
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
                // The old value (if any) still points at its intact ranges.
                kept_old.push(*key);
                continue;
            }
            (attrs(g), g)
        };
        if old != Some(&svc) {
            match t.put_frontend(key, &svc) {
                Ok(()) => report.frontends_written += 1,
                Err(e) => {
                    report.failures.push(e);
                    kept_old.push(*key);
                    continue;
                }
            }
        }
        shadow.entries.insert(*key, (geometry, ids.clone(), maglev));
    }

    // 3. Removals, referencing entries first.
    for key in current.keys().filter(|k| !desired.contains_key(k)) {
        match t.remove_frontend(key) {
            Ok(()) => {
                report.frontends_removed += 1;
                shadow.entries.remove(key);
            }
            Err(e) => report.failures.push(e),
        }
    }
    let live_revs: HashSet<u32> = rev_of.values().copied().collect();
    for id in have_rev_list
        .iter()
        .map(|(id, _)| id)
        .filter(|id| !live_revs.contains(id))
    {
        match t.remove_rev(*id) {
            Ok(()) => report.backends_removed += 1,
            Err(e) => report.failures.push(e),
        }
    }
    // A backend still named by a frontend that could not be rewritten stays.
    let mut referenced: HashSet<u32> = want_backends.keys().copied().collect();
    for key in &kept_old {
        if let Some(s) = current.get(key) {
            if let Ok((ids, maglev)) = ranges_of(t, shadow, key, s) {
                referenced.extend(ids);
                referenced.extend(maglev);
            }
        }
    }
    for id in have_backend_list
        .iter()
        .map(|(id, _)| id)
        .filter(|id| !referenced.contains(id))
    {
        match t.remove_backend(*id) {
            Ok(()) => report.backends_removed += 1,
            Err(e) => report.failures.push(e),
        }
    }
    // Source ranges no frontend wants; a frontend left as it was keeps its
    // rev_id, and its prefixes are wanted still (same key, same rev_id).
    for r in have_ranges.difference(&want_ranges) {
        match t.remove_source_range(&lpm_of(r)) {
            Ok(()) => report.backends_removed += 1,
            Err(e) => report.failures.push(e),
        }
    }
    Ok(report)
}

/// The backend ids in `s`'s ranges: from the shadow while the geometry
/// matches, else read from the slots (and remembered).
fn ranges_of(
    t: &impl SvcTables,
    shadow: &mut SlotShadow,
    key: &SvcKey,
    s: &Svc,
) -> Result<(Vec<u32>, Vec<u32>), DatapathError> {
    let g = Geometry::of(s);
    if let Some((sg, ids, maglev)) = shadow.entries.get(key) {
        if *sg == g {
            return Ok((ids.clone(), maglev.clone()));
        }
    }
    let read = |start: u32, len: u32| -> Result<Vec<u32>, DatapathError> {
        let end = start.saturating_add(len).min(t.capacity());
        (start..end).map(|i| t.slot(i)).collect()
    };
    let ids = read(g.base, g.count)?;
    let maglev = read(g.maglev_base, g.maglev_m)?;
    shadow
        .entries
        .insert(*key, (g, ids.clone(), maglev.clone()));
    Ok((ids, maglev))
}

#[cfg(test)]
mod tests;
