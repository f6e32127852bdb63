//! The response extensions between the guard and its neighbours: what dispatch hands the
//! guard with an answer, and the mark rescue reads on a guarded stream.

use std::sync::Arc;

/// The prefill worker's whole answer in a PD request (a response extension set by
/// dispatch), with its buffer reservation, held until the guard has checked it.
#[derive(Debug, Clone)]
pub struct PrefillAnswer(pub bytes::Bytes, pub Arc<crate::load::BufferPermit>);

/// A non-streamed answer's bytes (a response extension set by dispatch): the guard checks
/// these and passes the body on untouched, so what the body holds until the client has it
/// (worker loads, the buffer budget's reservation) stays held.
#[derive(Debug, Clone)]
pub struct BufferedAnswer(pub bytes::Bytes);

/// Marks a response whose outcome is counted when its stream ends, not at the headers.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeAtStreamEnd;
