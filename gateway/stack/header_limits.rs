//! Header limits: one header value over `server.max_header_value_bytes`, or all headers
//! over `server.max_header_bytes`, is 431 before anything else runs. (hyper enforces the
//! total while reading — HTTP/1 `max_header_size`, HTTP/2 `max_header_list_size` — so an
//! unfinished giant header never grows its buffer; this stage adds the per-value limit and
//! the JSON answer.)

use http::Request;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::error::GatewayError;

/// The tower predicate of the header-limits stage.
#[derive(Debug, Clone, Copy)]
pub struct HeaderLimits {
    max_value: usize,
    max_total: usize,
}

/// The header-limits stage as a layer.
pub type HeaderLimitsLayer = FilterLayer<HeaderLimits>;

impl HeaderLimits {
    /// At most `max_value` bytes per value and `max_total` for all headers.
    pub fn new(max_value: usize, max_total: usize) -> Self {
        HeaderLimits {
            max_value,
            max_total,
        }
    }

    /// The stage as a layer.
    pub fn layer(self) -> HeaderLimitsLayer {
        FilterLayer::new(self)
    }
}

impl<B> Predicate<Request<B>> for HeaderLimits {
    type Request = Request<B>;

    fn check(&mut self, request: Request<B>) -> Result<Request<B>, BoxError> {
        let mut total = 0usize;
        for (name, value) in request.headers() {
            if value.len() > self.max_value {
                return Err(GatewayError::HeaderTooLarge {
                    what: format!("`{name}`"),
                    limit: self.max_value,
                }
                .into());
            }
            // As HTTP/2 counts a header list: name, value and 32 bytes of overhead.
            total += name.as_str().len() + value.len() + 32;
        }
        if total > self.max_total {
            return Err(GatewayError::HeaderTooLarge {
                what: "block".into(),
                limit: self.max_total,
            }
            .into());
        }
        Ok(request)
    }
}
