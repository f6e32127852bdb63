//! Probe prompts of an exact token count, as the engine will count them: `/generate` token
//! ids (exact by construction) and chat messages whose rendered template counts exactly
//! `n` with the model's real tokenizer (or as close as the tokenizer allows, and then the
//! probe names the count it really sent).

use serde_json::{json, Map, Value};

use kvgate_tokenize::{ModelTokenizer, TokenizeError};

/// A sentence whose token ids are cycled to fill `/generate` prompts.
const FILLER: &str =
    "The gateway checks every prompt against the engine's limits before it is sent. ";
/// One token per repetition after the first in every tokenizer kvgate ships (" hello").
const CHAT_WORD: &str = "hello";
/// Rounds of adjusting a chat prompt's length to hit the count.
const TUNING_ROUNDS: usize = 8;

/// A prompt and the number of tokens the engine will count for it.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The body fields that carry it (`input_ids`, or `messages`).
    pub fields: Map<String, Value>,
    /// Its exact token count.
    pub tokens: u64,
    /// The text it holds, when it was built from text (for the isolation scan).
    pub text: Option<String>,
}

/// Builds prompts with one model's tokenizer.
pub struct PromptMaker<'a> {
    tokenizer: &'a ModelTokenizer,
    filler: Vec<u32>,
}

impl<'a> PromptMaker<'a> {
    pub fn new(tokenizer: &'a ModelTokenizer) -> Result<Self, TokenizeError> {
        let filler = tokenizer.encode(FILLER, false)?;
        Ok(Self { tokenizer, filler })
    }

    /// Whether chat prompts can be counted (the model has a chat template).
    pub fn has_chat(&self) -> bool {
        self.tokenizer.has_chat_template()
    }

    /// `/generate` with exactly `n` token ids of filler.
    pub fn generate(&self, n: u64) -> Prompt {
        let ids = cycle(&self.filler, n);
        let mut fields = Map::new();
        fields.insert("input_ids".into(), json!(ids));
        Prompt {
            fields,
            tokens: n,
            text: None,
        }
    }

    /// `/generate` with `text` repeated to `n` token ids (its ids cycled; decoding them
    /// gives the text back, so an answer that echoes any of it can be recognised).
    pub fn generate_text(&self, text: &str, n: u64) -> Result<Prompt, TokenizeError> {
        let unit = self.tokenizer.encode(text, false)?;
        let ids = cycle(&unit, n);
        let decoded = self.tokenizer.decode(&ids, false)?;
        let mut fields = Map::new();
        fields.insert("input_ids".into(), json!(ids));
        Ok(Prompt {
            fields,
            tokens: n,
            text: Some(decoded),
        })
    }

    /// A one-message chat whose rendered template counts `n` tokens (or the nearest count
    /// the tokenizer reaches, reported in `tokens`).
    pub fn chat(&self, n: u64) -> Result<Prompt, TokenizeError> {
        self.chat_of(CHAT_WORD, n)
    }

    /// A one-message chat of `unit` repeated to about `n` tokens.
    pub fn chat_text(&self, unit: &str, n: u64) -> Result<Prompt, TokenizeError> {
        self.chat_of(unit, n)
    }

    fn chat_of(&self, unit: &str, n: u64) -> Result<Prompt, TokenizeError> {
        let empty = self.count_chat("")?;
        let per_unit = self
            .count_chat(&repeat(unit, 2))?
            .saturating_sub(empty)
            .max(2)
            / 2;
        let mut units = (n.saturating_sub(empty) / per_unit.max(1)).max(1);
        let mut best: Option<(u64, String)> = None;
        for _ in 0..TUNING_ROUNDS {
            let content = repeat(unit, units);
            let count = self.count_chat(&content)?;
            let closer = best
                .as_ref()
                .is_none_or(|(c, _)| count.abs_diff(n) < c.abs_diff(n));
            if closer {
                best = Some((count, content));
            }
            if count == n {
                break;
            }
            let step = (count.abs_diff(n) / per_unit.max(1)).max(1);
            units = if count < n {
                units + step
            } else {
                units.saturating_sub(step).max(1)
            };
        }
        let (tokens, content) = best.unwrap_or_default();
        let mut fields = Map::new();
        fields.insert(
            "messages".into(),
            json!([{ "role": "user", "content": content }]),
        );
        Ok(Prompt {
            fields,
            tokens,
            text: Some(content),
        })
    }

    fn count_chat(&self, content: &str) -> Result<u64, TokenizeError> {
        let messages = json!([{ "role": "user", "content": content }]);
        let rendered = self.tokenizer.apply_chat_template(&messages, None, true)?;
        Ok(self.tokenizer.count_rendered_chat(&rendered)? as u64)
    }
}

fn cycle(unit: &[u32], n: u64) -> Vec<u32> {
    if unit.is_empty() {
        return vec![0; n as usize];
    }
    unit.iter().copied().cycle().take(n as usize).collect()
}

fn repeat(unit: &str, times: u64) -> String {
    let mut s = String::with_capacity(unit.len().saturating_add(1).saturating_mul(times as usize));
    for i in 0..times {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(unit);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn qwen3() -> ModelTokenizer {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen3");
        ModelTokenizer::from_files(
            &dir.join("tokenizer.json"),
            Some(&dir.join("tokenizer_config.json")),
        )
        .expect("the repo's Qwen3 tokenizer")
    }

    #[test]
    fn generate_prompts_have_exactly_n_ids() {
        let t = qwen3();
        let maker = PromptMaker::new(&t).expect("maker");
        for n in [1, 17, 4095] {
            let p = maker.generate(n);
            assert_eq!(
                p.fields["input_ids"].as_array().map(Vec::len),
                Some(n as usize)
            );
            assert_eq!(p.tokens, n);
        }
    }

    #[test]
    fn chat_prompts_count_exactly_n_after_the_template() {
        let t = qwen3();
        let maker = PromptMaker::new(&t).expect("maker");
        for n in [40, 1000, 4095, 4096, 4097] {
            let p = maker.chat(n).expect("chat");
            assert_eq!(p.tokens, n, "asked for {n}");
            let rendered = t
                .apply_chat_template(&p.fields["messages"], None, true)
                .expect("render");
            assert_eq!(t.count_rendered_chat(&rendered).expect("count") as u64, n);
        }
    }

    #[test]
    fn text_prompts_decode_to_their_unit() {
        let t = qwen3();
        let maker = PromptMaker::new(&t).expect("maker");
        let p = maker
            .generate_text("nonce kvgate-0123abcd ", 200)
            .expect("generate text");
        assert!(p
            .text
            .as_deref()
            .is_some_and(|s| s.contains("kvgate-0123abcd")));
    }
}
