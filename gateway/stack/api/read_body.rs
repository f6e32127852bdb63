//! Body buffering with a size bound, deadlines and the memory budget: `Request<B>` becomes
//! `Request<Bytes>`.
//!
//! The gateway must see the whole JSON before it can count tokens, so the body is read
//! here, after authentication and before parsing. A declared or actual size over
//! `server.max_body_bytes` is a 413, decided before the rest is read; a client that pauses
//! longer than `server.body_idle_timeout` between chunks, or takes longer than
//! `server.body_timeout` in all, gets 408; bytes the shared buffer budget cannot hold now
//! are a 503 `overloaded`. The budget's reservation rides on as a request extension.

use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{header, Request};
use http_body::Body;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::filter::{AsyncFilterLayer, AsyncPredicate};

use crate::body::BoxError;
use crate::error::GatewayError;
use crate::load::{BufferBudget, BufferPermit};

/// Limits of the body stage.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// `server.max_body_bytes`.
    pub max_bytes: usize,
    /// `server.body_idle_timeout`.
    pub idle_timeout: Duration,
    /// `server.body_timeout`.
    pub total_timeout: Duration,
    /// The shared budget of buffered bytes.
    pub budget: BufferBudget,
}

/// The tower predicate of the body stage.
#[derive(Debug, Clone)]
pub struct ReadBody {
    limits: BodyLimits,
}

impl<B> AsyncPredicate<Request<B>> for ReadBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Future = BoxFuture<'static, Result<Request<Bytes>, BoxError>>;
    type Request = Request<Bytes>;

    fn check(&mut self, request: Request<B>) -> Self::Future {
        let limits = self.limits.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let (bytes, permit) = read(&limits, &parts.headers, body).await?;
            parts.extensions.insert(Arc::new(permit));
            Ok(Request::from_parts(parts, bytes))
        })
    }
}

async fn read<B>(
    limits: &BodyLimits,
    headers: &http::HeaderMap,
    body: B,
) -> Result<(Bytes, BufferPermit), GatewayError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit = limits.max_bytes;
    let too_large = || GatewayError::BodyTooLarge { limit };
    let overloaded = || {
        ::metrics::counter!(crate::metrics::LOAD_SHED_TOTAL, "ceiling" => "buffered_bytes")
            .increment(1);
        GatewayError::Overloaded {
            ceiling: "buffered request bytes",
        }
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut permit = BufferPermit::default();
    if let Some(n) = declared {
        if !limits.budget.reserve(&mut permit, n) {
            return Err(overloaded());
        }
    }
    let deadline = Instant::now() + limits.total_timeout;
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize));
    loop {
        let wait = limits
            .idle_timeout
            .min(deadline.saturating_duration_since(Instant::now()));
        let frame = match tokio::time::timeout(wait, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                let e: BoxError = e.into();
                return Err(GatewayError::invalid(
                    format!("could not read the request body: {e}"),
                    None,
                ));
            }
            Err(_) if Instant::now() >= deadline => {
                return Err(GatewayError::RequestTimeout {
                    what: "server.body_timeout",
                    timeout: limits.total_timeout,
                })
            }
            Err(_) => {
                return Err(GatewayError::RequestTimeout {
                    what: "no data for server.body_idle_timeout",
                    timeout: limits.idle_timeout,
                })
            }
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(too_large());
        }
        if !limits.budget.reserve(&mut permit, len as u64) {
            return Err(overloaded());
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf.freeze(), permit))
}

/// The body stage as a layer.
pub type ReadBodyLayer = AsyncFilterLayer<ReadBody>;

impl ReadBody {
    /// Buffer bodies within `limits`.
    pub fn layer(limits: BodyLimits) -> ReadBodyLayer {
        AsyncFilterLayer::new(ReadBody { limits })
    }
}
