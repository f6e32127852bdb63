//! Authentication: an API key becomes a tenant.
//!
//! Sits right under tracing, before the body is read, so an unauthenticated client cannot
//! make the gateway buffer 64 MiB. Keys arrive as `Authorization: Bearer KEY` or
//! `x-api-key: KEY`; the config holds only their SHA-256 digests, and lookup is by digest,
//! so comparing never touches the secret byte by byte. Keys never reach logs or metrics.
//!
//! Writes: the [`AuthContext`] extension.

use http::{header, HeaderMap, Request};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::config::Config;
use crate::error::GatewayError;

pub use crate::tenant::TenantPolicy;

/// Who is calling, as established by the API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthContext {
    /// The tenant's configured name.
    pub tenant: Arc<str>,
    /// What it may do.
    pub policy: Arc<TenantPolicy>,
}

/// The digest → tenant table of one config generation.
#[derive(Debug, Default)]
struct Directory {
    by_digest: HashMap<[u8; 32], Arc<TenantPolicy>>,
    anonymous: Option<Arc<TenantPolicy>>,
}

impl Directory {
    fn from_config(config: &Config) -> Self {
        let mut by_digest = HashMap::new();
        for tenant in &config.tenants {
            let policy = Arc::new(TenantPolicy::from_config(tenant));
            for hex in &tenant.api_key_sha256 {
                if let Some(digest) = decode_hex32(hex) {
                    by_digest.insert(digest, policy.clone());
                }
            }
        }
        Self {
            by_digest,
            anonymous: config
                .server
                .allow_anonymous
                .then(|| Arc::new(TenantPolicy::anonymous())),
        }
    }
}

/// The key table of one config generation (`runtime::process::live`): a reload builds a new one
/// with the new pools, so a revoked key stops working for new requests while in-flight
/// ones keep the context they got — and no request ever pairs one file's tenants with
/// another's pools. Immutable: a request reads it without a lock.
#[derive(Debug, Clone)]
pub struct ApiKeys {
    directory: Arc<Directory>,
}

pub use crate::tenant::ANONYMOUS_TENANT;

impl ApiKeys {
    /// Build the table from validated config (digests are 64 lowercase hex digits).
    pub fn from_config(config: &Config) -> Self {
        Self {
            directory: Arc::new(Directory::from_config(config)),
        }
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.directory.by_digest.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.directory.by_digest.is_empty()
    }

    /// Find the tenant for the request's key.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<AuthContext, GatewayError> {
        let directory = &self.directory;
        let policy = match presented_key(headers) {
            Some(key) => {
                let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
                directory.by_digest.get(&digest).cloned()
            }
            None => directory.anonymous.clone(),
        }
        .ok_or(GatewayError::Unauthenticated)?;
        Ok(AuthContext {
            tenant: policy.name.clone(),
            policy,
        })
    }
}

/// The hex SHA-256 of a key (defined with the config, whose `api_key_sha256` it fills).
pub use crate::config::hash_key;

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.to_str().ok()?.trim();
        let (scheme, key) = value.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| key.trim())
            .filter(|k| !k.is_empty());
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

fn decode_hex32(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// The tower predicate of the authentication stage.
#[derive(Debug, Clone)]
pub struct Authenticate {
    keys: ApiKeys,
}

impl<B> Predicate<Request<B>> for Authenticate {
    type Request = Request<B>;

    fn check(&mut self, mut request: Request<B>) -> Result<Request<B>, BoxError> {
        let context = self.keys.authenticate(request.headers())?;
        request.extensions_mut().insert(context);
        Ok(request)
    }
}

/// The authentication stage as a layer.
pub type AuthenticateLayer = FilterLayer<Authenticate>;

impl Authenticate {
    /// Authenticate against `keys`.
    pub fn layer(keys: ApiKeys) -> AuthenticateLayer {
        FilterLayer::new(Authenticate { keys })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn keys() -> ApiKeys {
        let mut by_digest = HashMap::new();
        let policy = TenantPolicy {
            name: Arc::from("acme"),
            ..TenantPolicy::anonymous()
        };
        by_digest.insert(
            decode_hex32(&hash_key("sk-acme")).unwrap(),
            Arc::new(policy),
        );
        ApiKeys {
            directory: Arc::new(Directory {
                by_digest,
                anonymous: None,
            }),
        }
    }

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn bearer_and_x_api_key_authenticate() {
        let k = keys();
        for h in [
            headers("authorization", "Bearer sk-acme"),
            headers("authorization", "bearer  sk-acme "),
            headers("x-api-key", "sk-acme"),
        ] {
            assert_eq!(&*k.authenticate(&h).unwrap().tenant, "acme");
        }
    }

    #[test]
    fn wrong_missing_or_malformed_keys_are_rejected() {
        let k = keys();
        for h in [
            HeaderMap::new(),
            headers("authorization", "Bearer sk-other"),
            headers("authorization", "Basic sk-acme"),
            headers("authorization", "sk-acme"),
        ] {
            assert!(matches!(
                k.authenticate(&h),
                Err(GatewayError::Unauthenticated)
            ));
        }
    }

    #[test]
    fn hash_key_matches_sha256sum() {
        // printf %s kvgate-demo-key | sha256sum
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
