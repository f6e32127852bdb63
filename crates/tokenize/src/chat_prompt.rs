//! A chat completions request's prompt as an engine prepares, renders and tokenizes it
//! (`prepare` has the engines' rules).

use crate::prepare::{
    self, ChatPrompt, ChatRequest, ChatRules, ModelInput, MultimodalPrompt, TokenRepeat,
};
use crate::{ModelTokenizer, TokenizeError};

impl ModelTokenizer {
    /// Whether the chat template renders a system message after the first turn (SGLang's
    /// `detect_inline_system_support`, probed once per model and cached): when it does
    /// not, a Responses request's system messages are coalesced into one leading block
    /// ([`prepare::responses`]).
    pub fn inline_system_support(&self) -> bool {
        *self.inline_system.get_or_init(|| {
            let sentinel = "__sglang_inline_system_sentinel__";
            let messages = serde_json::json!([
                {"role": "system", "content": "t"}, {"role": "user", "content": "t"},
                {"role": "system", "content": sentinel}, {"role": "user", "content": "t"},
            ]);
            self.apply_chat_template(&messages, None, false)
                .is_ok_and(|rendered| rendered.contains(sentinel))
        })
    }

    /// The prompt of a chat completions request as an engine of `rules` prepares and
    /// renders it (see [`prepare`]) for a text-only model: what [`Self::chat_prompt_ids`]
    /// tokenizes. Media parts are refused with the engine's message.
    pub fn chat_prompt(
        &self,
        rules: ChatRules,
        request: &ChatRequest<'_>,
    ) -> Result<ChatPrompt, TokenizeError> {
        self.chat_prompt_with_media(rules, request, ModelInput::TextOnly)
            .map(|p| p.prompt)
    }

    /// [`Self::chat_prompt`] for a model that takes `input`: for a multimodal model (SGLang's
    /// rules) each media part reaches the template as `{"type": "image"}` (`video`, `audio`)
    /// and is listed, in render order, beside the prompt. The render holds the template's
    /// placeholder for each; expanding it to the item's tokens is the caller's (the
    /// model's processor's) step. With [`ModelInput::TextOnly`] this is `chat_prompt`.
    pub fn chat_prompt_with_media(
        &self,
        rules: ChatRules,
        request: &ChatRequest<'_>,
        input: ModelInput,
    ) -> Result<MultimodalPrompt, TokenizeError> {
        let Some(template) = &self.template else {
            return Err(TokenizeError::NoChatTemplate);
        };
        let prepared = prepare::prepare(rules, request, template.formats(), input)?;
        let mut rendered = template.render_prepared(&prepared)?;
        if rules == ChatRules::LlamaCpp && self.adds_bos() {
            // `common_chat_template_direct_apply_impl`: the tokenizer adds BOS itself, so a
            // template's leading BOS text is removed.
            if let Some(bos) = self.bos_token_id.and_then(|id| self.inner.id_to_token(id)) {
                if let Some(rest) = rendered.strip_prefix(bos.as_str()) {
                    rendered = rest.to_owned();
                }
            }
        }
        let appended = match prepared.continuation {
            prepare::Continuation::AppendEncoded(text) => Some(text),
            _ => None,
        };
        let prompt = ChatPrompt {
            rendered,
            add_special_tokens: prepared.add_special_tokens,
            appended,
            repeats: Vec::new(),
        };
        Ok(MultimodalPrompt {
            prompt,
            media: prepared.media,
        })
    }

    /// The token ids of a chat prompt: the render without special tokens, then any appended
    /// text encoded on its own with special tokens less one leading BOS (SGLang's
    /// `continue_final_message`).
    pub fn chat_prompt_ids(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = if prompt.add_special_tokens {
            self.ids_fast(&prompt.rendered, true)?
        } else {
            self.ids_rendered_chat(&prompt.rendered)?
        };
        if let Some(text) = &prompt.appended {
            ids.extend(self.appended_ids(text)?);
        }
        if !prompt.repeats.is_empty() {
            ids = with_repeats(ids, &prompt.repeats);
        }
        Ok(ids)
    }

    /// The token count of a chat prompt (`chat_prompt_ids(prompt).len()`).
    pub fn count_chat_prompt(&self, prompt: &ChatPrompt) -> Result<usize, TokenizeError> {
        let mut n = if prompt.add_special_tokens {
            self.count_fast(&prompt.rendered, true)?
        } else {
            self.count_rendered_chat(&prompt.rendered)?
        };
        if let Some(text) = &prompt.appended {
            n += self.appended_ids(text)?.len();
        }
        let extra: usize = prompt.repeats.iter().map(|r| r.extra as usize).sum();
        Ok(n + extra)
    }

    /// Whether encoding with special tokens puts a BOS first.
    fn adds_bos(&self) -> bool {
        self.extra_bos.is_some()
            || self.post_processor_ids.as_ref().is_some_and(|(before, _)| {
                before
                    .first()
                    .is_some_and(|id| Some(*id) == self.bos_token_id)
            })
    }

    fn appended_ids(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let mut ids = self.encode(text, true)?;
        if ids.first().is_some_and(|&id| Some(id) == self.bos_token_id) {
            ids.remove(0);
        }
        Ok(ids)
    }
}

/// `ids` with each repeat's `extra` copies of its token after that token's next occurrence.
fn with_repeats(ids: Vec<u32>, repeats: &[TokenRepeat]) -> Vec<u32> {
    let extra: usize = repeats.iter().map(|r| r.extra as usize).sum();
    let mut out = Vec::with_capacity(ids.len() + extra);
    let mut pending = repeats.iter().peekable();
    for id in ids {
        out.push(id);
        if let Some(r) = pending.peek().filter(|r| r.token == id) {
            out.extend(std::iter::repeat_n(id, r.extra as usize));
            pending.next();
        }
    }
    out
}
