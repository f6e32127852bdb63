//! Building a [`Generation`] from a config: at start-up from nothing, on reload from the
//! running one — taking over unchanged pools (and their workers' state) and unchanged
//! rollouts — and saying what changed. What no reload replaces (the leak detector's memory,
//! the salt secret, limits, the audit log) is the process's [`Shared`].

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

use super::tokenizers::load_tokenizer;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::generation::Generation;
use crate::rollout::Rollouts;
use crate::runtime::StartError;
use crate::shared::Shared;
use crate::stack::admission::{AdmissionState, ModelAdmission, PrefixHashing};
use crate::stack::api::ModelCatalog;
use crate::stack::auth::ApiKeys;
use crate::stack::guard::GuardState;
use crate::stack::isolate::IsolationState;
use crate::vision::ModelVision;

/// Build a generation of `config`; `previous` is the running one on a reload.
pub(crate) fn build(
    config: Config,
    previous: Option<&Generation>,
    shared: &Shared,
) -> Result<Generation, StartError> {
    let fleet = Arc::new(Fleet::reusing(
        &config,
        previous.map(|p| (&*p.config, &*p.fleet)),
    ));
    let visions = ModelVision::from_config(&config).map_err(StartError::Vision)?;
    let mut models = HashMap::new();
    for model in &config.models {
        let tokenizer =
            load_tokenizer(&model.tokenizer, model.chat_template.as_deref()).map_err(|source| {
                StartError::Tokenizer {
                    model: model.name.clone(),
                    source,
                }
            })?;
        let vision = visions.get(&model.name).map(|v| {
            // The token the engine repeats once per image token (prefix routing salts it).
            let token = tokenizer
                .encode(v.family().image_token(), false)
                .ok()
                .filter(|ids| ids.len() == 1)
                .map(|ids| ids[0]);
            (v.clone(), token)
        });
        models.insert(
            model.name.clone(),
            ModelAdmission {
                tokenizer,
                context_window: model.context_window,
                default_max_new_tokens: model.default_max_new_tokens,
                vision,
            },
        );
    }
    let tokenizers = models
        .iter()
        .map(|(name, m)| (name.clone(), m.tokenizer.clone()))
        .collect();
    let prefix = &config.prefix_routing;
    let admission = Arc::new(AdmissionState {
        models,
        fleet: fleet.clone(),
        permits: shared.count_permits.clone(),
        prefix: prefix
            .enabled
            .then(|| PrefixHashing::new(prefix.block_size)),
    });
    // The salt secret and the leak detector's memory are the process's: a reload keeps them.
    let isolation = Arc::new(IsolationState::new(&config, tokenizers, &shared.isolation));
    let guard = Arc::new(GuardState::from_config(
        &config,
        shared.audit.clone(),
        shared.activity.clone(),
    ));
    let rollouts = Arc::new(Rollouts::reusing(
        &config,
        &fleet,
        &shared.replica,
        &shared.audit,
        previous.map(|p| &*p.rollouts),
    ));
    Ok(Generation {
        number: 0,
        keys: ApiKeys::from_config(&config),
        catalog: ModelCatalog::from_config(&config),
        config: Arc::new(config),
        fleet,
        rollouts,
        admission,
        guard,
        isolation,
    })
}

/// What a reload changed, for its log line and the admin port's answer.
#[derive(Debug, Default)]
pub struct Changes {
    /// Pools taken over with their state.
    pub kept: Vec<String>,
    /// Pools built afresh: new, or changed.
    pub rebuilt: Vec<String>,
    pub removed: Vec<String>,
    /// Sections that differ from the running ones but apply only at start.
    pub restart_required: Vec<&'static str>,
}

impl Changes {
    /// Compare the running generation with the next one.
    pub fn between(old: &Generation, new: &Generation) -> Self {
        let mut changes = Self::default();
        for pool in new.fleet.pools() {
            match old.fleet.pool(&pool.name) {
                Some(o) if Arc::ptr_eq(o, pool) => changes.kept.push(pool.name.to_string()),
                _ => changes.rebuilt.push(pool.name.to_string()),
            }
        }
        for pool in old.fleet.pools() {
            if new.fleet.pool(&pool.name).is_none() {
                changes.removed.push(pool.name.to_string());
            }
        }
        let (a, b) = (&old.config, &new.config);
        for (section, differs) in [
            ("server", a.server != b.server),
            ("upstream", a.upstream != b.upstream),
            ("limits", a.limits != b.limits),
            ("audit", a.audit != b.audit),
            ("isolation", a.isolation != b.isolation),
            ("admission", a.admission != b.admission),
            ("tracing", a.tracing != b.tracing),
        ] {
            if differs {
                changes.restart_required.push(section);
            }
        }
        changes
    }

    /// For the admin port's reload answer.
    pub fn to_json(&self) -> Value {
        json!({
            "pools_kept": self.kept,
            "pools_rebuilt": self.rebuilt,
            "pools_removed": self.removed,
            "restart_required": self.restart_required,
        })
    }
}
