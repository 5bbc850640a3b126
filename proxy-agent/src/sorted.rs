// SPDX-License-Identifier: Apache-2.0
//! A small map and set kept as one sorted `Vec`, for the records the agent keeps per
//! service: the ebpf apply state's service-map entries and source ranges, the model's
//! slices of a service by name.
//!
//! Why not a `HashMap` or `BTreeMap`: a service has a handful of each (a ClusterIP with 4
//! endpoints has 5 entries, most services one slice). hashbrown gives 5 entries a table of
//! 8 buckets plus control bytes and grows it twice on the way (about 350 bytes per
//! service against 200 here, 17 MB at 50,000 services); a `BTreeMap`'s first node has
//! room for 11 (about 370 bytes for one slice). Lookups are binary searches over those
//! few entries; entries are mostly built in key order, so inserts are mostly appends.
//! Iteration is in key order, which keeps what is built from them deterministic.

use std::borrow::Borrow;

/// A map from `K` to `V` in a sorted `Vec`.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    fn position<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// Sets `key` to `value`; returns the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.entries.insert(at, (key, value));
                None
            }
        }
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.position(key).ok().map(|at| &self.entries[at].1)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.position(key).is_ok()
    }

    /// Takes `key` out; returns its value.
    pub fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let at = self.position(key).ok()?;
        Some(self.entries.remove(at).1)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Makes room for `additional` more entries at once.
    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Gives back the room the inserts left unused (the map is kept for as long as its
    /// service is programmed).
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }
}

impl<K: Ord, V> Extend<(K, V)> for SortedMap<K, V> {
    /// As inserting each in turn: a later value for the same key wins.
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        let before = self.entries.len();
        self.entries.extend(iter);
        if self.entries.len() == before {
            return;
        }
        // Stable: of equal keys the last pushed stays last, and is the one kept.
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(K, V)> = Vec::with_capacity(self.entries.len());
        for entry in self.entries.drain(..) {
            match kept.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => kept.push(entry),
            }
        }
        self.entries = kept;
    }
}

impl<K, V> IntoIterator for SortedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    /// In key order.
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

/// A set of `T` in a sorted `Vec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortedSet<T>(SortedMap<T, ()>);

impl<T> Default for SortedSet<T> {
    fn default() -> Self {
        Self(SortedMap::default())
    }
}

impl<T: Ord> SortedSet<T> {
    /// Adds `item`; false when it was there already.
    pub fn insert(&mut self, item: T) -> bool {
        self.0.insert(item, ()).is_none()
    }

    pub fn contains(&self, item: &T) -> bool {
        self.0.contains_key(item)
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.0.keys()
    }

    /// The items of `self` not in `other`.
    pub fn difference<'a>(&'a self, other: &'a SortedSet<T>) -> impl Iterator<Item = &'a T> {
        self.iter().filter(move |item| !other.contains(item))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn shrink_to_fit(&mut self) {
        self.0.shrink_to_fit();
    }
}

impl<T: Ord> Extend<T> for SortedSet<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        self.0.extend(iter.into_iter().map(|item| (item, ())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_in_any_order_read_back_sorted_with_the_last_value_of_a_key() {
        let mut map = SortedMap::default();
        assert_eq!(map.insert(3, 'c'), None);
        assert_eq!(map.insert(1, 'a'), None);
        assert_eq!(map.insert(2, 'b'), None);
        assert_eq!(map.insert(1, 'A'), Some('a'));
        map.extend([(5, 'e'), (0, 'z'), (5, 'E'), (2, 'B')]);
        let seen: Vec<(i32, char)> = map.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(seen, [(0, 'z'), (1, 'A'), (2, 'B'), (3, 'c'), (5, 'E')]);
        assert_eq!(map.get(&5), Some(&'E'));
        assert_eq!(map.get(&4), None);
        assert!(map.contains_key(&0) && !map.contains_key(&9));
        assert_eq!(map.len(), 5);
        map.shrink_to_fit();
        assert_eq!((&map).into_iter().count(), 5);
        assert_eq!(map.remove(&1), Some('A'));
        assert_eq!(map.remove(&1), None);
        assert_eq!(map.values().copied().collect::<String>(), "zBcE");
        let owned: Vec<(i32, char)> = map.into_iter().collect();
        assert_eq!(owned, [(0, 'z'), (2, 'B'), (3, 'c'), (5, 'E')]);
    }

    #[test]
    fn a_set_tells_its_difference() {
        let mut a = SortedSet::default();
        a.extend([4, 1, 3]);
        assert!(a.insert(2));
        assert!(!a.insert(2));
        let mut b = SortedSet::default();
        b.extend([3, 9]);
        assert_eq!(a.difference(&b).copied().collect::<Vec<_>>(), [1, 2, 4]);
        assert_eq!(b.difference(&a).copied().collect::<Vec<_>>(), [9]);
        assert_eq!(a.len(), 4);
        assert!(!a.is_empty() && SortedSet::<u8>::default().is_empty());
    }
}
