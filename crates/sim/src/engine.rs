//! The shared state of one simulated engine.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::bootstrap::BootstrapClient;
use super::config::SimConfig;
use super::prefix_cache::PrefixCache;
use super::reasoning::ThinkingTemplate;
use super::responses_store::ResponseStore;
use super::rooms::Rooms;
use super::scheduler::Scheduler;
use super::stats::{ReceivedRequest, SimStats, SimStatsSnapshot};
use kvgate_tokenize::ModelTokenizer;

/// One engine: its scheduler (running batch, waiting queue, KV pool), prefix cache, rooms,
/// counters and received-request log.
pub struct SimEngine {
    pub(crate) config: SimConfig,
    /// What the chat template does with `enable_thinking`, probed once at start.
    pub(crate) thinking: ThinkingTemplate,
    pub(crate) tokenizer: Arc<ModelTokenizer>,
    pub(crate) scheduler: Arc<Scheduler>,
    /// The prefix cache; `None` with `disable_radix_cache`.
    pub(crate) prefix_cache: Option<Arc<PrefixCache>>,
    /// The shared lower level of `SimFault::SharedLowerTier` (keyed by tokens only: every
    /// entry is in the default partition); `None` otherwise.
    pub(crate) lower_tier: Option<Arc<PrefixCache>>,
    pub(crate) rooms: Arc<Rooms>,
    pub(crate) stats: Arc<SimStats>,
    pub(crate) client: BootstrapClient,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Port of the bootstrap listener, when this engine runs one.
    pub(crate) bootstrap_port: Option<u16>,
    /// Woken whenever a stream starts, ends or sends a token event, so tests can wait on
    /// counters without sleeping.
    pub(crate) changed: Arc<Notify>,
    /// `/v1/responses`' kept responses (`--enable-response-store`).
    pub(crate) responses: ResponseStore,
}

impl std::fmt::Debug for SimEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimEngine")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl SimEngine {
    /// Counters so far, with the running batch and waiting queue as they are now.
    pub fn stats(&self) -> SimStatsSnapshot {
        let mut snapshot = self.stats.snapshot();
        let load = self.scheduler.load();
        snapshot.running_reqs = load.running as u64;
        snapshot.waiting_reqs = load.waiting as u64;
        snapshot.prefix_cache_blocks = self.prefix_cache.as_ref().map_or(0, |c| c.len() as u64);
        snapshot
    }

    /// The requests received so far, in arrival order (the latest 65,536, at most 256 MiB
    /// of bodies: a long run forgets its oldest).
    pub fn received(&self) -> Vec<ReceivedRequest> {
        self.stats.received()
    }

    /// The `rid`s of the requests the scheduler admitted into the running batch, in the
    /// order it admitted them (health checks appear as `health_generate`).
    pub fn admissions(&self) -> Vec<String> {
        self.stats.admissions()
    }

    /// The engine's configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Tokens currently held in the KV pool.
    pub fn used_kv_tokens(&self) -> usize {
        self.scheduler.pool().used_tokens()
    }

    /// Waits up to `timeout` until `done(stats)` holds (re-checked whenever a stream starts,
    /// ends or sends a token event, or the scheduler's queue or batch changes); returns the
    /// last snapshot either way, `Ok` when it held.
    pub async fn wait_for_stats(
        &self,
        timeout: Duration,
        done: impl Fn(&SimStatsSnapshot) -> bool,
    ) -> Result<SimStatsSnapshot, SimStatsSnapshot> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let snapshot = self.stats();
            if done(&snapshot) {
                return Ok(snapshot);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(self.stats());
            }
        }
    }
}
