// SPDX-License-Identifier: Apache-2.0
//! Shared copies of the names endpoints repeat (node names, zones and hint names) and of
//! the namespaces and port names that service keys repeat.
//!
//! The endpoints of a cluster name a few hundred nodes and zones at most, yet each
//! endpoint used to clone its own copy of its node name and zone, once in its slice's
//! record and once more in every merged per-port record. Interning makes every endpoint
//! on a node point at one shared string.
//!
//! The names come from API objects, so the set must not grow without bound when slices
//! churn or carry made-up names: names only the interner still holds are dropped once the
//! set has doubled since the last pruning (amortised O(1) per new name, and the set stays
//! within about twice the names in use).

use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

/// Below this many names the set is never pruned: it is small enough to keep as it is.
pub(crate) const MIN_PRUNE_AT: usize = 1024;

/// Shared by every thread that converts slices.
static SHARED: LazyLock<Mutex<NameInterner>> = LazyLock::new(|| Mutex::new(NameInterner::new()));

/// The interner the EndpointSlice conversion uses, locked. Hold it for all the names of
/// a slice rather than taking it per name.
pub fn lock_shared() -> MutexGuard<'static, NameInterner> {
    // A panic while the lock was held cannot leave the set inconsistent (each insert or
    // pruning is a single call on it), so a poisoned lock is still usable.
    SHARED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Namespaces and port names, apart: each service and each of its slices named its
/// namespace in a string of its own, and each service port its port name (100,000 copies
/// each of a few names at 50,000 services). A separate set, so that the per-slice lock
/// above is not also taken for every service.
static KEY_PARTS: LazyLock<Mutex<NameInterner>> = LazyLock::new(|| Mutex::new(NameInterner::new()));

/// The shared copy of a namespace or a port name.
pub fn shared_key_part(part: &str) -> Arc<str> {
    // Poisoning is harmless here for the reason given in `lock_shared`.
    KEY_PARTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .intern(part)
}

/// A set of shared strings; [`NameInterner::intern`] hands out the one copy of a name.
#[derive(Debug)]
pub struct NameInterner {
    /// foldhash: looked up for every node name, zone and hint of every slice.
    names: foldhash::HashSet<Arc<str>>,
    /// The set is pruned when it reaches this many names.
    prune_at: usize,
}

impl Default for NameInterner {
    fn default() -> Self {
        Self::new()
    }
}

impl NameInterner {
    pub fn new() -> Self {
        Self {
            names: foldhash::HashSet::default(),
            prune_at: MIN_PRUNE_AT,
        }
    }

    /// The shared copy of `name`.
    pub fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return Arc::clone(shared);
        }
        if self.names.len() >= self.prune_at {
            self.prune();
        }
        let shared: Arc<str> = Arc::from(name);
        self.names.insert(Arc::clone(&shared));
        shared
    }

    /// Number of names held, in use or not.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Drops the names nothing but the set refers to.
    fn prune(&mut self) {
        // A count of one is the set's own reference: nobody else holds the name, and
        // nobody can take a new reference without going through the set (`&mut self`).
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.prune_at = (self.names.len() * 2).max(MIN_PRUNE_AT);
        // Give back the table of a burst of names that are gone.
        self.names.shrink_to(self.prune_at);
    }
}
