//! Counting prompts: a cheap upper bound first, the exact count when the bound does not
//! settle admission (or later, in the background, for the stages that need it). A
//! conversation counted before is not rendered again: its exact count is remembered
//! (`ModelTokenizer::chat_key`).
//!
//! A byte-level BPE never produces more tokens than bytes of its (normalized) input, so
//! [`ModelTokenizer::token_upper_bound`] bounds a prompt from its length alone (it accounts
//! for NFC growth and BOS/EOS). A prompt whose bound fits every bound of a pool is admitted
//! without waiting for the exact count. Exact counting (the fast count-only path; rendered
//! chats through the per-segment cache) is CPU work and runs on the blocking pool, at most
//! `max_concurrent_counts` at a time, never on the async threads; it stops early once a
//! prompt is over every limit.

use std::sync::Arc;
use tokio::sync::Semaphore;

use super::chat::{
    render_chat, render_chat_with_media, render_responses, render_responses_with_media,
};
use super::prompt::{MaxNew, Sample};
use crate::error::GatewayError;
use crate::fleet::CountRules;
use crate::stack::api::PromptInput;
use crate::vision::{salt_image_ids, ChatImages, ImageSalts};
use kvgate_tokenize::{prepare, ChatKey, ChatPrompt, ModelTokenizer, TokenizeError};

/// The image token's id and each image's salt, in render order (`vision::salt_image_ids`).
pub(super) type ImageIdSalts = Arc<(u32, ImageSalts)>;

/// A sample's prompt size as admission knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptTokens {
    /// Counted exactly (or token ids).
    Exact(u64),
    /// Not counted yet: at most this many.
    AtMost(u64),
}

impl PromptTokens {
    /// The exact count, or the bound.
    pub fn value(self) -> u64 {
        match self {
            PromptTokens::Exact(n) | PromptTokens::AtMost(n) => n,
        }
    }
}

/// A prompt still to be counted exactly.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    text: PendingText,
    /// Where the chat's count is remembered once known.
    key: Option<ChatKey>,
}

/// What is counted.
#[derive(Debug, Clone)]
pub(super) enum PendingText {
    /// Plain text, encoded with special tokens.
    Plain(Arc<str>),
    /// A text pair (rerank): each side encoded with special tokens.
    Pair(Arc<str>, Arc<str>),
    /// A prepared, rendered chat (its render counted without special tokens, through the
    /// segment cache).
    Chat(Arc<ChatPrompt>),
}

impl PendingText {
    fn len(&self) -> usize {
        match self {
            PendingText::Plain(t) => t.len(),
            PendingText::Pair(a, b) => a.len() + b.len(),
            PendingText::Chat(c) => c.rendered.len() + c.appended.as_ref().map_or(0, |a| a.len()),
        }
    }
}

/// One sample, measured.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    pub tokens: PromptTokens,
    pub max_new: MaxNew,
    pub pending: Option<Pending>,
    /// A chat: its key (None for templates that read the clock) and, when it was rendered
    /// here, the rendered prompt (prefix routing hashes its token ids: `blocks`).
    pub chat: Option<(Option<ChatKey>, Option<Arc<ChatPrompt>>)>,
    /// Its token ids, when counted inline for prefix routing (`measure`'s `ids_first`),
    /// its images' tokens salted already.
    pub ids: Option<Vec<u32>>,
    /// A chat with images: how prefix routing salts their tokens.
    pub image_ids: Option<ImageIdSalts>,
}

/// Prompts up to this size are counted exactly right away, on the request's own thread:
/// the fast path counts 16 KiB in tens of microseconds, less than a hop to the blocking pool
/// and back costs. Larger ones get the byte bound first (and the blocking pool if needed).
pub const INLINE_COUNT_BYTES: usize = 16 * 1024;

/// How long a count waits for a slot on the blocking pool before the request is refused
/// with 503 `overloaded` (a few huge prompts must not stall every other request).
const COUNT_SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Bound (or count, for token ids and small prompts) every sample; prepares and renders
/// chats by `rules`, their images (`images`, for a vision model) expanded as its engines
/// expand them. `ids_first`: the first sample's token ids are wanted (prefix routing), so a
/// small one is encoded rather than only counted.
pub(super) fn measure(
    samples: &[Sample<'_>],
    tokenizer: &ModelTokenizer,
    model: &str,
    rules: CountRules,
    ids_first: bool,
    images: Option<&ChatImages>,
) -> Result<Vec<Measured>, GatewayError> {
    let mut measured: Vec<Measured> = samples
        .iter()
        .map(|s| {
            let (tokens, pending) = match &s.input {
                PromptInput::Ids(n) => (PromptTokens::Exact(*n as u64), None),
                PromptInput::Text(t) => (
                    PromptTokens::AtMost(tokenizer.token_upper_bound(t.len(), true) as u64),
                    Some(Pending {
                        text: PendingText::Plain(Arc::from(t.as_ref())),
                        key: None,
                    }),
                ),
                PromptInput::Pair(a, b) => (
                    PromptTokens::AtMost(
                        tokenizer
                            .token_upper_bound(a.len(), true)
                            .saturating_add(tokenizer.token_upper_bound(b.len(), true))
                            as u64,
                    ),
                    Some(Pending {
                        text: PendingText::Pair(Arc::from(a.as_ref()), Arc::from(b.as_ref())),
                        key: None,
                    }),
                ),
                PromptInput::Responses(fields) if images.is_some() => {
                    let Some(images) = images else {
                        return Err(GatewayError::Internal("images vanished".into()));
                    };
                    let prepared = render_responses_with_media(tokenizer, model, fields)?;
                    return expanded(tokenizer, model, rules, s, prepared, images);
                }
                PromptInput::Responses(fields) => {
                    let prompt = Arc::new(render_responses(tokenizer, model, fields)?);
                    let bound = chat_bound(tokenizer, &prompt);
                    return Ok(Measured {
                        tokens: PromptTokens::AtMost(bound as u64),
                        max_new: s.max_new,
                        pending: Some(Pending {
                            text: PendingText::Chat(prompt.clone()),
                            key: None,
                        }),
                        chat: Some((None, Some(prompt))),
                        ids: None,
                        image_ids: None,
                    });
                }
                &PromptInput::Chat { tools, fields, .. } if images.is_some() => {
                    let Some(images) = images else {
                        return Err(GatewayError::Internal("images vanished".into()));
                    };
                    return measure_with_images(tokenizer, model, rules, s, tools, fields, images);
                }
                &PromptInput::Chat {
                    messages,
                    tools,
                    fields,
                } => {
                    // A conversation seen before: its exact count, no render.
                    let options = prepare::options_key(rules.chat, fields);
                    let key = tokenizer.chat_key(messages, tools, &options);
                    if let Some(n) = key.and_then(|k| tokenizer.cached_chat_count(k)) {
                        return Ok(Measured {
                            tokens: PromptTokens::Exact(n as u64),
                            max_new: s.max_new,
                            pending: None,
                            chat: Some((key, None)),
                            ids: None,
                            image_ids: None,
                        });
                    }
                    // Not seen before: only now is the conversation parsed into values,
                    // prepared as the engine prepares it, and rendered.
                    let prompt =
                        render_chat(tokenizer, model, rules.chat, messages, tools, fields)?;
                    let bound = chat_bound(tokenizer, &prompt);
                    let prompt = Arc::new(prompt);
                    return Ok(Measured {
                        tokens: PromptTokens::AtMost(bound as u64),
                        max_new: s.max_new,
                        pending: Some(Pending {
                            text: PendingText::Chat(prompt.clone()),
                            key,
                        }),
                        chat: Some((key, Some(prompt))),
                        ids: None,
                        image_ids: None,
                    });
                }
            };
            Ok(Measured {
                tokens,
                max_new: s.max_new,
                pending,
                chat: None,
                ids: None,
                image_ids: None,
            })
        })
        .collect::<Result<_, GatewayError>>()?;
    // Small prompts: the exact count now, so no later stage waits for one.
    let small: usize = measured
        .iter()
        .filter_map(|m| m.pending.as_ref())
        .map(|p| p.text.len())
        .sum();
    if small <= INLINE_COUNT_BYTES {
        for (i, m) in measured.iter_mut().enumerate() {
            if let Some(p) = m.pending.take() {
                let counting = |e| GatewayError::Internal(format!("counting tokens: {e}"));
                if i == 0 && ids_first {
                    // The ids give the exact count too: the prompt is tokenized once.
                    let mut ids = ids_one(tokenizer, &p).map_err(counting)?;
                    m.tokens = PromptTokens::Exact(ids.len() as u64);
                    if let Some(salts) = &m.image_ids {
                        salt_image_ids(&mut ids, salts.0, &salts.1);
                    }
                    m.ids = Some(ids);
                } else {
                    m.tokens = PromptTokens::Exact(count_one(tokenizer, &p).map_err(counting)?);
                }
            }
        }
    }
    Ok(measured)
}

/// At most how many tokens a rendered chat is: its render's and its appended text's byte
/// bounds and its repeated image tokens. Saturating: a tokenizer with no byte bound answers
/// `usize::MAX`, which must stay "no bound" (a sum that wrapped would admit on a tiny one).
fn chat_bound(tokenizer: &ModelTokenizer, prompt: &ChatPrompt) -> usize {
    let repeated: usize = prompt.repeats.iter().map(|r| r.extra as usize).sum();
    tokenizer
        .token_upper_bound(prompt.rendered.len(), false)
        .saturating_add(repeated)
        .saturating_add(
            prompt
                .appended
                .as_ref()
                .map_or(0, |a| tokenizer.token_upper_bound(a.len(), true)),
        )
}

/// A chat with images (SGLang's rules, a vision model): rendered with its media parts as
/// placeholders, each expanded to the tokens its engine's processor gives the image; never
/// remembered by conversation (a remote image may change behind its URL).
fn measure_with_images(
    tokenizer: &ModelTokenizer,
    model: &str,
    rules: CountRules,
    sample: &Sample<'_>,
    tools: Option<&str>,
    fields: &serde_json::Map<String, serde_json::Value>,
    images: &ChatImages,
) -> Result<Measured, GatewayError> {
    let prepared = render_chat_with_media(
        tokenizer,
        model,
        rules.chat,
        &images.messages,
        tools,
        fields,
    )?;
    expanded(tokenizer, model, rules, sample, prepared, images)
}

/// A rendered prompt with media placeholders, each expanded to its image's tokens.
fn expanded(
    tokenizer: &ModelTokenizer,
    model: &str,
    rules: CountRules,
    sample: &Sample<'_>,
    mut prepared: kvgate_tokenize::MultimodalPrompt,
    images: &ChatImages,
) -> Result<Measured, GatewayError> {
    let salts = images.expand(model, &mut prepared, rules.image_cap)?;
    let prompt = Arc::new(prepared.prompt);
    let bound = chat_bound(tokenizer, &prompt);
    Ok(Measured {
        tokens: PromptTokens::AtMost(bound as u64),
        max_new: sample.max_new,
        pending: Some(Pending {
            text: PendingText::Chat(prompt.clone()),
            key: None,
        }),
        chat: Some((None, Some(prompt))),
        ids: None,
        image_ids: images.image_token.map(|t| Arc::new((t, salts))),
    })
}

/// The token ids of a pending prompt (what [`count_one`] counts), remembering a chat's
/// count.
fn ids_one(tokenizer: &ModelTokenizer, p: &Pending) -> Result<Vec<u32>, TokenizeError> {
    let prompt = match &p.text {
        PendingText::Plain(text) => return tokenizer.ids_fast(text, true),
        PendingText::Pair(a, b) => {
            let mut ids = tokenizer.ids_fast(a, true)?;
            ids.extend(tokenizer.ids_fast(b, true)?);
            return Ok(ids);
        }
        PendingText::Chat(prompt) => prompt,
    };
    let ids = tokenizer.chat_prompt_ids(prompt)?;
    if let Some(key) = p.key {
        tokenizer.remember_chat_count(key, ids.len());
    }
    Ok(ids)
}

/// Count every pending sample exactly, on the blocking pool (a refusal reports the exact
/// count, so over-long prompts are counted to their end; the body limit bounds the work).
pub(super) async fn count_exactly(
    measured: &mut [Measured],
    tokenizer: &Arc<ModelTokenizer>,
    permits: &Arc<Semaphore>,
) -> Result<(), GatewayError> {
    let pending: Vec<(usize, Pending)> = measured
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.pending.clone().map(|p| (i, p)))
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let counts = run_blocking(pending, tokenizer.clone(), permits.clone()).await?;
    for (i, n) in counts {
        measured[i].tokens = PromptTokens::Exact(n);
        measured[i].pending = None;
    }
    Ok(())
}

fn count_one(tokenizer: &ModelTokenizer, p: &Pending) -> Result<u64, TokenizeError> {
    let n = match &p.text {
        PendingText::Chat(prompt) => {
            // Chats re-send their history: the segment cache makes the repeat cheap.
            let n = tokenizer.count_chat_prompt(prompt)?;
            if let Some(key) = p.key {
                tokenizer.remember_chat_count(key, n);
            }
            n
        }
        PendingText::Plain(text) => tokenizer.count_fast(text, true)?,
        PendingText::Pair(a, b) => {
            tokenizer.count_fast(a, true)? + tokenizer.count_fast(b, true)?
        }
    };
    Ok(n as u64)
}

pub(super) async fn run_blocking(
    pending: Vec<(usize, Pending)>,
    tokenizer: Arc<ModelTokenizer>,
    permits: Arc<Semaphore>,
) -> Result<Vec<(usize, u64)>, GatewayError> {
    let _permit = match tokio::time::timeout(COUNT_SLOT_WAIT, permits.acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => return Err(GatewayError::Internal("token counting is shut down".into())),
        Err(_) => {
            ::metrics::counter!(crate::metrics::LOAD_SHED_TOTAL, "ceiling" => "token_counting")
                .increment(1);
            return Err(GatewayError::Overloaded {
                ceiling: "token counting",
            });
        }
    };
    tokio::task::spawn_blocking(move || {
        pending
            .into_iter()
            .map(|(i, p)| {
                count_one(&tokenizer, &p)
                    .map(|n| (i, n))
                    .map_err(|e| GatewayError::Internal(format!("counting tokens: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| GatewayError::Internal(format!("token counting task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen3() -> ModelTokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen3");
        ModelTokenizer::from_dir(&dir).unwrap()
    }

    #[test]
    fn a_conversation_seen_before_is_counted_from_the_cache_and_exactly() {
        let tok = qwen3();
        let messages = json!([{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "What is a KV page?"}]);
        let text = messages.to_string();
        let fields = serde_json::Map::new();
        let sample = |m: &'static str| Sample {
            input: PromptInput::Chat {
                messages: m,
                tools: None,
                fields: &fields,
            },
            max_new: MaxNew::Tokens(4),
        };
        let text: &'static str = Box::leak(text.into_boxed_str());
        let measure = |s: Sample<'_>, ids: bool| {
            measure(&[s], &tok, "qwen3", CountRules::default(), ids, None)
        };
        let rendered = tok.apply_chat_template(&messages, None, true).unwrap();
        let exact = tok.count(&rendered, false).unwrap() as u64;
        let options = prepare::options_key(kvgate_tokenize::ChatRules::Sglang, &fields);
        let key = tok.chat_key(text, None, &options).unwrap();
        assert_eq!(tok.cached_chat_count(key), None);
        let first = measure(sample(text), false).unwrap();
        assert_eq!(first[0].tokens, PromptTokens::Exact(exact));
        assert_eq!(tok.cached_chat_count(key), Some(exact as usize));
        let again = measure(sample(text), true).unwrap();
        assert_eq!(again[0].tokens, PromptTokens::Exact(exact));
        // One character more is another conversation, counted afresh.
        let other = json!([{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "What is a KV page?!"}]);
        let other_text: &'static str = Box::leak(other.to_string().into_boxed_str());
        let counted = measure(sample(other_text), true).unwrap();
        let rendered = tok.apply_chat_template(&other, None, true).unwrap();
        assert_eq!(
            counted[0].tokens,
            PromptTokens::Exact(tok.count(&rendered, false).unwrap() as u64)
        );
    }
}
