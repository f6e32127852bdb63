//! Unguessable values from the operating system's CSPRNG (`getrandom`): request ids (the
//! engines' `rid`), bootstrap rooms and the fallback cache-salt secret. A guessable rid or
//! room lets one tenant collide with another's request inside an engine.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fill `buf` from the OS CSPRNG. Should the OS refuse (it does not on Linux once booted),
/// fall back to a per-process random seed and a counter, so the request path never fails
/// for want of randomness; the failure is logged.
pub fn fill(buf: &mut [u8]) {
    if let Err(e) = getrandom::fill(buf) {
        tracing::error!(error = %e, "the OS random generator failed; using the fallback");
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        use std::hash::{BuildHasher, RandomState};
        for (i, chunk) in buf.chunks_mut(8).enumerate() {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let v = RandomState::new().hash_one((n, i)).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A random u64.
pub fn u64() -> u64 {
    let mut b = [0u8; 8];
    fill(&mut b);
    u64::from_le_bytes(b)
}

/// 128 random bits as 32 lowercase hex characters.
pub fn hex_id() -> String {
    let mut b = [0u8; 16];
    fill(&mut b);
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for byte in b {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_unique_hex() {
        let ids: HashSet<String> = (0..10_000).map(|_| hex_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids
            .iter()
            .all(|i| i.len() == 32 && i.bytes().all(|b| b.is_ascii_hexdigit())));
    }
}
