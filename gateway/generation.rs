//! [`Generation`]: the half of the stack's input that one config builds and a reload
//! replaces whole — tenants and keys, models, the fleet, rollouts, admission, the guard's
//! and isolation's per-pool settings. Requests take the generation that is current when
//! they arrive and keep it until they end (a stream included), so a reload never changes a
//! request midway.
//!
//! The other half is [`crate::shared::Shared`]; [`crate::build_stack`] takes one of each.
//! The runtime builds generations (`runtime::process`) and holds the current one.

use std::sync::Arc;

use crate::config::Config;
use crate::fleet::Fleet;
use crate::rollout::Rollouts;
use crate::stack::admission::AdmissionState;
use crate::stack::api::ModelCatalog;
use crate::stack::auth::ApiKeys;
use crate::stack::guard::GuardState;
use crate::stack::isolate::IsolationState;

/// Everything built from one config that a reload replaces.
#[derive(Debug)]
pub struct Generation {
    /// 1 for the config the gateway started with, then one more per reload.
    pub number: u64,
    pub config: Arc<Config>,
    /// Tenants and their keys.
    pub keys: ApiKeys,
    pub fleet: Arc<Fleet>,
    pub rollouts: Arc<Rollouts>,
    pub catalog: ModelCatalog,
    pub admission: Arc<AdmissionState>,
    pub guard: Arc<GuardState>,
    pub isolation: Arc<IsolationState>,
}
