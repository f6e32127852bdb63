//! The tenant series of one config: every tenant × model counter handle and every pool ×
//! class latency histogram, registered (at zero) when the config is loaded, looked up by
//! the request path without building a key.

use metrics::{Counter, Histogram};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use super::window::TenantHour;
use super::{Outcome, TokenUsage};
use crate::config::{Config, Priority};
use crate::metrics::{
    INTER_TOKEN_SECONDS, TENANT_CACHED_TOKENS_TOTAL, TENANT_COMPLETION_TOKENS_TOTAL,
    TENANT_PROMPT_TOKENS_TOTAL, TENANT_REQUESTS_TOTAL, TENANT_UNREPORTED_USAGE_TOTAL,
    TIME_TO_FIRST_TOKEN_SECONDS,
};
use crate::tenant::ANONYMOUS_TENANT;

/// The counters of one tenant × model, and the tenant's last hour.
#[derive(Debug)]
pub struct TenantSeries {
    pub(super) tenant: Arc<str>,
    pub(super) model: Arc<str>,
    requests: [Counter; Outcome::ALL.len()],
    prompt: Counter,
    completion: Counter,
    cached: Counter,
    unreported: Counter,
    pub(super) hour: Arc<TenantHour>,
}

impl TenantSeries {
    fn register(tenant: &Arc<str>, model: &Arc<str>, hour: Arc<TenantHour>) -> Self {
        let labels = |name: &'static str| ::metrics::counter!(name, "tenant" => tenant.to_string(), "model" => model.to_string());
        let requests = Outcome::ALL.map(|o| {
            ::metrics::counter!(
                TENANT_REQUESTS_TOTAL,
                "tenant" => tenant.to_string(),
                "model" => model.to_string(),
                "outcome" => o.label()
            )
        });
        let series = Self {
            tenant: tenant.clone(),
            model: model.clone(),
            requests,
            prompt: labels(TENANT_PROMPT_TOKENS_TOTAL),
            completion: labels(TENANT_COMPLETION_TOKENS_TOTAL),
            cached: labels(TENANT_CACHED_TOKENS_TOTAL),
            unreported: labels(TENANT_UNREPORTED_USAGE_TOTAL),
            hour,
        };
        // Exported at zero from now on: a counter appears in the exporter once registered,
        // and an `increment(0)` makes that explicit whatever the recorder does.
        for c in series.requests.iter().chain([
            &series.prompt,
            &series.completion,
            &series.cached,
            &series.unreported,
        ]) {
            c.increment(0);
        }
        series
    }

    /// Count one request's outcome and what the engine reported it used.
    pub(super) fn count(&self, outcome: Outcome, usage: Option<TokenUsage>) {
        self.requests[outcome.index()].increment(1);
        match usage {
            Some(u) => {
                self.prompt.increment(u.prompt);
                self.completion.increment(u.completion);
                self.cached.increment(u.cached);
            }
            // Served without a usage report (an engine that sends none, a pool whose guard
            // is off): counted here so a bill knows its tokens are incomplete.
            None if outcome == Outcome::Ok => self.unreported.increment(1),
            None => {}
        }
        self.hour.add(outcome, usage);
    }
}

/// The TTFT and inter-token histograms of one pool, by class.
#[derive(Debug)]
pub(super) struct PoolLatency {
    pub(super) ttft: [Histogram; Priority::ALL.len()],
    pub(super) itl: [Histogram; Priority::ALL.len()],
}

impl PoolLatency {
    fn register(pool: &str) -> Self {
        let h = |name: &'static str, class: Priority| ::metrics::histogram!(name, "pool" => pool.to_owned(), "class" => class.as_str());
        Self {
            ttft: Priority::ALL.map(|c| h(TIME_TO_FIRST_TOKEN_SECONDS, c)),
            itl: Priority::ALL.map(|c| h(INTER_TOKEN_SECONDS, c)),
        }
    }
}

/// The series of one config.
#[derive(Debug, Default)]
pub struct Book {
    /// tenant → model → series (looked up by `&str`: no key is built per request).
    tenants: HashMap<Arc<str>, HashMap<Arc<str>, Arc<TenantSeries>>>,
    pub(super) pools: HashMap<Arc<str>, PoolLatency>,
    /// Each tenant's last hour, in config order (the status page's rows).
    hours: Vec<Arc<TenantHour>>,
}

impl Book {
    /// The series of `tenant` using `model`, when both are in the config.
    pub fn series(&self, tenant: &str, model: &str) -> Option<Arc<TenantSeries>> {
        self.tenants.get(tenant)?.get(model).cloned()
    }

    /// Every configured tenant's last hour, in config order.
    pub fn hours(&self) -> &[Arc<TenantHour>] {
        &self.hours
    }
}

/// The process's accounting: the book of the config in force (replaced by a reload; the
/// counters and each tenant's last hour carry over, they are the same series).
#[derive(Debug, Default)]
pub struct Accounting {
    book: RwLock<Arc<Book>>,
}

impl Accounting {
    /// The book of `config`, registering every series it names at zero.
    pub fn new(config: &Config) -> Self {
        let accounting = Self::default();
        accounting.configure(config);
        accounting
    }

    /// Install the book of `config` (at start and on every reload): series of new tenants,
    /// models and pools are registered at zero; existing ones keep their handles and hours.
    pub fn configure(&self, config: &Config) {
        // The other series the config names exist at zero too (one hook for start and
        // reload).
        crate::metrics::zero::register(config);
        let previous = self.book();
        let mut names: Vec<Arc<str>> = config
            .tenants
            .iter()
            .map(|t| Arc::from(t.name.as_str()))
            .collect();
        if config.server.allow_anonymous {
            names.push(Arc::from(ANONYMOUS_TENANT));
        }
        let mut book = Book::default();
        for tenant in names {
            let hour = previous
                .hours
                .iter()
                .find(|h| h.tenant() == &*tenant)
                .cloned()
                .unwrap_or_else(|| Arc::new(TenantHour::new(tenant.clone())));
            let models = config
                .models
                .iter()
                .map(|m| {
                    let model: Arc<str> = Arc::from(m.name.as_str());
                    let series = previous.series(&tenant, &model).unwrap_or_else(|| {
                        Arc::new(TenantSeries::register(&tenant, &model, hour.clone()))
                    });
                    (model, series)
                })
                .collect();
            book.hours.push(hour);
            book.tenants.insert(tenant, models);
        }
        for pool in &config.pools {
            book.pools.insert(
                Arc::from(pool.name.as_str()),
                PoolLatency::register(&pool.name),
            );
        }
        *self.book.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(book);
    }

    /// The book in force.
    pub fn book(&self) -> Arc<Book> {
        self.book
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
