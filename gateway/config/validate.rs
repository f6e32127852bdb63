//! The rules across sections of the config, checked once at load (pingora's
//! `validate(self)`): what one section names must exist in another. Each section's own rules
//! live with its type (`PoolConfig::check`, `ServerConfig::check`, …).
//!
//! Each failure is an [`Invalid`] naming the key path and the fix.

use std::collections::HashSet;

use super::invalid::Invalid;
use super::models::{AnthropicMessages, ModelConfig};
use super::pools::{EngineKind, PoolConfig, PoolMode};
use super::rollout::RolloutConfig;
use super::server::ServerConfig;
use super::tenants::TenantConfig;
use super::upstream::UpstreamConfig;

/// The buffer budget must hold at least one largest request body or answer, or that
/// request could never be served.
pub(super) fn buffers(server: &ServerConfig, upstream: &UpstreamConfig) -> Result<(), Invalid> {
    let largest = server.max_body_bytes.max(upstream.max_response_bytes);
    if server.max_buffered_bytes < largest {
        return Err(Invalid::new(
            "server.max_buffered_bytes",
            format!("must hold at least one largest request body or answer ({largest}); raise it or lower server.max_body_bytes / upstream.max_response_bytes"),
        ));
    }
    Ok(())
}

/// Every pool serves a `[[models]]` name, and every model has a pool.
pub(super) fn pools_name_models(
    models: &[ModelConfig],
    pools: &[PoolConfig],
) -> Result<(), Invalid> {
    let model_names = names(models.iter().map(|m| &m.name));
    for (i, pool) in pools.iter().enumerate() {
        if !model_names.contains(pool.model.as_str()) {
            return Err(Invalid::new(
                format!("pools[{i}].model"),
                format!(
                    "`{}` is not a [[models]] name; use one of: {}",
                    pool.model,
                    sorted(&model_names)
                ),
            ));
        }
    }
    for (i, pool) in pools.iter().enumerate() {
        images_fit_the_model(i, pool, models)?;
    }
    for (i, model) in models.iter().enumerate() {
        if model.anthropic_messages == AnthropicMessages::Engine {
            engine_messages_pools(i, &model.name, pools)?;
        }
        let model = &model.name;
        if !pools.iter().any(|p| &p.model == model) {
            return Err(Invalid::new(
                "pools",
                format!(
                    "model `{model}` has no pool; add a [[pools]] table with model = \"{model}\""
                ),
            ));
        }
    }
    Ok(())
}

/// A model whose Anthropic requests go to the engines as they are: every pool of it can
/// take them unchanged (see [`AnthropicMessages::Engine`]).
fn engine_messages_pools(i: usize, model: &str, pools: &[PoolConfig]) -> Result<(), Invalid> {
    let key = format!("models[{i}].anthropic_messages");
    for pool in pools.iter().filter(|p| p.model == model) {
        let name = &pool.name;
        let problem = if pool.engine != EngineKind::Sglang {
            Some(format!(
                "pool `{name}` is not an SGLang pool, and only SGLang's `/v1/messages` is modelled"
            ))
        } else if pool.mode != PoolMode::Unified {
            Some(format!("pool `{name}` is disaggregated, and an Anthropic request has no field for the prefill's bootstrap room"))
        } else if pool.cache_salt {
            Some(format!("pool `{name}` salts its prefix cache per tenant, and SGLang's Anthropic request has no `cache_salt`; set `cache_salt = false` on it to let its tenants share prefix cache"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Invalid::new(
                key,
                format!("\"engine\" cannot be served: {problem}; or leave anthropic_messages = \"translate\" (the default)"),
            ));
        }
    }
    Ok(())
}

/// The models and pools a tenant is limited to exist, and so do the tenants a pool is
/// limited to.
pub(super) fn tenants_name_models_and_pools(
    models: &[ModelConfig],
    pools: &[PoolConfig],
    tenants: &[TenantConfig],
) -> Result<(), Invalid> {
    let model_names = names(models.iter().map(|m| &m.name));
    let pool_names = names(pools.iter().map(|p| &p.name));
    for (i, tenant) in tenants.iter().enumerate() {
        for (j, model) in tenant.models.iter().enumerate() {
            if !model_names.contains(model.as_str()) {
                return Err(Invalid::new(
                    format!("tenants[{i}].models[{j}]"),
                    format!(
                        "`{model}` is not a [[models]] name; use one of: {}",
                        sorted(&model_names)
                    ),
                ));
            }
        }
        for (j, pool) in tenant.pools.iter().enumerate() {
            if !pool_names.contains(pool.as_str()) {
                return Err(Invalid::new(
                    format!("tenants[{i}].pools[{j}]"),
                    format!(
                        "`{pool}` is not a [[pools]] name; use one of: {}",
                        sorted(&pool_names)
                    ),
                ));
            }
        }
    }
    let tenant_names = names(tenants.iter().map(|t| &t.name));
    for (i, pool) in pools.iter().enumerate() {
        for (j, tenant) in pool.tenants.iter().enumerate() {
            if !tenant_names.contains(tenant.as_str()) {
                return Err(Invalid::new(
                    format!("pools[{i}].tenants[{j}]"),
                    format!("`{tenant}` is not a [[tenants]] name"),
                ));
            }
        }
    }
    Ok(())
}

/// A rollout names a model (with one rollout at a time) and two pools of that model; then
/// its own rules.
pub(super) fn rollouts_name_pools(
    models: &[ModelConfig],
    pools: &[PoolConfig],
    rollouts: &[RolloutConfig],
) -> Result<(), Invalid> {
    let mut rolling = HashSet::new();
    for (i, r) in rollouts.iter().enumerate() {
        let key = |field: &str| format!("rollouts[{i}].{field}");
        let fail = |field: &str, reason: String| Err(Invalid::new(key(field), reason));
        if !models.iter().any(|m| m.name == r.model) {
            return fail("model", format!("`{}` is not a [[models]] name", r.model));
        }
        if !rolling.insert(r.model.as_str()) {
            return fail(
                "model",
                format!(
                    "`{}` has two rollouts; one model rolls out one canary at a time",
                    r.model
                ),
            );
        }
        for (field, name) in [("stable", &r.stable), ("canary", &r.canary)] {
            match pools.iter().find(|p| &p.name == name) {
                None => return fail(field, format!("`{name}` is not a [[pools]] name")),
                Some(p) if p.model != r.model => {
                    return fail(
                        field,
                        format!(
                            "pool `{name}` serves model `{}`, not `{}`",
                            p.model, r.model
                        ),
                    )
                }
                Some(_) => {}
            }
        }
        r.check().map_err(|e| e.under(&format!("rollouts[{i}]")))?;
    }
    Ok(())
}

/// Without an API key and without anonymous access, every request would be refused.
pub(super) fn someone_can_call(
    server: &ServerConfig,
    tenants: &[TenantConfig],
) -> Result<(), Invalid> {
    if !server.allow_anonymous && tenants.iter().all(|t| t.api_key_sha256.is_empty()) {
        return Err(Invalid::new(
            "tenants",
            "no tenant has an API key, so every request would get 401; add [[tenants]] with api_key_sha256, or set server.allow_anonymous = true",
        ));
    }
    Ok(())
}

fn names<'a>(names: impl Iterator<Item = &'a String>) -> HashSet<&'a str> {
    names.map(String::as_str).collect()
}

fn sorted(set: &HashSet<&str>) -> String {
    let mut v: Vec<&str> = set.iter().copied().collect();
    v.sort_unstable();
    v.join(", ")
}

/// `[pools.images]` says what a pool does with images: only for a model that takes them,
/// and only SGLang's image handling is counted so far.
fn images_fit_the_model(
    i: usize,
    pool: &PoolConfig,
    models: &[ModelConfig],
) -> Result<(), Invalid> {
    let Some(model) = models.iter().find(|m| m.name == pool.model) else {
        return Ok(());
    };
    if model.vision.is_none() && pool.images != Default::default() {
        return Err(Invalid::new(
            format!("pools[{i}].images"),
            format!(
                "model `{}` takes no images; add [models.vision] to it, or remove [pools.images]",
                model.name
            ),
        ));
    }
    if model.vision.is_some() && pool.chat_rules() != super::ChatRules::Sglang {
        return Err(Invalid::new(
            format!("pools[{i}].engine"),
            format!(
                "model `{}` takes images, and kvgate counts images as SGLang prepares them only; serve it from SGLang pools",
                model.name
            ),
        ));
    }
    Ok(())
}
