//! The client-facing API: which endpoints exist and how each request becomes one
//! [`InferenceRequest`], the single request model every later stage works on.
//!
//! OpenAI chat, OpenAI completions and SGLang `/generate` differ only here: parsing yields the
//! same typed extension for all three, so admission, routing, dispatch and the guard are one
//! pipeline.
//!
//! Reads: the buffered body (`Request<Bytes>`). Writes: the `InferenceRequest` extension.

pub mod catalog;
mod endpoint;
mod parse;
pub mod read_body;

pub use endpoint::Endpoint;
pub use parse::{parse_inference, ModelCatalog, Parse, ParseLayer};

use serde_json::{Map, Value};

/// One client request, whichever API it came through.
#[derive(Debug, Clone)]
pub struct InferenceRequest {
    /// The route it arrived on (and is forwarded to).
    pub endpoint: Endpoint,
    /// The gateway model name (`[[models]].name`).
    pub model: String,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// Number of prompts in the request (SGLang and completions batches); 1 for chat.
    pub batch: usize,
    /// The client's JSON object, forwarded after per-pool rewriting.
    pub body: Map<String, Value>,
}
