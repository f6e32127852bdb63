//! Stop strings, as SGLang applies them: after each generated token the text so far is
//! checked for each stop string in the request's order; the first token whose text holds
//! one ends generation there (it counts as generated), and the answer is cut before it.

use super::reply::text;
use kvgate_tokenize::ModelTokenizer;

/// Where a stop string ended generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Tokens generated, the one that completed the stop string included.
    pub(crate) tokens: usize,
    /// The stop string found (SGLang's `matched_stop`).
    pub(crate) matched: String,
    /// Bytes of text kept: everything before the stop string.
    pub(crate) cut: usize,
}

/// The first stop of `stops` in the text of `ids`, if any.
pub(crate) fn find(tokenizer: &ModelTokenizer, ids: &[u32], stops: &[String]) -> Option<Stopped> {
    if stops.is_empty() {
        return None;
    }
    // Token by token, so a stop early in a long answer ends the search there.
    (1..=ids.len()).find_map(|tokens| {
        let text = text(tokenizer, ids.get(..tokens).unwrap_or_default());
        if tokens < ids.len() && text.ends_with('\u{FFFD}') {
            // Inside a multi-byte character: held back, as the detokenizer holds it.
            return None;
        }
        stops.iter().find_map(|stop| {
            text.find(stop.as_str()).map(|cut| Stopped {
                tokens,
                matched: stop.clone(),
                cut,
            })
        })
    })
}
