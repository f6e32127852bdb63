//! Cutting long texts at boundaries where tokenization provably restarts, and counting the
//! pieces on a few scoped threads.
//!
//! # Why the cut points are exact
//!
//! A cut goes at byte `p` when byte `p-1` is `\n` and byte `p` is an ASCII letter. Write
//! `S = L + R` for the text cut at `p`. Every step of the pipeline gives the same pieces for
//! `S` as for `L` and `R` separately, except that a piece holding the cut may be cut in two:
//!
//! 1. **Added tokens**: cutting is only enabled when no added token contains `\n`, so no
//!    match holds both `p-1` and `p`; a leftmost-longest match starting before `p` never
//!    reads past `p-1`. Matches are the same; the text gap around `p` (if any) is cut in two.
//! 2. **NFC**: `\n` composes with nothing and an ASCII letter is never the second element
//!    of a canonical composition; both have combining class 0, so no reordering crosses
//!    them: `NFC(L + R) = NFC(L) + NFC(R)`.
//! 3. **"Gap" splits** (`\p{N}{1,3}`, DeepSeek's CJK run class): they never match `\n`, so
//!    a match never holds `p-1`, and no attempt from before `p` reads past `p-1`. The
//!    only difference is again that the gap holding `p` is cut in two.
//! 4. **"Word" splits** (the Qwen2/3 and DeepSeek-V3 word regexes, ending in
//!    `\s*[\r\n]+|\s+(?!\S)|\s+`): no alternative can contain `\n` followed by a letter
//!    (newlines only occur in trailing `[\r\n]*`, in `\s*[\r\n]+`, or in pure-whitespace
//!    runs; prefix classes exclude `\r\n`). The `\n` at `p-1` is always matched (by
//!    `\s*[\r\n]+` at the latest), so some match ends exactly at `p`. The only alternative
//!    whose outcome depends on what follows a run is `\s+(?!\S)`, and it is only tried when
//!    `\s*[\r\n]+` failed, i.e. for runs without a newline, which end before `p-1`. So the
//!    pieces of `S` are exactly the pieces of `L` followed by those of `R`.
//!
//! A piece cut in two by steps 1–3 still holds the `\n`+letter boundary, so the next step
//! applies to it; the last split is a "word" split, which cuts exactly. Pre-tokens being the
//! same, their BPE counts are the same. Cutting is only enabled when the configuration is
//! exactly one this argument covers ([`chunkable`]); otherwise long texts are counted on
//! one thread.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use super::config::Normalize;

/// `\p{N}{1,3}` (DeepSeek-V3): never matches `\n`.
const GAP_DIGITS: &str = r"\p{N}{1,3}";
/// DeepSeek-V3's CJK run split: never matches `\n`.
const GAP_CJK: &str = "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+";
/// Qwen2/Qwen2.5/Qwen3's word regex.
const WORD_QWEN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek-V3's word regex (with literal CR and LF inside its classes, as in its file).
const WORD_DEEPSEEK: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

/// Whether texts may be cut at `\n`+ASCII-letter boundaries for this configuration (see
/// the module docs): known split patterns only, the last one a word split, and no added
/// token containing `\n`.
pub(crate) fn chunkable(
    normalize: Normalize,
    patterns: &[String],
    token_has_newline: bool,
) -> bool {
    let known = |p: &str| [GAP_DIGITS, GAP_CJK, WORD_QWEN, WORD_DEEPSEEK].contains(&p);
    let word = |p: &str| p == WORD_QWEN || p == WORD_DEEPSEEK;
    matches!(normalize, Normalize::Identity | Normalize::Nfc)
        && !token_has_newline
        && patterns.iter().all(|p| known(p))
        && patterns.last().is_some_and(|p| word(p))
}

/// Cuts `text` into at most `parts` pieces of roughly equal size at safe boundaries.
pub(crate) fn cut(text: &str, parts: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(parts);
    let mut start = 0;
    for i in 1..parts {
        let target = (text.len() / parts * i).max(start + 1);
        let Some(p) = boundary_at_or_after(bytes, target) else {
            break;
        };
        // `p` follows a `\n`, an ASCII byte, so it is a char boundary.
        if let Some(piece) = text.get(start..p) {
            out.push(piece);
            start = p;
        }
    }
    if let Some(rest) = text.get(start..) {
        out.push(rest);
    }
    out
}

/// The first `p >= from` with `bytes[p-1] == b'\n'` and `bytes[p]` an ASCII letter.
fn boundary_at_or_after(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from.max(1);
    while i < bytes.len() {
        let nl = bytes.get(i - 1..)?.iter().position(|&b| b == b'\n')? + i - 1;
        let p = nl + 1;
        if bytes.get(p).is_some_and(u8::is_ascii_alphabetic) {
            return Some(p);
        }
        i = p + 1;
    }
    None
}

/// Runs `f` on every piece, the first on the calling thread and each other on its own
/// scoped thread, and returns the results in order. `pieces.len()` is the thread count.
pub(crate) fn run<T: Send, P: Sync>(pieces: &[P], f: impl Fn(&P) -> T + Sync) -> Vec<T> {
    let Some((first, rest)) = pieces.split_first() else {
        return Vec::new();
    };
    thread::scope(|scope| {
        let handles: Vec<_> = rest.iter().map(|p| scope.spawn(|| f(p))).collect();
        let mut out = Vec::with_capacity(pieces.len());
        out.push(f(first));
        for h in handles {
            match h.join() {
                Ok(v) => out.push(v),
                // A worker panic is a bug; re-raise it on the caller's thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// Runs `f` over `pieces` on up to `threads` threads (the caller's included). Pieces are
/// handed out one at a time, so a worker whose core is busy with other work simply takes
/// fewer; each worker folds its pieces into one state made by `init` (so per-call caches
/// are shared across its pieces). `f` returns `false` to make every worker stop.
pub(crate) fn run_pooled<P: Sync, S: Send>(
    pieces: &[P],
    threads: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &P) -> bool + Sync,
) -> Vec<S> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let work = || {
        let mut state = init();
        while !stop.load(Ordering::Relaxed) {
            let Some(piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            if !f(&mut state, piece) {
                stop.store(true, Ordering::Relaxed);
            }
        }
        state
    };
    let workers = threads.clamp(1, pieces.len().max(1));
    let ids: Vec<usize> = (0..workers).collect();
    run(&ids, |_| work())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_after_a_newline_before_a_letter() {
        let text = "aaaa\n1111\n bbbb\ncccc\ndddd";
        let pieces = cut(text, 3);
        assert_eq!(pieces.concat(), text);
        for p in &pieces[1..] {
            assert!(p.as_bytes()[0].is_ascii_alphabetic(), "{pieces:?}");
        }
        assert_eq!(pieces, ["aaaa\n1111\n bbbb\n", "cccc\n", "dddd"]);
        assert_eq!(cut("no newline at all", 4), ["no newline at all"]);
    }

    #[test]
    fn pooled_workers_cover_every_piece_once_and_can_stop() {
        let pieces: Vec<usize> = (1..=100).collect();
        let sums = run_pooled(
            &pieces,
            3,
            || 0usize,
            |acc, p| {
                *acc += p;
                true
            },
        );
        assert!(sums.len() <= 3);
        assert_eq!(sums.iter().sum::<usize>(), 5050);
        let seen = run_pooled(
            &pieces,
            2,
            || 0usize,
            |n, _| {
                *n += 1;
                false
            },
        );
        assert!(seen.iter().sum::<usize>() <= 2);
    }

    #[test]
    fn only_covered_configurations_are_chunkable() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(chunkable(Normalize::Nfc, &p(&[WORD_QWEN]), false));
        assert!(chunkable(
            Normalize::Identity,
            &p(&[GAP_DIGITS, GAP_CJK, WORD_DEEPSEEK]),
            false
        ));
        assert!(!chunkable(Normalize::Nfc, &p(&[WORD_QWEN]), true));
        assert!(!chunkable(
            Normalize::Nfc,
            &p(&[WORD_QWEN, GAP_DIGITS]),
            false
        ));
        assert!(!chunkable(Normalize::Nfc, &p(&[]), false));
        assert!(!chunkable(Normalize::Nfc, &p(&[r"\s+"]), false));
    }
}
