//! `[[tenants]]`: who may call the gateway (API keys, stored as SHA-256 digests) and within
//! which bounds.

use serde::Deserialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::adapter_name::AdapterName;
use super::files::resolve;
use super::invalid::Invalid;
use super::isolation::LeakMode;
use super::priority::Priority;

/// `[[tenants]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Hex SHA-256 digests of the tenant's API keys (never the keys themselves).
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// An environment variable holding keys (comma- or newline-separated); hashed at load.
    #[serde(default)]
    pub api_keys_env: Option<String>,
    /// A file holding keys, one per line (`#` comments); hashed at load.
    #[serde(default)]
    pub api_keys_file: Option<PathBuf>,
    /// Largest prompt this tenant may send, in tokens (an admission bound).
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// Largest `max_tokens` / `max_new_tokens` this tenant may ask for.
    #[serde(default)]
    pub max_new_tokens: Option<u64>,
    /// Models this tenant may use (empty: all).
    #[serde(default)]
    pub models: Vec<String>,
    /// Pools this tenant is pinned to (empty: any pool of the model).
    #[serde(default)]
    pub pools: Vec<String>,
    /// LoRA adapters this tenant may name in `lora_path` (adapter names as the engines
    /// registered them, never paths; empty: none).
    #[serde(default)]
    pub lora_adapters: Vec<String>,
    /// `chat_template_kwargs` keys this tenant may not send (403 `template_kwarg_not_allowed`);
    /// empty: every key is allowed, and counted as the engine renders it.
    #[serde(default)]
    pub denied_chat_template_kwargs: Vec<String>,
    /// Requests per minute (burst: the whole minute at once).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute: prompt + max new tokens reserved at admission, settled with the
    /// engine's reported usage when the response ends.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once (until the response body ends).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// May choose a pool of the model with the `x-kvgate-pool` header (testing a canary by
    /// hand, even at weight 0); others get 403 when they send it.
    #[serde(default)]
    pub choose_pool: bool,
    /// The leak detection of this tenant's answers where it is stricter than the pool's
    /// (`strict` for a tenant that must never receive a unit of a detected run; a tenant
    /// cannot lower a pool's mode, as the pool's mode protects the other tenants' prompts).
    #[serde(default)]
    pub leak_detection: Option<LeakMode>,
    /// Its share of served tokens against other tenants of the same class while a pool's
    /// queue is in use (weighted fair queuing): 2 gets twice the tokens of 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The class of its requests that send no `x-kvgate-priority` header.
    #[serde(default)]
    pub priority: Priority,
    /// The highest class its requests may ask for with `x-kvgate-priority` (default:
    /// `priority`); asking above it is 403 `priority_not_allowed`.
    #[serde(default)]
    pub max_priority: Option<Priority>,
}

fn default_weight() -> u32 {
    1
}

impl TenantConfig {
    /// The rules of one tenant; keys are relative to it (`api_key_sha256[0]`). Keys named
    /// by `api_keys_env` / `api_keys_file` are read and hashed into `api_key_sha256`, and
    /// every digest is lowercased.
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        if self.name.trim().is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        for (field, value) in [
            ("max_prompt_tokens", self.max_prompt_tokens),
            ("max_new_tokens", self.max_new_tokens),
        ] {
            if value == Some(0) {
                return Err(Invalid::new(
                    field,
                    "must be at least 1, or left out for no cap",
                ));
            }
        }
        if self.weight == 0 {
            return Err(Invalid::new(
                "weight",
                "must be at least 1 (its share of served tokens: 1 is the default, 2 gets twice as much)",
            ));
        }
        if self.max_priority() < self.priority {
            return Err(Invalid::new(
                "max_priority",
                format!(
                    "`{}` is below `priority = \"{}\"`; raise `max_priority` to at least `{}` or lower `priority`",
                    self.max_priority(),
                    self.priority,
                    self.priority
                ),
            ));
        }
        for name in &self.lora_adapters {
            AdapterName::parse(name).map_err(|e| Invalid::new("lora_adapters", e.to_string()))?;
        }
        if let Some(file) = self.api_keys_file.as_mut() {
            resolve(base, file, "api_keys_file")?;
        }
        let loaded = self.load_keys()?;
        self.api_key_sha256.extend(loaded);
        for (j, hash) in self.api_key_sha256.iter_mut().enumerate() {
            *hash = hash.to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Invalid::new(
                    format!("api_key_sha256[{j}]"),
                    "must be 64 hex digits: the SHA-256 of the key (`kvgate hash-key`, or `printf %s KEY | sha256sum`)",
                ));
            }
        }
        Ok(())
    }

    /// The highest class its requests may ask for: `max_priority`, else `priority`.
    pub fn max_priority(&self) -> Priority {
        self.max_priority.unwrap_or(self.priority)
    }

    /// Keys named by `api_keys_env` / `api_keys_file`, hashed (the keys themselves are
    /// dropped).
    fn load_keys(&self) -> Result<Vec<String>, Invalid> {
        let mut keys = Vec::new();
        if let Some(var) = &self.api_keys_env {
            let value = std::env::var(var).map_err(|_| {
                Invalid::new("api_keys_env", format!("environment variable `{var}` is not set (or not UTF-8); export it or remove the key"))
            })?;
            keys.extend(
                value
                    .split([',', '\n'])
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
            );
        }
        if let Some(path) = &self.api_keys_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Invalid::new(
                    "api_keys_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned),
            );
        }
        Ok(keys.iter().map(|k| hash_key(k)).collect())
    }
}

/// The rules of the `[[tenants]]` list: names unique, each tenant valid, each API key
/// belonging to one tenant.
pub(super) fn check_tenants(tenants: &mut [TenantConfig], base: &Path) -> Result<(), Invalid> {
    let mut names = HashSet::new();
    let mut key_hashes = HashSet::new();
    for (i, tenant) in tenants.iter_mut().enumerate() {
        // A repeated name was valid where it was first seen, so this comes first.
        if !names.insert(tenant.name.clone()) {
            return Err(Invalid::new(
                format!("tenants[{i}].name"),
                format!(
                    "`{}` is defined twice; tenant names must be unique",
                    tenant.name
                ),
            ));
        }
        tenant
            .check(base)
            .map_err(|e| e.under(&format!("tenants[{i}]")))?;
        for (j, hash) in tenant.api_key_sha256.iter().enumerate() {
            if !key_hashes.insert(hash.clone()) {
                return Err(Invalid::new(
                    format!("tenants[{i}].api_key_sha256[{j}]"),
                    "this key hash is listed twice; each API key belongs to one tenant",
                ));
            }
        }
    }
    Ok(())
}

/// The hex SHA-256 of a key, as `api_key_sha256` expects (`kvgate hash-key`).
pub fn hash_key(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
