//! `/v1/responses` state that outlives one request.
//!
//! SGLang keeps a stored response (`store: true`, the default) in the one engine process
//! that served it (`serving_responses.py`: `response_store`, `msg_store`): a later request
//! naming it (`previous_response_id`, `GET /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`) succeeds only on that worker, and would leak one
//! tenant's conversation to another if any tenant could name it. [`owners`] records, per
//! response id, the tenant, pool and worker that hold it, in memory and, when the gateway
//! has Redis, shared across replicas.
//!
//! [`ownership`] is the stage that records owners and checks them (another tenant's id
//! answers 404, as if it did not exist; an owner store that cannot answer, 503) and pins
//! a request naming a stored response to its worker; [`proxy`] answers `GET
//! /v1/responses/{id}` and its `cancel` from that worker.

pub mod owners;
pub mod ownership;
pub mod proxy;

pub use owners::{OwnersError, ResponseOwner, ResponseOwners, MAX_ID_BYTES};
pub use ownership::{Continuation, ResponseOwnership};
pub use proxy::StoredResponseProxy;
