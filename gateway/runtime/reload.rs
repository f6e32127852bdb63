//! Reload: re-read the config file and swap in what may change without a restart. Used by
//! the admin port (`POST /reload`) and the SIGHUP handler of `kvgate serve`; kept apart from
//! `app` so the admin port does not depend on the gateway that owns it.

use std::path::PathBuf;

use crate::config::Config;
use crate::stack::auth::ApiKeys;

/// Re-reads the config file and swaps in its tenants and keys (SIGHUP, admin `POST /reload`).
/// Requests in flight keep the tenant context they were admitted with; pools and models
/// are not changed by a reload (restart for those).
#[derive(Debug, Clone)]
pub struct Reloader {
    pub(crate) path: PathBuf,
    pub(crate) keys: ApiKeys,
}

impl Reloader {
    /// Reload now. An invalid file leaves the running tenants untouched.
    pub fn reload(&self) -> Result<serde_json::Value, crate::config::ConfigError> {
        let config = Config::load(&self.path)?;
        let keys = self.keys.reload(&config);
        tracing::info!(
            tenants = config.tenants.len(),
            keys,
            "reloaded tenants and API keys"
        );
        Ok(serde_json::json!({"reloaded": true, "tenants": config.tenants.len(), "keys": keys}))
    }
}
