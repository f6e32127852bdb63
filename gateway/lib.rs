//! kvgate: a multi-tenant admission and isolation gateway for LLM inference engines.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![forbid(unsafe_code)]

pub mod sim;
pub mod tokenize;
