//! A prompt as KV blocks (issue 31): the keys a pool's prefix index knows prompts by.
//!
//! Engines cache a prompt's KV in pages of `block_size` tokens and reuse a page only when
//! every token before it matches too, so a block is known by a *chained* hash: block `i`'s
//! hash covers its token ids and block `i − 1`'s hash. Only full blocks count (a partial
//! last page is not shared). The hash is a fixed function (the same on every replica and
//! build, so replicas could share their indexes), fast enough to run over every prompt:
//! 64-bit folded multiplies over pairs of ids, about a nanosecond per id.
//!
//! The chain is computed once per request, off the async threads when long (admission);
//! [`seeded`] then turns it into the keys of one cache partition — the tenant's salt for
//! pools that send it, one constant for pools whose engines share their cache among
//! tenants — with one more mix per block. Seeding each chained hash is as good as seeding
//! the chain itself (each one already commits to its whole prefix), and lets routing pick
//! the partition after it picked the pool. Two tenants with the same prompt on a salted
//! pool get unrelated keys: they never share affinity, as they never share cache.

/// The partition of pools without a cache salt: their engines share one cache.
pub const SHARED_PARTITION: u64 = 0x6b76_6761_7465_2f70; // "kvgate/p"

const K0: u64 = 0x243f_6a88_85a3_08d3;
const K1: u64 = 0x1319_8a2e_0370_7344;
const K2: u64 = 0xa409_3822_299f_31d0;
const K3: u64 = 0x082e_fa98_ec4e_6c89;

/// The 128-bit product of `a` and `b`, folded to 64 bits: every input bit reaches every
/// output bit (the core of wyhash and foldhash).
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The chained hashes of the full `block_size`-token blocks of `ids`, in order.
pub fn chain(ids: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(ids.len() / block_size);
    let mut previous = K0;
    for block in ids.chunks_exact(block_size) {
        let mut h = previous;
        let mut pairs = block.chunks_exact(2);
        for pair in &mut pairs {
            let word = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
            h = fold(h ^ K1, word ^ K2);
        }
        if let [last] = pairs.remainder() {
            h = fold(h ^ K1, u64::from(*last) ^ K3);
        }
        previous = fold(h ^ K3, block_size as u64 ^ K0);
        out.push(previous);
    }
    out
}

/// The keys of `chain` in the cache partition `partition`.
pub fn seeded(chain: &[u64], partition: u64) -> Vec<u64> {
    let seed = fold(partition ^ K2, K1);
    chain.iter().map(|&h| fold(h ^ seed, K3) ^ h).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_blocks_count_and_each_key_covers_its_whole_prefix() {
        let ids: Vec<u32> = (0..50).collect();
        let blocks = chain(&ids, 16);
        assert_eq!(blocks.len(), 3, "50 tokens: three full blocks of 16");
        assert_eq!(chain(&ids[..15], 16), Vec::<u64>::new());
        // The same prefix, the same keys; a change in block 0 changes every key after it.
        assert_eq!(chain(&ids[..48], 16), blocks);
        let mut changed = ids.clone();
        changed[3] = 999;
        let other = chain(&changed, 16);
        assert!(other.iter().zip(&blocks).all(|(a, b)| a != b));
        // A change in block 2 leaves blocks 0 and 1 alone.
        let mut late = ids.clone();
        late[40] = 999;
        let late = chain(&late, 16);
        assert_eq!(late[..2], blocks[..2]);
        assert_ne!(late[2], blocks[2]);
        // Odd block sizes use every id.
        let odd = chain(&ids, 5);
        let mut one_off = ids.clone();
        one_off[4] += 1;
        assert_ne!(chain(&one_off, 5)[0], odd[0]);
        assert_eq!(chain(&ids, 0), Vec::<u64>::new());
    }

    #[test]
    fn the_hash_is_fixed_across_builds_and_replicas() {
        // Pinned: replicas (and builds) sharing an index must agree on every key.
        let ids: Vec<u32> = (0..32).collect();
        assert_eq!(
            chain(&ids, 16),
            [0x0e47_e0d6_fe39_cf99, 0x243e_cbee_7af6_8d47]
        );
        assert_eq!(
            seeded(&chain(&ids, 16), SHARED_PARTITION),
            [0x78be_d736_aea8_796e, 0x63f9_da62_9cc2_ff7a]
        );
    }

    #[test]
    fn partitions_keep_identical_prompts_apart() {
        let ids: Vec<u32> = (100..164).collect();
        let blocks = chain(&ids, 16);
        let a = seeded(&blocks, 1);
        let b = seeded(&blocks, 2);
        let shared = seeded(&blocks, SHARED_PARTITION);
        for (i, key) in a.iter().enumerate() {
            assert!(!b.contains(key) && !shared.contains(key), "block {i}");
        }
        assert_eq!(a, seeded(&blocks, 1), "the same partition, the same keys");
    }
}
