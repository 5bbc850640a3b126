// SPDX-License-Identifier: Apache-2.0
//! SCTP's CRC32c after a port rewrite, without reading the packet: the CRC is affine over
//! GF(2), crc(m ^ d) = crc(m) ^ crc(d) ^ crc(0) for messages of one length, and
//! crc(d) ^ crc(0) is the register of `d` alone (no initial or final inversion). When `d`
//! is zero but for its first 4 bytes (the ports), read as the little-endian word `w`, that
//! register is w * x^(8 * len) modulo the polynomial (reflected bit order), `len` the bytes
//! covered. x^(8 * len) is the product of x^(8 * 2^k) over the set bits k of `len`, and a
//! product with one of those constants is four lookups in [`SHIFT`] (the multiplication is
//! linear in its other factor, byte by byte). No loop, no call, no stack: cheap enough for
//! the tc/XDP programs, which use it, and checked by the host tests against a whole-packet
//! CRC (zlib's crc32_combine rests on the same identities).

/// CRC32c (Castagnoli), in its reflected bit order.
pub const CRC32C_POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the polynomial, in the reflected bit order (bit 31 is x^0).
pub const fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 0;
    while bit < 32 {
        if a & (1 << (31 - bit)) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 {
            (b >> 1) ^ CRC32C_POLY
        } else {
            b >> 1
        };
        bit += 1;
    }
    product
}

/// `SHIFT[k][j][b]` = x^(8 * 2^k) * (b << 8j) modulo the polynomial: multiplying a word by
/// x^(8 * 2^k) is the XOR of its four bytes' entries.
pub static SHIFT: [[[u32; 256]; 4]; 16] = shift_tables();

const fn shift_tables() -> [[[u32; 256]; 4]; 16] {
    let mut tables = [[[0; 256]; 4]; 16];
    // x^8, then squared: x^(8 * 2^k).
    let mut constant = mult_mod_p(1 << 30, 1 << 30); // x^2
    constant = mult_mod_p(constant, constant); // x^4
    constant = mult_mod_p(constant, constant); // x^8
    let mut k = 0;
    while k < 16 {
        let mut j = 0;
        while j < 4 {
            let mut b = 0;
            while b < 256 {
                tables[k][j][b] = mult_mod_p(constant, (b as u32) << (8 * j));
                b += 1;
            }
            j += 1;
        }
        constant = mult_mod_p(constant, constant);
        k += 1;
    }
    tables
}

/// `word * x^(8 * 2^k)` modulo the polynomial.
#[inline(always)]
fn shifted(k: usize, word: u32) -> u32 {
    let t = &SHIFT[k & 15];
    t[0][(word & 0xff) as usize]
        ^ t[1][((word >> 8) & 0xff) as usize]
        ^ t[2][((word >> 16) & 0xff) as usize]
        ^ t[3][((word >> 24) & 0xff) as usize]
}

/// What to XOR into an SCTP packet's CRC32c (the value; Linux stores it little-endian)
/// when its first 4 bytes (source and destination port) change by `delta` (old XOR new,
/// as laid out in the packet) and the CRC covers `len` bytes in all (header and chunks).
#[inline(always)]
pub fn port_change_delta(delta: [u8; 4], len: u16) -> u32 {
    let mut register = u32::from_le_bytes(delta);
    let mut k = 0;
    while k < 16 {
        if len & (1 << k) != 0 {
            register = shifted(k, register);
        }
        k += 1;
    }
    register
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC32c of a whole message, bit by bit (initial and final inversion), as SCTP
    /// computes it with the checksum field zeroed.
    fn crc32c(message: &[u8]) -> u32 {
        let mut register = !0u32;
        for byte in message {
            register ^= u32::from(*byte);
            for _ in 0..8 {
                register = if register & 1 != 0 {
                    (register >> 1) ^ CRC32C_POLY
                } else {
                    register >> 1
                };
            }
        }
        !register
    }

    /// A small deterministic generator (xorshift), so that the test needs no crate.
    fn bytes(seed: &mut u64, n: usize) -> [u8; 1500] {
        let mut out = [0u8; 1500];
        for b in out.iter_mut().take(n) {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *b = *seed as u8;
        }
        out
    }

    #[test]
    fn the_known_check_value() {
        // RFC 3720 B.4 / the catalogue's check value of CRC-32C over "123456789".
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn a_port_rewrite_patched_by_the_delta_matches_a_recomputed_crc() {
        let mut seed = 0x9E37_79B9_7F4A_7C15;
        for len in [12usize, 13, 16, 28, 64, 100, 257, 512, 1024, 1452, 1500] {
            for side in 0..3 {
                let mut packet = bytes(&mut seed, len);
                packet[8..12].fill(0);
                let before = crc32c(&packet[..len]);
                let new_ports = bytes(&mut seed, 4);
                let mut delta = [0u8; 4];
                let range = match side {
                    0 => 0..2,
                    1 => 2..4,
                    _ => 0..4,
                };
                for i in range {
                    delta[i] = packet[i] ^ new_ports[i];
                    packet[i] = new_ports[i];
                }
                let after = crc32c(&packet[..len]);
                assert_eq!(
                    before ^ port_change_delta(delta, len as u16),
                    after,
                    "len {len}, side {side}"
                );
            }
        }
    }

    #[test]
    fn no_change_no_delta() {
        assert_eq!(port_change_delta([0; 4], 1000), 0);
    }
}
