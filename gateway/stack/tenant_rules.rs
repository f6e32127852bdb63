//! Tenant rules that need only the parsed request: the models a tenant may use (403
//! `model_not_allowed`), the LoRA adapters it may name (403 `lora_not_allowed`), the
//! `chat_template_kwargs` keys it may set (403 `template_kwarg_not_allowed`), whether
//! it may choose a pool with `x-kvgate-pool` (403 `pool_choice_not_allowed`) and the
//! priority class it may ask for with `x-kvgate-priority` (`priority`; 403
//! `priority_not_allowed`, 400 for a value that names no class). Caps on prompt
//! and new tokens and pool pinning are admission's (they shape which pools fit); rate limits
//! follow admission (they reserve its count).
//!
//! Reads: `AuthContext`, `InferenceRequest`, the `x-kvgate-pool` and `x-kvgate-priority`
//! headers. Writes: `PoolChoice`, `RequestPriority` (always); names the request's
//! [`Ledger`] for its tenant and model.

use bytes::Bytes;
use http::Request;
use serde_json::Value;
use tower::filter::{FilterLayer, Predicate};

use crate::accounting::Ledger;
use crate::body::BoxError;
use crate::error::GatewayError;
use crate::stack::api::{fields, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::priority::{self, RequestPriority};
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
        // The request's account is this tenant's from here, refusals below included. Both
        // names are looked up in the config's book: a model the config does not name is not
        // counted per tenant, so no label value ever comes from the client. The class label
        // is the tenant's configured class (bounded, and stable per tenant).
        if let Some(ledger) = request.extensions().get::<Ledger>() {
            ledger.identify(&auth.tenant, &parsed.model, auth.policy.priority);
        }
        // A stored response's GET and cancel name no model: the owner check (which ties the
        // id to this tenant) stands in for it.
        if !parsed.endpoint.is_stored_response() && !auth.policy.allows_model(&parsed.model) {
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
        // A Responses `reasoning` sets the template's thinking switches (SGLang's
        // `normalize_reasoning_to_thinking`): denied with them.
        if parsed.endpoint == crate::stack::api::Endpoint::CreateResponse
            && parsed.fields.get("reasoning").is_some_and(|r| !r.is_null())
        {
            if let Some(key) = ["enable_thinking", "thinking", "reasoning_effort"]
                .into_iter()
                .find(|k| auth.policy.denied_template_kwargs.iter().any(|d| d == k))
            {
                return Err(GatewayError::TemplateKwargNotAllowed {
                    tenant: auth.tenant.to_string(),
                    key: key.to_owned(),
                }
                .into());
            }
        }
        // Template variables change the prompt; an operator may keep some from a tenant.
        if let Some(Value::Object(kwargs)) = parsed.fields.get("chat_template_kwargs") {
            if let Some(key) = kwargs
                .keys()
                .find(|k| auth.policy.denied_template_kwargs.contains(*k))
            {
                return Err(GatewayError::TemplateKwargNotAllowed {
                    tenant: auth.tenant.to_string(),
                    key: key.clone(),
                }
                .into());
            }
        }
        let class = priority::resolve(request.headers(), &auth.policy)?;
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
        request.extensions_mut().insert(RequestPriority(class));
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Priority;
    use crate::stack::api::{Endpoint, EngineDirectives};
    use crate::tenant::TenantPolicy;
    use std::sync::Arc;

    fn checked(header: Option<&str>) -> Result<Request<Bytes>, GatewayError> {
        let policy = TenantPolicy {
            priority: Priority::Standard,
            max_priority: Priority::Critical,
            ..TenantPolicy::anonymous()
        };
        let auth = AuthContext {
            tenant: policy.name.clone(),
            policy: Arc::new(policy),
        };
        let parsed = InferenceRequest::from_fields(
            Endpoint::Generate,
            "qwen3".into(),
            false,
            1,
            serde_json::Map::new(),
            EngineDirectives::default(),
        );
        let mut request = Request::new(Bytes::new());
        if let Some(value) = header {
            request.headers_mut().insert(
                crate::stack::priority::PRIORITY_HEADER,
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        request.extensions_mut().insert(auth);
        request.extensions_mut().insert(parsed);
        TenantRules.check(request).map_err(GatewayError::from_boxed)
    }

    #[test]
    fn every_request_leaves_with_its_priority_class() {
        let class = |r: Request<Bytes>| r.extensions().get::<RequestPriority>().copied();
        let default = checked(None).unwrap();
        assert_eq!(class(default), Some(RequestPriority(Priority::Standard)));
        let asked = checked(Some("critical")).unwrap();
        assert_eq!(class(asked), Some(RequestPriority(Priority::Critical)));
        let lowered = checked(Some("sheddable")).unwrap();
        assert_eq!(class(lowered), Some(RequestPriority(Priority::Sheddable)));
        assert_eq!(checked(Some("urgent")).unwrap_err().status(), 400);
    }
}
