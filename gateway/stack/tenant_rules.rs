//! Tenant rules that need only the parsed request: the models a tenant may use (403
//! `model_not_allowed`) and the LoRA adapters it may name (403 `lora_not_allowed`). Caps on prompt and new tokens and pool pinning are admission's
//! (they shape which pools fit); rate limits follow admission (they reserve its count).
//!
//! Reads: `AuthContext`, `InferenceRequest`.

use bytes::Bytes;
use http::Request;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::error::GatewayError;
use crate::stack::api::{fields, InferenceRequest};
use crate::stack::auth::AuthContext;

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

    fn check(&mut self, request: Request<Bytes>) -> Result<Request<Bytes>, BoxError> {
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
        Ok(request)
    }
}
