//! Thinking, as a Qwen3-style model and SGLang do it: whether the chat template switches it
//! (`enable_thinking`), the made-up thought the sim "generates" before its answer, and the
//! split SGLang's reasoning parser (`--reasoning-parser qwen3`) makes of
//! `<think>…</think>` and the answer.
//!
//! Without the parser the thought stays in `content`, `<think>` tags and all, as SGLang
//! sends it; with it (and `separate_reasoning`, true by default) it moves to
//! `reasoning_content`.

use serde_json::json;

use super::options::Options;
use kvgate_tokenize::ModelTokenizer;

/// The thought a thinking model writes before its answer (a few tokens, so short answers
/// still carry most of their text).
pub(crate) const THOUGHT: &str = "<think>\nA short answer will do.\n</think>\n\n";

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// What the model's chat template does with `enable_thinking`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThinkingTemplate {
    /// The template renders differently with `enable_thinking` true and false.
    pub(crate) toggles: bool,
    /// Without the argument it renders as with `true` (Qwen3: thinking unless turned off).
    pub(crate) default_on: bool,
}

impl ThinkingTemplate {
    /// Probes the template with a one-message conversation, rendered with
    /// `enable_thinking` unset, true and false.
    pub(crate) fn of(tokenizer: &ModelTokenizer) -> Self {
        let probe = json!([{"role": "user", "content": "probe"}]);
        let render = |on: Option<bool>| {
            let kwargs = on.map(|on| json!({"enable_thinking": on}));
            tokenizer
                .apply_chat_template_with(&probe, None, true, kwargs.as_ref())
                .ok()
        };
        match (render(None), render(Some(true)), render(Some(false))) {
            (Some(unset), Some(on), Some(off)) if on != off => Self {
                toggles: true,
                default_on: unset == on,
            },
            _ => Self::default(),
        }
    }
}

/// Where a chat answer's thought goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Thinking {
    /// No thought: thinking off, or a template that has none.
    Off,
    /// `<think>…</think>` at the start of `content` (no reasoning parser).
    Inline,
    /// The thought in `reasoning_content` (a reasoning parser, `separate_reasoning`).
    Separate,
}

impl Thinking {
    /// The thinking of a chat request on an engine with `template`, with or without a
    /// reasoning parser.
    pub(crate) fn of(
        template: ThinkingTemplate,
        reasoning_parser: bool,
        options: &Options,
    ) -> Self {
        let on = template.toggles && options.enable_thinking.unwrap_or(template.default_on);
        match (on, reasoning_parser && options.separate_reasoning) {
            (false, _) => Self::Off,
            (true, false) => Self::Inline,
            (true, true) => Self::Separate,
        }
    }
}

/// SGLang's reasoning split of generated text (thinking forced on, as it is for a request
/// with thinking on): leading `<think>` dropped; before `</think>` the reasoning, after it
/// the answer; no `</think>` yet, all reasoning.
pub(crate) fn split(text: &str) -> (&str, &str) {
    let mut body = text;
    while let Some(rest) = body.strip_prefix(THINK_START) {
        body = rest;
    }
    match body.find(THINK_END) {
        Some(at) => (
            body.get(..at).unwrap_or_default(),
            body.get(at + THINK_END.len()..).unwrap_or_default(),
        ),
        None => (body, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_follows_sglangs_parser() {
        assert_eq!(
            split("<think>\nhm\n</think>\n\nYes."),
            ("\nhm\n", "\n\nYes.")
        );
        assert_eq!(split("<think>\nstill thinking"), ("\nstill thinking", ""));
        assert_eq!(split("<think>"), ("", ""));
        assert_eq!(split("no tags"), ("no tags", ""));
    }

    #[test]
    fn thinking_follows_the_template_the_request_and_the_parser() {
        let qwen3 = ThinkingTemplate {
            toggles: true,
            default_on: true,
        };
        let mut options = Options::default();
        assert_eq!(Thinking::of(qwen3, false, &options), Thinking::Inline);
        assert_eq!(Thinking::of(qwen3, true, &options), Thinking::Separate);
        assert_eq!(
            Thinking::of(ThinkingTemplate::default(), true, &options),
            Thinking::Off
        );
        options.separate_reasoning = false;
        assert_eq!(Thinking::of(qwen3, true, &options), Thinking::Inline);
        options.enable_thinking = Some(false);
        assert_eq!(Thinking::of(qwen3, true, &options), Thinking::Off);
        let explicit = ThinkingTemplate {
            toggles: true,
            default_on: false,
        };
        assert_eq!(
            Thinking::of(explicit, true, &Options::default()),
            Thinking::Off
        );
        options.enable_thinking = Some(true);
        assert_eq!(Thinking::of(explicit, false, &options), Thinking::Inline);
    }
}
