//! What isolation hands the guard (a request extension): the request's leak mode and the
//! scanner of its answer, ready once the tenant's own prompt is on record. The guard only
//! calls it; the fingerprint store and the per-pool switches stay isolation's.

use futures_util::future::{BoxFuture, Shared};
use std::sync::Arc;

use super::leak::{FingerprintStore, ResponseScanner};
use crate::config::LeakMode;

/// The leak scan of one request's answer, handed over by isolation (inserted only when
/// the request's leak mode — its pool's, or its tenant's where that is stricter — is on).
#[derive(Clone)]
pub struct LeakWatch {
    mode: LeakMode,
    /// The store and the answered tenant; `None` for a request without a tenant (it is
    /// not scanned).
    source: Option<(FingerprintStore, Arc<str>)>,
    /// The fingerprinting of the prompt when it runs on the blocking pool (token ids).
    job: Option<Shared<BoxFuture<'static, ()>>>,
}

impl LeakWatch {
    pub(super) fn new(
        mode: LeakMode,
        source: Option<(FingerprintStore, Arc<str>)>,
        job: Option<Shared<BoxFuture<'static, ()>>>,
    ) -> Self {
        Self { mode, source, job }
    }

    /// The request's leak mode.
    pub fn mode(&self) -> LeakMode {
        self.mode
    }

    /// The scanner of the answer, once the tenant's own prompt is on record (a scanner
    /// knows its tenant from the prompts recorded when it is made); `None` when the mode
    /// is off or the request has no tenant.
    pub async fn scanner(self) -> Option<ResponseScanner> {
        let (store, tenant) = self.source.filter(|_| self.mode.is_on())?;
        if let Some(job) = self.job {
            job.await;
        }
        Some(store.scanner(&tenant))
    }
}

impl std::fmt::Debug for LeakWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeakWatch")
            .field("mode", &self.mode)
            .field("tenant", &self.source.as_ref().map(|(_, t)| t))
            .finish()
    }
}
