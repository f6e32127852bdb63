//! Body buffering with a size bound: `Request<B>` becomes `Request<Bytes>`.
//!
//! The gateway must see the whole JSON before it can count tokens, so the body is read
//! here, after authentication and before parsing. A declared or actual size over
//! `server.max_body_bytes` is a 413, decided before the rest is read.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, Request};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower::filter::{AsyncFilterLayer, AsyncPredicate};

use crate::body::BoxError;
use crate::error::GatewayError;

/// The tower predicate of the body stage.
#[derive(Debug, Clone, Copy)]
pub struct ReadBody {
    limit: usize,
}

impl<B> AsyncPredicate<Request<B>> for ReadBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Future = BoxFuture<'static, Result<Request<Bytes>, BoxError>>;
    type Request = Request<Bytes>;

    fn check(&mut self, request: Request<B>) -> Self::Future {
        let limit = self.limit;
        Box::pin(async move {
            let declared = request
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit as u64) {
                return Err(GatewayError::BodyTooLarge { limit }.into());
            }
            let (parts, body) = request.into_parts();
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) if e.is::<LengthLimitError>() => {
                    return Err(GatewayError::BodyTooLarge { limit }.into())
                }
                Err(e) => {
                    return Err(GatewayError::invalid(
                        format!("could not read the request body: {e}"),
                        None,
                    )
                    .into())
                }
            };
            Ok(Request::from_parts(parts, bytes))
        })
    }
}

/// The body stage as a layer.
pub type ReadBodyLayer = AsyncFilterLayer<ReadBody>;

impl ReadBody {
    /// Buffer bodies of at most `limit` bytes.
    pub fn layer(limit: usize) -> ReadBodyLayer {
        AsyncFilterLayer::new(ReadBody { limit })
    }
}
