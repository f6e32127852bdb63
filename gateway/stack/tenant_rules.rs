//! Tenant rules that need only the parsed request: the models a tenant may use (403
//! `model_not_allowed`), the LoRA adapters it may name (403 `lora_not_allowed`) and whether
//! it may choose a pool with `x-kvgate-pool` (403 `pool_choice_not_allowed`). Caps on prompt
//! and new tokens and pool pinning are admission's (they shape which pools fit); rate limits
//! follow admission (they reserve its count).
//!
//! Reads: `AuthContext`, `InferenceRequest`, the `x-kvgate-pool` header. Writes: `PoolChoice`.

use bytes::Bytes;
use http::Request;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::error::GatewayError;
use crate::stack::api::{fields, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::routing::{PoolChoice, POOL_CHOICE_HEADER};

/// The tower predicate of the tenant-rules stage.
#[derive(Debug, Clone, Copy, Default)]
pub struct TenantRules;

/// The tenant-rules stage as a layer.
pub type TenantRulesLayer = FilterLayer<TenantRules>;

impl TenantRules {
    /// The stage.
    pub fn layer() -> TenantRulesLayer {
        FilterLayer::new(TenantRules)
    }
}

impl Predicate<Request<Bytes>> for TenantRules {
    type Request = Request<Bytes>;

    fn check(&mut self, mut request: Request<Bytes>) -> Result<Request<Bytes>, BoxError> {
        let (Some(auth), Some(parsed)) = (
            request.extensions().get::<AuthContext>(),
            request.extensions().get::<InferenceRequest>(),
        ) else {
            return Err(GatewayError::Internal(
                "tenant rules ran before authentication or parsing".into(),
            )
            .into());
        };
        if !auth.policy.allows_model(&parsed.model) {
            return Err(GatewayError::ModelNotAllowed {
                tenant: auth.tenant.to_string(),
                model: parsed.model.clone(),
            }
            .into());
        }
        // Adapters by name only, from the tenant's list (names were checked at parsing).
        if let Some(adapter) = fields::lora_adapters(&parsed.fields)?
            .into_iter()
            .find(|a| !auth.policy.allows_lora(a))
        {
            return Err(GatewayError::LoraNotAllowed {
                tenant: auth.tenant.to_string(),
                adapter: adapter.to_owned(),
            }
            .into());
        }
        if let Some(value) = request.headers().get(POOL_CHOICE_HEADER) {
            if !auth.policy.choose_pool {
                return Err(GatewayError::PoolChoiceNotAllowed {
                    tenant: auth.tenant.to_string(),
                }
                .into());
            }
            let pool = value.to_str().map_err(|_| {
                GatewayError::invalid(
                    format!("the {POOL_CHOICE_HEADER} header must be a pool name"),
                    None,
                )
            })?;
            let choice = PoolChoice(std::sync::Arc::from(pool.trim()));
            request.extensions_mut().insert(choice);
        }
        Ok(request)
    }
}
