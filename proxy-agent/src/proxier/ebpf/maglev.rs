// SPDX-License-Identifier: Apache-2.0
//! Maglev lookup tables (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
//! Load Balancer", NSDI 2016, section 3.4), pure: no kernel here.
//!
//! Each backend gets a permutation of the table's `size` entries from two hashes of its
//! identity: `offset = h1 % size`, `skip = h2 % (size - 1) + 1`, the j-th preference being
//! `(offset + j * skip) % size` (a permutation because `size` is prime). Backends take turns
//! claiming their next preferred entry that is still free until the table is full, so each
//! ends up with `size / n` entries give or take one turn's worth, and removing one backend
//! moves little more than its own entries.
//!
//! The identity hashed is the backend's address, port and protocol
//! (`proxy_common::maglev::backend_hash`), never this node's id for it: every node builds the
//! same assignment of entries to backends, and only then writes its own ids into it. Backends
//! take turns in the order of their identities, so the input order does not matter either.
//! With the flow hash of `proxy_common::maglev`, a flow entering through any node picks the
//! same backend.
//!
//! How the tables reach the programs (one array map, a table per distinct backend set, the
//! index in the frontend's slot 0, written before the slot 0 that points at it) is
//! described in `apply`.

use std::net::IpAddr;

use proxy_common::maglev::{BACKEND_OFFSET_SEED, BACKEND_SKIP_SEED, backend_hash};

use super::desired::BackendAddr;

/// The address as the shared hash takes it: 16 bytes, IPv4 in the first four.
fn addr_bytes(addr: &IpAddr) -> ([u8; 16], bool) {
    match addr {
        IpAddr::V4(a) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&a.octets());
            (out, false)
        }
        IpAddr::V6(a) => (a.octets(), true),
    }
}

/// A backend's preference list: where it starts and how far it steps.
fn permutation(backend: &BackendAddr, size: u32) -> (u64, u64) {
    let (bytes, v6) = addr_bytes(&backend.addr);
    let offset = backend_hash(BACKEND_OFFSET_SEED, &bytes, v6, backend.port, backend.proto);
    let skip = backend_hash(BACKEND_SKIP_SEED, &bytes, v6, backend.port, backend.proto);
    let size = u64::from(size);
    (u64::from(offset) % size, u64::from(skip) % (size - 1) + 1)
}

/// The table of `size` entries (a prime, at least 2) for `backends`, each given as its
/// identity and the id the table holds for it (this node's backend id). Duplicate identities
/// count once. No backends: a table of zeros (0 is no backend id: the programs then choose
/// at random, which with no backends means the frontend's own verdict).
pub fn build_table(backends: &[(BackendAddr, u32)], size: u32) -> Vec<u32> {
    let mut sorted: Vec<(BackendAddr, u32)> = backends.to_vec();
    sorted.sort_by_key(|(addr, _)| *addr);
    sorted.dedup_by_key(|(addr, _)| *addr);
    let len = size as usize;
    let mut table = vec![0u32; len];
    if sorted.is_empty() || size < 2 {
        return table;
    }
    // (current candidate entry, skip) per backend: the j-th preference is reached by adding
    // skip j times, modulo size, with no multiplication.
    let mut cursors: Vec<(u64, u64)> = sorted.iter().map(|(b, _)| permutation(b, size)).collect();
    let size64 = u64::from(size);
    let mut filled = vec![false; len];
    let mut remaining = len;
    'fill: loop {
        for (i, (_, id)) in sorted.iter().enumerate() {
            let (ref mut next, skip) = cursors[i];
            // A permutation visits every entry, so a free one is found before the cursor
            // comes round (the table is not full here).
            let mut entry = *next;
            while filled[entry as usize] {
                entry = (entry + skip) % size64;
            }
            *next = (entry + skip) % size64;
            filled[entry as usize] = true;
            table[entry as usize] = *id;
            remaining -= 1;
            if remaining == 0 {
                break 'fill;
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const SIZE: u32 = proxy_common::maglev::DEFAULT_TABLE_SIZE;

    fn backend(i: u32) -> BackendAddr {
        BackendAddr {
            addr: IpAddr::from([10, 1, (i >> 8) as u8, i as u8]),
            port: 8080,
            proto: 6,
        }
    }

    /// Backends 1..=n, with ids that differ from their position (as node-local ids do).
    fn backends(n: u32) -> Vec<(BackendAddr, u32)> {
        (1..=n).map(|i| (backend(i), 1000 + i)).collect()
    }

    fn shares(table: &[u32]) -> HashMap<u32, usize> {
        let mut out = HashMap::new();
        for id in table {
            *out.entry(*id).or_default() += 1;
        }
        out
    }

    #[test]
    fn every_backend_gets_about_its_share() {
        for n in [1u32, 2, 3, 10, 100, 1000] {
            let table = build_table(&backends(n), SIZE);
            assert!(table.iter().all(|id| *id > 1000 && *id <= 1000 + n));
            let counts = shares(&table);
            assert_eq!(counts.len(), n as usize, "every backend has entries");
            // The fill gives every backend one entry per round, except that the last round
            // stops when the table is full: shares differ by at most one... plus what the
            // permutations' collisions skew; the paper measures the spread within a few
            // percent of M/N for M >> N (here: at most 1 entry + 5% of the share, or 3
            // entries where the share is tiny).
            let share = SIZE as f64 / f64::from(n);
            let slack = (share * 0.05).max(3.0) + 1.0;
            for (id, count) in &counts {
                assert!(
                    (*count as f64 - share).abs() <= slack,
                    "n={n}: backend {id} has {count} entries, expected {share:.1} +- {slack:.1}"
                );
            }
        }
    }

    #[test]
    fn the_table_is_deterministic_and_independent_of_input_order() {
        let mut input = backends(50);
        let table = build_table(&input, SIZE);
        assert_eq!(table, build_table(&input, SIZE));
        input.reverse();
        assert_eq!(table, build_table(&input, SIZE));
        input.rotate_left(17);
        input.push(input[3]);
        assert_eq!(table, build_table(&input, SIZE), "a duplicate counts once");
    }

    #[test]
    fn the_assignment_depends_on_the_backends_addresses_not_on_their_ids() {
        // Two nodes with different local ids for the same backends build the same
        // assignment of entries to backends.
        let here = backends(20);
        let there: Vec<(BackendAddr, u32)> = here.iter().map(|(b, id)| (*b, id * 7)).collect();
        let a = build_table(&here, SIZE);
        let b = build_table(&there, SIZE);
        assert!(a.iter().zip(&b).all(|(x, y)| x * 7 == *y));
    }

    #[test]
    fn removing_one_of_n_backends_moves_about_one_nth_of_the_entries() {
        for n in [3u32, 10, 50, 1000] {
            let all = backends(n);
            let before = build_table(&all, SIZE);
            let removed = all[n as usize / 2].1;
            let rest: Vec<_> = all
                .iter()
                .copied()
                .filter(|(_, id)| *id != removed)
                .collect();
            let after = build_table(&rest, SIZE);
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            let of_removed = before.iter().filter(|id| **id == removed).count();
            // Entries of the removed backend must move; the paper bounds the others'
            // disruption to a few percent of the table.
            let moved_fraction = moved as f64 / f64::from(SIZE);
            let bound = 1.0 / f64::from(n) + 0.03;
            assert!(
                moved_fraction <= bound,
                "n={n}: {moved} of {SIZE} entries moved ({moved_fraction:.4} > {bound:.4})"
            );
            assert!(moved >= of_removed);
            // Entries of other backends mostly stay.
            let others_moved = moved - of_removed;
            let others = SIZE as usize - of_removed;
            assert!(
                (others_moved as f64) / (others as f64) <= 0.03,
                "n={n}: {others_moved} of {others} entries of remaining backends moved"
            );
        }
    }

    #[test]
    fn small_and_degenerate_inputs() {
        assert_eq!(build_table(&[], 251), vec![0; 251]);
        let one = build_table(&backends(1), 251);
        assert!(one.iter().all(|id| *id == 1001));
        // More backends than entries: the table is full and some backends get none.
        let many = build_table(&backends(300), 251);
        assert!(many.iter().all(|id| *id != 0));
    }
}
