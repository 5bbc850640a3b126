// SPDX-License-Identifier: Apache-2.0
//! Stable small ids for backends (u32) and frontends (rev_nat_id, 24 bits): the same thing keeps
//! its id for as long as something refers to it, a freed id is reused, and ids found in the
//! pinned maps at start-up are adopted so that a restart changes nothing.

use std::{collections::hash_map::Entry, hash::Hash};

// foldhash, not SipHash: see `apply`.
use foldhash::{HashMap, HashMapExt};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no free {kind} id left (all {max} in use)")]
pub struct Exhausted {
    pub kind: &'static str,
    pub max: u64,
}

/// What the allocator keeps per key: 12 bytes and the payload, where `(u64, usize)` and a
/// second map for the payload took 40 bytes and a second entry (at 200,000 backends the
/// two maps held 25 MB).
#[derive(Clone, Copy, Debug)]
struct Slot<P> {
    id: u32,
    refs: u32,
    payload: P,
}

/// A set of small ids, one bit each: ids are dense from 1, so the set is a bitmap as long
/// as the highest id in it (a million backend ids: 125 KB, and no hashing).
#[derive(Clone, Debug, Default)]
pub struct IdBits(Vec<u64>);

impl IdBits {
    pub fn contains(&self, id: u32) -> bool {
        self.0
            .get(id as usize / 64)
            .is_some_and(|word| word & (1 << (id % 64)) != 0)
    }

    pub fn insert(&mut self, id: u32) {
        let word = id as usize / 64;
        if word >= self.0.len() {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (id % 64);
    }

    pub fn remove(&mut self, id: u32) {
        if let Some(word) = self.0.get_mut(id as usize / 64) {
            *word &= !(1 << (id % 64));
        }
    }
}

/// What [`IdAllocator::acquire_looked`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired<P> {
    pub id: u64,
    /// Handed out for the first time now (nothing held it before this reference).
    pub fresh: bool,
    /// Its payload before this reference (the default when fresh).
    pub payload: P,
}

/// Reference-counted id allocator over `1..=max` (0 is never handed out: it means "none" in
/// the maps). Each key carries a payload `P` besides its id (the entry written for a
/// backend), which lives and dies with the key's id.
#[derive(Debug)]
pub struct IdAllocator<K, P = ()> {
    kind: &'static str,
    max: u64,
    by_key: HashMap<K, Slot<P>>,
    /// The ids in `by_key`, one bit each (adopting tells a taken id in constant time: a
    /// restart adopts every entry of the maps). Sized to the highest id handed out.
    taken: IdBits,
    free: Vec<u32>,
    /// Ids released since the last [`IdAllocator::recycle`]: not handed out again until
    /// then, so that one sync never deletes the entry of an id it also gave away anew.
    released: Vec<u32>,
    next: u64,
    /// Keys adopted and not acquired since: [`IdAllocator::drop_unreferenced`] has work
    /// only while some are left (it runs at every sync; a scan of every key would make a
    /// one-service sync cost as much as all services).
    unreferenced: usize,
}

impl<K: Clone + Eq + Hash, P: Copy + Default> IdAllocator<K, P> {
    pub fn new(kind: &'static str, max: u64) -> Self {
        Self {
            kind,
            // Ids are u32 in the maps.
            max: max.min(u64::from(u32::MAX)),
            by_key: HashMap::new(),
            taken: IdBits::default(),
            free: Vec::new(),
            released: Vec::new(),
            next: 1,
            unreferenced: 0,
        }
    }

    fn is_taken(&self, id: u32) -> bool {
        self.taken.contains(id)
    }

    fn set_taken(&mut self, id: u32, taken: bool) {
        if taken {
            self.taken.insert(id);
        } else {
            self.taken.remove(id);
        }
    }

    /// The id of `key`, taking one reference (allocating on first use, with the default
    /// payload).
    pub fn acquire(&mut self, key: &K) -> Result<u64, Exhausted> {
        self.acquire_looked(key).map(|acquired| acquired.id)
    }

    /// [`IdAllocator::acquire`], also saying whether the id is new and what payload it
    /// had, in one lookup (a cold sync acquires a million backends).
    pub fn acquire_looked(&mut self, key: &K) -> Result<Acquired<P>, Exhausted> {
        // One probe, whether the key has an id or gets one: a lookup and then an insert
        // hashed and probed each new key twice, a million times in a cold sync.
        let vacant = match self.by_key.entry(key.clone()) {
            Entry::Occupied(mut known) => {
                let slot = known.get_mut();
                if slot.refs == 0 {
                    self.unreferenced = self.unreferenced.saturating_sub(1);
                }
                slot.refs += 1;
                return Ok(Acquired {
                    id: u64::from(slot.id),
                    fresh: false,
                    payload: slot.payload,
                });
            }
            Entry::Vacant(vacant) => vacant,
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None if self.next <= self.max => {
                self.next += 1;
                // `max` is at most u32::MAX.
                (self.next - 1) as u32
            }
            None => {
                return Err(Exhausted {
                    kind: self.kind,
                    max: self.max,
                });
            }
        };
        vacant.insert(Slot {
            id,
            refs: 1,
            payload: P::default(),
        });
        self.set_taken(id, true);
        Ok(Acquired {
            id: u64::from(id),
            fresh: true,
            payload: P::default(),
        })
    }

    /// Drops one reference; returns the id when it became unused (its payload goes with
    /// it). It becomes available again at the next [`IdAllocator::recycle`].
    pub fn release(&mut self, key: &K) -> Option<u64> {
        let slot = self.by_key.get_mut(key)?;
        slot.refs = slot.refs.saturating_sub(1);
        if slot.refs > 0 {
            return None;
        }
        let id = slot.id;
        self.by_key.remove(key);
        self.set_taken(id, false);
        self.released.push(id);
        Some(u64::from(id))
    }

    /// Makes `id` available again at once: it was handed out and released by a plan that
    /// was thrown away, so no entry of it is written, and none is deleted.
    pub fn forget(&mut self, id: u64) {
        if let Some(pos) = self.released.iter().position(|r| u64::from(*r) == id) {
            let id = self.released.swap_remove(pos);
            self.free.push(id);
        }
    }

    /// Makes the ids released so far available again (after their map entries are gone).
    pub fn recycle(&mut self) {
        self.free.append(&mut self.released);
    }

    /// The largest id handed out.
    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn get(&self, key: &K) -> Option<u64> {
        self.by_key.get(key).map(|slot| u64::from(slot.id))
    }

    /// Sets the payload of `key`; false (and nothing kept) when `key` has no id.
    pub fn set_payload(&mut self, key: &K, payload: P) -> bool {
        match self.by_key.get_mut(key) {
            Some(slot) => {
                slot.payload = payload;
                true
            }
            None => false,
        }
    }

    /// Makes room for `additional` more keys at once (a sync that brings in a million
    /// backends grows the table once instead of twenty times, rehashing every key each
    /// time).
    pub fn reserve(&mut self, additional: usize) {
        self.by_key.reserve(additional);
    }

    /// How many keys have an id.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Every key with an id, its id and its payload.
    pub fn iter(&self) -> impl Iterator<Item = (&K, u64, &P)> {
        self.by_key
            .iter()
            .map(|(key, slot)| (key, u64::from(slot.id), &slot.payload))
    }

    /// Registers an id found in the maps at start-up, with no reference yet and `payload`;
    /// the first `acquire` of `key` then returns it. Ids above `max` or already taken are
    /// ignored.
    pub fn adopt_with(&mut self, key: K, id: u64, payload: P) -> bool {
        if id == 0 || id > self.max || self.by_key.contains_key(&key) {
            return false;
        }
        // `max` is at most u32::MAX.
        let id = id as u32;
        if self.is_taken(id) {
            return false;
        }
        self.by_key.insert(
            key,
            Slot {
                id,
                refs: 0,
                payload,
            },
        );
        self.set_taken(id, true);
        self.unreferenced += 1;
        self.free.retain(|f| *f != id);
        if u64::from(id) >= self.next {
            // Ids skipped over become free.
            self.free.extend(self.next as u32..id);
            self.next = u64::from(id) + 1;
        }
        true
    }

    /// [`IdAllocator::adopt_with`] the default payload.
    pub fn adopt(&mut self, key: K, id: u64) -> bool {
        self.adopt_with(key, id, P::default())
    }

    /// Drops adopted ids that nothing acquired (the service went away while the agent was
    /// down); returns their keys and ids so the caller can delete their map entries.
    pub fn drop_unreferenced(&mut self) -> Vec<(K, u64)> {
        if self.unreferenced == 0 {
            return Vec::new();
        }
        self.unreferenced = 0;
        let stale: Vec<(K, u32)> = self
            .by_key
            .iter()
            .filter(|(_, slot)| slot.refs == 0)
            .map(|(k, slot)| (k.clone(), slot.id))
            .collect();
        for (key, id) in &stale {
            self.by_key.remove(key);
            self.set_taken(*id, false);
            self.released.push(*id);
        }
        stale
            .into_iter()
            .map(|(key, id)| (key, u64::from(id)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_bits_hold_ids_across_words() {
        let mut bits = IdBits::default();
        assert!(!bits.contains(0) && !bits.contains(1_000_000));
        for id in [1, 63, 64, 65, 1_000_000] {
            bits.insert(id);
        }
        for id in [1, 63, 64, 65, 1_000_000] {
            assert!(bits.contains(id), "{id}");
        }
        assert!(!bits.contains(2) && !bits.contains(999_999));
        bits.remove(64);
        bits.remove(5_000_000);
        assert!(!bits.contains(64) && bits.contains(63) && bits.contains(65));
    }

    #[test]
    fn same_key_same_id_and_refcounted() {
        let mut ids: IdAllocator<_> = IdAllocator::new("backend", 10);
        let a = ids.acquire(&"a").unwrap();
        assert_eq!(ids.acquire(&"a").unwrap(), a);
        assert_eq!(ids.release(&"a"), None);
        assert_eq!(ids.release(&"a"), Some(a));
        assert_eq!(ids.get(&"a"), None);
    }

    #[test]
    fn freed_ids_are_reused_only_after_recycling_and_zero_is_never_used() {
        let mut ids: IdAllocator<_> = IdAllocator::new("backend", 10);
        let a = ids.acquire(&"a").unwrap();
        let b = ids.acquire(&"b").unwrap();
        assert!(a >= 1 && b >= 1 && a != b);
        ids.release(&"a");
        // Within the same sync the released id stays out of reach.
        let c = ids.acquire(&"c").unwrap();
        assert_ne!(c, a);
        ids.recycle();
        assert_eq!(ids.acquire(&"d").unwrap(), a);
    }

    #[test]
    fn a_forgotten_id_is_free_at_once() {
        let mut ids: IdAllocator<_> = IdAllocator::new("backend", 1);
        let a = ids.acquire(&"a").unwrap();
        ids.release(&"a");
        assert!(ids.acquire(&"b").is_err());
        ids.forget(a);
        assert_eq!(ids.acquire(&"b").unwrap(), a);
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut ids: IdAllocator<_> = IdAllocator::new("rev_nat", 2);
        ids.acquire(&1).unwrap();
        ids.acquire(&2).unwrap();
        assert_eq!(
            ids.acquire(&3),
            Err(Exhausted {
                kind: "rev_nat",
                max: 2
            })
        );
    }

    #[test]
    fn adopted_ids_survive_a_restart_and_unused_ones_are_dropped() {
        let mut ids: IdAllocator<_> = IdAllocator::new("backend", 100);
        assert!(ids.adopt("kept", 7));
        assert!(ids.adopt("gone", 3));
        assert!(!ids.adopt("dup", 7));
        assert_eq!(ids.acquire(&"kept").unwrap(), 7);
        let stale = ids.drop_unreferenced();
        assert_eq!(stale, vec![("gone", 3)]);
        ids.recycle();
        // Ids below the highest adopted one are handed out again, never 7.
        let mut handed = Vec::new();
        for k in ["x", "y", "z", "w", "v", "u", "t"] {
            handed.push(ids.acquire(&k).unwrap());
        }
        assert!(!handed.contains(&7));
        assert!(handed.contains(&3));
    }

    #[test]
    fn a_payload_lives_and_dies_with_its_id() {
        let mut ids: IdAllocator<&str, Option<u8>> = IdAllocator::new("backend", 200);
        assert!(!ids.set_payload(&"a", Some(1)), "no id, no payload");
        let first = ids.acquire_looked(&"a").unwrap();
        assert!(first.fresh);
        assert_eq!(first.payload, None);
        assert!(ids.set_payload(&"a", Some(1)));
        let again = ids.acquire_looked(&"a").unwrap();
        assert_eq!(
            (again.id, again.fresh, again.payload),
            (first.id, false, Some(1))
        );
        ids.release(&"a");
        assert_eq!(
            ids.acquire_looked(&"a").unwrap().payload,
            Some(1),
            "one reference was left"
        );
        ids.release(&"a");
        ids.release(&"a");
        assert_eq!(ids.get(&"a"), None);
        ids.recycle();
        let anew = ids.acquire_looked(&"a").unwrap();
        assert!(anew.fresh, "a new id starts afresh");
        assert_eq!(anew.payload, None);
        // Adopted ids far apart (the bitmap of taken ids grows to the highest).
        assert!(ids.adopt_with("b", 150, Some(2)));
        assert!(!ids.adopt_with("c", 150, Some(3)), "150 is taken");
        let adopted = ids.acquire_looked(&"b").unwrap();
        assert_eq!(
            (adopted.id, adopted.fresh, adopted.payload),
            (150, false, Some(2))
        );
        let mut seen: Vec<(&str, u64)> = ids.iter().map(|(k, id, _)| (*k, id)).collect();
        seen.sort();
        assert_eq!(seen[1], ("b", 150));
    }
}
