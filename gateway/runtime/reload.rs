//! Reload: re-read the config file and swap in what may change without a restart. Used by
//! the admin port (`POST /reload`) and the SIGHUP handler of `kvgate serve`; kept apart from
//! `app` so the admin port does not depend on the gateway that owns it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::config::Config;
use crate::stack::auth::ApiKeys;

/// Re-reads the config file and swaps in its tenants and keys (SIGHUP, admin `POST /reload`).
/// Requests in flight keep the tenant context they were admitted with; pools and models
/// are not changed by a reload (restart for those).
#[derive(Debug, Clone)]
pub struct Reloader {
    pub(crate) path: PathBuf,
    pub(crate) keys: ApiKeys,
    /// Shared by every clone (SIGHUP handler, admin port), so each sees the last reload
    /// whoever triggered it.
    last: Arc<Mutex<Option<LastReload>>>,
}

/// The last reload, as the status page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    /// When it finished.
    pub at: SystemTime,
    /// Ok, or why the file was refused (the running config was kept).
    pub result: Result<(), String>,
}

impl Reloader {
    /// Reload `keys` from the config file at `path`.
    pub fn new(path: PathBuf, keys: ApiKeys) -> Self {
        Self {
            path,
            keys,
            last: Arc::default(),
        }
    }

    /// Reload now. An invalid file leaves the running tenants untouched.
    pub fn reload(&self) -> Result<serde_json::Value, crate::config::ConfigError> {
        let result = self.swap();
        let record = LastReload {
            at: SystemTime::now(),
            result: result.as_ref().map(|_| ()).map_err(ToString::to_string),
        };
        // A panic elsewhere while holding the lock left a whole record: keep using it.
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(record);
        result
    }

    /// The last reload since start, if any.
    pub fn last(&self) -> Option<LastReload> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn swap(&self) -> Result<serde_json::Value, crate::config::ConfigError> {
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
