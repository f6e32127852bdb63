//! The routing stage: reads what the request is and who sends it, chooses its pool, then
//! its workers — at once, or after waiting its turn in the pool's queue.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use std::sync::Arc;
use std::time::Duration;

use super::affinity::PrefixRouting;
use super::wait::{self, Scheduling, Sharer, Unclaimed, Waiter};
use super::{
    choose_pool, no_eligible_worker, AdmittedPools, ChosenPool, PinnedWorker, PoolChoice,
    RequestBlocks, RequestCost, RoutePlan,
};
use crate::audit::AuditLog;
use crate::config::Priority;
use crate::error::GatewayError;
use crate::fleet::{Fleet, KvCost};
use crate::stack::api::InferenceRequest;
use crate::stack::auth::AuthContext;
use crate::stack::priority::RequestPriority;
use crate::stack::request_id::RequestId;
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};

/// The response header of a request that waited in the gateway queue: how long, in ms.
pub const QUEUED_MS_HEADER: &str = "x-kvgate-queued-ms";

/// The client's own timeout, in seconds, as the OpenAI SDKs send it: a queued request never
/// waits past it.
const CLIENT_TIMEOUT_HEADER: &str = "x-stainless-timeout";

/// The routing stage.
#[derive(Debug, Clone)]
pub struct Route {
    fleet: Arc<Fleet>,
    scheduling: Scheduling,
    prefix: Arc<PrefixRouting>,
    audit: AuditLog,
}

/// The routing stage as a layer.
pub type RouteLayer = StageLayer<Route>;

impl Route {
    /// Route over `fleet`'s pools, queueing by `scheduling`, preferring the workers that
    /// hold a prompt's prefix by `prefix`; queue refusals are audited.
    pub fn layer(
        fleet: Arc<Fleet>,
        scheduling: Scheduling,
        prefix: PrefixRouting,
        audit: AuditLog,
    ) -> RouteLayer {
        StageLayer::new(Route {
            fleet,
            scheduling,
            prefix: Arc::new(prefix),
            audit,
        })
    }
}

impl Stage for Route {
    fn handle(&self, mut request: Request<Bytes>, next: Next) -> StageFuture {
        let route = self.clone();
        Box::pin(async move {
            let (plan, waited) = route.plan(&request).await?;
            request.extensions_mut().insert(plan);
            let mut response = next.oneshot(request).await?;
            if let Some(waited) = waited {
                let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                response
                    .headers_mut()
                    .insert(QUEUED_MS_HEADER, HeaderValue::from(ms));
            }
            Ok(response)
        })
    }
}

impl Route {
    /// The request's route, and how long it waited for its workers (None: no wait).
    async fn plan(
        &self,
        request: &Request<Bytes>,
    ) -> Result<(RoutePlan, Option<Duration>), GatewayError> {
        let extensions = request.extensions();
        let parsed = extensions
            .get::<InferenceRequest>()
            .ok_or_else(|| GatewayError::Internal("routing ran before parsing".into()))?;
        let admitted = extensions
            .get::<AdmittedPools>()
            .map(|a| a.0.clone())
            .unwrap_or_else(|| Arc::from(Vec::new()));
        let auth = extensions.get::<AuthContext>();
        // Anonymous traffic has no tenant to stick to: split request by request.
        let sticky = auth
            .filter(|a| &*a.tenant != crate::tenant::ANONYMOUS_TENANT)
            .map(|a| a.tenant.clone());
        // A request naming a stored response goes to the worker that holds it, or nowhere.
        let pinned = extensions.get::<PinnedWorker>();
        let choice = match pinned {
            Some(pin) => Some(pin.pool.clone()),
            None => extensions.get::<PoolChoice>().map(|c| c.0.clone()),
        };
        // What the request will hold in its workers' KV (none known without admission).
        let cost = extensions
            .get::<RequestCost>()
            .map_or(KvCost::ZERO, |c| c.0.kv_cost());
        let ChosenPool { pool, slot } = choose_pool(
            &self.fleet,
            parsed,
            &admitted,
            sticky.as_deref(),
            choice.as_deref(),
        )?;
        if self.fleet.is_draining() {
            // Shutting down: what starts now could be cut by the drain (issue 38).
            let reason = crate::fleet::QueueRefusal::Draining;
            return Err(GatewayError::QueueRefused {
                pool: pool.name.to_string(),
                reason: "kvgate is shutting down and starts nothing new; another replica answers a retry",
                retry_after: reason.retry_after(),
            });
        }
        let sharer = Sharer {
            tenant: auth.map_or_else(
                || Arc::from(crate::tenant::ANONYMOUS_TENANT),
                |a| a.tenant.clone(),
            ),
            weight: auth.map_or(1, |a| a.policy.weight),
        };
        let waiter = || Waiter {
            tenant: sharer.tenant.clone(),
            weight: sharer.weight,
            class: extensions
                .get::<RequestPriority>()
                .map_or(Priority::Standard, |p| p.0),
            client_timeout: client_timeout(request.headers()),
            request_id: RequestId::of(request).map(|id| id.as_str().to_owned()),
        };
        if let Some(pin) = pinned {
            let unified: &[Arc<crate::fleet::Worker>] = match &pool.workers {
                crate::fleet::PoolWorkers::Unified(ws) => ws,
                crate::fleet::PoolWorkers::Disaggregated { .. } => &[],
            };
            let load = unified
                .iter()
                .find(|w| w.authority == pin.authority && w.is_eligible())
                .and_then(|w| w.claim(cost.total))
                .ok_or_else(|| {
                    no_eligible_worker(
                        &self.fleet,
                        parsed,
                        format!(
                            "the worker {} holding response {} cannot take it now",
                            pin.authority, pin.response_id
                        ),
                    )
                })?;
            return Ok((
                RoutePlan {
                    pool,
                    target: Arc::new(super::Target::Unified(load)),
                    slot,
                    cost,
                    overcommit: self.scheduling.overcommit,
                    share: None,
                    prefix_keys: None,
                    pinned: true,
                },
                None,
            ));
        }
        let claimed = {
            // The prompt's blocks in the pool's cache partition (the partition is the tenant
            // isolation will salt the request with, on pools that salt).
            let blocks = extensions.get::<RequestBlocks>();
            let tenant = auth.map(|a| &*a.tenant);
            let affinity = self.prefix.affinity(&pool, blocks, tenant).await;
            let claimed = wait::claim(
                &pool,
                cost,
                self.scheduling,
                &sharer,
                affinity.as_ref(),
                waiter,
                &self.audit,
            )
            .await;
            (claimed, affinity.map(|a| a.keys().clone()))
        };
        let (claimed, prefix_keys) = claimed;
        match claimed {
            Ok(claimed) => Ok((
                RoutePlan {
                    pool,
                    target: Arc::new(claimed.target),
                    slot,
                    cost,
                    overcommit: self.scheduling.overcommit,
                    share: claimed.share.map(Arc::new),
                    prefix_keys,
                    pinned: false,
                },
                claimed.waited,
            )),
            Err(Unclaimed::NoEligibleWorker) => Err(no_eligible_worker(
                &self.fleet,
                parsed,
                format!("pool `{}` lost its eligible workers", pool.name),
            )),
            Err(Unclaimed::Refused {
                reason,
                retry_after,
            }) => Err(GatewayError::QueueRefused {
                pool: pool.name.to_string(),
                reason: match reason {
                    crate::fleet::QueueRefusal::Full => "its gateway queue is full",
                    crate::fleet::QueueRefusal::Shed => {
                        "the request was shed from its queue for another (a higher class, or a tenant with fewer queued)"
                    }
                    crate::fleet::QueueRefusal::TimedOut => {
                        "the request waited in its queue past its deadline"
                    }
                    crate::fleet::QueueRefusal::Closed => "its queue closed (a reload)",
                    crate::fleet::QueueRefusal::Draining => {
                        "kvgate is shutting down and starts nothing new; another replica answers a retry"
                    }
                },
                retry_after,
            }),
        }
    }
}

/// The client's own timeout from `x-stainless-timeout` (seconds; ignored when unreadable).
fn client_timeout(headers: &HeaderMap) -> Option<Duration> {
    let secs: f64 = headers
        .get(CLIENT_TIMEOUT_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (secs.is_finite() && secs > 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_timeout_is_read_in_seconds_and_nonsense_is_ignored() {
        let mut headers = HeaderMap::new();
        assert_eq!(client_timeout(&headers), None);
        headers.insert(CLIENT_TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        assert_eq!(client_timeout(&headers), Some(Duration::from_millis(2500)));
        for bad in ["0", "-1", "NaN", "soon", "inf"] {
            headers.insert(CLIENT_TIMEOUT_HEADER, HeaderValue::from_static(bad));
            assert_eq!(client_timeout(&headers), None, "{bad}");
        }
    }
}
