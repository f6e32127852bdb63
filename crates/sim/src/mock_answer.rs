//! The mock engine's answers: one fixed text per kind, chosen by a marker in the request.
//!
//! The kinds differ in how text units (the leak detector's: a run of ASCII letters/digits
//! is one unit up to 16 bytes, every other non-space character is one unit) relate to
//! tokens, which is what a hold-back counted in units costs in time:
//!
//! - `prose` (the default): English sentences, about one unit per token;
//! - `code`: a Rust and a Python snippet, many one-character units (brackets, operators);
//! - `digits`: order numbers, amounts, dates, IP addresses — one token per digit (Qwen3),
//!   so several tokens per unit;
//! - `cjk`: Chinese and Japanese prose, about one unit and one token per character.
//!
//! A request asks for a kind with `[answer:KIND]` anywhere in its body (a message, the
//! prompt, the text); no marker or an unknown kind gets prose.

use kvgate_tokenize::ModelTokenizer;

/// Tokens of the longest answer (each kind's text repeated, then cut).
pub(crate) const ANSWER_TOKENS: usize = 1024;

/// The text every request got before there were kinds (kept byte for byte).
const PROSE: &str = "Pages of KV are admitted before they are used, and never shared. ";

const CODE: &str = r#"fn admit(pool: &mut Pool, need: usize) -> Result<Vec<Page>, Full> {
    if pool.free() < need {
        return Err(Full { need, free: pool.free() });
    }
    Ok((0..need).map(|_| pool.take()).collect())
}

def admit(pool, need):
    if pool.free() < need:
        raise Full(need=need, free=pool.free())
    return [pool.take() for _ in range(need)]

"#;

const DIGITS: &str = "Order 48213-0937 shipped on 2026-03-14 at 09:41:07 for $1,284.50 \
(tax 102.76) to 192.168.40.17, invoice 7730041, card ending 5521. ";

const CJK: &str = "分页的键值缓存在使用之前就被接纳，而且从不共享。\
ページは使われる前に確保され、決して共有されません。";

/// Which fixed text a request is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AnswerKind {
    Prose,
    Code,
    Digits,
    Cjk,
}

/// The marker's opening; the kind's name and `]` follow.
const MARKER: &[u8] = b"[answer:";

impl AnswerKind {
    /// Every kind, in the order of [`AnswerKind::index`].
    pub(crate) const ALL: [AnswerKind; 4] = [Self::Prose, Self::Code, Self::Digits, Self::Cjk];

    /// The kind's position in [`AnswerKind::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The kind's name in the marker.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Prose => "prose",
            Self::Code => "code",
            Self::Digits => "digits",
            Self::Cjk => "cjk",
        }
    }

    /// The kind a request body asks for with its first `[answer:KIND]`; prose without one.
    pub(crate) fn of_body(body: &[u8]) -> Self {
        let Some(at) = body.windows(MARKER.len()).position(|w| w == MARKER) else {
            return Self::Prose;
        };
        let rest = body.get(at + MARKER.len()..).unwrap_or_default();
        let name = rest.split(|&b| b == b']').next().unwrap_or_default();
        Self::ALL
            .into_iter()
            .find(|kind| kind.name().as_bytes().eq_ignore_ascii_case(name))
            .unwrap_or(Self::Prose)
    }

    fn text(self) -> &'static str {
        match self {
            Self::Prose => PROSE,
            Self::Code => CODE,
            Self::Digits => DIGITS,
            Self::Cjk => CJK,
        }
    }

    /// The kind's answer as token ids: its text repeated, cut to [`ANSWER_TOKENS`].
    pub(crate) fn ids(self, tokenizer: &ModelTokenizer) -> Result<Vec<u32>, std::io::Error> {
        // Every text is at least 8 tokens long, so this many copies are enough.
        let text = self.text().repeat(ANSWER_TOKENS / 8);
        let mut ids = tokenizer
            .encode(&text, false)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        ids.truncate(ANSWER_TOKENS);
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_picks_the_kind_and_anything_else_is_prose() {
        let body = br#"{"messages":[{"role":"user","content":"[answer:code] write it"}]}"#;
        assert_eq!(AnswerKind::of_body(body), AnswerKind::Code);
        assert_eq!(
            AnswerKind::of_body(b"x [answer:digits]"),
            AnswerKind::Digits
        );
        assert_eq!(AnswerKind::of_body(b"[answer:CJK]"), AnswerKind::Cjk);
        assert_eq!(AnswerKind::of_body(b"[answer:prose]"), AnswerKind::Prose);
        assert_eq!(AnswerKind::of_body(b"[answer:poetry]"), AnswerKind::Prose);
        assert_eq!(AnswerKind::of_body(b"[answer:code"), AnswerKind::Code);
        assert_eq!(AnswerKind::of_body(b"no marker"), AnswerKind::Prose);
        assert_eq!(AnswerKind::of_body(b""), AnswerKind::Prose);
        for kind in AnswerKind::ALL {
            assert_eq!(AnswerKind::ALL[kind.index()], kind);
        }
    }
}
