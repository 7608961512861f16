//! The hasher of the server's maps keyed by values the server itself gave out (virtual
//! handles, addresses, record numbers) and function ids, looked up on every call: a
//! multiply-fold of each word with a seed drawn per map, and of the result. SipHash, the
//! standard library's default, cost more than the rest of a handle setter's work in the
//! server. Keys a guest chooses are only looked up in these maps, never inserted, and the
//! seed keeps their buckets unpredictable; maps keyed by the guest's own bytes keep the
//! default.

use std::hash::{BuildHasher, Hasher};

/// Builds [`FoldHasher`]s with the map's seed.
#[derive(Clone, Copy)]
pub struct FoldHash(u64);

impl Default for FoldHash {
    fn default() -> Self {
        FoldHash(std::collections::hash_map::RandomState::new().build_hasher().finish())
    }
}

impl BuildHasher for FoldHash {
    type Hasher = FoldHasher;
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(self.0)
    }
}

pub struct FoldHasher(u64);

/// The two halves of the 128-bit product of `x` and `k`, folded: every bit of `x` reaches
/// both the low bits of the result (which pick a bucket) and its high bits (the control byte);
/// aligned addresses differ in their high bits only.
fn fold(x: u64, k: u64) -> u64 {
    let m = u128::from(x) * u128::from(k);
    (m as u64) ^ ((m >> 64) as u64)
}

impl FoldHasher {
    fn add(&mut self, word: u64) {
        self.0 = fold(self.0 ^ word, 0x5851_f42d_4c95_7f2d);
    }
}

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.add(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
    fn finish(&self) -> u64 {
        // Once more: one fold leaves keys that differ only above bit 20 (2 MiB blocks) in
        // fewer buckets than chance would.
        fold(self.0, 0x9e37_79b9_7f4a_7c15)
    }
}

/// A hash map hashed with [`FoldHash`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, FoldHash>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Aligned addresses and consecutive handles spread over the buckets: the low bits of
    /// their hashes (which pick the bucket) differ.
    #[test]
    fn aligned_keys_spread() {
        let h = FoldHash::default();
        let buckets = |keys: &mut dyn Iterator<Item = u64>| {
            let mut seen = std::collections::HashSet::new();
            for k in keys {
                seen.insert(h.hash_one(k) & 1023);
            }
            seen.len()
        };
        assert!(buckets(&mut (0..1024u64).map(|i| 0x6000_0000_0000 + (i << 21))) > 500);
        assert!(buckets(&mut (1..=1024u64).map(|i| 0x9E00_0000_0000_0000 | i)) > 500);
    }
}
