//! The content hash of a recopy's exact held pass: one 64-bit hash per block of
//! [`HASH_BLOCK`] bytes of a region, computed on the host from the bytes a pass sent, and on
//! the device (the API server's kernel, the same function) from the memory as it is when the
//! session is held; a block whose hashes agree has, up to a 64-bit collision, the bytes sent
//! already, and is not sent again.
//!
//! The function, over the block's 8-byte little-endian words `w[i]` (the last one padded
//! with zero bytes when the block's length is not a multiple of 8):
//!
//! ```text
//! hash = sum over i, wrapping in u64, of fmix64(w[i] ^ (i * WORD_STEP) ^ SEED)
//! ```
//!
//! `fmix64` is MurmurHash3's finaliser, a bijection of u64: changing one word changes its
//! term and no other, so the sum always changes; changes of several words cancel with odds
//! of about 2^-64. A sum is the same in any order, so the device's threads may add their
//! parts as they finish.

/// Bytes a hash covers: blocks are counted from the start of each region (the last may be
/// shorter). Small, so that a program scattering small writes over a large allocation
/// resends what it wrote, not whole pieces of [`COPY_CHUNK`](crate::engine::COPY_CHUNK).
pub const HASH_BLOCK: u64 = 16 << 10;
/// Mixed into every word (the digits of pi).
pub const SEED: u64 = 0x243f_6a88_85a3_08d3;
/// Word `i` is mixed with `i * WORD_STEP` (odd: distinct for every index), so that words
/// trading places change the hash.
pub const WORD_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// MurmurHash3's 64-bit finaliser.
#[inline]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The hash of `bytes` (one block, or any range: the function is defined for any length).
pub fn block_hash(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    let mut step = 0u64;
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        sum = sum.wrapping_add(fmix64(w ^ step ^ SEED));
        step = step.wrapping_add(WORD_STEP);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut w = [0u8; 8];
        w[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(fmix64(u64::from_le_bytes(w) ^ step ^ SEED));
    }
    sum
}

/// The hashes of `bytes`' blocks of [`HASH_BLOCK`] bytes, in order (`bytes` starting at a
/// block's start).
pub fn block_hashes(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks(HASH_BLOCK as usize).map(block_hash).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Word by word, as the device computes it.
    fn reference(bytes: &[u8]) -> u64 {
        let mut sum = 0u64;
        for i in 0..bytes.len().div_ceil(8) {
            let mut w = 0u64;
            for b in 0..8 {
                if let Some(&byte) = bytes.get(8 * i + b) {
                    w |= (byte as u64) << (8 * b);
                }
            }
            sum = sum.wrapping_add(fmix64(w ^ (i as u64).wrapping_mul(WORD_STEP) ^ SEED));
        }
        sum
    }

    #[test]
    fn known_vectors() {
        // MurmurHash3's finaliser: 0 stays 0, and a known value.
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!(block_hash(&[]), 0);
        // One zero word: fmix64(SEED).
        assert_eq!(block_hash(&[0; 8]), fmix64(SEED));
        // A short tail is a zero-padded word.
        assert_eq!(block_hash(&[1, 2, 3]), fmix64(0x03_02_01 ^ SEED));
        assert_eq!(block_hash(&[0; 16]), fmix64(SEED).wrapping_add(fmix64(WORD_STEP ^ SEED)));
        // Pinned, so that the host's and the device's functions cannot drift apart unseen
        // (the API server's kernel is checked against this function).
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(block_hash(&bytes), reference(&bytes));
        assert_eq!(block_hash(&bytes), 0x3b34_1d71_2e09_7409, "{:#x}", block_hash(&bytes));
    }

    #[test]
    fn the_fast_function_is_the_reference() {
        for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 1000, 4096, 4099] {
            let bytes: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8).collect();
            assert_eq!(block_hash(&bytes), reference(&bytes), "{len} bytes");
        }
    }

    #[test]
    fn any_change_of_one_word_changes_the_hash() {
        let mut bytes: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 5) as u8).collect();
        let before = block_hash(&bytes);
        for at in [0usize, 1, 8, 100, 4095] {
            for flip in [1u8, 0x80, 0xff] {
                bytes[at] ^= flip;
                assert_ne!(block_hash(&bytes), before, "byte {at} ^ {flip:#x}");
                bytes[at] ^= flip;
            }
        }
        assert_eq!(block_hash(&bytes), before);
        // Words trading places.
        bytes.swap(0, 8);
        assert_ne!(block_hash(&bytes), before);
        // Trailing zeros of a tail are seen through the length only: the padding is zero.
        assert_eq!(block_hash(&[5, 0, 0]), block_hash(&[5]));
    }

    #[test]
    fn blocks_are_counted_from_the_start() {
        let bytes: Vec<u8> = (0..(2 * HASH_BLOCK + 5)).map(|i| (i % 251) as u8).collect();
        let h = block_hashes(&bytes);
        assert_eq!(h.len(), 3);
        let b = HASH_BLOCK as usize;
        assert_eq!(h, vec![block_hash(&bytes[..b]), block_hash(&bytes[b..2 * b]), block_hash(&bytes[2 * b..])]);
    }
}
