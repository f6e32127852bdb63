//! What the engine will count: the prompt of every sample of a request, and how many new
//! tokens each may generate.
//!
//! - chat: the messages rendered through the model's chat template (with the generation
//!   prompt, as SGLang's OpenAI server does), encoded without special tokens;
//! - completions: `prompt` as a string, a list of strings, token ids or a list of token-id
//!   lists; strings are encoded with special tokens (SGLang's default);
//! - `/generate`: `text` (string or list) or `input_ids` (list or list of lists).
//!
//! Missing `max_tokens` / `max_new_tokens`: the model's `default_max_new_tokens` when
//! configured (and then sent to the engine, so it cannot generate more than was admitted);
//! otherwise the engines' own defaults — `/generate` 128 (SGLang `sampling_params`),
//! completions 16 (OpenAI), chat the rest of the context window (OpenAI/SGLang).

use crate::error::GatewayError;
use crate::stack::api::{Endpoint, InferenceRequest, PromptInput};

/// SGLang's `sampling_params.max_new_tokens` default.
pub const GENERATE_DEFAULT_MAX_NEW_TOKENS: u64 = 128;
/// OpenAI's (and SGLang's) `/v1/completions` `max_tokens` default.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u64 = 16;

/// How many new tokens a sample may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxNew {
    /// A number: from the client, the model default or the engine default.
    Tokens(u64),
    /// The rest of the context window (chat without `max_tokens`).
    RestOfWindow,
}

/// One sample of a request.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    pub input: PromptInput<'a>,
    pub max_new: MaxNew,
}

fn engine_default(endpoint: Endpoint) -> MaxNew {
    match endpoint {
        Endpoint::Generate => MaxNew::Tokens(GENERATE_DEFAULT_MAX_NEW_TOKENS),
        Endpoint::Completions => MaxNew::Tokens(COMPLETIONS_DEFAULT_MAX_TOKENS),
        // Neither caps new tokens by default: what fits is given and sent to the engine.
        Endpoint::ChatCompletions | Endpoint::CreateResponse => MaxNew::RestOfWindow,
        // Prefill-only requests generate nothing (their `requested_max_new` is 0 anyway);
        // the rest have no prompt.
        _ => MaxNew::Tokens(0),
    }
}

/// Every sample of `request` with its new-token allowance.
pub fn samples(
    request: &InferenceRequest,
    model_default: Option<u64>,
) -> Result<Vec<Sample<'_>>, GatewayError> {
    request
        .prompts()?
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            let max_new = match request.requested_max_new(i)? {
                Some(n) => MaxNew::Tokens(n),
                None => model_default.map_or(engine_default(request.endpoint), MaxNew::Tokens),
            };
            Ok(Sample { input, max_new })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::api::{parse_inference, ModelCatalog};
    use serde_json::Value;

    fn parse(endpoint: Endpoint, body: Value) -> InferenceRequest {
        let text = "[server]\nallow_anonymous = true\n[[models]]\nname = \"qwen3\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\ncontext_window = 100\n[[pools]]\nname = \"p\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{ url = \"http://127.0.0.1:1\" }]\n".to_string();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/x.toml");
        let cfg = crate::config::Config::from_toml(&text, &path).unwrap();
        parse_inference(
            endpoint,
            &bytes::Bytes::from(body.to_string()),
            &ModelCatalog::from_config(&cfg),
        )
        .unwrap()
    }

    #[test]
    fn defaults_follow_the_engines_unless_the_model_sets_one() {
        let g = parse(
            Endpoint::Generate,
            serde_json::json!({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 3}, {}]}),
        );
        let s = samples(&g, None).unwrap();
        assert_eq!(s[0].max_new, MaxNew::Tokens(3));
        assert_eq!(s[1].max_new, MaxNew::Tokens(128));
        let c = parse(
            Endpoint::ChatCompletions,
            serde_json::json!({"model": "qwen3", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(samples(&c, None).unwrap()[0].max_new, MaxNew::RestOfWindow);
        assert_eq!(
            samples(&c, Some(64)).unwrap()[0].max_new,
            MaxNew::Tokens(64)
        );
        let p = parse(
            Endpoint::Completions,
            serde_json::json!({"model": "qwen3", "prompt": [[1, 2, 3], [4]]}),
        );
        let s = samples(&p, None).unwrap();
        assert!(matches!(s[0].input, PromptInput::Ids(3)));
        assert!(matches!(s[1].input, PromptInput::Ids(1)));
        assert_eq!(s[0].max_new, MaxNew::Tokens(16));
    }

    #[test]
    fn model_default_is_sent_to_the_engine() {
        let mut g = parse(Endpoint::Generate, serde_json::json!({"text": "a"}));
        g.directives.default_max_new_tokens = Some(7);
        assert_eq!(g.directives.default_max_new_tokens, Some(7));
        assert_eq!(samples(&g, Some(7)).unwrap()[0].max_new, MaxNew::Tokens(7));
        let mut c = parse(
            Endpoint::ChatCompletions,
            serde_json::json!({"model": "qwen3", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}),
        );
        c.directives.default_max_new_tokens = Some(7);
        assert_eq!(samples(&c, Some(7)).unwrap()[0].max_new, MaxNew::Tokens(3));
    }

    #[test]
    fn bad_max_tokens_is_invalid() {
        let c = parse(
            Endpoint::Completions,
            serde_json::json!({"model": "qwen3", "prompt": "x", "max_tokens": -1}),
        );
        assert!(matches!(
            samples(&c, None),
            Err(GatewayError::InvalidRequest { .. })
        ));
    }
}
