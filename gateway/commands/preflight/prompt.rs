//! Probe prompts of an exact token count, as the engine will count them: `/generate` token
//! ids (exact by construction) and chat messages whose rendered template counts exactly
//! `n` with the model's real tokenizer (or as close as the tokenizer allows, and then the
//! probe names the count it really sent).
//!
//! Every prompt carries a nonce of its own, spread through it: the text repeats a unit that
//! holds the nonce, so any stretch of the prompt a little longer than one unit (a stale KV
//! page read back, an answer echoing it) shows whose prompt it was.

use serde_json::{json, Map, Value};

use kvgate_tokenize::{ChatRequest, ChatRules, ModelTokenizer, TokenizeError};

use crate::secure_random;

/// One token per repetition after the first in every tokenizer kvgate ships (" hello"):
/// what pads a chat prompt to its exact count.
const CHAT_WORD: &str = "hello";
/// Rounds of adjusting a chat prompt's length to hit the count.
const TUNING_ROUNDS: usize = 8;

/// A fresh nonce, unique to one probe prompt of this run.
pub fn nonce() -> String {
    format!("kvgate{:016x}", secure_random::u64())
}

/// The unit a prompt repeats: short (about two dozen tokens), so that any answer of a few
/// dozen tokens read from the prompt's pages holds a whole nonce.
fn unit(nonce: &str) -> String {
    format!("Probe {nonce} checks the engine's limits.")
}

/// A prompt and the number of tokens the engine will count for it.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The body fields that carry it (`input_ids`, or `messages`).
    pub fields: Map<String, Value>,
    /// Its exact token count.
    pub tokens: u64,
    /// The text it holds (the chat message's content; the decoded `/generate` ids), for
    /// the cross-probe check.
    pub text: String,
    /// Its nonce (absent only from a chat prompt too short to hold one).
    pub nonce: Option<String>,
}

/// Builds prompts with one model's tokenizer.
pub struct PromptMaker<'a> {
    tokenizer: &'a ModelTokenizer,
    /// How the pool's engines prepare a chat: chat probes are sized by their count.
    rules: ChatRules,
}

impl<'a> PromptMaker<'a> {
    pub fn new(tokenizer: &'a ModelTokenizer, rules: ChatRules) -> Result<Self, TokenizeError> {
        Ok(Self { tokenizer, rules })
    }

    /// Whether chat prompts can be counted (the model has a chat template).
    pub fn has_chat(&self) -> bool {
        self.tokenizer.has_chat_template()
    }

    /// `/generate` with exactly `n` token ids: a fresh nonce's unit, its ids cycled
    /// (decoding them gives the text back, so an answer that echoes any of it is known).
    pub fn generate(&self, n: u64) -> Result<Prompt, TokenizeError> {
        let nonce = nonce();
        let unit = self
            .tokenizer
            .encode(&format!("{} ", unit(&nonce)), false)?;
        let ids = cycle(&unit, n);
        let text = self.tokenizer.decode(&ids, false)?;
        let mut fields = Map::new();
        fields.insert("input_ids".into(), json!(ids));
        Ok(Prompt {
            fields,
            tokens: n,
            nonce: text.contains(&nonce).then_some(nonce),
            text,
        })
    }

    /// A one-message chat whose rendered template counts `n` tokens (or the nearest count
    /// the tokenizer reaches, reported in `tokens`): a fresh nonce's unit repeated, with as
    /// many padding words spread between the units as it takes to hit the count.
    pub fn chat(&self, n: u64) -> Result<Prompt, TokenizeError> {
        let nonce = nonce();
        let mut unit = unit(&nonce);
        let empty = self.count_chat("")?;
        let per_unit = (self.count_chat(&repeat(&unit, 2))?.saturating_sub(empty) / 2).max(1);
        // A unit's worth less than fits, so padding can make up the rest exactly.
        let mut units = (n.saturating_sub(empty) / per_unit).saturating_sub(1);
        if units == 0 {
            unit = format!("Probe {nonce}.");
            units = 1;
        }
        if self.count_chat(&unit)? > n {
            // Too short for a nonce: padding alone.
            units = 0;
        }
        let (tokens, content) = self.pad(&unit, units, n)?;
        let mut fields = Map::new();
        fields.insert(
            "messages".into(),
            json!([{ "role": "user", "content": content }]),
        );
        Ok(Prompt {
            fields,
            tokens,
            nonce: content.contains(&nonce).then_some(nonce),
            text: content,
        })
    }

    /// `units` times `unit` with padding words spread after them, as many as bring the
    /// chat to `n` tokens (or nearest).
    fn pad(&self, unit: &str, units: u64, n: u64) -> Result<(u64, String), TokenizeError> {
        let content = |words: u64| {
            if units == 0 {
                return repeat(CHAT_WORD, words.max(1));
            }
            let mut s = String::new();
            for i in 0..units {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str(unit);
                for _ in 0..words / units + u64::from(i < words % units) {
                    s.push(' ');
                    s.push_str(CHAT_WORD);
                }
            }
            s
        };
        let mut words = n.saturating_sub(self.count_chat(&content(0))?);
        let mut best: Option<(u64, String)> = None;
        for _ in 0..TUNING_ROUNDS {
            let text = content(words);
            let count = self.count_chat(&text)?;
            let closer = best
                .as_ref()
                .is_none_or(|(c, _)| count.abs_diff(n) < c.abs_diff(n));
            if closer {
                best = Some((count, text));
            }
            if count == n {
                break;
            }
            let step = count.abs_diff(n).max(1);
            words = if count < n {
                words + step
            } else {
                words.saturating_sub(step)
            };
        }
        Ok(best.unwrap_or_default())
    }

    fn count_chat(&self, content: &str) -> Result<u64, TokenizeError> {
        let messages = json!([{ "role": "user", "content": content }]);
        let fields = Map::new();
        let request = ChatRequest {
            messages: &messages,
            tools: None,
            fields: &fields,
        };
        let prompt = self.tokenizer.chat_prompt(self.rules, &request)?;
        Ok(self.tokenizer.count_chat_prompt(&prompt)? as u64)
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
        let maker = PromptMaker::new(&t, ChatRules::Sglang).expect("maker");
        for n in [1, 17, 4095] {
            let p = maker.generate(n).expect("generate");
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
        let maker = PromptMaker::new(&t, ChatRules::Sglang).expect("maker");
        for n in [40, 64, 1000, 4041, 4089, 4095, 4096, 4097] {
            let p = maker.chat(n).expect("chat");
            assert_eq!(p.tokens, n, "asked for {n}");
            let rendered = t
                .apply_chat_template(&p.fields["messages"], None, true)
                .expect("render");
            assert_eq!(t.count_rendered_chat(&rendered).expect("count") as u64, n);
        }
    }

    #[test]
    fn every_prompt_holds_its_own_nonce_throughout() {
        let t = qwen3();
        let maker = PromptMaker::new(&t, ChatRules::Sglang).expect("maker");
        let a = maker.generate(200).expect("generate");
        let b = maker.generate(200).expect("generate");
        let c = maker.chat(1000).expect("chat");
        for p in [&a, &b, &c] {
            let nonce = p.nonce.as_deref().expect("a nonce");
            // Spread through: every stretch of 120 bytes holds it whole.
            let text = p.text.as_bytes();
            let needle = nonce.as_bytes();
            for start in (0..text.len().saturating_sub(120)).step_by(40) {
                assert!(
                    text[start..start + 120]
                        .windows(needle.len())
                        .any(|w| w == needle),
                    "no nonce in {:?}",
                    String::from_utf8_lossy(&text[start..start + 120])
                );
            }
        }
        assert_ne!(a.nonce, b.nonce, "a nonce per prompt");
        // A chat too short for a unit still holds its nonce, and its exact count.
        let short = maker.chat(40).expect("chat");
        assert_eq!(short.tokens, 40);
        assert!(short.nonce.is_some(), "{}", short.text);
    }
}
