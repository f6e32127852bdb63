//! The response guard: reads every SSE stream coming back from an engine and keeps aborted, refused or placeholder results from reaching clients as successes.

pub mod sse;
