//! The two splitting steps of the count-only path: added tokens, then the pre-tokenizer regexes.
//!
//! Both reproduce what HF `tokenizers` does, but only report *where* the pieces are, as
//! borrowed `&str` slices, so nothing is allocated per token.

use aho_corasick::{AhoCorasick, MatchKind};
use regex_automata::{meta::Regex, Anchored, Input};

/// Why a split could not be done the fast way, or why counting stopped.
#[derive(Debug)]
pub(crate) enum Halt {
    /// The input hit a case the fast path does not model (an empty regex match): the
    /// caller must use the library's own encode.
    Fallback,
    /// The count passed the caller's limit; the partial count is in the tally.
    Over,
    /// The BPE model refused a pre-token.
    Encode(String),
}

/// One piece of an added-token split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece<'h> {
    /// Text between added tokens (possibly empty never: empty gaps are not reported).
    Text(&'h str),
    /// One added token: always exactly one id; the index of its pattern (in the list the
    /// matcher was built from).
    Token(usize),
}

/// Finds added tokens like HF's `AddedVocabulary` (leftmost-longest Aho-Corasick, no
/// lstrip/rstrip/single_word handling: configurations that use those are not accepted).
pub(crate) struct AddedMatcher {
    ac: AhoCorasick,
}

impl AddedMatcher {
    /// Builds the automaton over `patterns`; `None` when there are none (HF's `None` trie).
    pub(crate) fn new(patterns: &[String]) -> Result<Option<Self>, String> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns)
            .map_err(|e| e.to_string())?;
        Ok(Some(Self { ac }))
    }

    /// Whether any pattern contains `byte` (used to prove chunk boundaries safe).
    pub(crate) fn any_contains(patterns: &[String], byte: u8) -> bool {
        patterns.iter().any(|p| p.as_bytes().contains(&byte))
    }

    /// Calls `f` for every gap and every match of `hay`, in order.
    pub(crate) fn split<'h>(
        matcher: Option<&Self>,
        hay: &'h str,
        f: &mut dyn FnMut(Piece<'h>) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        let Some(matcher) = matcher else {
            return if hay.is_empty() {
                Ok(())
            } else {
                f(Piece::Text(hay))
            };
        };
        let mut last = 0;
        for m in matcher.ac.find_iter(hay) {
            if m.start() > last {
                f(Piece::Text(slice(hay, last, m.start())?))?;
            }
            f(Piece::Token(m.pattern().as_usize()))?;
            last = m.end();
        }
        if last < hay.len() {
            f(Piece::Text(slice(hay, last, hay.len())?))?;
        }
        Ok(())
    }
}

/// `&hay[start..end]` without a panic path (patterns are whole UTF-8 strings, so match
/// bounds are char boundaries; a failure here would be a bug, reported as a fallback).
fn slice(hay: &str, start: usize, end: usize) -> Result<&str, Halt> {
    hay.get(start..end).ok_or(Halt::Fallback)
}

/// HF's `\s+(?!\S)|\s+` tail: the only look-around these pre-tokenizers use. The `regex`
/// engines have no look-ahead, so a pattern `X|\s+(?!\S)|\s+` is run as the two patterns
/// `[X, \s+]` (leftmost-first, X preferred, exactly like the alternation) and a `\s+`
/// match is then shortened by one char when it is followed by more text (see
/// [`Stage::split`]).
const WS_TAIL: &str = r"|\s+(?!\S)|\s+";

/// One `Split { pattern: Regex, behavior: Isolated, invert: false }` pre-tokenizer.
pub(crate) struct Stage {
    re: Regex,
    /// The pattern had [`WS_TAIL`]: pattern id 1 is its `\s+` branch.
    ws_tail: bool,
}

impl Stage {
    /// Compiles an HF split regex; errors when it needs look-around other than [`WS_TAIL`].
    pub(crate) fn compile(pattern: &str) -> Result<Self, String> {
        // A `|` inside a group or class would leave that group or class unclosed at the
        // end of the pattern, so a valid pattern ending in WS_TAIL has it at the top level.
        if let Some(head) = pattern.strip_suffix(WS_TAIL) {
            let re = Regex::new_many(&[head, r"\s+"]).map_err(|e| e.to_string())?;
            return Ok(Self { re, ws_tail: true });
        }
        let re = Regex::new(pattern).map_err(|e| e.to_string())?;
        Ok(Self { re, ws_tail: false })
    }

    /// Calls `f` with each piece of `hay` in order: every match and every gap between
    /// matches (HF's `Isolated` behaviour), as fancy-regex's `find_iter` would produce them.
    pub(crate) fn split<'h>(
        &self,
        hay: &'h str,
        f: &mut dyn FnMut(&'h str) -> Result<(), Halt>,
    ) -> Result<(), Halt> {
        let mut last = 0;
        let mut pos = 0;
        // Most pre-tokenizer regexes match back to back; an anchored search then avoids
        // the reverse scan an unanchored search needs to find the start.
        let mut dense = true;
        while pos < hay.len() {
            let found = if dense {
                match self
                    .re
                    .search(&Input::new(hay).range(pos..).anchored(Anchored::Yes))
                {
                    Some(m) => Some(m),
                    None => self.re.search(&Input::new(hay).range(pos..)),
                }
            } else {
                self.re.search(&Input::new(hay).range(pos..))
            };
            let Some(m) = found else { break };
            let (start, mut end) = (m.start(), m.end());
            if end == start {
                // fancy-regex steps over empty matches in its own way; not modelled.
                return Err(Halt::Fallback);
            }
            dense = start == pos;
            if self.ws_tail && m.pattern().as_usize() == 1 && end < hay.len() {
                // `\s+(?!\S)` backtracks one char when the run is followed by a non-space
                // (the run is maximal, so what follows is not whitespace); a one-char run
                // fails it and falls to the plain `\s+`, which takes the run whole.
                let run = slice(hay, start, end)?;
                if let Some((last_char, _)) = run.char_indices().next_back() {
                    if last_char > 0 {
                        end = start + last_char;
                    }
                }
            }
            if start > last {
                f(slice(hay, last, start)?)?;
            }
            f(slice(hay, start, end)?)?;
            last = end;
            pos = end;
        }
        if last < hay.len() {
            f(slice(hay, last, hay.len())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(stage: &Stage, hay: &str) -> Vec<String> {
        let mut out = Vec::new();
        stage
            .split(hay, &mut |p| {
                out.push(p.to_string());
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn whitespace_tail_gives_back_one_char_before_a_word() {
        let stage = Stage::compile(r"[^\s]+|\s+(?!\S)|\s+").unwrap();
        assert!(stage.ws_tail);
        assert_eq!(pieces(&stage, "a   b "), ["a", "  ", " ", "b", " "]);
        assert_eq!(pieces(&stage, "a b"), ["a", " ", "b"]);
        assert_eq!(pieces(&stage, "   "), ["   "]);
    }

    #[test]
    fn gaps_are_pieces_and_lookaround_elsewhere_is_refused() {
        let stage = Stage::compile(r"\p{N}{1,3}").unwrap();
        assert_eq!(pieces(&stage, "ab12345c"), ["ab", "123", "45", "c"]);
        assert!(Stage::compile(r"a(?=b)").is_err());
    }

    #[test]
    fn added_tokens_are_leftmost_longest() {
        let pats = vec!["<a>".to_string(), "<a>b".to_string(), "b".to_string()];
        let m = AddedMatcher::new(&pats).unwrap();
        let mut out = Vec::new();
        AddedMatcher::split(m.as_ref(), "x<a>bb", &mut |p| {
            out.push(p);
            Ok(())
        })
        .unwrap();
        assert_eq!(out, [Piece::Text("x"), Piece::Token(1), Piece::Token(2)]);
    }
}
