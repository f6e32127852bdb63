//! N-gram hashing: a fast, non-cryptographic 64-bit hash of a window of token ids, and a
//! pass-through `Hasher` for maps keyed by such hashes.
//!
//! Why not cryptographic: a collision can only make the detector wrong about one n-gram —
//! a response n-gram colliding with another tenant's is one false foreign match (and
//! suspicion needs `min_matches` distinct ones), and two tenants' n-grams colliding in the
//! store mark that one hash "common", hiding one n-gram of a leak that spans many (a
//! 20-token sentence holds 13 8-grams). At 64 bits and 10⁶ stored entries the chance of any
//! collision at all is about 10⁻⁸. The keys are fixed, so stored fingerprints mean the same
//! on every replica; crafting collisions needs the victim's tokens, which is the secret.

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's multiplier (from rustc): odd, with well-spread bits.
const MUL: u64 = 0x517c_c1b7_2722_0a95;
/// Fixed start state, so the hash of an n-gram is the same in every process.
const SEED: u64 = 0x243f_6a88_85a3_08d3;

/// Base of the n-gram polynomial: odd, so multiplying by it loses nothing mod 2^64.
const BASE: u64 = 0x9e37_79b9_7f4a_7c15;

/// An id spread over 64 bits before it enters the polynomial.
#[inline]
fn spread(id: u32) -> u64 {
    (u64::from(id) ^ SEED).wrapping_mul(MUL)
}

/// Hash of one n-gram of token ids: a polynomial in [`BASE`] over the spread ids (so the
/// hashes of all windows of a sequence roll in O(1) each, [`ngram_hashes`]), finalised: the definition [`ngram_hashes`] must match (tests).
#[cfg(test)]
pub(crate) fn ngram_hash(ids: &[u32]) -> u64 {
    fmix64(
        ids.iter()
            .fold(0u64, |h, &id| h.wrapping_mul(BASE).wrapping_add(spread(id))),
    )
}

/// The [`ngram_hash`] of every `n`-long window of `ids`, in order, appended to `out`: one
/// multiply-add per id instead of `n` (an answer's scan and a prompt's record both hash
/// every window).
pub(crate) fn ngram_hashes(ids: &[u32], n: usize, out: &mut Vec<u64>) {
    if n == 0 || ids.len() < n {
        return;
    }
    out.reserve(ids.len() - n + 1);
    let top = BASE.wrapping_pow(n as u32);
    let mut h = ids[..n]
        .iter()
        .fold(0u64, |h, &id| h.wrapping_mul(BASE).wrapping_add(spread(id)));
    out.push(fmix64(h));
    for (&new, &old) in ids[n..].iter().zip(ids) {
        h = h
            .wrapping_mul(BASE)
            .wrapping_add(spread(new))
            .wrapping_sub(spread(old).wrapping_mul(top));
        out.push(fmix64(h));
    }
}

/// FxHash's step over every id, from state `h`.
#[inline]
fn fold(h: u64, ids: &[u32]) -> u64 {
    ids.iter().fold(h, |h, &id| {
        (h.rotate_left(5) ^ u64::from(id)).wrapping_mul(MUL)
    })
}

/// Hash of a whole prompt (its length included), to tell a prompt sent again.
pub(crate) fn prompt_hash(ids: &[u32]) -> u64 {
    fmix64(fold(SEED ^ ids.len() as u64, ids))
}

/// Key of the text pieces a prompt is fingerprinted from (see `isolate::tail_pieces`) and
/// the byte limit that cut them, for telling a prompt sent again before turning it into
/// units: eight bytes per step.
pub fn text_key(texts: &[&str], limit: usize) -> u64 {
    let mut h = SEED ^ limit as u64;
    for t in texts {
        h = (h.rotate_left(5) ^ t.len() as u64).wrapping_mul(MUL);
        let mut chunks = t.as_bytes().chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(MUL);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(MUL);
        }
    }
    fmix64(h)
}

/// MurmurHash3's finaliser: Fx alone leaves the high bits weak, and the maps below use
/// the low bits for the bucket index, the high bits for the control tag, and bits 40.. for
/// the shard, so every bit must depend on every input bit.
#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Hasher for keys that already are well-mixed 64-bit hashes: hashing them again (SipHash,
/// std's default) would cost more than the whole n-gram hash.
#[derive(Default, Clone, Copy)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are used; this keeps any other key type correct, if slower.
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(MUL);
        }
    }
}

/// `BuildHasher` for maps keyed by [`ngram_hash`] values.
pub(crate) type BuildPassThrough = BuildHasherDefault<PassThrough>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn rolled_hashes_are_the_windows_hashes() {
        let ids: Vec<u32> = (0..200u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 7)
            .collect();
        for n in [1, 2, 8, 13, 200] {
            let mut rolled = Vec::new();
            ngram_hashes(&ids, n, &mut rolled);
            let direct: Vec<u64> = ids.windows(n).map(ngram_hash).collect();
            assert_eq!(rolled, direct, "n = {n}");
        }
        let mut none = Vec::new();
        ngram_hashes(&ids[..3], 4, &mut none);
        ngram_hashes(&ids, 0, &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn text_keys_tell_pieces_and_limits_apart() {
        let k = text_key(&["ab", "c"], 100);
        assert_eq!(k, text_key(&["ab", "c"], 100));
        assert_ne!(k, text_key(&["a", "bc"], 100));
        assert_ne!(k, text_key(&["abc"], 100));
        assert_ne!(k, text_key(&["ab", "c"], 99));
        let long = "0123456789abcdefX".repeat(3);
        assert_ne!(
            text_key(&[&long], 1),
            text_key(&[&long.replace('X', "Y")], 1)
        );
    }

    #[test]
    fn order_and_values_matter() {
        assert_eq!(ngram_hash(&[1, 2, 3]), ngram_hash(&[1, 2, 3]));
        assert_ne!(ngram_hash(&[1, 2, 3]), ngram_hash(&[3, 2, 1]));
        assert_ne!(ngram_hash(&[1, 2, 3]), ngram_hash(&[1, 2, 4]));
        assert_ne!(ngram_hash(&[0, 0]), ngram_hash(&[0]));
    }

    #[test]
    fn no_collisions_on_dense_small_ids() {
        // Every 2-gram over ids 0..1000: a million near-identical inputs.
        let mut seen = HashSet::new();
        for a in 0..1000 {
            for b in 0..1000 {
                assert!(seen.insert(ngram_hash(&[a, b])));
            }
        }
    }

    #[test]
    fn shard_bits_are_spread() {
        // The store shards on bits 40..44; sequential n-grams must fill all 16 shards evenly.
        let mut counts = [0usize; 16];
        for i in 0..16_000u32 {
            counts[((ngram_hash(&[i, i + 1]) >> 40) & 15) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
