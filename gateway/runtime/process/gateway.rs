//! Assembling and running one gateway: data port, admin port, capacity discovery, the
//! first resolution of `discover` names.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::build;
use crate::accounting::Accounting;
use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::build_stack;
use crate::config::Config;
use crate::dns::Discoverer;
use crate::fleet::{discover_all, share_loop, Fleet};
use crate::generation::Generation;
use crate::load::{BufferBudget, InFlightLimit};
use crate::rollout::{sync_loop, Rollouts};
use crate::runtime::admin::Admin;
use crate::runtime::listener::bind::bind_with_backlog;
use crate::runtime::listener::data_threads::serve_on_threads;
use crate::runtime::listener::server::{self, ConnectionLimits, Shutdown, ShutdownTrigger};
use crate::runtime::process::background::{
    activity_loop, cert_watch_loop, discovery_loop, dns_loop, health_loop, housekeeping_loop,
};
use crate::runtime::process::live::Live;
use crate::runtime::process::live_stack::LiveStack;
use crate::runtime::process::reload::Reloader;
use crate::runtime::process::replica::replica_name;
use crate::runtime::process::shared_redis;
use crate::runtime::CapacityReport;
use crate::runtime::StartError;
use crate::shared::Shared;
use crate::stack::api::read_body::BodyLimits;
use crate::stack::dispatch::DispatchLimits;
use crate::stack::header_limits::HeaderLimits;
use crate::stack::isolate::IsolationMemory;
use crate::stack::rate_limit::limiter::{Limiter, MemoryStore};
use crate::telemetry::export::ExportTask;
use crate::telemetry::Telemetry;
use crate::tls::{CertWatch, EngineTls, ServerCert};
use crate::upstream::Upstream;

/// A configured gateway, not yet serving.
#[derive(Debug)]
pub struct Gateway {
    /// The config it started with: `[server]`, `[upstream]`, `[limits]` and `[audit]`
    /// apply from here (a reload changes the rest, in [`Live`]).
    config: Arc<Config>,
    /// Models, pools, rollouts, admission: replaced whole by a reload.
    live: Arc<Live>,
    /// What every stack of this process shares, whatever the generation.
    shared: Shared,
    /// TLS to engines, shared by every engine client (a reload reaches them all).
    engine_tls: Arc<EngineTls>,
    /// The span export task, spawned by `start` (export on only).
    export_task: Option<ExportTask>,
}

impl Gateway {
    /// Build pools, workers, tokenizers and the upstream client from validated config.
    pub fn new(config: Config) -> Result<Self, StartError> {
        let engine_tls = EngineTls::from_config(&config)?;
        let counts = config
            .admission
            .max_concurrent_counts
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        // Shared by every stack built from this gateway: the ceilings are per process.
        let budget = BufferBudget::new(config.server.max_buffered_bytes.as_u64());
        let (telemetry, export_task) = Telemetry::from_config(&config.tracing);
        let server = &config.server;
        let shared = Shared {
            // Redis, when configured, is connected in `start` (it needs the runtime).
            limiter: Limiter::new(MemoryStore::new()),
            audit: AuditLog::open(&config.audit).map_err(StartError::Audit)?,
            activity: Arc::new(Activity::default()),
            accounting: Arc::new(Accounting::new(&config)),
            upstream: Upstream::new(&config.upstream, &engine_tls),
            body: BodyLimits {
                max_bytes: bytes_usize(server.max_body_bytes),
                idle_timeout: server.body_idle_timeout,
                total_timeout: server.body_timeout,
                budget: budget.clone(),
            },
            dispatch: DispatchLimits {
                max_response_bytes: bytes_usize(config.upstream.max_response_bytes),
                budget,
                retry_ratio: config.upstream.retry_budget_ratio as f32,
            },
            headers: HeaderLimits::new(
                bytes_usize(server.max_header_value_bytes),
                bytes_usize(server.max_header_bytes),
            ),
            in_flight: InFlightLimit::new(server.max_in_flight),
            telemetry,
            isolation: IsolationMemory::from_config(&config),
            replica: Arc::from(replica_name()),
            count_permits: Arc::new(tokio::sync::Semaphore::new(counts)),
            responses: Arc::new(shared_redis::response_owners(&config)),
        };
        let started = Arc::new(config.clone());
        let live = Arc::new(Live::new(build::build(config, None, &shared)?));
        Ok(Self {
            config: started,
            live,
            shared,
            engine_tls,
            export_task,
        })
    }

    /// The live pools (of the current config).
    pub fn fleet(&self) -> Arc<Fleet> {
        self.live.current().fleet.clone()
    }

    /// The engine client of discovery and probes.
    pub fn upstream(&self) -> &Upstream {
        &self.shared.upstream
    }

    /// The audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.shared.audit
    }

    /// What every stack of this process shares (with [`Self::generation`], the input of
    /// [`crate::build_stack`]).
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The current generation: what the config in force built.
    pub fn generation(&self) -> Arc<Generation> {
        self.live.current()
    }

    /// Connect the Redis limit store when `[limits] backend = "redis"` (a node, a cluster
    /// or a Sentinel-managed primary: `shared_redis`).
    pub async fn connect_limits(&mut self) -> Result<(), StartError> {
        if let Some(limiter) = shared_redis::limiter(&self.config.limits).await? {
            self.shared.limiter = limiter;
        }
        Ok(())
    }

    /// Bind the configured addresses and start.
    pub async fn bind_and_start(self) -> Result<RunningGateway, StartError> {
        let backlog = self.config.server.listen_backlog;
        let bind = |addr: SocketAddr, key: &'static str| async move {
            bind_with_backlog(addr, backlog).map_err(|source| StartError::Bind {
                addr,
                key,
                source,
            })
        };
        let data = bind(self.config.server.listen, "server.listen").await?;
        let admin = bind(self.config.server.admin_listen, "server.admin_listen").await?;
        self.start(data, admin).await
    }

    /// Start serving on already-bound listeners (tests bind `127.0.0.1:0`).
    ///
    /// Capacity is discovered once before the first request is accepted, so workers with
    /// only discovered capacity are eligible from the start; then on an interval.
    pub async fn start(
        mut self,
        data: TcpListener,
        admin: TcpListener,
    ) -> Result<RunningGateway, StartError> {
        // The recorder first: gauges set while starting (the limit store's health) count.
        crate::metrics::handle();
        self.connect_limits().await?;
        let server_cert = match &self.config.server.tls {
            Some(t) => Some(ServerCert::load(&t.cert, &t.key)?),
            None => None,
        };
        let tls = server_cert.as_ref().map(ServerCert::acceptor).transpose()?;
        let certs = Arc::new(CertWatch::new(server_cert, self.engine_tls.clone()));
        // `discover` names resolve before the first request, so their engines serve from
        // the start (a name that does not answer yet lists none: its pool waits for it).
        let dns = Arc::new(Discoverer::default());
        let first = self.live.current();
        if !crate::dns::queries(&self.config).is_empty() {
            let resolved = dns.resolve(&self.config, first.fleet.names()).await;
            self.live = Arc::new(Live::new(build::build(
                resolved,
                Some(&first),
                &self.shared,
            )?));
        }
        let first = self.live.current();
        discover_all(&first.fleet, &self.shared.upstream).await;
        let report = CapacityReport::build(&self.config, &first.fleet);
        for line in report.warnings() {
            tracing::warn!("{line}");
        }
        if self.config.admission.strict && !report.warnings().is_empty() {
            return Err(StartError::Mismatch(report.warnings().join("\n")));
        }
        let data_addr = data.local_addr()?;
        let admin_addr = admin.local_addr()?;
        let (trigger, shutdown) = Shutdown::new();
        let drain = self.config.server.drain_timeout;
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(discovery_loop(
            self.live.clone(),
            self.shared.upstream.clone(),
            self.config.upstream.discovery_interval,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(health_loop(
            self.live.clone(),
            self.shared.upstream.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(cert_watch_loop(
            certs.clone(),
            self.config.server.tls_watch_interval,
            shutdown.clone(),
        )));
        let live = self.live.clone();
        tasks.push(tokio::spawn(sync_loop(
            move || live.current().rollouts.clone(),
            shared_redis::shared_decisions(&self.config.limits),
            shutdown.clone(),
        )));
        if let Some(share) =
            shared_redis::prefix_share(&self.config.limits, self.shared.replica.clone())
        {
            let live = self.live.clone();
            let mut stop = shutdown.clone();
            tasks.push(tokio::spawn(share_loop(
                move || {
                    let generation = live.current();
                    let p = &generation.config.prefix_routing;
                    (p.enabled && p.share_with_replicas).then(|| generation.fleet.clone())
                },
                share,
                async move { stop.wait().await },
            )));
        }
        tasks.push(tokio::spawn(housekeeping_loop(
            self.shared.limiter.clone(),
            self.shared.isolation.store.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(activity_loop(
            self.shared.activity.clone(),
            shutdown.clone(),
        )));
        // The admin port outlives the data port's drain, so `/health` can answer 503 while
        // draining (load balancers see it) instead of refusing connections.
        let (admin_trigger, admin_shutdown) = Shutdown::new();
        if let Some(export) = self.export_task.take() {
            // Spans of draining requests still go out: export stops with the admin port,
            // after the drain, and flushes what is queued then.
            let mut stop = admin_shutdown.clone();
            tasks.push(tokio::spawn(export.run(async move { stop.wait().await })));
        }
        // One stack per data thread, each with its own engine client (pooled connections
        // stay on their thread); everything else in it is shared. Each follows reloads.
        let shared = self.shared.clone();
        let upstream_config = self.config.upstream.clone();
        let engine_tls = self.engine_tls.clone();
        let live = self.live.clone();
        let data_server = serve_on_threads(
            data,
            tls,
            self.config.server.data_threads,
            move || {
                let shared = Shared {
                    upstream: Upstream::new(&upstream_config, &engine_tls),
                    ..shared.clone()
                };
                LiveStack::new(live.clone(), move |generation: &Generation| {
                    build_stack::<hyper::body::Incoming>(&shared, generation)
                })
            },
            shutdown.clone(),
            drain,
            ConnectionLimits::from_config(&self.config.server),
        );
        tasks.push(tokio::spawn(async move {
            if let Err(e) = data_server.await {
                tracing::error!(error = %e, "the data port could not be served");
            }
            admin_trigger.trigger();
        }));
        let reloader = Reloader {
            path: self.config.source.clone(),
            certs: Some(certs),
            live: self.live.clone(),
            shared: self.shared.clone(),
            engine_tls: self.engine_tls.clone(),
            last: Arc::default(),
            serial: Arc::default(),
            strict: self.config.admission.strict,
            dns,
            written: Arc::new(std::sync::Mutex::new(self.config.clone())),
        };
        tasks.push(tokio::spawn(dns_loop(reloader.clone(), shutdown.clone())));
        let admin_token = crate::runtime::admin::admin_token(&self.config.server)?;
        let admin_service = Admin::new(self.live.clone(), shutdown.clone(), Some(reloader.clone()))
            .with_status(self.shared.activity.clone())
            .with_accounting(self.shared.accounting.clone())
            .with_token(admin_token);
        tasks.push(tokio::spawn(server::serve(
            admin,
            None,
            admin_service,
            admin_shutdown,
            Duration::from_millis(100),
            ConnectionLimits::default(),
        )));
        tracing::info!(%data_addr, %admin_addr, tls = self.config.server.tls.is_some(), "kvgate listening");
        Ok(RunningGateway {
            data_addr,
            admin_addr,
            trigger,
            tasks,
            live: self.live,
            budget: self.shared.body.budget.clone(),
            audit: self.shared.audit,
            reloader,
        })
    }
}

fn bytes_usize(b: bytesize::ByteSize) -> usize {
    usize::try_from(b.as_u64()).unwrap_or(usize::MAX)
}

/// A serving gateway.
#[derive(Debug)]
pub struct RunningGateway {
    data_addr: SocketAddr,
    admin_addr: SocketAddr,
    trigger: ShutdownTrigger,
    tasks: Vec<JoinHandle<()>>,
    live: Arc<Live>,
    audit: AuditLog,
    reloader: Reloader,
    budget: BufferBudget,
}

impl RunningGateway {
    /// Reloads tenants and keys from the config file.
    pub fn reloader(&self) -> &Reloader {
        &self.reloader
    }

    /// The data port's address.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    /// The admin port's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The live pools (of the config in force now).
    pub fn fleet(&self) -> Arc<Fleet> {
        self.live.current().fleet.clone()
    }

    /// The canary rollouts (of the config in force now).
    pub fn rollouts(&self) -> Arc<Rollouts> {
        self.live.current().rollouts.clone()
    }

    /// The config in force now, and everything built from it.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// The audit log (recent lines in memory).
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Bytes of request bodies and engine answers held in memory right now, over all
    /// requests (`server.max_buffered_bytes` bounds it).
    pub fn buffered_bytes(&self) -> u64 {
        self.budget.in_use()
    }

    /// Stop accepting and start draining: queued requests are answered 503 at once and
    /// nothing new is dispatched (`Fleet::begin_drain`); what runs may finish.
    pub fn begin_shutdown(&self) {
        self.live.current().fleet.begin_drain();
        self.trigger.trigger();
    }

    /// Wait until every server has drained (call [`Self::begin_shutdown`] first).
    pub async fn wait(self) {
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "gateway task failed");
            }
        }
    }

    /// Stop accepting, drain, and return when done.
    pub async fn shutdown(self) {
        self.begin_shutdown();
        self.wait().await;
    }
}
