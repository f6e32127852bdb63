//! Text units: the leak detector's tokenizer-free view of text.
//!
//! A prompt and the answer that might leak it are compared as sequences of units, hashed
//! to `u32`: every maximal run of ASCII letters and digits is one unit (a word; a word
//! longer than [`MAX_WORD_BYTES`] is cut into pieces of that length), every other
//! character that is not whitespace is a unit of its own (punctuation, CJK characters,
//! accented letters), and whitespace only separates. Splitting needs no tokenizer and no
//! model, costs one pass over the bytes, and is the same whether the text comes whole or
//! in stream chunks cut anywhere (a word cut by a chunk boundary is held until it ends).
//! Whitespace is ignored, so a detokenizer's spacing changes do not hide a leak.
//!
//! The detector's guarantee in these terms: an answer holding a run of
//! `ngram + min_matches - 1` consecutive units (starting at a word or character boundary)
//! that only another tenant's recent prompt holds is a suspected leak. In a stream, block
//! mode lets at most `ngram - 1` units of such a run out (it holds output only inside a
//! foreign run), strict mode none (it holds every stream back by `ngram + min_matches`
//! units); see `guard/leak.rs`. As no unit is longer than 16 bytes, all of these are
//! bounded in bytes too: 16 per unit, whitespace aside.

/// The longest unit in bytes: longer words (base64, hex dumps) are cut every 16 bytes, so a
/// unit count bounds a byte count (the stream guarantees above all).
pub const MAX_WORD_BYTES: usize = 16;

/// FxHash's multiplier: odd, with well-spread bits (as in `hash.rs`).
const MUL: u64 = 0x517c_c1b7_2722_0a95;
/// Start state of a unit's hash: fixed, so units mean the same in every process.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

#[inline]
fn mix(h: u64, v: u64) -> u64 {
    (h.rotate_left(5) ^ v).wrapping_mul(MUL)
}

#[inline]
fn finish(mut h: u64) -> u32 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h ^ (h >> 29)) as u32
}

/// The unit of a character that is neither whitespace nor part of a word, tagged so it
/// never equals a one-letter word's hash.
#[inline]
fn char_unit(c: char) -> u32 {
    finish(mix(SEED ^ 0xff, u64::from(u32::from(c)) | 1 << 40))
}

/// The unit of a word: its (at most 16) bytes, packed, hashed once at its end.
#[inline]
fn word_unit(word: u128, len: usize) -> u32 {
    finish(mix(
        mix(SEED ^ len as u64, word as u64),
        (word >> 64) as u64,
    ))
}

/// Splits text into units incrementally.
#[derive(Debug, Clone, Default)]
pub struct TextUnits {
    /// The open word's bytes, little-endian: a word is at most 16 bytes, so it fits, and
    /// collecting a byte is a shift and an or instead of a multiply chain.
    word: u128,
    /// Bytes of the open word (0: none open).
    word_len: usize,
}

impl TextUnits {
    /// A splitter at the start of a text.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append the units `text` completes to `out` (a trailing word waits for its end).
    pub fn push(&mut self, text: &str, out: &mut Vec<u32>) {
        out.reserve(text.len() / 5);
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            // ASCII (nearly all of most text) byte by byte; anything else as a char.
            if b.is_ascii() {
                i += 1;
                if b.is_ascii_alphanumeric() {
                    if self.word_len == MAX_WORD_BYTES {
                        self.end_word(out);
                    }
                    self.word |= u128::from(b) << (8 * self.word_len);
                    self.word_len += 1;
                } else {
                    self.end_word(out);
                    if !b.is_ascii_whitespace() && b != 0x0b {
                        out.push(char_unit(char::from(b)));
                    }
                }
                continue;
            }
            let Some(c) = text.get(i..).and_then(|rest| rest.chars().next()) else {
                break;
            };
            i += c.len_utf8();
            self.end_word(out);
            if !c.is_whitespace() {
                out.push(char_unit(c));
            }
        }
    }

    /// The unit of the word still open (waiting for its end), as it stands: the unit it
    /// becomes if the text ends here.
    pub fn open_unit(&self) -> Option<u32> {
        (self.word_len > 0).then(|| word_unit(self.word, self.word_len))
    }

    /// The end of the text: the last word is complete.
    pub fn finish(&mut self, out: &mut Vec<u32>) {
        self.end_word(out);
    }

    fn end_word(&mut self, out: &mut Vec<u32>) {
        if self.word_len > 0 {
            out.push(word_unit(self.word, self.word_len));
            self.word = 0;
            self.word_len = 0;
        }
    }
}

/// All units of a whole text.
pub fn units_of(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 4);
    let mut units = TextUnits::new();
    units.push(text, &mut out);
    units.finish(&mut out);
    out
}

/// The longest run of consecutive units that `seen` quotes from `source`: how much of a
/// foreign text an answer let out, in the unit the leak guarantees are stated in (the
/// stream tests measure those bounds with it). Quadratic in time, linear in memory.
pub fn longest_shared_run(seen: &str, source: &str) -> usize {
    let (a, b) = (units_of(seen), units_of(source));
    // run[j]: the length of the common run ending at the current unit of `a` and b[j].
    let mut run = vec![0usize; b.len() + 1];
    let mut best = 0;
    for &x in &a {
        for j in (0..b.len()).rev() {
            run[j + 1] = if b[j] == x { run[j] + 1 } else { 0 };
            best = best.max(run[j + 1]);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn words_and_other_characters_are_units_and_spacing_is_ignored() {
        assert_eq!(units_of("The secret code is QUOKKA-4471.").len(), 8);
        assert_eq!(units_of("a  b\n\tc"), units_of("a b c"));
        assert_ne!(units_of("ab"), units_of("a b"));
        assert_eq!(units_of("秘密です").len(), 4);
        assert_ne!(units_of("a"), units_of("!"));
    }

    #[test]
    fn the_longest_shared_run_counts_consecutive_units_only() {
        assert_eq!(longest_shared_run("x a b c y a b", "a b c d a b"), 3);
        assert_eq!(longest_shared_run("nothing here", "a b c"), 0);
        assert_eq!(longest_shared_run("", "a b"), 0);
        assert_eq!(longest_shared_run("a, b", "a ,b"), 3);
    }

    #[test]
    fn long_words_are_cut_every_16_bytes() {
        let word = "0123456789abcdef".repeat(3) + "xy";
        let units = units_of(&word);
        assert_eq!(units.len(), 4);
        assert_eq!(units[0], units[1], "equal 16-byte pieces hash alike");
        assert_eq!(units[3], units_of("xy")[0]);
        // Cut anywhere, a stream gives the same pieces.
        let mut split = TextUnits::new();
        let mut out = Vec::new();
        split.push(&word[..20], &mut out);
        split.push(&word[20..], &mut out);
        split.finish(&mut out);
        assert_eq!(out, units);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn chunk_boundaries_never_change_the_units(
            text in "[a-zA-Z0-9 .,\\n秘é-]{0,80}",
            cuts in prop::collection::vec(0usize..80, 0..8),
        ) {
            let whole = units_of(&text);
            let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len() && text.is_char_boundary(c)).collect();
            bounds.sort_unstable();
            let mut units = TextUnits::new();
            let (mut out, mut prev) = (Vec::new(), 0);
            for b in bounds.into_iter().chain([text.len()]) {
                units.push(&text[prev..b], &mut out);
                prev = b;
            }
            units.finish(&mut out);
            prop_assert_eq!(out, whole);
        }

        #[test]
        fn the_byte_path_splits_like_the_char_rules(text in "\\PC{0,60}|[ -~\t\n\x0b\x0c\r\u{85}\u{a0}]{0,60}") {
            // The rules, char by char: what `push` must equal whatever its fast path does.
            let mut want = Vec::new();
            let mut word: Vec<u8> = Vec::new();
            let unit = |word: &[u8]| {
                let mut packed = [0u8; 16];
                packed[..word.len()].copy_from_slice(word);
                word_unit(u128::from_le_bytes(packed), word.len())
            };
            for c in text.chars() {
                if c.is_ascii_alphanumeric() {
                    if word.len() == MAX_WORD_BYTES {
                        want.push(unit(&word));
                        word.clear();
                    }
                    word.push(c as u8);
                    continue;
                }
                if !word.is_empty() {
                    want.push(unit(&word));
                    word.clear();
                }
                if !c.is_whitespace() {
                    want.push(char_unit(c));
                }
            }
            if !word.is_empty() {
                want.push(unit(&word));
            }
            prop_assert_eq!(units_of(&text), want);
        }
    }
}
