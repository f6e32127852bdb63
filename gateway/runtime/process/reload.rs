//! Reload: read the config file again and replace the whole live configuration — tenants
//! and keys, models, pools and their workers, weights, rollouts, health, admission — and
//! every certificate file. Used by the admin port (`POST /reload`) and the SIGHUP handler
//! of `kvgate serve`; kept apart from `gateway` so the admin port does not depend on the
//! gateway that owns it.
//!
//! All or nothing: a config that fails validation, a tokenizer that does not load, a
//! certificate that is broken, or (with `admission.strict`) a new mismatch between a
//! model's window and its pools refuses the reload whole; the running config keeps
//! serving, and the error is logged, counted and returned. Requests and streams in flight
//! finish on the generation they started with. Workers of new or changed pools have their
//! capacity discovered before the new config serves (I3).

use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use super::build::{self, Changes};
use super::capacity::CapacityReport;
use super::live::Live;
use crate::config::Config;
use crate::dns::Discoverer;
use crate::fleet::{discover_worker, Discovery};
use crate::metrics;
use crate::runtime::{ReloadError, StartError};
use crate::shared::Shared;
use crate::tls::{CertWatch, EngineTls};

/// Reloads the config (SIGHUP, admin `POST /reload`).
#[derive(Debug, Clone)]
pub struct Reloader {
    pub(crate) path: PathBuf,
    pub(crate) certs: Option<Arc<CertWatch>>,
    pub(crate) live: Arc<Live>,
    /// The process's state; its engine client discovers new workers before they serve.
    pub(crate) shared: Shared,
    pub(crate) engine_tls: Arc<EngineTls>,
    /// Shared by every clone (SIGHUP handler, admin port), so each sees the last reload
    /// whoever triggered it.
    pub(crate) last: Arc<Mutex<Option<LastReload>>>,
    /// Held for a whole reload (shared by every clone).
    pub(crate) serial: Arc<tokio::sync::Mutex<()>>,
    /// `admission.strict` of the config the gateway started with.
    pub(crate) strict: bool,
    /// Resolves the `discover` names of a config (shared by every clone).
    pub(crate) dns: Arc<Discoverer>,
    /// The config in force as written (its `discover` entries unresolved): what a DNS
    /// update resolves again. The generation holds the resolved one.
    pub(crate) written: Arc<Mutex<Arc<Config>>>,
}

/// Which workers of the rebuilt pools an install probes before they serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// All of them (a reload: the operator may have restarted engines).
    RebuiltPools,
    /// Only those not known before (a DNS update).
    NewWorkers,
}

/// The last reload, as the status page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastReload {
    /// When it finished.
    pub at: SystemTime,
    /// Ok, or why it was refused (the running config was kept).
    pub result: Result<(), String>,
}

impl Reloader {
    /// Reload now; logged and counted (`kvgate_config_reloads_total{result}`) either way.
    pub async fn reload(&self) -> Result<Value, ReloadError> {
        let result = self.apply().await;
        ::metrics::counter!(
            metrics::CONFIG_RELOADS_TOTAL,
            "result" => if result.is_ok() { "ok" } else { "error" }
        )
        .increment(1);
        if let Err(e) = &result {
            tracing::error!(error = %e, file = %self.path.display(), "reload refused: the running config is kept");
        }
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

    async fn apply(&self) -> Result<Value, ReloadError> {
        // One reload at a time: two overlapping ones (a SIGHUP and a POST) would each build
        // from the same running config, and the older file could be installed last. A DNS
        // update takes the same lock.
        let _one_at_a_time = self.serial.lock().await;
        let written = Config::load(&self.path)?;
        // Read every certificate now, use them only once everything else passed.
        let certificates = match &self.certs {
            Some(c) => Some(c.read_all()?),
            None => None,
        };
        // The file's `discover` names are resolved afresh; one that fails keeps its last answer.
        let resolved = self
            .dns
            .resolve(&written, self.live.current().fleet.names())
            .await;
        let answer = self
            .install(resolved, certificates, Probe::RebuiltPools)
            .await?;
        *self.written.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(written);
        Ok(answer)
    }

    /// Resolve the `discover` names of the config in force again and, when a pool's engines
    /// changed, install the generation of the new answers as a reload does: unchanged pools
    /// kept whole, a changed one rebuilt with its surviving workers' accounts and state, new
    /// workers probed before they serve, removed ones left to the requests they still run.
    /// Returns the new generation's number, or None when nothing changed.
    pub async fn refresh_dns(&self) -> Result<Option<u64>, ReloadError> {
        let _one_at_a_time = self.serial.lock().await;
        let written = self
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let running = self.live.current();
        let resolved = self.dns.resolve(&written, running.fleet.names()).await;
        if resolved.pools == running.config.pools {
            return Ok(None);
        }
        let result = self.install(resolved, None, Probe::NewWorkers).await;
        ::metrics::counter!(
            metrics::DISCOVERY_DNS_UPDATES_TOTAL,
            "result" => if result.is_ok() { "ok" } else { "error" }
        )
        .increment(1);
        let answer = result?;
        Ok(answer.get("generation").and_then(Value::as_u64))
    }

    /// Build the generation of `config` (resolved) from the running one, probe the workers
    /// `probe` names, check it, and install it (with `certificates`, read by the caller).
    async fn install(
        &self,
        config: Config,
        certificates: Option<crate::tls::ReadCertificates>,
        probe: Probe,
    ) -> Result<Value, ReloadError> {
        let running = self.live.current();
        // Tokenizers load from disk (a new one takes seconds): off the runtime's threads.
        let (shared, previous) = (self.shared.clone(), running.clone());
        let next =
            tokio::task::spawn_blocking(move || build::build(config, Some(&previous), &shared))
                .await
                .map_err(|e| ReloadError::Interrupted(e.to_string()))??;
        let changes = Changes::between(&running, &next);
        // Workers of new or changed pools serve only once their capacity is known; the
        // running config serves meanwhile. A DNS update probes only the workers it adds:
        // the survivors carried their answers over.
        let fresh = next
            .fleet
            .pools()
            .iter()
            .filter(|p| changes.rebuilt.iter().any(|name| **name == *p.name))
            .flat_map(|p| p.all_workers().cloned().collect::<Vec<_>>())
            .filter(|w| probe == Probe::RebuiltPools || matches!(w.discovery(), Discovery::Pending))
            .map(|w| discover_worker(w, self.shared.upstream.clone()));
        futures_util::future::join_all(fresh).await;
        // After discovery, as at start-up, so the report speaks of real capacity.
        let report = CapacityReport::build(&next.config, &next.fleet);
        for line in report.warnings() {
            tracing::warn!("{line}");
        }
        // `[admission]` applies from start: its `strict` refuses a reload that brings a
        // window larger than a KV pool (not one that finds a worker briefly out).
        if self.strict && !report.mismatches().is_empty() {
            return Err(StartError::Mismatch(report.mismatches().join("\n")).into());
        }
        // https:// workers added by the reload need their names (and, without a CA
        // file, the system's roots) before the first connection.
        self.engine_tls.reconfigure(&next.config)?;
        let certificates = match (&self.certs, certificates) {
            (Some(watch), Some(read)) => Some(watch.install(read)),
            _ => None,
        };
        let tenants = next.config.tenants.len();
        let models = next.config.models.len();
        let keys = next.keys.len();
        let (old_rollouts, new_rollouts) = (running.rollouts.clone(), next.rollouts.clone());
        let next_fleet = next.fleet.clone();
        // The next config's tenant series exist (at zero) before its first request.
        self.shared.accounting.configure(&next.config);
        let number = self.live.install(next);
        drain_workers_gone(&running.fleet, &next_fleet);
        // Rollouts the reload replaced stop deciding (requests in flight still report to
        // them); new ones over kept pools start from the configured weights.
        let same =
            |a: &Arc<crate::rollout::Rollout>, b: &Arc<crate::rollout::Rollout>| Arc::ptr_eq(a, b);
        for old in old_rollouts.all() {
            if !new_rollouts.all().iter().any(|r| same(r, old)) {
                old.retire();
            }
        }
        // A rollout rebound to pools rebuilt with other workers only carries on as it was.
        for new in new_rollouts.all() {
            if !old_rollouts.all().iter().any(|r| new.continues(r)) {
                new.start_from_configured_weights();
            }
        }
        if !changes.restart_required.is_empty() {
            tracing::warn!(
                sections = ?changes.restart_required,
                "these sections changed but apply only at start: restart to use them"
            );
        }
        tracing::info!(
            generation = number,
            tenants,
            keys,
            models,
            pools_kept = ?changes.kept,
            pools_rebuilt = ?changes.rebuilt,
            pools_removed = ?changes.removed,
            cause = ?probe,
            "config reloaded: new requests use it, requests in flight finish on the previous one"
        );
        let mut answer = json!({
            "reloaded": true,
            "generation": number,
            "tenants": tenants,
            "keys": keys,
            "models": models,
            "warnings": report.warnings(),
            "certificates": certificates.map(|c| c.to_json()),
        });
        if let (Some(map), Value::Object(more)) = (answer.as_object_mut(), changes.to_json()) {
            map.extend(more);
        }
        Ok(answer)
    }
}

/// Workers a pool no longer has (gone from the file or from its DNS name's answer) get
/// nothing new from the previous generation either: requests still queued there would
/// otherwise be dispatched to an engine that may be gone. What runs there finishes.
/// Pools removed whole are left as they were (their engines were not said to be gone).
fn drain_workers_gone(previous: &crate::fleet::Fleet, next: &crate::fleet::Fleet) {
    for pool in previous.pools() {
        let Some(now) = next.pool(&pool.name) else {
            continue;
        };
        for worker in pool.all_workers() {
            let kept = now
                .all_workers()
                .any(|w| w.role == worker.role && w.authority == worker.authority);
            if !kept && !worker.is_draining() {
                tracing::info!(pool = %pool.name, worker = %worker.authority,
                    "worker gone from the pool: drained (in-flight requests finish, no new ones)");
                worker.set_draining(true);
            }
        }
    }
}
