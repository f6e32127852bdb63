//! The request path, one module per stage of [`crate::build_stack`], in stack order.
//! Each stage's module holds what only it uses; [`stage`] is the shared Layer/Service
//! plumbing of the async stages below `read_body`, [`shell`] that of the stages above it
//! (generic over the request body).

pub mod shell;
pub mod stage;

pub mod admission;
pub mod anthropic_reply;
pub mod api;
pub mod auth;
pub mod dispatch;
pub mod guard;
pub mod header_limits;
pub mod isolate;
pub mod load_shed;
pub mod local_answer;
pub mod observe;
pub mod priority;
pub mod rate_limit;
pub mod request_id;
pub mod rescue;
pub mod responses;
pub mod routing;
pub mod stage_span;
pub mod tenant_rules;
pub mod trace_context;
