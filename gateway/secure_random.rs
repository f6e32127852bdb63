//! Unguessable values from the operating system's CSPRNG (`getrandom`): request ids (the
//! engines' `rid`), bootstrap rooms and the fallback cache-salt secret. A guessable rid or
//! room lets one tenant collide with another's request inside an engine.
//!
//! Small values come from a per-thread buffer of OS randomness refilled 4 KiB at a time,
//! each byte handed out once: one `getrandom` call per 256 request ids instead of one per
//! request, the same bytes the OS would have returned.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of OS randomness fetched per refill of a thread's buffer.
const BUFFER_BYTES: usize = 4096;
/// Requests up to this size are served from the buffer.
const BUFFERED_MAX: usize = 64;

struct Buffered {
    bytes: Box<[u8; BUFFER_BYTES]>,
    /// Bytes of `bytes` already handed out (all of them at first: fetched on first use).
    used: usize,
}

thread_local! {
    static BUFFER: RefCell<Buffered> = RefCell::new(Buffered {
        bytes: Box::new([0; BUFFER_BYTES]),
        used: BUFFER_BYTES,
    });
}

/// Fill a small `buf` from this thread's buffer (refilled from the OS when spent).
fn fill_buffered(buf: &mut [u8]) {
    BUFFER.with(|cell| {
        let Ok(mut b) = cell.try_borrow_mut() else {
            return fill_os(buf);
        };
        if BUFFER_BYTES - b.used < buf.len() {
            fill_os(&mut b.bytes[..]);
            b.used = 0;
        }
        let start = b.used;
        let Some(src) = b.bytes.get_mut(start..start + buf.len()) else {
            return fill_os(buf);
        };
        buf.copy_from_slice(src);
        // Never hand out the same bytes twice, even if this buffer were seen later.
        src.fill(0);
        b.used += buf.len();
    });
}

/// Fill `buf` with randomness from the OS CSPRNG (small requests through this thread's
/// buffer of it).
pub fn fill(buf: &mut [u8]) {
    if buf.len() <= BUFFERED_MAX {
        fill_buffered(buf);
    } else {
        fill_os(buf);
    }
}

/// Fill `buf` from the OS CSPRNG. Should the OS refuse (it does not on Linux once booted),
/// fall back to a per-process random seed and a counter, so the request path never fails
/// for want of randomness; the failure is logged.
fn fill_os(buf: &mut [u8]) {
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

/// A random RFC 9562 version-4 UUID, `xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx` (preflight's
/// request ids: some engines accept no other `x-request-id`).
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    fill(&mut b);
    // RFC 9562: version 4, variant 0b10.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

/// 128 random bits as 32 lowercase hex digits (the gateway's request ids; Python's
/// `uuid.UUID` accepts this form too, so llama-cpp-python's server takes them).
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

    #[test]
    fn buffered_bytes_are_never_repeated_across_refills_and_threads() {
        let mut seen = HashSet::new();
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| u64()).collect::<Vec<_>>()))
            .collect();
        for t in threads {
            for v in t.join().unwrap() {
                assert!(seen.insert(v), "a repeated value");
            }
        }
        let mut big = [0u8; 200];
        fill(&mut big);
        assert!(big.iter().any(|&b| b != 0));
    }
}
