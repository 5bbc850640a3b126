// SPDX-License-Identifier: Apache-2.0
//! Stable small ids for backends (u32) and frontends (rev_nat_id, u16): the same thing keeps
//! its id for as long as something refers to it, a freed id is reused, and ids found in the
//! pinned maps at start-up are adopted so that a restart changes nothing.

use std::hash::Hash;

// foldhash, not SipHash: see `apply`.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no free {kind} id left (all {max} in use)")]
pub struct Exhausted {
    pub kind: &'static str,
    pub max: u64,
}

/// Reference-counted id allocator over `1..=max` (0 is never handed out: it means "none" in
/// the maps).
#[derive(Debug)]
pub struct IdAllocator<K> {
    kind: &'static str,
    max: u64,
    by_key: HashMap<K, (u64, usize)>,
    /// The ids in `by_key` (adopting tells a taken id in constant time: a restart adopts
    /// every entry of the maps).
    taken: HashSet<u64>,
    free: Vec<u64>,
    /// Ids released since the last [`IdAllocator::recycle`]: not handed out again until
    /// then, so that one sync never deletes the entry of an id it also gave away anew.
    released: Vec<u64>,
    next: u64,
    /// Keys adopted and not acquired since: [`IdAllocator::drop_unreferenced`] has work
    /// only while some are left (it runs at every sync; a scan of every key would make a
    /// one-service sync cost as much as all services).
    unreferenced: usize,
}

impl<K: Clone + Eq + Hash> IdAllocator<K> {
    pub fn new(kind: &'static str, max: u64) -> Self {
        Self {
            kind,
            max,
            by_key: HashMap::new(),
            taken: HashSet::new(),
            free: Vec::new(),
            released: Vec::new(),
            next: 1,
            unreferenced: 0,
        }
    }

    /// The id of `key`, taking one reference (allocating on first use).
    pub fn acquire(&mut self, key: &K) -> Result<u64, Exhausted> {
        if let Some((id, refs)) = self.by_key.get_mut(key) {
            if *refs == 0 {
                self.unreferenced = self.unreferenced.saturating_sub(1);
            }
            *refs += 1;
            return Ok(*id);
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None if self.next <= self.max => {
                self.next += 1;
                self.next - 1
            }
            None => {
                return Err(Exhausted {
                    kind: self.kind,
                    max: self.max,
                });
            }
        };
        self.by_key.insert(key.clone(), (id, 1));
        self.taken.insert(id);
        Ok(id)
    }

    /// Drops one reference; returns the id when it became unused. It becomes available
    /// again at the next [`IdAllocator::recycle`].
    pub fn release(&mut self, key: &K) -> Option<u64> {
        let (id, refs) = self.by_key.get_mut(key)?;
        *refs -= 1;
        if *refs > 0 {
            return None;
        }
        let id = *id;
        self.by_key.remove(key);
        self.taken.remove(&id);
        self.released.push(id);
        Some(id)
    }

    /// Makes `id` available again at once: it was handed out and released by a plan that
    /// was thrown away, so no entry of it is written, and none is deleted.
    pub fn forget(&mut self, id: u64) {
        if let Some(pos) = self.released.iter().position(|r| *r == id) {
            self.released.swap_remove(pos);
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
        self.by_key.get(key).map(|(id, _)| *id)
    }

    /// Registers an id found in the maps at start-up, with no reference yet; the first
    /// `acquire` of `key` then returns it. Ids above `max` or already taken are ignored.
    pub fn adopt(&mut self, key: K, id: u64) -> bool {
        if id == 0 || id > self.max || self.taken.contains(&id) || self.by_key.contains_key(&key) {
            return false;
        }
        self.by_key.insert(key, (id, 0));
        self.taken.insert(id);
        self.unreferenced += 1;
        self.free.retain(|f| *f != id);
        if id >= self.next {
            // Ids skipped over become free.
            self.free.extend(self.next..id);
            self.next = id + 1;
        }
        true
    }

    /// Drops adopted ids that nothing acquired (the service went away while the agent was
    /// down); returns their keys and ids so the caller can delete their map entries.
    pub fn drop_unreferenced(&mut self) -> Vec<(K, u64)> {
        if self.unreferenced == 0 {
            return Vec::new();
        }
        self.unreferenced = 0;
        let stale: Vec<(K, u64)> = self
            .by_key
            .iter()
            .filter(|(_, (_, refs))| *refs == 0)
            .map(|(k, (id, _))| (k.clone(), *id))
            .collect();
        for (key, id) in &stale {
            self.by_key.remove(key);
            self.taken.remove(id);
            self.released.push(*id);
        }
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_id_and_refcounted() {
        let mut ids = IdAllocator::new("backend", 10);
        let a = ids.acquire(&"a").unwrap();
        assert_eq!(ids.acquire(&"a").unwrap(), a);
        assert_eq!(ids.release(&"a"), None);
        assert_eq!(ids.release(&"a"), Some(a));
        assert_eq!(ids.get(&"a"), None);
    }

    #[test]
    fn freed_ids_are_reused_only_after_recycling_and_zero_is_never_used() {
        let mut ids = IdAllocator::new("backend", 10);
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
        let mut ids = IdAllocator::new("backend", 1);
        let a = ids.acquire(&"a").unwrap();
        ids.release(&"a");
        assert!(ids.acquire(&"b").is_err());
        ids.forget(a);
        assert_eq!(ids.acquire(&"b").unwrap(), a);
    }

    #[test]
    fn exhaustion_is_an_error() {
        let mut ids = IdAllocator::new("rev_nat", 2);
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
        let mut ids = IdAllocator::new("backend", 100);
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
}
