//! The allowlists of the routes beyond chat, completions and `/generate`: the prefill-only
//! routes, kvgate's own tokenizer routes and `/v1/responses` (the table in `fields.rs`
//! says what happens to a field; these say which fields each route passes).

/// `/v1/embeddings`: OpenAI's fields (SGLang's `EmbeddingRequest` and vLLM's take them).
pub const EMBEDDING_FIELDS: [&str; 6] = [
    "model",
    "input",
    "encoding_format",
    "dimensions",
    "user",
    "lora_path",
];

/// SGLang `/v1/rerank` (`V1RerankReqInput`); `model` only selects the gateway model.
pub const RERANK_FIELDS: [&str; 5] = ["model", "query", "documents", "top_n", "return_documents"];

/// SGLang `/v1/score` (`ScoringRequest`), without its embedding overrides.
pub const SCORE_FIELDS: [&str; 8] = [
    "model",
    "query",
    "items",
    "label_token_ids",
    "apply_softmax",
    "temperature",
    "return_token_logprobs",
    "item_first",
];

/// `/tokenize`, answered by kvgate (SGLang's `TokenizeRequest`; a chat takes the template
/// fields chat completions take).
pub const TOKENIZE_FIELDS: [&str; 9] = [
    "model",
    "prompt",
    "messages",
    "tools",
    "add_special_tokens",
    "tool_choice",
    "chat_template_kwargs",
    "reasoning_effort",
    "continue_final_message",
];

/// `/detokenize`, answered by kvgate (SGLang's `DetokenizeRequest`).
pub const DETOKENIZE_FIELDS: [&str; 3] = ["model", "tokens", "skip_special_tokens"];

/// `/v1/responses` (SGLang's `ResponsesRequest`, sglang 0.5.23 `protocol.py`): the fields
/// that shape the prompt (counted by `kvgate_tokenize::prepare::responses`), sampling, and
/// `store` (a stored response is owned by its tenant: `stack::responses`).
pub const RESPONSES_FIELDS: [&str; 22] = [
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "previous_response_id",
    "store",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "truncation",
    "include",
    "user",
    "chat_template_kwargs",
    "seed",
];
