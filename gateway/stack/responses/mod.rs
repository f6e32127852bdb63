//! `/v1/responses` state that outlives one request.
//!
//! SGLang keeps a stored response (`store: true`, the default) in the one engine process
//! that served it (`serving_responses.py`: `response_store`, `msg_store`): a later request
//! naming it (`previous_response_id`, `GET /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`) succeeds only on that worker, and would leak one
//! tenant's conversation to another if any tenant could name it. [`owners`] records, per
//! response id, the tenant, pool and worker that hold it (and the stored conversation's
//! tokens, for admission's estimate of the follow-up's prompt), in memory and, when the
//! gateway has Redis, shared across replicas.
//!
//! Reads and writes no request extension: the Responses route records an owner when an
//! engine's answer names a stored response and looks it up before routing a request that
//! names one (another tenant's id answers 404, as if it did not exist; an owner store that
//! cannot answer, 503).

pub mod owners;

pub use owners::{OwnersError, ResponseOwner, ResponseOwners, MAX_ID_BYTES};
