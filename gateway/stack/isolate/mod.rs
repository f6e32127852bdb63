//! Isolation stage (I5): strips every cache key a client sent, injects the tenant's own
//! `cache_salt` for pools that take one, and fingerprints the tenant's prompt for the leak
//! detector. Sits after routing (it needs the pool) and before the guard (which scans the
//! answer against the fingerprints).
//!
//! Fingerprinting splits the prompt's text (its tail) into units right here — no tokenizer,
//! no thread hop — so a tenant's own prompt is on record before its answer is read. Only
//! token-id prompts need the tokenizer (to decode them to text): that runs on the blocking
//! pool, and the guard waits for it before scanning.
//!
//! The guard gets the answer's leak scan from here ready-made ([`LeakWatch`]): it never
//! reads the store or the pools' switches itself.
//!
//! Reads: `AuthContext`, `InferenceRequest`, `RoutePlan`. Writes: [`LeakWatch`] (when the
//! request's leak mode is on).

pub mod leak;
mod salt;
mod watch;

pub use leak::FingerprintStore;
pub use salt::CacheSalter;
pub use watch::LeakWatch;

use bytes::Bytes;
use futures_util::future::{BoxFuture, FutureExt, Shared};
use http::Request;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::config::{Config, LeakMode};
use crate::stack::api::prompt_view::{Content, Prompts};
use crate::stack::api::{InferenceRequest, PromptView};
use crate::stack::auth::AuthContext;
use crate::stack::routing::RoutePlan;
use kvgate_tokenize::ModelTokenizer;
use leak::LeakDetectorConfig;

/// The fingerprinting of a prompt under way on the blocking pool.
type FingerprintJob = Shared<BoxFuture<'static, ()>>;

#[derive(Debug, Clone, Copy)]
struct PoolIsolation {
    cache_salt: bool,
    leak: LeakMode,
}

/// What isolation keeps for the life of the process, whatever reloads bring: the salt
/// secret and the leak detector's memory of recent prompts (a reload must not forget them:
/// a leak right after it would go unseen). `[isolation]` itself changes only with a restart.
#[derive(Debug, Clone)]
pub struct IsolationMemory {
    pub salter: CacheSalter,
    pub store: FingerprintStore,
    /// `isolation.fingerprint_bytes`: how much of a prompt's tail is fingerprinted.
    pub fingerprint_bytes: usize,
}

impl IsolationMemory {
    /// The secret from `isolation.salt_secret_env` (random per start without one) and an
    /// empty fingerprint store sized by `[isolation]`.
    pub fn from_config(config: &Config) -> Self {
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
        Self {
            salter: CacheSalter::new(&secret),
            store: FingerprintStore::new(LeakDetectorConfig {
                ngram: iso.ngram,
                window: iso.window,
                max_entries: iso.max_entries,
                min_matches: iso.min_matches,
            }),
            fingerprint_bytes: usize::try_from(iso.fingerprint_bytes.as_u64())
                .unwrap_or(usize::MAX),
        }
    }
}

/// Isolation's state for one generation: the process's memory, per-pool switches, the
/// models' tokenizers.
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
    /// Build from config over the process's `memory`; `tokenizers` by model name.
    pub fn new(
        config: &Config,
        tokenizers: HashMap<String, Arc<ModelTokenizer>>,
        memory: &IsolationMemory,
    ) -> Self {
        Self {
            salter: memory.salter.clone(),
            store: memory.store.clone(),
            pools: Self::pool_settings(config),
            tokenizers,
            fingerprint_bytes: memory.fingerprint_bytes,
        }
    }

    fn pool_settings(config: &Config) -> HashMap<String, PoolIsolation> {
        config
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
            .collect()
    }

    /// The leak mode of a pool.
    pub fn leak_mode(&self, pool: &str) -> LeakMode {
        self.pools.get(pool).map_or(LeakMode::Off, |p| p.leak)
    }

    /// The leak mode of one request: its pool's, or its tenant's where that is stricter.
    pub fn request_leak_mode(&self, pool: &str, auth: Option<&AuthContext>) -> LeakMode {
        let pool = self.leak_mode(pool);
        auth.map_or(pool, |a| a.policy.leak_mode(pool))
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
enum PromptMaterial<'a> {
    Texts(Vec<&'a str>),
    Ids(Vec<Vec<u32>>),
    /// The messages' text content, in order (the template's own tokens are the same for
    /// every tenant, so they would only make n-grams common).
    Chat(Vec<&'a str>),
}

fn material<'a>(view: &'a PromptView<'a>) -> PromptMaterial<'a> {
    match view {
        PromptView::Chat(messages) => {
            let mut texts = Vec::with_capacity(messages.len());
            for m in messages {
                match &m.content {
                    Content::Text(t) => texts.push(t.as_ref()),
                    Content::Parts(parts) => texts.extend(parts.iter().map(AsRef::as_ref)),
                    Content::None | Content::Other => {}
                }
            }
            PromptMaterial::Chat(texts)
        }
        PromptView::Samples(Prompts::Texts(texts)) => {
            PromptMaterial::Texts(texts.iter().map(AsRef::as_ref).collect())
        }
        PromptView::Samples(Prompts::Ids(ids)) => PromptMaterial::Ids(ids.clone()),
    }
}

/// The last `limit` bytes of `texts` (joined, one separator between them): the pieces a
/// prompt is fingerprinted from. Its key and its units both come from these, so a huge
/// prompt costs `limit` bytes of work either way.
fn tail_pieces<'a>(texts: &[&'a str], limit: usize) -> Vec<&'a str> {
    let total: usize = texts.iter().map(|t| t.len() + 1).sum();
    let mut skip = total.saturating_sub(limit);
    let mut pieces = Vec::with_capacity(texts.len());
    for t in texts {
        if skip > t.len() {
            skip -= t.len() + 1;
            continue;
        }
        pieces.push(tail(t, t.len().saturating_sub(skip)));
        skip = 0;
    }
    pieces
}

/// The units of `pieces` (whitespace between them).
fn units_of_pieces(pieces: &[&str]) -> Vec<u32> {
    let mut splitter = leak::units::TextUnits::new();
    let mut out = Vec::new();
    for piece in pieces {
        splitter.push(piece, &mut out);
        splitter.push("\n", &mut out);
    }
    splitter.finish(&mut out);
    out
}

/// Record a prompt given as text, keyed by the pieces it is fingerprinted from.
/// The texts of a `/v1/responses` request's prompt: `instructions`, then the input (a
/// string, or its items' text: message content, parts' `text`, tool outputs).
fn responses_texts(fields: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    use serde_json::Value;
    fn collect(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(items) => items.iter().for_each(|i| collect(i, out)),
            Value::Object(o) => ["content", "text", "output"]
                .iter()
                .filter_map(|k| o.get(*k))
                .for_each(|x| collect(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(Value::String(i)) = fields.get("instructions") {
        out.push(i.clone());
    }
    if let Some(input) = fields.get("input") {
        collect(input, &mut out);
    }
    out
}

fn record_text(store: &FingerprintStore, tenant: &str, texts: &[&str], limit: usize, now: Instant) {
    let pieces = tail_pieces(texts, limit);
    let key = leak::hash::text_key(&pieces, limit);
    store.record_text_prompt(tenant, key, now, || units_of_pieces(&pieces));
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
        let auth = request.extensions().get::<AuthContext>();
        let tenant = auth.map(|a| a.tenant.clone());
        let Some(pool) = request
            .extensions()
            .get::<RoutePlan>()
            .map(|p| p.pool.name.to_string())
        else {
            return Ok(request);
        };
        let leak = self.state.request_leak_mode(&pool, auth);
        let job = match &tenant {
            Some(tenant) => self.isolate(&mut request, tenant, &pool, leak),
            None => None,
        };
        // Handed over whenever the mode is on: the guard then reads the answer, and scans it
        // when the request has a tenant.
        if leak.is_on() {
            let source = tenant.map(|t| (self.state.store.clone(), t));
            request
                .extensions_mut()
                .insert(LeakWatch::new(leak, source, job));
        }
        Ok(request)
    }
}

impl Isolate {
    /// The tenant's cache salt, and its prompt on record for the leak detector: now for
    /// text, or by the returned job (token ids are decoded on the blocking pool first).
    fn isolate(
        &self,
        request: &mut Request<Bytes>,
        tenant: &Arc<str>,
        pool: &str,
        leak: LeakMode,
    ) -> Option<FingerprintJob> {
        let switches = self
            .state
            .pools
            .get(pool)
            .copied()
            .unwrap_or(PoolIsolation {
                cache_salt: false,
                leak: LeakMode::Off,
            });
        let parsed = request.extensions_mut().get_mut::<InferenceRequest>()?;
        // A client may never choose its cache namespace: dispatch drops every client cache
        // key (`api::fields`) and sends this tenant's salt where the pool takes one.
        if switches.cache_salt {
            parsed.directives.cache_salt = Some(self.state.salter.salt(tenant));
        }
        if !leak.is_on() {
            return None;
        }
        if parsed.endpoint == crate::stack::api::Endpoint::CreateResponse {
            // A Responses prompt is built from several fields: its texts, in order.
            let texts = responses_texts(&parsed.fields);
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            record_text(
                &self.state.store,
                tenant,
                &texts,
                self.state.fingerprint_bytes,
                Instant::now(),
            );
            return None;
        }
        // Read again from the client's bytes (checked by the parse stage): borrowed text,
        // no tree.
        let Ok(Some(view)) = parsed.prompt_view() else {
            return None;
        };
        let material = material(&view);
        let store = self.state.store.clone();
        let limit = self.state.fingerprint_bytes;
        let now = Instant::now();
        let all_ids = match material {
            PromptMaterial::Texts(texts) => {
                // One record per sample: each is its own sequence of KV pages.
                for t in texts {
                    record_text(&store, tenant, &[t], limit, now);
                }
                return None;
            }
            PromptMaterial::Chat(texts) => {
                record_text(&store, tenant, &texts, limit, now);
                return None;
            }
            PromptMaterial::Ids(all) => all,
        };
        // Token ids become text first: the tokenizer's decode, off the async threads.
        let tokenizer = self.state.tokenizer(&parsed.model).cloned()?;
        let tenant = tenant.clone();
        let task = tokio::task::spawn_blocking(move || {
            for ids in &all_ids {
                let tail_ids = &ids[ids.len().saturating_sub(limit / 4)..];
                if let Ok(text) = tokenizer.decode(tail_ids, false) {
                    store.record_prompt(
                        &tenant,
                        &units_of_pieces(&tail_pieces(&[&text], limit)),
                        now,
                    );
                }
            }
        });
        let job = async move {
            let _ = task.await;
        }
        .boxed()
        .shared();
        Some(job)
    }
}
