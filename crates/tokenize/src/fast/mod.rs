//! Exact, count-only tokenization: the same number of ids as `tokenizers`' encode, without
//! building ids, offsets, or per-token strings, fast enough for million-token prompts.
//!
//! # Design
//!
//! HF `tokenizers` encodes a text in these steps (`TokenizerImpl::encode_single_sequence`):
//! 1. split at added tokens with `normalized: false` (leftmost-longest over the raw text),
//!    each match being one id;
//! 2. normalize every remaining piece on its own, then split it at added tokens with
//!    `normalized: true`;
//! 3. run the pre-tokenizer on every remaining piece: here a sequence of `Split(regex,
//!    Isolated)` steps, each applied to every piece of the step before, then `ByteLevel`,
//!    which only maps bytes to chars;
//! 4. run the BPE model on every pre-token; the ids are the concatenation;
//! 5. the post-processor adds a fixed number of special tokens when asked to.
//!
//! This module does the same steps with the same semantics, but:
//! - pieces are `&str` slices of the input (NFC only allocates for text that is not
//!   already NFC, found with the Unicode quick check: ASCII and almost all real text is);
//! - the split regexes run on `regex-automata` (DFA-based, no backtracking VM): the one
//!   look-ahead these tokenizers use, `\s+(?!\S)`, is replaced by an exact rewrite (see
//!   [`split::Stage`]);
//! - each distinct pre-token is BPE'd once: a per-call map of `&str → count` and a shared,
//!   bounded, text-verified cache across calls ([`cache::CountCache`]); on a miss the piece
//!   is byte-level mapped and handed to the real model (`tokenizers::Model::tokenize`), so
//!   merges are never re-implemented;
//! - long texts are cut where tokenization provably restarts and counted on a few threads
//!   ([`parallel`], with the exactness argument).
//!
//! # Exactness
//!
//! Every step is either the library's own code (NFC, BPE) or a reimplementation of a
//! narrowly checked configuration ([`config::plan`]): NFC or no normalizer; only
//! `Split(Isolated)` regexes without look-around (apart from the rewritten tail) followed
//! by `ByteLevel(use_regex=false)`; a BPE without dropout; added tokens without
//! lstrip/rstrip/single_word; no truncation or padding; a post-processor that only adds
//! special tokens. Anything else, and any input that hits an unmodelled case (an empty
//! regex match), makes the caller fall back to the library's encode: a count is never
//! approximated. The fixture corpus and property tests compare both paths.

mod cache;
mod config;
mod ids;
mod parallel;
mod split;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokenizers::{Model, ModelWrapper, NormalizedString, Normalizer};
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized};

use cache::{CountCache, IdsCache};
pub(crate) use config::Normalize;
pub(crate) use split::Halt;
use split::{AddedMatcher, Piece, Stage};

/// Tuning of the fast counting path (thread use and cache sizes).
#[derive(Debug, Clone)]
pub struct CountConfig {
    /// Most threads one count may use (1 disables parallel counting).
    pub threads: usize,
    /// Texts shorter than this are counted on the calling thread only.
    pub parallel_min_bytes: usize,
    /// Entry cap of the shared per-pre-token count cache (0 disables it).
    pub piece_cache_entries: usize,
    /// Entry cap of the per-segment cache used by `count_rendered_chat` (0 disables it).
    pub segment_cache_entries: usize,
    /// Cap on the bytes of segment text the segment cache keeps (it stores the text to
    /// verify hits exactly). Sized for the conversations resent within seconds (a chat's
    /// earlier turns), not for every distinct message: under a stream of new 2 KB chats a
    /// 64 MiB cap filled in seconds with segments that never hit again, and was a gateway's
    /// largest memory cost after the tokenizer itself.
    pub segment_cache_bytes: usize,
}

impl Default for CountConfig {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
            parallel_min_bytes: 256 * 1024,
            piece_cache_entries: 200_000,
            segment_cache_entries: 50_000,
            segment_cache_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Segments shorter than this are counted directly rather than through the segment cache:
/// counting them costs about as much as a lookup, and they would crowd the cache.
const SEGMENT_CACHE_MIN_BYTES: usize = 64;
/// Chunks per thread when a long text is cut for parallel counting.
const CHUNKS_PER_THREAD: usize = 4;
/// How many tokens a worker counts between publishing its progress to the shared total.
const PUBLISH_EVERY: usize = 4096;

/// The count-only tokenizer for one `tokenizer.json`.
pub(crate) struct FastCounter {
    raw_tokens: Option<AddedMatcher>,
    normalized_tokens: Option<AddedMatcher>,
    normalize: Normalize,
    stages: Vec<Stage>,
    chunkable: bool,
    byte_chars: [char; 256],
    pieces: CountCache,
    segments: CountCache,
    /// The ids of pre-tokens seen before (the ids path, [`ids`]).
    piece_ids: IdsCache,
    /// The ids of rendered-chat segments seen before (the ids path's `ids_segments`).
    segment_ids: IdsCache,
    /// The ids of the added tokens `raw_tokens` and `normalized_tokens` match, by pattern.
    raw_token_ids: Vec<u32>,
    normalized_token_ids: Vec<u32>,
    config: CountConfig,
}

impl FastCounter {
    /// Builds the fast path for `tokenizer_json`, or says why it cannot be exact.
    pub(crate) fn new(tokenizer_json: &str, config: CountConfig) -> Result<Self, String> {
        let plan = config::plan(tokenizer_json)?;
        let stages = plan
            .split_patterns
            .iter()
            .map(|p| Stage::compile(p))
            .collect::<Result<Vec<_>, _>>()?;
        let newline = AddedMatcher::any_contains(&plan.raw_tokens, b'\n')
            || AddedMatcher::any_contains(&plan.normalized_tokens, b'\n');
        Ok(Self {
            raw_tokens: AddedMatcher::new(&plan.raw_tokens)?,
            normalized_tokens: AddedMatcher::new(&plan.normalized_tokens)?,
            normalize: plan.normalize,
            chunkable: parallel::chunkable(plan.normalize, &plan.split_patterns, newline),
            stages,
            byte_chars: byte_chars(),
            pieces: CountCache::new(config.piece_cache_entries, config.piece_cache_entries * 64),
            segments: CountCache::new(config.segment_cache_entries, config.segment_cache_bytes),
            piece_ids: IdsCache::new(config.piece_cache_entries, config.piece_cache_entries * 64),
            segment_ids: IdsCache::new(config.segment_cache_entries, config.segment_cache_bytes),
            raw_token_ids: plan.raw_token_ids,
            normalized_token_ids: plan.normalized_token_ids,
            config,
        })
    }

    /// The normalizer in use (for byte bounds).
    pub(crate) fn normalize(&self) -> Normalize {
        self.normalize
    }

    /// Counts the tokens of `text` (without post-processor specials). Returns the count and
    /// whether counting stopped early because it exceeded `limit` (the count is then a
    /// lower bound greater than `limit`).
    pub(crate) fn count(
        &self,
        model: &ModelWrapper,
        text: &str,
        limit: usize,
    ) -> Result<(usize, bool), Halt> {
        let threads = self.config.threads.max(1);
        if !self.chunkable || threads == 1 || text.len() < self.config.parallel_min_bytes {
            let mut tally = Tally::new(self, model, limit, None);
            return finish(tally.text(text), tally.n);
        }
        // More chunks than threads: a worker whose core is busy elsewhere takes fewer.
        let parts = parallel::cut(text, threads * CHUNKS_PER_THREAD);
        let total = AtomicUsize::new(0);
        let workers = parallel::run_pooled(
            &parts,
            threads,
            || (Tally::new(self, model, limit, Some(&total)), Ok(())),
            |(tally, result), part| {
                *result = tally.text(part);
                result.is_ok()
            },
        );
        let mut n = 0;
        let mut over = false;
        for (tally, result) in workers {
            n += tally.n;
            over |= finish(result, tally.n)?.1;
        }
        Ok((n, over))
    }

    /// Counts a rendered chat (no post-processor specials), reusing the counts of the
    /// text segments between added tokens that earlier calls have seen.
    pub(crate) fn count_segments(&self, model: &ModelWrapper, text: &str) -> Result<usize, Halt> {
        let mut tally = Tally::new(self, model, usize::MAX, None);
        let mut cached = 0usize;
        let mut misses: Vec<&str> = Vec::new();
        AddedMatcher::split(self.raw_tokens.as_ref(), text, &mut |piece| match piece {
            Piece::Token(_) => tally.add(1),
            Piece::Text(t) if t.len() < SEGMENT_CACHE_MIN_BYTES => tally.segment(t),
            Piece::Text(t) => {
                match self.segments.get(t) {
                    Some(n) => cached += n as usize,
                    None => misses.push(t),
                }
                Ok(())
            }
        })?;
        let miss_bytes: usize = misses.iter().map(|m| m.len()).sum();
        let threads = self.config.threads.max(1);
        let groups: Vec<&[&str]> = if threads > 1 && miss_bytes >= self.config.parallel_min_bytes {
            split_by_bytes(&misses, miss_bytes, threads)
        } else {
            vec![&misses[..]]
        };
        let results = parallel::run(&groups, |group| {
            let mut t = Tally::new(self, model, usize::MAX, None);
            let mut out = Vec::with_capacity(group.len());
            for seg in group.iter() {
                let before = t.n;
                t.segment(seg)?;
                out.push(t.n - before);
            }
            Ok::<_, Halt>(out)
        });
        let mut missed = 0;
        for (group, counts) in groups.iter().zip(results) {
            for (seg, n) in group.iter().zip(counts?) {
                missed += n;
                if let Ok(n) = u32::try_from(n) {
                    self.segments.insert(seg, n);
                }
            }
        }
        Ok(tally.n + cached + missed)
    }
}

/// `Over` is a normal early stop, not an error.
fn finish(r: Result<(), Halt>, n: usize) -> Result<(usize, bool), Halt> {
    match r {
        Ok(()) => Ok((n, false)),
        Err(Halt::Over) => Ok((n, true)),
        Err(e) => Err(e),
    }
}

/// Splits `items` into at most `parts` consecutive groups of about equal byte size.
fn split_by_bytes<'a, 'b>(items: &'a [&'b str], total: usize, parts: usize) -> Vec<&'a [&'b str]> {
    let per = total.div_ceil(parts).max(1);
    let mut out = Vec::with_capacity(parts);
    let (mut start, mut acc) = (0, 0);
    for (i, item) in items.iter().enumerate() {
        acc += item.len();
        if acc >= per && out.len() + 1 < parts {
            out.push(&items[start..=i]);
            start = i + 1;
            acc = 0;
        }
    }
    if start < items.len() || out.is_empty() {
        out.push(&items[start..]);
    }
    out
}

/// GPT-2's byte-to-char table, as `ByteLevel` uses: printable bytes map to themselves,
/// the others to U+0100 onwards in byte order.
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The state of one count on one thread.
struct Tally<'a, 'c> {
    fc: &'c FastCounter,
    model: &'c ModelWrapper,
    /// Pre-tokens of this call already counted (keys borrow the input: no allocation).
    local: HashMap<&'a str, u32, foldhash::fast::FixedState>,
    buf: String,
    n: usize,
    limit: usize,
    /// With parallel workers: the sum of what every worker has published so far.
    shared: Option<&'c AtomicUsize>,
    unpublished: usize,
}

impl<'a, 'c> Tally<'a, 'c> {
    fn new(
        fc: &'c FastCounter,
        model: &'c ModelWrapper,
        limit: usize,
        shared: Option<&'c AtomicUsize>,
    ) -> Self {
        Self {
            fc,
            model,
            local: HashMap::default(),
            buf: String::new(),
            n: 0,
            limit,
            shared,
            unpublished: 0,
        }
    }

    fn add(&mut self, k: usize) -> Result<(), Halt> {
        self.n += k;
        match self.shared {
            None if self.n > self.limit => Err(Halt::Over),
            None => Ok(()),
            Some(shared) => {
                self.unpublished += k;
                if self.unpublished < PUBLISH_EVERY && self.n <= self.limit {
                    return Ok(());
                }
                let delta = std::mem::take(&mut self.unpublished);
                let total = shared.fetch_add(delta, Ordering::Relaxed) + delta;
                if total > self.limit {
                    Err(Halt::Over)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Step 1 and onwards for a whole text.
    fn text(&mut self, text: &'a str) -> Result<(), Halt> {
        let fc = self.fc;
        AddedMatcher::split(fc.raw_tokens.as_ref(), text, &mut |piece| match piece {
            Piece::Token(_) => self.add(1),
            Piece::Text(t) => self.segment(t),
        })
    }

    /// Steps 2–4 for a piece between raw added tokens.
    fn segment(&mut self, seg: &'a str) -> Result<(), Halt> {
        let fc = self.fc;
        match fc.normalized(seg)? {
            Cow::Borrowed(s) => {
                AddedMatcher::split(fc.normalized_tokens.as_ref(), s, &mut |piece| match piece {
                    Piece::Token(_) => self.add(1),
                    Piece::Text(t) => fc.pretokenize(0, t, &mut |p| self.borrowed(p)),
                })
            }
            Cow::Owned(s) => {
                AddedMatcher::split(
                    fc.normalized_tokens.as_ref(),
                    &s,
                    &mut |piece| match piece {
                        Piece::Token(_) => self.add(1),
                        Piece::Text(t) => fc.pretokenize(0, t, &mut |p| self.owned(p)),
                    },
                )
            }
        }
    }

    fn borrowed(&mut self, piece: &'a str) -> Result<(), Halt> {
        let n = match self.local.get(piece) {
            Some(&n) => n,
            None => {
                let n = self.lookup(piece)?;
                self.local.insert(piece, n);
                n
            }
        };
        self.add(n as usize)
    }

    fn owned(&mut self, piece: &str) -> Result<(), Halt> {
        let n = self.lookup(piece)?;
        self.add(n as usize)
    }

    /// Shared cache, else the BPE model itself.
    fn lookup(&mut self, piece: &str) -> Result<u32, Halt> {
        if let Some(n) = self.fc.pieces.get(piece) {
            return Ok(n);
        }
        self.buf.clear();
        self.buf
            .extend(piece.bytes().map(|b| self.fc.byte_chars[usize::from(b)]));
        let tokens = self
            .model
            .tokenize(&self.buf)
            .map_err(|e| Halt::Encode(e.to_string()))?;
        let n = u32::try_from(tokens.len()).map_err(|_| Halt::Fallback)?;
        self.fc.pieces.insert(piece, n);
        Ok(n)
    }
}

impl FastCounter {
    /// Step 2's normalization; borrows when the text is already normalized.
    fn normalized<'s>(&self, s: &'s str) -> Result<Cow<'s, str>, Halt> {
        if self.normalize == Normalize::Identity
            || s.is_ascii()
            || is_nfc_quick(s.chars()) == IsNormalized::Yes
        {
            return Ok(Cow::Borrowed(s));
        }
        let mut n = NormalizedString::from(s);
        tokenizers::normalizers::unicode::NFC
            .normalize(&mut n)
            .map_err(|e| Halt::Encode(e.to_string()))?;
        Ok(Cow::Owned(n.get().to_owned()))
    }

    /// Step 3: split stage `stage` and the ones after it, calling `f` per pre-token.
    fn pretokenize<'h>(
        &self,
        stage: usize,
        hay: &'h str,
        f: &mut dyn FnMut(&'h str) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        match self.stages.get(stage) {
            None if hay.is_empty() => Ok(()),
            None => f(hay),
            Some(s) => s.split(hay, &mut |p| self.pretokenize(stage + 1, p, f)),
        }
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_chars();
        assert_eq!(t[usize::from(b'a')], 'a');
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
    }

    #[test]
    fn byte_groups_cover_all_items() {
        let items = ["aaaa", "b", "cccccc", "dd", "e"];
        let groups = split_by_bytes(&items, 14, 2);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups.concat(), items);
        assert_eq!(split_by_bytes(&[], 0, 2).len(), 1);
    }
}
