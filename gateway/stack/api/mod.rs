//! The client-facing API: which endpoints exist and how each request becomes one
//! [`InferenceRequest`], the single request model every later stage works on.
//!
//! OpenAI chat, OpenAI completions and SGLang `/generate` differ only here: parsing yields the
//! same typed extension for all three, so admission, routing, dispatch and the guard are one
//! pipeline.
//!
//! Reads: the buffered body (`Request<Bytes>`). Writes: the `InferenceRequest` extension.

mod anthropic_body;
pub mod catalog;
mod endpoint;
pub mod fields;
mod model_catalog;
mod parse;
pub mod pooling_view;
pub mod prompt_view;
pub mod raw;
pub mod read_body;
mod request;

pub use endpoint::{model_id, stored_response, Endpoint, EngineNeeds};
pub use model_catalog::ModelCatalog;
pub use parse::{parse_inference, Parse, ParseLayer};

pub use request::{bulk_fields, EngineDirectives, InferenceRequest, PromptInput, PromptView};
