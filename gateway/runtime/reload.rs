//! Reload: re-read the config file and swap in what may change without a restart, and read
//! every certificate file again. Used by the admin port (`POST /reload`) and the SIGHUP
//! handler of `kvgate serve`; kept apart from `app` so the admin port does not depend on
//! the gateway that owns it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Config, ConfigError};
use crate::stack::auth::ApiKeys;
use crate::tls::{CertWatch, TlsError};

/// Re-reads the config file and swaps in its tenants and keys, and reads the certificates
/// of the data port and of TLS to engines again (SIGHUP, admin `POST /reload`). Requests in
/// flight keep the tenant context they were admitted with, and open connections their
/// certificates; pools and models are not changed by a reload (restart for those).
#[derive(Debug, Clone)]
pub struct Reloader {
    pub(crate) path: PathBuf,
    pub(crate) keys: ApiKeys,
    pub(crate) certs: Option<Arc<CertWatch>>,
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("certificates not reloaded, the running ones are kept: {0}")]
    Certificates(#[from] TlsError),
}

impl ReloadError {
    /// The error code of the admin port's answer.
    pub fn code(&self) -> &'static str {
        match self {
            ReloadError::Config(_) => "invalid_config",
            ReloadError::Certificates(_) => "invalid_certificate",
        }
    }
}

impl Reloader {
    /// Reload now: the config file first (an invalid one changes nothing), then the
    /// certificates (a failure there keeps the running tenants too), then the tenants.
    pub fn reload(&self) -> Result<serde_json::Value, ReloadError> {
        let config = Config::load(&self.path)?;
        let tls = self.certs.as_ref().map(|c| c.reload_all());
        if let Some(e) = tls.as_ref().and_then(|t| t.error()) {
            return Err(e.clone().into());
        }
        let keys = self.keys.reload(&config);
        tracing::info!(
            tenants = config.tenants.len(),
            keys,
            "reloaded tenants and API keys"
        );
        Ok(serde_json::json!({
            "reloaded": true,
            "tenants": config.tenants.len(),
            "keys": keys,
            "certificates": tls.map(|t| t.to_json()),
        }))
    }
}
