//! [`SortedMap`]: a map kept as one sorted vector, for desired states that
//! are built whole once per pass and then only read and diffed.
//!
//! The NetworkPolicy compile emits tens of thousands of rules per pass; an
//! ordered tree costs an allocation per entry to build and a pointer chase
//! per step to walk, while a sorted vector is built by one sort and walked
//! in step with another (the sync's diff is a merge of two sorted runs).
//! Point inserts are O(n): fine for tests and small maps, never on the
//! compile's path.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// A map as a vector sorted by key, keys distinct.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SortedMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The map of `entries`, which must already be sorted by key and
    /// distinct (checked in debug builds); the compile's fast path.
    pub fn from_sorted(entries: Vec<(K, V)>) -> Self {
        debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
        Self { entries }
    }

    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// The value of `key`.
    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    /// Does the map hold `key`?
    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value` (O(n)); the value it replaced, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes `key` (O(n)); its value, if it was there.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| self.entries.remove(i).1)
    }

    /// Keeps only the entries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The keys in order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values in key order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.entries.iter().map(|(_, v)| v)
    }

    /// The entries, sorted by key.
    pub fn as_slice(&self) -> &[(K, V)] {
        &self.entries
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SortedMap<K, V> {
    type Output = V;
    /// The value of `key`; panics if there is none, as `BTreeMap`'s does.
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(v) => v,
            None => panic!("SortedMap: no entry for the key"),
        }
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SortedMap<K, V> {
    /// Sorts the pairs; of equal keys the last one wins, as in a
    /// `BTreeMap` built from the same sequence.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut entries: Vec<(K, V)> = iter.into_iter().collect();
        // stable: equal keys keep their order, and the last is kept below
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for e in entries {
            match out.last_mut() {
                Some(last) if last.0 == e.0 => *last = e,
                _ => out.push(e),
            }
        }
        Self { entries: out }
    }
}

impl<'a, K, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<K, V> IntoIterator for SortedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq<BTreeMap<K, V>> for SortedMap<K, V> {
    fn eq(&self, other: &BTreeMap<K, V>) -> bool {
        self.entries.len() == other.len()
            && self
                .entries
                .iter()
                .zip(other)
                .all(|((a, b), (c, d))| a == c && b == d)
    }
}

impl<K: PartialEq, V: PartialEq> PartialEq<SortedMap<K, V>> for BTreeMap<K, V> {
    fn eq(&self, other: &SortedMap<K, V>) -> bool {
        other == self
    }
}

/// One step of a walk over two sorted maps in key order.
#[derive(Debug)]
pub enum Merge<'a, K, V> {
    /// Only in the left map.
    Left(&'a K, &'a V),
    /// Only in the right map.
    Right(&'a K, &'a V),
    /// In both: the left value, then the right.
    Both(&'a K, &'a V, &'a V),
}

/// Walks `left` and `right` together in key order.
pub fn merge<'a, K: Ord, V>(
    left: &'a SortedMap<K, V>,
    right: &'a SortedMap<K, V>,
) -> impl Iterator<Item = Merge<'a, K, V>> + 'a {
    let (mut l, mut r) = (
        left.entries.iter().peekable(),
        right.entries.iter().peekable(),
    );
    std::iter::from_fn(move || match (l.peek(), r.peek()) {
        (None, None) => None,
        (Some(_), None) => l.next().map(|(k, v)| Merge::Left(k, v)),
        (None, Some(_)) => r.next().map(|(k, v)| Merge::Right(k, v)),
        (Some((a, _)), Some((b, _))) => match a.cmp(b) {
            Ordering::Less => l.next().map(|(k, v)| Merge::Left(k, v)),
            Ordering::Greater => r.next().map(|(k, v)| Merge::Right(k, v)),
            Ordering::Equal => match (l.next(), r.next()) {
                (Some((k, v)), Some((_, w))) => Some(Merge::Both(k, v, w)),
                _ => None,
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_from_any_order_it_is_sorted_and_the_last_of_equal_keys_wins() {
        let m: SortedMap<u32, &str> = [(3, "c"), (1, "a"), (3, "C"), (2, "b")]
            .into_iter()
            .collect();
        let b: BTreeMap<u32, &str> = [(3, "c"), (1, "a"), (3, "C"), (2, "b")]
            .into_iter()
            .collect();
        assert_eq!(m, b);
        assert_eq!(m.as_slice(), &[(1, "a"), (2, "b"), (3, "C")]);
        assert_eq!(m.get(&3), Some(&"C"));
        assert!(!m.contains_key(&4));
    }

    #[test]
    fn inserts_and_removes_keep_it_sorted() {
        let mut m = SortedMap::new();
        for k in [5, 1, 9, 3, 7] {
            assert_eq!(m.insert(k, k * 10), None);
        }
        assert_eq!(m.insert(3, 33), Some(30));
        assert_eq!(m.remove(&9), Some(90));
        assert_eq!(m.remove(&9), None);
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), [1, 3, 5, 7]);
        assert_eq!(m.values().copied().collect::<Vec<_>>(), [10, 33, 50, 70]);
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn a_merge_visits_every_key_once_in_order() {
        let a: SortedMap<u32, u32> = [(1, 1), (2, 2), (4, 4)].into_iter().collect();
        let b: SortedMap<u32, u32> = [(2, 20), (3, 30), (5, 50)].into_iter().collect();
        let steps: Vec<String> = merge(&a, &b)
            .map(|s| match s {
                Merge::Left(k, _) => format!("L{k}"),
                Merge::Right(k, _) => format!("R{k}"),
                Merge::Both(k, v, w) => format!("B{k}:{v}/{w}"),
            })
            .collect();
        assert_eq!(steps, ["L1", "B2:2/20", "R3", "L4", "R5"]);
        assert_eq!(merge(&a, &SortedMap::new()).count(), 3);
    }

    #[test]
    fn it_equals_a_btreemap_only_with_the_same_entries() {
        let m: SortedMap<u32, u32> = [(1, 1), (2, 2)].into_iter().collect();
        let same: BTreeMap<u32, u32> = [(2, 2), (1, 1)].into_iter().collect();
        let other: BTreeMap<u32, u32> = [(1, 1), (2, 3)].into_iter().collect();
        let shorter: BTreeMap<u32, u32> = [(1, 1)].into_iter().collect();
        assert_eq!(m, same);
        assert_eq!(same, m);
        assert_ne!(m, other);
        assert_ne!(m, shorter);
    }
}
