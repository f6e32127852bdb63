//! One request's account: whose it is, what the engine reported it used, how its tokens
//! came, and how it ended; settled into the tenant's series once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::book::{Book, TenantSeries};
use super::{Outcome, TokenUsage};
use crate::config::Priority;

/// The request extension (cloned: one shared account per request).
#[derive(Debug, Clone)]
pub struct Ledger(Arc<Cell>);

#[derive(Debug)]
struct Cell {
    book: Arc<Book>,
    /// When the gateway received the request (time to first token counts from here).
    started: Instant,
    entry: Mutex<Entry>,
}

#[derive(Debug, Default)]
struct Entry {
    series: Option<Arc<TenantSeries>>,
    /// The pool's key in the book (no string is built per request).
    pool: Option<Arc<str>>,
    class: Priority,
    usage: Option<TokenUsage>,
    outcome: Option<Outcome>,
    /// Of a stream: when its first and last events went to the client.
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    settled: bool,
}

/// What the audit line of a request carries of its account.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerSnapshot {
    /// The tenant and model it is counted for (both from the config).
    pub tenant: Option<Arc<str>>,
    pub model: Option<Arc<str>>,
    pub usage: Option<TokenUsage>,
    /// Time to first token (streams).
    pub ttft: Option<Duration>,
    /// Mean time between tokens after the first (streams of two or more tokens).
    pub inter_token: Option<Duration>,
}

impl LedgerSnapshot {
    /// The audit fields: `prompt_tokens`, `completion_tokens`, `cached_tokens`, `ttft_ms`,
    /// `itl_ms`, each only when known.
    pub fn audit_fields(&self, out: &mut Vec<(&str, serde_json::Value)>) {
        if let (Some(tenant), Some(model)) = (&self.tenant, &self.model) {
            out.push(("tenant", tenant.as_ref().into()));
            out.push(("model", model.as_ref().into()));
        }
        if let Some(u) = self.usage {
            out.push(("prompt_tokens", u.prompt.into()));
            out.push(("completion_tokens", u.completion.into()));
            out.push(("cached_tokens", u.cached.into()));
        }
        let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
        if let Some(d) = self.ttft {
            out.push(("ttft_ms", ms(d).into()));
        }
        if let Some(d) = self.inter_token {
            out.push(("itl_ms", ms(d).into()));
        }
    }
}

impl Entry {
    fn snapshot(&self, started: Instant) -> LedgerSnapshot {
        let ttft = self
            .first_token
            .map(|f| f.saturating_duration_since(started));
        let inter_token = match (self.first_token, self.last_token, self.usage) {
            (Some(first), Some(last), Some(u)) if u.completion > 1 => {
                Some(last.saturating_duration_since(first) / (u.completion - 1) as u32)
            }
            _ => None,
        };
        LedgerSnapshot {
            tenant: self.series.as_ref().map(|s| s.tenant.clone()),
            model: self.series.as_ref().map(|s| s.model.clone()),
            usage: self.usage,
            ttft,
            inter_token,
        }
    }
}

impl Ledger {
    /// A new account in `book`, started now.
    pub fn new(book: Arc<Book>) -> Self {
        Self(Arc::new(Cell {
            book,
            started: Instant::now(),
            entry: Mutex::new(Entry::default()),
        }))
    }

    fn entry(&self) -> std::sync::MutexGuard<'_, Entry> {
        // A panic while holding it leaves plain numbers behind: still usable.
        self.0.entry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The request is `tenant`'s, for `model`, in priority `class`: counted when both are
    /// in the config, else not per tenant.
    pub fn identify(&self, tenant: &str, model: &str, class: Priority) {
        let series = self.0.book.series(tenant, model);
        let mut entry = self.entry();
        entry.series = series;
        entry.class = class;
    }

    /// The request went to `pool`.
    pub fn route(&self, pool: &str) {
        let key = self
            .0
            .book
            .pools
            .get_key_value(pool)
            .map(|(k, _)| k.clone());
        self.entry().pool = key;
    }

    /// The engine reported `usage`.
    pub fn usage(&self, usage: TokenUsage) {
        self.entry().usage = Some(usage);
    }

    /// A stream's first and last events went to the client at these instants.
    pub fn token_times(&self, first: Instant, last: Instant) {
        let mut entry = self.entry();
        entry.first_token = Some(first);
        entry.last_token = Some(last);
    }

    /// The request ended `outcome` (a later call wins: the guard's word on a trip comes
    /// before the error the rescue sees, and is kept by [`Self::outcome_unless_set`]).
    pub fn outcome(&self, outcome: Outcome) {
        self.entry().outcome = Some(outcome);
    }

    /// The request ended `outcome`, unless a stage below already said how.
    pub fn outcome_unless_set(&self, outcome: Outcome) {
        let mut entry = self.entry();
        if entry.outcome.is_none() {
            entry.outcome = Some(outcome);
        }
    }

    /// What the audit line carries.
    pub fn snapshot(&self) -> LedgerSnapshot {
        self.entry().snapshot(self.0.started)
    }

    /// Count the request in its tenant's series and its pool's histograms, once (later
    /// calls, and the drop of the last handle, count nothing more).
    pub fn settle(&self) {
        settle(&self.0);
    }
}

fn settle(cell: &Cell) {
    let mut entry = cell.entry.lock().unwrap_or_else(PoisonError::into_inner);
    if entry.settled {
        return;
    }
    entry.settled = true;
    let Some(outcome) = entry.outcome else {
        return; // never answered (the stack was dropped mid-request): nothing to count
    };
    let snapshot = entry.snapshot(cell.started);
    if let Some(series) = &entry.series {
        series.count(outcome, entry.usage);
    }
    if let Some(latency) = entry.pool.as_ref().and_then(|p| cell.book.pools.get(p)) {
        let class = entry.class.index();
        if let Some(d) = snapshot.ttft {
            latency.ttft[class].record(d.as_secs_f64());
        }
        if let Some(d) = snapshot.inter_token {
            latency.itl[class].record(d.as_secs_f64());
        }
    }
}

impl Drop for Cell {
    /// A stream whose end no stage settled (one the guard does not follow to its end)
    /// settles when its last handle goes.
    fn drop(&mut self) {
        settle(self);
    }
}
