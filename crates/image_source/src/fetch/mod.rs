//! Remote images: [`ImageFetcher`] reads the start of an `https://` (or, where the policy
//! says, `http://`) image, refusing every way a URL could reach what it should not.
//!
//! Per hop: parse and check the URL (`target`), resolve the name once and check every
//! address (`connect::checked_addresses`), connect to a checked address and send the GET
//! over that socket (`connect::send`). A 3xx with `Location` starts the next hop from
//! scratch; anything else ends the walk. The final body is read by `body::read`. The whole
//! walk runs under the policy's one timeout.

use std::sync::Arc;

use http::header::{CONTENT_ENCODING, CONTENT_TYPE, LOCATION};
use http::StatusCode;

use crate::enough::{Enough, Prefix};
use crate::policy::FetchPolicy;
use crate::resolve::{Resolve, SystemResolver};

mod body;
mod connect;
mod error;
mod target;

#[cfg(test)]
mod tests;

pub use error::{FetchError, SetupError};
use target::Target;

/// Fetches the start of remote images under a [`FetchPolicy`].
#[derive(Clone)]
pub struct ImageFetcher {
    policy: Arc<FetchPolicy>,
    resolver: Arc<dyn Resolve>,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for ImageFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageFetcher")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

// === impl ImageFetcher ===

impl ImageFetcher {
    /// A fetcher with the system's resolver and CA certificates. The certificates are read
    /// only when the policy fetches at all; none to read is then an error.
    pub fn new(policy: FetchPolicy) -> Result<Self, SetupError> {
        let mut roots = rustls::RootCertStore::empty();
        if policy.allowed {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                let errors: Vec<String> = native.errors.iter().map(|e| e.to_string()).collect();
                return Err(SetupError::NoRoots(if errors.is_empty() {
                    "none found".into()
                } else {
                    errors.join("; ")
                }));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| SetupError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // The request goes out as HTTP/1.1 over the pinned socket.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self::with_tls_config(policy, Arc::new(tls)))
    }

    /// A fetcher with the system's resolver and the given TLS settings (an internal CA, or
    /// a test's).
    pub fn with_tls_config(policy: FetchPolicy, tls: Arc<rustls::ClientConfig>) -> Self {
        Self {
            policy: Arc::new(policy),
            resolver: Arc::new(SystemResolver),
            tls,
        }
    }

    /// The same fetcher resolving names through `resolver`.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Its policy.
    pub fn policy(&self) -> &FetchPolicy {
        &self.policy
    }

    /// Read the start of the image at `url`: the body is read until `enough` says
    /// [`Enough::Yes`] (then the connection is dropped), the body ends, or more than the
    /// policy's `max_bytes` would be needed; all within the policy's timeout.
    pub async fn fetch(
        &self,
        url: &str,
        mut enough: impl FnMut(&[u8]) -> Enough + Send,
    ) -> Result<Prefix, FetchError> {
        if !self.policy.allowed {
            return Err(FetchError::Disabled);
        }
        let after = self.policy.timeout;
        match tokio::time::timeout(after, self.walk(url, &mut enough)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout { after }),
        }
    }

    async fn walk(
        &self,
        url: &str,
        enough: &mut (dyn FnMut(&[u8]) -> Enough + Send),
    ) -> Result<Prefix, FetchError> {
        let policy = &*self.policy;
        let mut target = Target::parse(url, policy)?;
        let mut redirects = 0;
        loop {
            let addrs = connect::checked_addresses(&target, policy, &*self.resolver).await?;
            let (response, connection) = connect::send(&target, &addrs, &self.tls).await?;
            let status = response.status();
            if is_redirect(status) {
                if redirects == policy.max_redirects {
                    return Err(FetchError::TooManyRedirects {
                        max: policy.max_redirects,
                    });
                }
                let location = response
                    .headers()
                    .get(LOCATION)
                    .ok_or_else(|| FetchError::Redirect {
                        reason: format!("HTTP {} without a Location", status.as_u16()),
                    })?
                    .to_str()
                    .map_err(|_| FetchError::Redirect {
                        reason: "Location is not text".into(),
                    })?;
                let next = target.redirect(location, policy)?;
                tracing::debug!(from = %target.url, to = %next.url, "image URL redirected");
                // This hop's connection closes here, before the next one opens.
                drop((response, connection));
                target = next;
                redirects += 1;
                continue;
            }
            if !status.is_success() {
                return Err(FetchError::Status {
                    status: status.as_u16(),
                });
            }
            check_headers(response.headers())?;
            let prefix = body::read(
                response.into_body(),
                target.host_str(),
                policy.max_bytes,
                enough,
            )
            .await;
            drop(connection);
            return prefix;
        }
    }
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// An image's headers: an image content type (or none that says otherwise), no encoding.
///
/// `application/octet-stream` (and `binary/octet-stream`, S3's old default) are accepted,
/// as is no `Content-Type` at all (RFC 9110 lets a recipient treat that as octet-stream):
/// object stores serve uploaded images that way, and the caller's header parser reads the
/// magic bytes anyway, so an octet-stream that is not an image is still refused. Any other
/// type (`text/html`: a login page, an error page) is not an image.
fn check_headers(headers: &http::HeaderMap) -> Result<(), FetchError> {
    if let Some(value) = headers.get(CONTENT_TYPE) {
        let text = String::from_utf8_lossy(value.as_bytes());
        let essence = text
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let ok = essence
            .strip_prefix("image/")
            .is_some_and(|sub| !sub.is_empty())
            || essence == "application/octet-stream"
            || essence == "binary/octet-stream";
        if !ok {
            return Err(FetchError::ContentType {
                content_type: text.into_owned(),
            });
        }
    }
    if let Some(value) = headers.get(CONTENT_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        if !text.trim().eq_ignore_ascii_case("identity") {
            return Err(FetchError::ContentEncoding {
                encoding: text.into_owned(),
            });
        }
    }
    Ok(())
}
