//! Isolation stage (I5): strips every cache key a client sent, injects the tenant's own
//! `cache_salt` for pools that take one, and fingerprints the tenant's prompt for the leak
//! detector. Sits after routing (it needs the pool) and before the guard (which scans the
//! answer against the fingerprints).
//!
//! Fingerprinting encodes the prompt's tail on the blocking pool; the guard waits for it
//! before scanning, so a tenant's own prompt is always on record before its answer is read.
//!
//! Reads: `AuthContext`, `InferenceRequest`, `RoutePlan`. Writes: [`FingerprintJob`].

pub mod leak;
mod salt;

pub use salt::CacheSalter;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::Request;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::config::{Config, LeakMode};
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::routing::RoutePlan;
use kvgate_tokenize::ModelTokenizer;
use leak::{FingerprintStore, LeakDetectorConfig};

/// The fingerprinting of this request's prompt, done or under way.
#[derive(Clone)]
pub struct FingerprintJob(pub Shared<BoxFuture<'static, ()>>);

impl std::fmt::Debug for FingerprintJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FingerprintJob")
    }
}

#[derive(Debug, Clone, Copy)]
struct PoolIsolation {
    cache_salt: bool,
    leak: LeakMode,
}

/// Shared state of isolation: the salter, the fingerprint store, per-pool switches.
#[derive(Debug)]
pub struct IsolationState {
    salter: CacheSalter,
    /// The leak detector's memory of recent prompts.
    pub store: FingerprintStore,
    pools: HashMap<String, PoolIsolation>,
    tokenizers: HashMap<String, Arc<ModelTokenizer>>,
    fingerprint_bytes: usize,
}

impl IsolationState {
    /// Build from config; `tokenizers` by model name.
    pub fn new(config: &Config, tokenizers: HashMap<String, Arc<ModelTokenizer>>) -> Self {
        let iso = &config.isolation;
        let secret = iso
            .salt_secret_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|s| !s.is_empty())
            .map(String::into_bytes)
            .unwrap_or_else(|| {
                tracing::warn!("no isolation.salt_secret_env secret: cache salts are random per start (replicas will not share prefix caches)");
                random_secret()
            });
        let pools = config
            .pools
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    PoolIsolation {
                        cache_salt: p.cache_salt,
                        leak: p.leak_detection,
                    },
                )
            })
            .collect();
        Self {
            salter: CacheSalter::new(&secret),
            store: FingerprintStore::new(LeakDetectorConfig {
                ngram: iso.ngram,
                window: iso.window,
                max_entries: iso.max_entries,
                min_matches: iso.min_matches,
            }),
            pools,
            tokenizers,
            fingerprint_bytes: usize::try_from(iso.fingerprint_bytes.as_u64())
                .unwrap_or(usize::MAX),
        }
    }

    /// The leak mode of a pool.
    pub fn leak_mode(&self, pool: &str) -> LeakMode {
        self.pools.get(pool).map_or(LeakMode::Off, |p| p.leak)
    }

    /// The tokenizer of a model (to turn answers into ids for scanning).
    pub fn tokenizer(&self, model: &str) -> Option<&Arc<ModelTokenizer>> {
        self.tokenizers.get(model)
    }

    /// The tenant's salt (tests and operators compare it with what engines received).
    pub fn salt(&self, tenant: &str) -> String {
        self.salter.salt(tenant)
    }
}

fn random_secret() -> Vec<u8> {
    let mut secret = vec![0u8; 32];
    crate::secure_random::fill(&mut secret);
    secret
}

/// The prompt texts (or ids) of a request, as owned data for the blocking pool.
enum PromptMaterial {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
    Chat(Value, Option<Value>),
}

fn material(parsed: &InferenceRequest) -> Option<PromptMaterial> {
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let from = |v: &Value| -> Option<PromptMaterial> {
        match v {
            Value::String(s) => Some(PromptMaterial::Texts(vec![s.clone()])),
            Value::Array(items) if items.iter().all(Value::is_string) => {
                Some(PromptMaterial::Texts(
                    items
                        .iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect(),
                ))
            }
            Value::Array(items) if items.iter().all(Value::is_array) => {
                Some(PromptMaterial::Ids(items.iter().filter_map(ids).collect()))
            }
            other => ids(other).map(|one| PromptMaterial::Ids(vec![one])),
        }
    };
    match parsed.endpoint {
        Endpoint::ChatCompletions => Some(PromptMaterial::Chat(
            parsed.prompt_value()?.clone(),
            parsed.fields.get("tools").cloned(),
        )),
        Endpoint::Completions | Endpoint::Generate => from(parsed.prompt_value()?),
        Endpoint::ListModels => None,
    }
}

fn tail(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The tower predicate of the isolation stage.
#[derive(Debug, Clone)]
pub struct Isolate {
    state: Arc<IsolationState>,
}

/// The isolation stage as a layer.
pub type IsolateLayer = FilterLayer<Isolate>;

impl Isolate {
    /// The stage over `state`.
    pub fn layer(state: Arc<IsolationState>) -> IsolateLayer {
        FilterLayer::new(Isolate { state })
    }
}

impl Predicate<Request<Bytes>> for Isolate {
    type Request = Request<Bytes>;

    fn check(&mut self, mut request: Request<Bytes>) -> Result<Request<Bytes>, BoxError> {
        let tenant = request
            .extensions()
            .get::<AuthContext>()
            .map(|a| a.tenant.clone());
        let pool = request
            .extensions()
            .get::<RoutePlan>()
            .map(|p| p.pool.name.to_string());
        let (Some(tenant), Some(pool)) = (tenant, pool) else {
            return Ok(request);
        };
        let switches = self
            .state
            .pools
            .get(&pool)
            .copied()
            .unwrap_or(PoolIsolation {
                cache_salt: false,
                leak: LeakMode::Off,
            });
        let Some(parsed) = request.extensions_mut().get_mut::<InferenceRequest>() else {
            return Ok(request);
        };
        // A client may never choose its cache namespace: dispatch drops every client cache
        // key (`api::fields`) and sends this tenant's salt where the pool takes one.
        if switches.cache_salt {
            parsed.directives.cache_salt = Some(self.state.salter.salt(&tenant));
        }
        if switches.leak == LeakMode::Off {
            return Ok(request);
        }
        let (Some(material), Some(tokenizer)) = (
            material(parsed),
            self.state.tokenizer(&parsed.model).cloned(),
        ) else {
            return Ok(request);
        };
        let store = self.state.store.clone();
        let limit = self.state.fingerprint_bytes;
        let task = tokio::task::spawn_blocking(move || {
            let now = std::time::Instant::now();
            let record = |ids: &[u32]| store.record_prompt(&tenant, ids, now);
            match material {
                PromptMaterial::Ids(all) => all
                    .iter()
                    .for_each(|ids| record(&ids[ids.len().saturating_sub(limit)..])),
                PromptMaterial::Texts(texts) => texts.iter().for_each(|t| {
                    if let Ok(ids) = tokenizer.encode(tail(t, limit), false) {
                        record(&ids);
                    }
                }),
                PromptMaterial::Chat(messages, tools) => {
                    if let Ok(rendered) =
                        tokenizer.apply_chat_template(&messages, tools.as_ref(), true)
                    {
                        if let Ok(ids) = tokenizer.encode(tail(&rendered, limit), false) {
                            record(&ids);
                        }
                    }
                }
            }
        });
        let job = async move {
            let _ = task.await;
        }
        .boxed()
        .shared();
        request.extensions_mut().insert(FingerprintJob(job));
        Ok(request)
    }
}
