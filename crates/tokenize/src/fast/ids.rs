//! The ids path: the same steps as the count-only path (added tokens, normalization,
//! pre-tokenizer splits, BPE per pre-token), collecting the token ids instead of counting
//! them — exactly the ids of `tokenizers`' encode, without its offsets, per-token strings
//! or backtracking regexes. The gateway hashes them into KV blocks (prefix-aware routing),
//! so it needs the ids a prompt will have in the engine, fast enough for every request.
//!
//! Each distinct pre-token of one call is looked up once: a repeat copies the ids it got
//! the first time from the output itself. Pre-tokens seen by earlier calls come from a
//! shared, bounded, text-verified cache ([`super::cache::IdsCache`]); the rest go to the
//! real BPE model (merges are never re-implemented). Anything the fast path does not model
//! halts with [`Halt::Fallback`], and the caller uses the library's encode.
//!
//! A rendered chat ([`FastCounter::ids_segments`]) is split at added tokens first, as the
//! library does, and the ids of each long text segment between them are cached (bounded,
//! text-verified): a conversation that grew by one message only encodes the new text.

use std::borrow::Cow;
use std::collections::HashMap;

use tokenizers::{Model, ModelWrapper};

use super::split::{AddedMatcher, Halt, Piece};
use super::{FastCounter, SEGMENT_CACHE_MIN_BYTES};

impl FastCounter {
    /// Appends the ids of `text` (without post-processor specials) to `out`.
    pub(crate) fn ids(
        &self,
        model: &ModelWrapper,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), Halt> {
        let mut collect = Collect {
            fc: self,
            model,
            local: HashMap::default(),
            buf: String::new(),
            out,
        };
        collect.text(text)
    }
}

impl FastCounter {
    /// Appends the ids of a rendered chat (`text` without post-processor specials) to
    /// `out`, reusing the ids of the text segments between added tokens that earlier calls
    /// have seen.
    pub(crate) fn ids_segments(
        &self,
        model: &ModelWrapper,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), Halt> {
        let mut collect = Collect {
            fc: self,
            model,
            local: HashMap::default(),
            buf: String::new(),
            out,
        };
        AddedMatcher::split(self.raw_tokens.as_ref(), text, &mut |piece| match piece {
            Piece::Token(i) => collect.added(&self.raw_token_ids, i),
            Piece::Text(t) if t.len() < SEGMENT_CACHE_MIN_BYTES => collect.segment(t),
            Piece::Text(t) => {
                let out = &mut *collect.out;
                if self
                    .segment_ids
                    .get_with(t, |ids| out.extend_from_slice(ids))
                    .is_some()
                {
                    return Ok(());
                }
                let start = collect.out.len();
                collect.segment(t)?;
                let ids = collect.out[start..].to_vec().into_boxed_slice();
                self.segment_ids.insert(t, ids);
                Ok(())
            }
        })
    }
}

/// The state of one ids call.
struct Collect<'a, 'c> {
    fc: &'c FastCounter,
    model: &'c ModelWrapper,
    /// Pre-tokens of this call already done: where their ids sit in `out`.
    local: HashMap<&'a str, (usize, usize), foldhash::fast::FixedState>,
    buf: String,
    out: &'c mut Vec<u32>,
}

impl<'a> Collect<'a, '_> {
    /// Step 1 and onwards for a whole text.
    fn text(&mut self, text: &'a str) -> Result<(), Halt> {
        let fc = self.fc;
        AddedMatcher::split(fc.raw_tokens.as_ref(), text, &mut |piece| match piece {
            Piece::Token(i) => self.added(&fc.raw_token_ids, i),
            Piece::Text(t) => self.segment(t),
        })
    }

    fn added(&mut self, ids: &[u32], pattern: usize) -> Result<(), Halt> {
        let id = ids.get(pattern).ok_or(Halt::Fallback)?;
        self.out.push(*id);
        Ok(())
    }

    /// Steps 2–4 for a piece between raw added tokens.
    fn segment(&mut self, seg: &'a str) -> Result<(), Halt> {
        let fc = self.fc;
        match fc.normalized(seg)? {
            Cow::Borrowed(s) => {
                AddedMatcher::split(fc.normalized_tokens.as_ref(), s, &mut |piece| match piece {
                    Piece::Token(i) => self.added(&fc.normalized_token_ids, i),
                    Piece::Text(t) => fc.pretokenize(0, t, &mut |p| self.borrowed(p)),
                })
            }
            Cow::Owned(s) => {
                AddedMatcher::split(
                    fc.normalized_tokens.as_ref(),
                    &s,
                    &mut |piece| match piece {
                        Piece::Token(i) => self.added(&fc.normalized_token_ids, i),
                        Piece::Text(t) => fc.pretokenize(0, t, &mut |p| self.lookup(p)),
                    },
                )
            }
        }
    }

    fn borrowed(&mut self, piece: &'a str) -> Result<(), Halt> {
        if let Some(&(start, len)) = self.local.get(piece) {
            self.out.extend_from_within(start..start + len);
            return Ok(());
        }
        let start = self.out.len();
        self.lookup(piece)?;
        self.local.insert(piece, (start, self.out.len() - start));
        Ok(())
    }

    /// Shared cache, else the BPE model itself.
    fn lookup(&mut self, piece: &str) -> Result<(), Halt> {
        let out = &mut *self.out;
        if self
            .fc
            .piece_ids
            .get_with(piece, |ids| out.extend_from_slice(ids))
            .is_some()
        {
            return Ok(());
        }
        self.buf.clear();
        self.buf
            .extend(piece.bytes().map(|b| self.fc.byte_chars[usize::from(b)]));
        let tokens = self
            .model
            .tokenize(&self.buf)
            .map_err(|e| Halt::Encode(e.to_string()))?;
        let start = self.out.len();
        self.out.extend(tokens.iter().map(|t| t.id));
        self.fc
            .piece_ids
            .insert(piece, self.out[start..].to_vec().into_boxed_slice());
        Ok(())
    }
}
