// SPDX-License-Identifier: Apache-2.0
//! The hash of Maglev load balancing, shared by the eBPF programs (which hash a new flow's
//! 5-tuple to pick a table entry) and the agent (which hashes a backend's address to place
//! it in the table, and whose tests compute the entry a flow must reach).
//!
//! It is MurmurHash3 (x86, 32-bit) over 32-bit words with fixed seeds: every node computes
//! the same value for the same packet and the same backend, which is what lets an ECMP router
//! spread one client's packets over nodes. Words, not bytes: the programs hash fixed-size
//! fields without a byte loop the verifier would have to follow.

/// Seed of the flow hash ("MGLV").
pub const FLOW_HASH_SEED: u32 = 0x4d47_4c56;
/// Seeds of a backend's two hashes in the table build: its offset and its skip.
pub const BACKEND_OFFSET_SEED: u32 = 0x6f66_6673;
pub const BACKEND_SKIP_SEED: u32 = 0x736b_6970;

/// Default and bounds of the table size (entries per table; a prime, as the paper requires
/// for the permutations to cover the table).
pub const DEFAULT_TABLE_SIZE: u32 = 16_381;
pub const MIN_TABLE_SIZE: u32 = 251;
pub const MAX_TABLE_SIZE: u32 = 131_071;

/// One MurmurHash3 round: mixes the word `k` into the state `h`.
#[inline(always)]
pub const fn mix_word(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// MurmurHash3's finalisation after `words` words.
#[inline(always)]
pub const fn finish(h: u32, words: u32) -> u32 {
    let mut h = h ^ words.wrapping_mul(4);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Mixes a 16-byte address (IPv4 in the first four bytes, the rest zero, as the maps that
/// serve both families hold it), most significant byte first.
#[inline(always)]
pub const fn mix_addr(mut h: u32, addr: &[u8; 16]) -> u32 {
    let mut i = 0;
    while i < 4 {
        h = mix_word(
            h,
            u32::from_be_bytes([
                addr[4 * i],
                addr[4 * i + 1],
                addr[4 * i + 2],
                addr[4 * i + 3],
            ]),
        );
        i += 1;
    }
    h
}

/// Words the flow hash mixes: two addresses of four, the ports, the protocol.
const FLOW_WORDS: u32 = 10;

/// The flow hash of a packet: source and destination address (16 bytes each, see
/// [`mix_addr`]), source and destination port in network byte order as the packet (and
/// the maps) hold them, and the IP protocol.
#[inline(always)]
pub const fn flow_hash(
    saddr: &[u8; 16],
    daddr: &[u8; 16],
    sport: u16,
    dport: u16,
    proto: u8,
) -> u32 {
    let mut h = mix_addr(FLOW_HASH_SEED, saddr);
    h = mix_addr(h, daddr);
    h = mix_word(h, ((sport as u32) << 16) | dport as u32);
    h = mix_word(h, proto as u32);
    finish(h, FLOW_WORDS)
}

/// A backend's hash with `seed` (see [`BACKEND_OFFSET_SEED`], [`BACKEND_SKIP_SEED`]): its
/// address (16 bytes, see [`mix_addr`]; `v6` tells the families apart), port (host order)
/// and protocol, nothing that is local to a node.
pub const fn backend_hash(seed: u32, addr: &[u8; 16], v6: bool, port: u16, proto: u8) -> u32 {
    let mut h = mix_addr(seed, addr);
    h = mix_word(h, ((port as u32) << 16) | ((v6 as u32) << 8) | proto as u32);
    finish(h, 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MurmurHash3_x86_32 of the bytes of `words` (little-endian), as the reference
    /// implementation computes it, so that ours is the published function.
    fn murmur3_reference(seed: u32, words: &[u32]) -> u32 {
        let mut h = seed;
        for w in words {
            h = mix_word(h, *w);
        }
        finish(h, words.len() as u32)
    }

    #[test]
    fn mixing_matches_murmur3_test_vectors() {
        // Known MurmurHash3_x86_32 values: "" with seed 0 is 0, "" with seed 1 is
        // 0x514e28b7, the bytes 0x21436587 (one word) with seed 0x5082edee is 0x2362f9de.
        assert_eq!(murmur3_reference(0, &[]), 0);
        assert_eq!(murmur3_reference(1, &[]), 0x514e_28b7);
        assert_eq!(
            murmur3_reference(0x5082_edee, &[u32::from_le_bytes([0x21, 0x43, 0x65, 0x87])]),
            0x2362_f9de
        );
    }

    #[test]
    fn the_flow_hash_depends_on_every_field() {
        let a = [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let b = [10, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let base = flow_hash(&a, &b, 1000u16.to_be(), 80u16.to_be(), 6);
        assert_eq!(base, flow_hash(&a, &b, 1000u16.to_be(), 80u16.to_be(), 6));
        assert_ne!(base, flow_hash(&b, &a, 1000u16.to_be(), 80u16.to_be(), 6));
        assert_ne!(base, flow_hash(&a, &b, 1001u16.to_be(), 80u16.to_be(), 6));
        assert_ne!(base, flow_hash(&a, &b, 1000u16.to_be(), 81u16.to_be(), 6));
        assert_ne!(base, flow_hash(&a, &b, 1000u16.to_be(), 80u16.to_be(), 17));
    }
}
